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

__all__ = ["lltm"]


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


# Looked up once: attribute lookups on torch.ops cost microseconds per call.
_cell = torch.ops.lltm.cell.default


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
