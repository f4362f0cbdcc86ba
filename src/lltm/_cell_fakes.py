"""The fake kernels of the cell ops, for torch.compile (lltm.ops says why)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._fake_checks import (
    _CELL_GATES,
    _STATE,
    _WEIGHTS,
    _X,
    _check_dim,
    _check_dtypes_and_devices,
    _check_forward,
    _check_layouts,
    _check_shape,
    _empty_where,
    _expect,
    _shape_str,
)


@torch.library.register_fake("lltm::forward")
def _forward_fake(*args: Tensor) -> tuple[Tensor, ...]:
    batch, features, state = _check_forward("lltm::forward", *args)
    x, old_cell = args[0], args[4]
    state_like = [old_cell.new_empty((batch, state)) for _ in range(5)]
    return (*state_like, x.new_empty((batch, state + features)), x.new_empty((batch, 3 * state)))


@torch.library.register_fake("lltm::cell")
def _cell_fake(*args: Tensor) -> tuple[Tensor, Tensor]:
    batch, _, state = _check_forward("lltm::cell", *args)
    return args[4].new_empty((batch, state)), args[4].new_empty((batch, state))


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
def _backward_fake(grad_h: Tensor, grad_cell: Tensor, *saved: Tensor) -> tuple[Tensor, ...]:
    op = "lltm::backward"
    # The schema's: the forward's saved outputs, X and gate_weights, then the weights.
    names = ("new_cell", "input_gate", "output_gate", "candidate_cell")
    state_args = {
        "grad_h": grad_h,
        "grad_cell": grad_cell,
        **dict(zip(names, saved[:4], strict=True)),
    }
    x, gate_weights, weights = saved[4:]
    tensors = {**state_args, "X": x, "gate_weights": gate_weights, "weights": weights}
    _check_layouts(op, tensors)
    _check_dtypes_and_devices(op, tensors)
    for name, t in state_args.items():
        _check_dim(op, name, t, 2, _STATE)
    _check_dim(op, "X", x, 2, _X)
    _check_dim(op, "gate_weights", gate_weights, 2, _CELL_GATES)
    _check_dim(op, "weights", weights, 2, _WEIGHTS)
    batch, state = grad_h.shape
    features = x.shape[1] - state
    want = f"X to have shape {_X} with at least state_size = {state} columns"
    _expect(torch._check_value, features >= 0, op, want, _shape_str(x.shape))
    for name, t in state_args.items():
        if name != "grad_h":
            _check_shape(op, name, t, (batch, state), _STATE)
    _check_shape(op, "X", x, (batch, state + features), _X)
    _check_shape(op, "gate_weights", gate_weights, (batch, 3 * state), _CELL_GATES)
    _check_shape(op, "weights", weights, (3 * state, state + features), _WEIGHTS)
    shapes = [(batch, state), (batch, features), (3 * state, state + features), (1, 3 * state)]
    return tuple(grad_h.new_empty(shape) for shape in [*shapes, (batch, state)])


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
    optional = {"grad_h": grad_h, "grad_cell": grad_cell, "X": X}
    _check_layouts(
        op,
        {"grad_h": grad_h, "grad_cell": grad_cell, "new_cell": new_cell, "gates": gates, "X": X}
        | {"weights": weights},
        optional=tuple(optional),
    )
    _check_dtypes_and_devices(op, {"new_cell": new_cell, "gates": gates, "weights": weights})
    for name, t in optional.items():
        if t is not None:
            _check_dtypes_and_devices(op, {"new_cell": new_cell, name: t})
    want = "X = [old_h | input] to be a tensor when the weights need a gradient (output_mask[1])"
    _expect(torch._check_value, not output_mask[1] or X is not None, op, want, None)
    _check_dim(op, "new_cell", new_cell, 2, _STATE)
    _check_dim(op, "gates", gates, 2, _CELL_GATES)
    _check_dim(op, "weights", weights, 2, _WEIGHTS)
    batch, state = new_cell.shape
    features = weights.shape[1] - state
    want = (
        f"weights to have shape {_WEIGHTS} with 3 * state_size = {3 * state} rows and at "
        f"least state_size = {state} columns"
    )
    ok = weights.shape[0] == 3 * state and features >= 0
    _expect(torch._check_value, ok, op, want, _shape_str(weights.shape))
    for name, t in (("grad_h", grad_h), ("grad_cell", grad_cell)):
        if t is not None:
            _check_dim(op, name, t, 2, _STATE)
            _check_shape(op, name, t, (batch, state), _STATE)
    _check_shape(op, "gates", gates, (batch, 3 * state), _CELL_GATES)
    if X is not None:
        _check_dim(op, "X", X, 2, _X)
        _check_shape(op, "X", X, (batch, state + features), _X)
    shapes = [(batch, features), (3 * state, state + features), (3 * state,)]
    return _empty_where(new_cell, [*shapes, (batch, state), (batch, state)], output_mask)
