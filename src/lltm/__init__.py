"""lltm: the LLTM cell of PyTorch's C++/CUDA extension tutorial.

``lltm.lltm`` and ``lltm.LLTM`` are the differentiable API of one step,
``lltm.lltm_sequence`` and ``lltm.LLTMLayer`` of whole sequences; ``lltm._C``
keeps the tutorial's ``forward``/``backward`` functions; ``torch.ops.lltm``
holds the dispatcher ops both are built on. ``LLTM_BACKEND`` (auto, aot,
jit) picks the prebuilt module or a build on import (:mod:`lltm.jit`).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import torch

from ._loader import load_extension

# Loads the compiled module (which registers torch.ops.lltm): the prebuilt one
# when it matches this torch, else per LLTM_BACKEND.
_C, _backend = load_extension()

from . import paths, reference, tuning
from .layer import LLTMLayer
from .module import LLTM
from .ops import lltm, lltm_sequence
from .paths import PathsThatRan, paths_that_ran, sequence_paths
from .tuning import PathChoice, clear_path_choices, path_choices


def _package_version() -> str:
    """The installed version of lltm, or ``0+unknown`` when run from a source tree.

    ``PYTHONPATH=src`` with ``LLTM_BACKEND=jit`` imports lltm without
    installing it, so there is no distribution metadata to read.
    """
    try:
        return importlib.metadata.version("lltm")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


__version__: str = _package_version()

# The sequence paths chosen by earlier processes (lltm.tuning).
tuning._install()

__all__ = [
    "LLTM",
    "LLTMLayer",
    "PathChoice",
    "PathsThatRan",
    "__version__",
    "available_backends",
    "build_info",
    "clear_path_choices",
    "lltm",
    "lltm_sequence",
    "path_choices",
    "paths",
    "paths_that_ran",
    "reference",
    "sequence_paths",
    "tuning",
]


def build_info() -> dict[str, Any]:
    """What the loaded compiled module was built against.

    Returns:
        A dict with ``backend`` (``"aot"`` for the prebuilt module, ``"jit"``
        for a build on import), ``version`` (of lltm), ``torch`` (the version
        built against), ``cuda`` (the CUDA version, None without CUDA
        kernels), ``cuda_archs`` (list of architectures), ``cxx11_abi`` and
        ``pybind11`` (the headers' version); the prebuilt module adds
        ``cxx_standard``, ``cxx_compiler`` and ``build_type``, the JIT build
        ``library`` (its path).
    """
    if _backend == "jit":
        from . import jit  # noqa: PLC0415

        built = jit.loaded_info()
        return {
            "backend": "jit",
            "version": __version__,
            "torch": str(torch.__version__),
            "cuda": torch.version.cuda if built["with_cuda"] else None,
            "cuda_archs": list(built["cuda_archs"]),
            "cxx11_abi": torch._C._GLIBCXX_USE_CXX11_ABI,
            "pybind11": _C.PYBIND11_VERSION,
            "library": built["library"],
        }
    from . import _build_info  # noqa: PLC0415

    return {
        "backend": "aot",
        "version": _build_info.VERSION,
        "torch": _build_info.TORCH_VERSION,
        "cuda": _build_info.CUDA_VERSION,
        "cuda_archs": list(_build_info.CUDA_ARCHS),
        "cxx11_abi": _build_info.CXX11_ABI,
        "cxx_standard": _build_info.CXX_STANDARD,
        "cxx_compiler": _build_info.CXX_COMPILER,
        "pybind11": _build_info.PYBIND11_VERSION,
        "build_type": _build_info.BUILD_TYPE,
    }


def available_backends() -> list[str]:
    """The devices ``torch.ops.lltm`` has kernels for and can run on now.

    ``"cpu"`` always; ``"cuda"`` when the module was built with CUDA and a
    CUDA device is visible.
    """
    backends = ["cpu"]
    has_cuda_kernel = torch._C._dispatch_has_kernel_for_dispatch_key("lltm::forward", "CUDA")
    if has_cuda_kernel and torch.cuda.is_available():
        backends.append("cuda")
    return backends
