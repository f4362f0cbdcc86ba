"""lltm's version and torch pin, from the torch it is built against.

A ``[[tool.dynamic-metadata]]`` provider for scikit-build-core (see
pyproject.toml). A compiled extension works only under the torch minor
release and the accelerator build it was compiled for, so a wheel built
from a checkout says which in two places:

* its version carries a local label, ``pt{major}{minor}`` and ``cpu`` or
  ``cu{NNN}``, e.g. ``0.1.0+pt214cu130`` or ``0.1.0+pt213cpu``, as PyG does;
* ``Requires-Dist: torch==X.Y.*`` pins the torch minor.

The sdist keeps the plain version (PyPI refuses local versions) and marks
Requires-Dist dynamic. A wheel built from the sdist keeps the plain version
too: PEP 643 lets a wheel differ from its sdist only in fields marked
Dynamic, and Version never is.

The build uses the torch of the environment it runs in, and this provider
never asks for torch as a build requirement: an isolated build would then
pull a torch of its own (a CUDA build of several GB from PyPI), possibly
another release than the user's, and build an lltm that does not load under
the user's torch. Where no torch is importable, as in an isolated build, it
stops and says how to build against the installed torch.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

__all__ = ["TorchBuild", "TorchVariant", "local_label", "no_torch_message", "torch_build"]

SETTINGS = {"version"}


def no_torch_message(where: str) -> str:
    """The error when the build cannot import torch: what happened, and what works."""
    return (
        f"lltm builds against the torch installed where it is built, and {where} cannot "
        "import torch.\n"
        "pip and `python -m build` build in an isolated environment unless told otherwise, "
        "and lltm does not install a torch there: it could differ from yours (another "
        "release, or the CUDA build instead of the CPU one) and give an lltm that does not "
        "load under your torch. Install torch first, then build without isolation:\n"
        '    pip install "scikit-build-core>=1.1" ninja\n'
        "    pip install --no-build-isolation lltm    "
        "(from a checkout: pip install --no-build-isolation .)\n"
        "Prebuilt wheels for each torch and CUDA are listed in lltm's README."
    )


def _build_environment() -> str:
    if any("pip-build-env" in entry for entry in sys.path):
        return "pip's isolated build environment"
    return f"the Python running the build ({sys.executable})"


@dataclass(frozen=True)
class TorchBuild:
    """What a build of torch is, as read from its ``torch/version.py``."""

    version: str
    cuda: str | None
    hip: str | None = None

    @property
    def minor(self) -> str:
        """``X.Y``, the torch minor release."""
        release = Version(self.version).release
        return f"{release[0]}.{release[1]}"


def local_label(torch: TorchBuild) -> str:
    """The local version label of a wheel built against ``torch``: ``pt214cu130``, ``pt213cpu``."""
    if torch.hip:
        msg = (
            f"torch {torch.version} is a ROCm build (torch.version.hip = {torch.hip}), and lltm "
            "has no ROCm support: build against a CPU or CUDA build of torch."
        )
        raise RuntimeError(msg)
    release = Version(torch.version).release
    accelerator = f"cu{torch.cuda.replace('.', '')}" if torch.cuda else "cpu"
    return f"pt{release[0]}{release[1]}{accelerator}"


def torch_build() -> TorchBuild:
    """The torch of this build environment, without importing it (that takes seconds)."""
    spec = find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(no_torch_message(_build_environment()))
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    if not version_file.is_file():
        msg = f"{version_file} is missing: the torch at {version_file.parent} is broken"
        raise RuntimeError(msg)
    info = runpy.run_path(str(version_file))
    return TorchBuild(version=info["__version__"], cuda=info.get("cuda"), hip=info.get("hip"))


def _base_version(settings: Mapping[str, Any]) -> str:
    unknown = set(settings) - SETTINGS
    if unknown:
        msg = f"lltm_build_meta: unknown settings {sorted(unknown)}; it takes {sorted(SETTINGS)}"
        raise RuntimeError(msg)
    raw = settings.get("version")
    try:
        version = Version(str(raw))
    except InvalidVersion:
        version = None
    if raw is None or version is None or version.local is not None:
        msg = (
            f"lltm_build_meta: version = {raw!r} in [[tool.dynamic-metadata]]: expected a "
            'public PEP 440 version like "0.1.0" (the local label is added per build)'
        )
        raise RuntimeError(msg)
    return str(raw)


class TorchVariant:
    """The provider: ``version`` and ``dependencies`` of an lltm build."""

    def __init__(self) -> None:
        self.state = "metadata_wheel"

    def build_state(self, build_state: str) -> None:
        """scikit-build-core says which artifact is built: sdist, wheel, editable, metadata_*."""
        self.state = build_state

    def dynamic_metadata(
        self, settings: Mapping[str, Any], project: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The version and dependencies for the artifact being built."""
        del project
        version = _base_version(settings)
        if self.state == "sdist":
            return {"version": version, "dependencies": []}
        torch = torch_build()
        label = local_label(torch)  # checks the torch build even where no label is added
        from_sdist = Path("PKG-INFO").is_file()
        return {
            "version": version if from_sdist else f"{version}+{label}",
            "dependencies": [f"torch=={torch.minor}.*"],
        }

    def dynamic_wheel(self, settings: Mapping[str, Any]) -> dict[str, bool]:
        """Requires-Dist depends on the torch of the wheel's build: Dynamic in the sdist."""
        del settings
        return {"dependencies": True}

    def get_requires_for_dynamic_metadata(self, settings: Mapping[str, Any]) -> list[str]:
        """Nothing: torch must already be there (see the module's docstring)."""
        del settings
        return []
