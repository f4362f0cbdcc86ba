"""Choosing and loading lltm's compiled module: prebuilt (AOT) or built on import (JIT).

A pybind11 extension links against one torch's C++ ABI. Under a torch of
another minor release it fails to load with an ``undefined symbol`` error that
names neither version. So the versions are compared first, and
``LLTM_BACKEND`` says what to do:

* ``aot``: load the prebuilt ``lltm._C``; on a mismatch, raise an ImportError
  that names both versions and the fixes;
* ``jit``: always build the sources with :mod:`lltm.jit`;
* ``auto`` (default): the prebuilt module when it matches the installed torch,
  else warn once and build with :mod:`lltm.jit`.

Either way the ``lltm`` operators are registered once per process: the JIT
module takes the name ``lltm._C`` in ``sys.modules``, so the prebuilt
library is never loaded beside it.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from types import ModuleType

import torch

BACKENDS = ("auto", "aot", "jit")


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+", maxsplit=1)[0].split(".")[:2]
    return int(major), int(minor)


def mismatch_message(built: str, installed: str) -> str | None:
    """The error text when torch ``installed`` cannot load a build for torch ``built``."""
    if _major_minor(built) == _major_minor(installed):
        return None
    built_mm = ".".join(map(str, _major_minor(built)))
    installed_mm = ".".join(map(str, _major_minor(installed)))
    return (
        f"lltm was built against torch {built}, but torch {installed} is installed. "
        "A compiled extension only works with the torch minor release it was built "
        f"against. Either install torch=={built_mm}.* "
        f"(pip install 'torch=={built_mm}.*'), install an lltm wheel built for torch "
        f"{installed_mm}, or rebuild lltm against the installed torch "
        "(pip install --no-build-isolation --force-reinstall --no-deps lltm, "
        "or from a checkout: pip install --no-build-isolation .)."
    )


def backend_setting() -> str:
    """``LLTM_BACKEND``, checked: ``auto`` (the default), ``aot`` or ``jit``."""
    value = os.environ.get("LLTM_BACKEND", "").strip().lower() or "auto"
    if value not in BACKENDS:
        msg = f"LLTM_BACKEND={value!r}: expected one of {', '.join(BACKENDS)}"
        raise ImportError(msg)
    return value


def _load_jit(problem: str | None) -> ModuleType:
    from . import jit  # noqa: PLC0415 - only when JIT is used

    try:
        module = jit.load_from_environment()
    except jit.JitUnavailableError as exc:
        if problem is None:
            msg = f"LLTM_BACKEND=jit: cannot build lltm here: {exc}"
        else:
            msg = f"{problem} Building lltm for the installed torch instead failed: {exc}."
        raise ImportError(msg) from exc
    sys.modules["lltm._C"] = module
    return module


def load_extension() -> tuple[ModuleType, str]:
    """Load lltm's compiled module as ``LLTM_BACKEND`` says.

    Returns:
        The module (``lltm._C`` or its JIT build) and the backend used,
        ``"aot"`` or ``"jit"``.
    """
    setting = backend_setting()
    if setting == "jit":
        return _load_jit(None), "jit"
    try:
        from . import _build_info  # noqa: PLC0415
    except ImportError as exc:
        msg = (
            "lltm's compiled module is missing: lltm was imported from a source tree "
            "that was never built. Install it with `pip install --no-build-isolation -e .` "
            "(see CONTRIBUTING.md), or set LLTM_BACKEND=jit to build it on import."
        )
        raise ImportError(msg) from exc
    problem = mismatch_message(_build_info.TORCH_VERSION, torch.__version__)
    if problem is None:
        return importlib.import_module("lltm._C"), "aot"
    if setting == "aot":
        raise ImportError(problem)
    warnings.warn(
        f"lltm: the prebuilt module was built for torch {_build_info.TORCH_VERSION}, "
        f"but torch {torch.__version__} is installed: building lltm for it with "
        "lltm.jit (a minute or two the first time; later imports load it from torch's "
        "extension cache). Set LLTM_BACKEND=aot to get an error instead.",
        RuntimeWarning,
        stacklevel=3,
    )
    return _load_jit(problem), "jit"
