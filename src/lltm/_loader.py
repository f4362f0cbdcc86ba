"""Loading lltm._C, with a clear error when it cannot match the installed torch.

A pybind11 extension links against one torch's C++ ABI. Under a torch of
another minor release it fails to load with an ``undefined symbol`` error that
names neither version; this module checks the versions first and says what to
do instead.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+", maxsplit=1)[0].split(".")[:2]
    return int(major), int(minor)


def mismatch_message(built: str, installed: str) -> str | None:
    """The error text when torch ``installed`` cannot load a build for torch ``built``."""
    if _major_minor(built) == _major_minor(installed):
        return None
    built_mm = ".".join(map(str, _major_minor(built)))
    return (
        f"lltm was built against torch {built}, but torch {installed} is installed. "
        "A compiled extension only works with the torch minor release it was built "
        f"against. Either install torch=={built_mm}.* "
        f"(pip install 'torch=={built_mm}.*'), or rebuild lltm against the installed torch "
        "(pip install --no-build-isolation --force-reinstall --no-deps lltm, "
        "or from a checkout: pip install --no-build-isolation .)."
    )


def load_extension() -> ModuleType:
    """Import and return ``lltm._C`` after checking it matches the installed torch."""
    try:
        from . import _build_info  # noqa: PLC0415
    except ImportError as exc:
        msg = (
            "lltm's compiled module is missing: lltm was imported from a source tree "
            "that was never built. Install it with "
            "`pip install --no-build-isolation -e .` (see CONTRIBUTING.md)."
        )
        raise ImportError(msg) from exc
    problem = mismatch_message(_build_info.TORCH_VERSION, torch.__version__)
    if problem is not None:
        raise ImportError(problem)
    return importlib.import_module("lltm._C")
