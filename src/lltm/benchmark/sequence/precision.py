"""The precisions of a sequence run: a dtype and the TF32 switches that it is timed under."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .._common import DTYPES

__all__ = ["DTYPE_PRECISION", "PRECISIONS", "Precision", "precision_switches"]


@dataclass(frozen=True)
class Precision:
    """A dtype and the TF32 switches under which it is timed."""

    name: str
    dtype: torch.dtype
    matmul_tf32: bool = False
    cudnn_tf32: bool = False
    note: str = ""


PRECISIONS = {
    p.name: p
    for p in (
        Precision("float32", torch.float32),
        Precision(
            "float32-defaults",
            torch.float32,
            cudnn_tf32=True,
            note="torch's defaults: nn.LSTM computes in TF32 (cuDNN's switch), "
            "lltm in fp32 (it follows the matmul switch)",
        ),
        Precision("float16", torch.float16),
        Precision(
            "bfloat16",
            torch.bfloat16,
            note="PyTorch does not flatten bf16 nn.LSTM weights: cuDNN copies them at "
            "every call (the reduced-precision anchor is float16)",
        ),
        Precision("float64", torch.float64),
    )
}
# A dtype's own precision: its name, TF32 off.
DTYPE_PRECISION = {dtype: name for name, dtype in DTYPES.items()}
# nn.LSTM's warning at every bf16 call: the report says it once instead.
_UNFLATTENED_WARNING = r"RNN module weights are not part of single contiguous chunk"


@contextlib.contextmanager
def precision_switches(p: Precision) -> Iterator[None]:
    """Set both TF32 switches as ``p`` says for the calls inside, and hush bf16 nn.LSTM."""
    old = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    torch.backends.cuda.matmul.allow_tf32 = p.matmul_tf32
    torch.backends.cudnn.allow_tf32 = p.cudnn_tf32
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_UNFLATTENED_WARNING)
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old[0]
        torch.backends.cudnn.allow_tf32 = old[1]
        torch.set_float32_matmul_precision(old[2])
