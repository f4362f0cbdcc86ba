"""lltm: the LLTM cell of PyTorch's C++/CUDA extension tutorial.

``lltm.lltm`` and ``lltm.LLTM`` are the differentiable API; ``lltm._C``
keeps the tutorial's ``forward``/``backward`` functions; ``torch.ops.lltm``
holds the dispatcher ops both are built on.
"""

from __future__ import annotations

from typing import Any

import torch

from ._loader import load_extension

# Loads the compiled module (which registers torch.ops.lltm), after checking
# that it was built for this torch.
_C = load_extension()

from . import _build_info, reference
from .module import LLTM
from .ops import lltm

__version__: str = _build_info.VERSION

__all__ = ["LLTM", "__version__", "available_backends", "build_info", "lltm", "reference"]


def build_info() -> dict[str, Any]:
    """What the compiled module was built against.

    Returns:
        A dict with ``version`` (of lltm), ``torch`` (the version built
        against), ``cuda`` (the CUDA version, None on CPU builds),
        ``cuda_archs`` (list of architectures), ``cxx11_abi``,
        ``cxx_standard``, ``cxx_compiler``, ``pybind11`` (the headers'
        version) and ``build_type``.
    """
    return {
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
