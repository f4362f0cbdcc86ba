"""The LLTM operators: the Python API over the ``torch.ops.lltm`` dispatcher ops.

The schemas, the CPU/CUDA kernels and the autograd kernels are registered in
C++ (``cpp/``). This module adds what ``torch.compile`` needs on top of them:
a fake kernel for each op, so that the compiler can trace shapes without
running a kernel. The fake kernels mirror the C++ checks with
``torch._check``, so that ``torch.compile`` rejects bad shapes with the same
wording at trace time.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
) -> tuple[Tensor, Tensor, Tensor]:
    """One LLTM layer over a whole sequence, differentiable (backprop through time in C++).

    Step ``t`` is :func:`lltm` on ``input[t]`` and the previous step's state,
    starting from ``(h0, c0)``; the input projection of all steps is one GEMM,
    and each step one recurrent GEMM and one fused kernel (on CUDA, at small
    batch, one persistent kernel runs every step: see ``LLTM_SEQUENCE_PATH``
    in the README).

    Args:
        input: ``[steps, batch, input_features]``.
        weights: ``[3 * state_size, state_size + input_features]``, the cell's layout.
        bias: ``[3 * state_size]`` or ``[1, 3 * state_size]``.
        h0: ``[batch, state_size]``.
        c0: ``[batch, state_size]``.

    All five share one floating dtype (float32, float64, float16 or bfloat16)
    and one device.

    Returns:
        ``(output, h_n, c_n)``: ``output[t]`` is ``h_t``, ``[steps, batch,
        state_size]``; ``h_n`` and ``c_n`` are the last step's state,
        ``[batch, state_size]`` (``h0`` and ``c0`` for zero steps).
    """
    return _sequence(input, weights, bias, h0, c0)


# Looked up once: attribute lookups on torch.ops cost microseconds per call.
_cell = torch.ops.lltm.cell.default
_sequence = torch.ops.lltm.sequence.default


# --- fake kernels -------------------------------------------------------------------------


def _check_same(op: str, tensors: dict[str, Tensor]) -> None:
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        torch._check(
            t.dim() == 2 or name == "bias", lambda name=name: f"{op}: expected {name} to be 2-D"
        )
        torch._check(
            t.dtype == first.dtype,
            lambda name=name: f"{op}: expected {name} to have the same dtype as {first_name}",
        )
        torch._check(
            t.device == first.device,
            lambda name=name: f"{op}: expected {name} to be on the same device as {first_name}",
        )


def _check_forward(
    op: str,
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
) -> tuple[int, int, int]:
    _check_same(
        op,
        {"input": input, "weights": weights, "bias": bias, "old_h": old_h, "old_cell": old_cell},
    )
    batch, features = input.shape
    state = old_h.shape[1]
    torch._check(old_h.shape[0] == batch, lambda: f"{op}: expected old_h to have batch rows")
    torch._check(old_cell.shape == old_h.shape, lambda: f"{op}: expected old_cell to match old_h")
    torch._check(
        weights.shape == (3 * state, state + features),
        lambda: (
            f"{op}: expected weights to have shape [3 * state_size, state_size + input_features]"
        ),
    )
    torch._check(
        bias.numel() == 3 * state and bias.dim() in (1, 2),
        lambda: f"{op}: expected bias to have shape [3 * state_size] or [1, 3 * state_size]",
    )
    return batch, features, state


@torch.library.register_fake("lltm::forward")
def _forward_fake(
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
) -> tuple[Tensor, ...]:
    batch, features, state = _check_forward("lltm::forward", input, weights, bias, old_h, old_cell)
    state_like = [old_cell.new_empty((batch, state)) for _ in range(5)]
    X = input.new_empty((batch, state + features))  # noqa: N806
    gate_weights = input.new_empty((batch, 3 * state))
    return (*state_like, X, gate_weights)


@torch.library.register_fake("lltm::cell")
def _cell_fake(
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
) -> tuple[Tensor, Tensor]:
    batch, _, state = _check_forward("lltm::cell", input, weights, bias, old_h, old_cell)
    return old_cell.new_empty((batch, state)), old_cell.new_empty((batch, state))


@torch.library.register_fake("lltm::cell_forward")
def _cell_forward_fake(
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
    save_X: bool,  # noqa: N803
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    op = "lltm::cell_forward"
    batch, features, state = _check_forward(op, input, weights, bias, old_h, old_cell)
    X = input.new_empty((batch, state + features)) if save_X else None  # noqa: N806
    return (
        old_cell.new_empty((batch, state)),
        old_cell.new_empty((batch, state)),
        old_cell.new_empty((batch, 3 * state)),
        X,
    )


@torch.library.register_fake("lltm::backward")
def _backward_fake(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    input_gate: Tensor,
    output_gate: Tensor,
    candidate_cell: Tensor,
    X: Tensor,  # noqa: N803
    gate_weights: Tensor,
    weights: Tensor,
) -> tuple[Tensor, ...]:
    op = "lltm::backward"
    state_args = {
        "grad_h": grad_h,
        "grad_cell": grad_cell,
        "new_cell": new_cell,
        "input_gate": input_gate,
        "output_gate": output_gate,
        "candidate_cell": candidate_cell,
    }
    _check_same(op, {**state_args, "X": X, "gate_weights": gate_weights, "weights": weights})
    batch, state = grad_h.shape
    features = X.shape[1] - state
    for name, t in state_args.items():
        torch._check(
            t.shape == grad_h.shape, lambda name=name: f"{op}: expected {name} to match grad_h"
        )
    torch._check(
        gate_weights.shape == (batch, 3 * state),
        lambda: f"{op}: expected gate_weights to have shape [batch, 3 * state_size]",
    )
    torch._check(
        weights.shape == (3 * state, state + features),
        lambda: (
            f"{op}: expected weights to have shape [3 * state_size, state_size + input_features]"
        ),
    )
    return (
        grad_h.new_empty((batch, state)),
        grad_h.new_empty((batch, features)),
        grad_h.new_empty((3 * state, state + features)),
        grad_h.new_empty((1, 3 * state)),
        grad_h.new_empty((batch, state)),
    )


@torch.library.register_fake("lltm::cell_backward")
def _cell_backward_fake(
    grad_h: Tensor | None,
    grad_cell: Tensor | None,
    new_cell: Tensor,
    gates: Tensor,
    X: Tensor | None,  # noqa: N803
    weights: Tensor,
    output_mask: list[bool],
) -> tuple[Tensor | None, ...]:
    op = "lltm::cell_backward"
    tensors = {"new_cell": new_cell, "gates": gates, "weights": weights}
    for name, t in (("grad_h", grad_h), ("grad_cell", grad_cell), ("X", X)):
        if t is not None:
            tensors[name] = t
    _check_same(op, tensors)
    batch, state = new_cell.shape
    features = weights.shape[1] - state
    torch._check(
        not output_mask[1] or X is not None,
        lambda: (
            f"{op}: expected X = [old_h | input] to be a tensor when the weights need a "
            "gradient (output_mask[1]), but got None"
        ),
    )
    torch._check(
        gates.shape == (batch, 3 * state),
        lambda: f"{op}: expected gates to have shape [batch, 3 * state_size]",
    )
    shapes = [
        (batch, features),
        (3 * state, state + features),
        (3 * state,),
        (batch, state),
        (batch, state),
    ]
    return tuple(
        new_cell.new_empty(shape) if wanted else None
        for shape, wanted in zip(shapes, output_mask, strict=True)
    )


# --- fake kernels of the sequence ops ---------------------------------------------------


def _check_sequence_same(op: str, tensors: dict[str, Tensor]) -> None:
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        torch._check(
            t.dtype == first.dtype,
            lambda name=name: f"{op}: expected {name} to have the same dtype as {first_name}",
        )
        torch._check(
            t.device == first.device,
            lambda name=name: f"{op}: expected {name} to be on the same device as {first_name}",
        )


def _check_dim(op: str, name: str, t: Tensor, dim: int, layout: str) -> None:
    torch._check(t.dim() == dim, lambda: f"{op}: expected {name} to be a {dim}-D tensor {layout}")


_STEPS = "[steps, batch, input_features]"
_STATE = "[batch, state_size]"
_STATES = "[steps, batch, state_size]"
_GATES = "[steps, batch, 3 * state_size]"
_WEIGHTS = "[3 * state_size, state_size + input_features]"


def _check_sequence_forward(
    op: str,
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    h0: Tensor,
    c0: Tensor,
) -> tuple[int, int, int, int]:
    _check_sequence_same(op, {"input": input, "weights": weights, "bias": bias, "h0": h0, "c0": c0})
    _check_dim(op, "input", input, 3, _STEPS)
    _check_dim(op, "h0", h0, 2, _STATE)
    _check_dim(op, "c0", c0, 2, _STATE)
    _check_dim(op, "weights", weights, 2, _WEIGHTS)
    steps, batch, features = input.shape
    state = h0.shape[1]
    for name, t in (("h0", h0), ("c0", c0)):
        torch._check(
            t.shape == (batch, state),
            lambda name=name: f"{op}: expected {name} to have shape {_STATE}",
        )
    torch._check(
        weights.shape == (3 * state, state + features),
        lambda: f"{op}: expected weights to have shape {_WEIGHTS}",
    )
    torch._check(
        bias.numel() == 3 * state and bias.dim() in (1, 2),
        lambda: f"{op}: expected bias to have shape [3 * state_size] or [1, 3 * state_size]",
    )
    return steps, batch, features, state


@torch.library.register_fake("lltm::sequence")
def _sequence_fake(
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    h0: Tensor,
    c0: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    steps, batch, _, state = _check_sequence_forward("lltm::sequence", input, weights, bias, h0, c0)
    return (
        input.new_empty((steps, batch, state)),
        input.new_empty((batch, state)),
        input.new_empty((batch, state)),
    )


@torch.library.register_fake("lltm::sequence_forward")
def _sequence_forward_fake(
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    h0: Tensor,
    c0: Tensor,
) -> tuple[Tensor, ...]:
    steps, batch, _, state = _check_sequence_forward(
        "lltm::sequence_forward", input, weights, bias, h0, c0
    )
    return (
        input.new_empty((steps, batch, state)),
        input.new_empty((batch, state)),
        input.new_empty((batch, state)),
        input.new_empty((steps, batch, state)),
        input.new_empty((steps, batch, 3 * state)),
    )


@torch.library.register_fake("lltm::sequence_backward")
def _sequence_backward_fake(
    grad_output: Tensor | None,
    grad_h_n: Tensor | None,
    grad_c_n: Tensor | None,
    input: Tensor,  # noqa: A002
    weights: Tensor,
    h0: Tensor,
    output: Tensor,
    cells: Tensor,
    gates: Tensor,
    output_mask: list[bool],
) -> tuple[Tensor | None, ...]:
    op = "lltm::sequence_backward"
    tensors = {
        "input": input,
        "weights": weights,
        "h0": h0,
        "output": output,
        "cells": cells,
        "gates": gates,
    }
    grads = {"grad_output": grad_output, "grad_h_n": grad_h_n, "grad_c_n": grad_c_n}
    _check_sequence_same(op, {**tensors, **{k: v for k, v in grads.items() if v is not None}})
    _check_dim(op, "input", input, 3, _STEPS)
    _check_dim(op, "h0", h0, 2, _STATE)
    _check_dim(op, "weights", weights, 2, _WEIGHTS)
    steps, batch, features = input.shape
    state = h0.shape[1]
    torch._check(
        weights.shape == (3 * state, state + features),
        lambda: f"{op}: expected weights to have shape {_WEIGHTS}",
    )
    for name, t in (("output", output), ("cells", cells), ("grad_output", grad_output)):
        if t is not None:
            torch._check(
                t.shape == (steps, batch, state),
                lambda name=name: f"{op}: expected {name} to have shape {_STATES}",
            )
    torch._check(
        gates.shape == (steps, batch, 3 * state),
        lambda: f"{op}: expected gates to have shape {_GATES}",
    )
    for name, t in (("grad_h_n", grad_h_n), ("grad_c_n", grad_c_n)):
        if t is not None:
            torch._check(
                t.shape == (batch, state),
                lambda name=name: f"{op}: expected {name} to have shape {_STATE}",
            )
    shapes = [
        (steps, batch, features),
        (3 * state, state + features),
        (3 * state,),
        (batch, state),
        (batch, state),
    ]
    return tuple(
        input.new_empty(shape) if wanted else None
        for shape, wanted in zip(shapes, output_mask, strict=True)
    )
