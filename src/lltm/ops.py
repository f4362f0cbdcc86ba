"""The LLTM operators: the Python API over the ``torch.ops.lltm`` dispatcher ops.

The schemas, the CPU/CUDA kernels and the autograd kernels are registered in
C++ (``cpp/``). What ``torch.compile`` needs on top of them is a fake kernel
for each op, so that the compiler can trace shapes without running a kernel
(``_cell_fakes`` and ``_sequence_fakes``, registered by this module's import).
The fake kernels mirror the C++ checks with ``torch._check``
(``_fake_checks``), so that ``torch.compile`` rejects bad shapes with the same
wording at trace time.
"""

from __future__ import annotations

import torch
from torch import Tensor

# The fake kernels, registered on import.
from . import _cell_fakes, _sequence_fakes  # noqa: F401

__all__ = ["lltm", "lltm_sequence"]


def lltm(
    input: Tensor,  # noqa: A002 - the tutorial's name
    weights: Tensor,
    bias: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
) -> tuple[Tensor, Tensor]:
    """One differentiable LLTM step.

    With ``X = [old_h | input]`` and ``X @ weights.T + bias`` split into three
    gates, ``new_cell = old_cell + elu(g) * sigmoid(i)`` and
    ``new_h = tanh(new_cell) * sigmoid(o)``.

    Args:
        input: ``[batch, input_features]``.
        weights: ``[3 * state_size, state_size + input_features]``.
        bias: ``[3 * state_size]`` or ``[1, 3 * state_size]``.
        old_h: ``[batch, state_size]``.
        old_cell: ``[batch, state_size]``.

    All five share one floating dtype (float32, float64, float16 or bfloat16)
    and one device.

    Returns:
        ``(new_h, new_cell)``, each ``[batch, state_size]``.
    """
    return _cell(input, weights, bias, old_h, old_cell)


def lltm_sequence(
    input: Tensor,  # noqa: A002 - the tutorial's name
    weights: Tensor,
    bias: Tensor,
    h0: Tensor,
    c0: Tensor,
    batch_sizes: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One LLTM layer over a whole sequence, differentiable (backprop through time in C++).

    Step ``t`` is :func:`lltm` on ``input[t]`` and the previous step's state,
    starting from ``(h0, c0)``; the input projection of all steps is one GEMM,
    and each step one recurrent GEMM and one fused kernel (on CUDA, at small
    batch, one persistent kernel runs every step: see ``LLTM_SEQUENCE_PATH``
    in the README).

    Args:
        input: ``[steps, batch, input_features]``; with ``batch_sizes``, a
            packed batch ``[sum(batch_sizes), input_features]``, step
            ``t``'s rows after step ``t - 1``'s (a ``PackedSequence``'s
            ``data``).
        weights: the cell's weights, as :func:`lltm` takes them, for one
            direction; or ``[2, 3 * state_size, state_size + input_features]``
            for two, the second of which runs from each sequence's end to its
            start (``nn.LSTM``'s bidirectional layer). A leading dimension of
            1 is one direction with a direction dimension.
        bias: the cell's bias, likewise (``[directions, 3 * state_size]`` or
            ``[directions, 1, 3 * state_size]`` with a direction dimension).
        h0: the state before the first step, as :func:`lltm`'s ``old_h``
            (``[directions, batch, state_size]`` with a direction dimension).
        c0: likewise, as its ``old_cell``.
        batch_sizes: for a packed batch, the number of sequences at each
            step, as a ``PackedSequence`` holds it (int64 on the CPU,
            non-increasing, ``batch_sizes[0]`` = batch): the sequences are
            sorted by decreasing length, and each stops at its own.

    The five tensors share one dtype and one device, as :func:`lltm`'s do.

    Returns:
        ``(output, h_n, c_n)``: ``output[t]`` is ``h_t``, ``[steps, batch,
        directions * state_size]`` (direction ``d`` in columns ``d * state_size``
        on; packed like ``input`` with ``batch_sizes``); ``h_n`` and ``c_n``
        are each sequence's state after its last step (for the second
        direction, after its first), shaped as ``h0`` (``h0`` and ``c0`` for
        zero steps).
    """
    return _sequence(input, weights, bias, h0, c0, batch_sizes)


# Looked up once: attribute lookups on torch.ops cost microseconds per call.
_cell = torch.ops.lltm.cell.default
_sequence = torch.ops.lltm.sequence.default
