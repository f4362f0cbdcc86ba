"""The LLTM operators: the Python API over the ``torch.ops.lltm`` dispatcher ops.

The schemas and the CPU/CUDA kernels are registered in C++ (``cpp/lltm.cpp``).
This module adds what ``torch.compile`` and autograd need on top of them:

* a fake kernel for each op, so that the compiler can trace shapes without
  running a kernel;
* an autograd formula for ``lltm::forward``, whose backward calls the
  ``lltm::backward`` op, so that the backward is traceable too.
"""

from __future__ import annotations

from typing import Any

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
    new_h, new_cell, *_ = torch.ops.lltm.forward.default(input, weights, bias, old_h, old_cell)
    return new_h, new_cell


# --- fake kernels -------------------------------------------------------------------------
# They mirror the C++ checks with torch._check, so that torch.compile rejects
# bad shapes with the same wording at trace time.


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


@torch.library.register_fake("lltm::forward")
def _forward_fake(
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    old_h: Tensor,
    old_cell: Tensor,
) -> tuple[Tensor, ...]:
    op = "lltm::forward"
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
    state_like = [old_cell.new_empty((batch, state)) for _ in range(5)]
    X = input.new_empty((batch, state + features))  # noqa: N806
    gate_weights = input.new_empty((batch, 3 * state))
    return (*state_like, X, gate_weights)


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


# --- autograd -----------------------------------------------------------------------------
# Only new_h and new_cell are differentiable outputs. The other five are the
# saved activations the tutorial returns for its backward; they are marked
# non-differentiable so that a loss built on them cannot silently get a
# gradient that ignores that path.


def _setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
    _input, weights, bias, _old_h, _old_cell = inputs
    _new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights = output  # noqa: N806
    ctx.mark_non_differentiable(input_gate, output_gate, candidate_cell, X, gate_weights)
    ctx.save_for_backward(
        new_cell, input_gate, output_gate, candidate_cell, X, gate_weights, weights
    )
    ctx.bias_shape = bias.shape


def _backward(
    ctx: Any, grad_h: Tensor | None, grad_cell: Tensor | None, *_: Any
) -> tuple[Any, ...]:
    new_cell, input_gate, output_gate, candidate_cell, X, gate_weights, weights = (  # noqa: N806
        ctx.saved_tensors
    )
    # Autograd passes None for an output that does not reach the loss.
    if grad_h is None:
        grad_h = torch.zeros_like(new_cell)
    if grad_cell is None:
        grad_cell = torch.zeros_like(new_cell)
    d_old_h, d_input, d_weights, d_bias, d_old_cell = torch.ops.lltm.backward.default(
        grad_h,
        grad_cell,
        new_cell,
        input_gate,
        output_gate,
        candidate_cell,
        X,
        gate_weights,
        weights,
    )
    return d_input, d_weights, d_bias.reshape(ctx.bias_shape), d_old_h, d_old_cell


torch.library.register_autograd("lltm::forward", _backward, setup_context=_setup_context)


def _no_double_backward(_ctx: Any, *_grads: Any) -> tuple[Any, ...]:
    msg = "lltm::backward is not differentiable: lltm supports first-order gradients only"
    raise RuntimeError(msg)


def _setup_backward_context(ctx: Any, inputs: tuple[Tensor, ...], output: Any) -> None:
    pass


torch.library.register_autograd(
    "lltm::backward", _no_double_backward, setup_context=_setup_backward_context
)
