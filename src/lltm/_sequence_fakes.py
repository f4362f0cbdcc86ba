"""The fake kernels of the sequence ops, for torch.compile (lltm.ops says why)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from ._fake_checks import (
    _GATES,
    _STATE,
    _STATES,
    _STEPS,
    _WEIGHTS,
    _check_bias,
    _check_dim,
    _check_dtypes_and_devices,
    _check_layouts,
    _check_shape,
    _dtype_name,
    _empty_where,
    _expect,
    _shape_str,
)

_PACKED = "[sum(batch_sizes), input_features]"
_DIR_STATE = "[directions, batch, state_size]"
_DIR_STATES = "[directions, steps, batch, state_size]"
_DIR_GATES = "[directions, steps, batch, 3 * state_size]"
_DIR_WEIGHTS = "[directions, 3 * state_size, state_size + input_features]"
_OUTPUT = "[steps, batch, directions * state_size]"
_PACKED_OUTPUT = "[sum(batch_sizes), directions * state_size]"
_PACKED_STATES = "[sum(batch_sizes), state_size]"


def _batch_sizes(op: str, batch_sizes: Tensor) -> list[int] | None:
    """checks.cpp's check_batch_sizes: the values, where they can be read (not fake)."""
    ok = (
        batch_sizes.dim() == 1
        and batch_sizes.dtype == torch.int64
        and batch_sizes.device.type == "cpu"
    )
    got = f"a {batch_sizes.dim()}-D {_dtype_name(batch_sizes.dtype)} tensor on {batch_sizes.device}"
    want = "batch_sizes to be a 1-D int64 tensor on the CPU, [steps] (a PackedSequence's)"
    _expect(torch._check_value, ok, op, want, got)
    if isinstance(batch_sizes, FakeTensor):
        return None
    values = [int(v) for v in batch_sizes.tolist()]
    for t, v in enumerate(values):
        after = f" after {values[t - 1]}" if t > 0 else ""
        want = (
            "batch_sizes to be at least 1 and non-increasing (the sequences sorted by "
            "decreasing length, as a PackedSequence holds them)"
        )
        ok = v >= 1 and (t == 0 or v <= values[t - 1])
        _expect(torch._check_value, ok, op, want, f"batch_sizes[{t}] = {v}{after}")
    return values


def _directions(op: str, weights: Tensor) -> tuple[int, bool]:
    """checks.cpp's check_directions: (directions, whether the arguments carry them)."""
    got = f"a {weights.dim()}-D tensor of shape {_shape_str(weights.shape)}"
    want = f"weights to be a 2-D tensor {_WEIGHTS} or a 3-D tensor {_DIR_WEIGHTS}"
    _expect(torch._check_value, weights.dim() in (2, 3), op, want, got)
    if weights.dim() == 2:
        return 1, False
    directions = weights.shape[0]
    want = "weights to hold 1 or 2 directions (its first dimension)"
    _expect(torch._check_value, directions in (1, 2), op, want, directions)
    return directions, True


def _directed(stacked: bool, directions: int, *shape: int) -> tuple[int, ...]:
    return (directions, *shape) if stacked else shape


def _check_sequence_bias(op: str, bias: Tensor, state: int, stacked: bool, d: int) -> None:
    if not stacked:
        _check_bias(op, bias, state)
        return
    g = 3 * state
    shape = tuple(bias.shape)
    ok = shape in ((d, g), (d, 1, g))
    want = (
        f"bias to have shape [directions, 3 * state_size] = {_shape_str([d, g])} or "
        f"[directions, 1, 3 * state_size] = {_shape_str([d, 1, g])}"
    )
    _expect(torch._check_value, ok, op, want, _shape_str(bias.shape))


def _sequence_head(
    op: str,
    input: Tensor,  # noqa: A002
    weights: Tensor,
    batch_sizes: Tensor | None,
) -> tuple[list[int] | None, int, bool]:
    """batch_sizes, input's dimensions and the directions: (values, directions, stacked)."""
    packed = batch_sizes is not None
    values = _batch_sizes(op, batch_sizes) if batch_sizes is not None else None
    _check_dim(op, "input", input, 2 if packed else 3, _PACKED if packed else _STEPS)
    directions, stacked = _directions(op, weights)
    return values, directions, stacked


def _sequence_sizes(
    op: str,
    input: Tensor,  # noqa: A002
    h0: Tensor,
    batch_sizes: Tensor | None,
    values: list[int] | None,
) -> tuple[int, int, int, int]:
    """(steps, batch, features, state), and a packed input's rows checked where known."""
    features, state = input.shape[-1], h0.shape[-1]
    if batch_sizes is None:
        return input.shape[0], input.shape[1], features, state
    steps = batch_sizes.shape[0]
    if values is None:  # fake: the values are not known
        return steps, h0.shape[-2], features, state
    _check_shape(op, "input", input, (sum(values), features), _PACKED)
    return steps, values[0] if steps else h0.shape[-2], features, state


class _Sequence:
    """A sequence op's problem, as checks.cpp's checks find it."""

    def __init__(
        self,
        steps: int,
        batch: int,
        features: int,
        state: int,
        directions: int,
        stacked: bool,
        packed: bool,
    ) -> None:
        self.steps, self.batch, self.features, self.state = steps, batch, features, state
        self.directions, self.stacked, self.packed = directions, stacked, packed

    def directed(self, *shape: int) -> tuple[int, ...]:
        return _directed(self.stacked, self.directions, *shape)


def _check_sequence(
    op: str,
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    h0: Tensor,
    c0: Tensor,
    batch_sizes: Tensor | None,
) -> _Sequence:
    """sequence::check_forward_args."""
    tensors = {"input": input, "weights": weights, "bias": bias, "h0": h0, "c0": c0}
    _check_layouts(op, {**tensors, "batch_sizes": batch_sizes}, optional=("batch_sizes",))
    _check_dtypes_and_devices(op, tensors)
    values, directions, stacked = _sequence_head(op, input, weights, batch_sizes)
    state_layout = _DIR_STATE if stacked else _STATE
    for name, t in (("h0", h0), ("c0", c0)):
        _check_dim(op, name, t, 3 if stacked else 2, state_layout)
    steps, batch, features, state = _sequence_sizes(op, input, h0, batch_sizes, values)
    for name, t in (("h0", h0), ("c0", c0)):
        _check_shape(op, name, t, _directed(stacked, directions, batch, state), state_layout)
    want = _directed(stacked, directions, 3 * state, state + features)
    _check_shape(op, "weights", weights, want, _DIR_WEIGHTS if stacked else _WEIGHTS)
    _check_sequence_bias(op, bias, state, stacked, directions)
    packed = batch_sizes is not None
    return _Sequence(steps, batch, features, state, directions, stacked, packed)


def _sequence_outputs(p: _Sequence, input: Tensor) -> list[Tensor]:  # noqa: A002
    """(output, h_n, c_n, cells, gates) of a sequence op."""
    s, d = p.state, p.directions
    output = (input.shape[0], d * s) if p.packed else (p.steps, p.batch, d * s)
    shapes = [
        output,
        p.directed(p.batch, s),
        p.directed(p.batch, s),
        p.directed(p.steps, p.batch, s),
        p.directed(p.steps, p.batch, 3 * s),
    ]
    return [input.new_empty(shape) for shape in shapes]


@torch.library.register_fake("lltm::sequence")
def _sequence_fake(
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    h0: Tensor,
    c0: Tensor,
    batch_sizes: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    p = _check_sequence("lltm::sequence", input, weights, bias, h0, c0, batch_sizes)
    output, h_n, c_n, _, _ = _sequence_outputs(p, input)
    return output, h_n, c_n


@torch.library.register_fake("lltm::sequence_forward")
def _sequence_forward_fake(
    input: Tensor,  # noqa: A002
    weights: Tensor,
    bias: Tensor,
    h0: Tensor,
    c0: Tensor,
    batch_sizes: Tensor | None = None,
) -> tuple[Tensor, ...]:
    op = "lltm::sequence_forward"
    p = _check_sequence(op, input, weights, bias, h0, c0, batch_sizes)
    # output, h_n, c_n, then the cells and gates of every step for the backward.
    return tuple(_sequence_outputs(p, input))


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
    batch_sizes: Tensor | None,
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
    _check_layouts(
        op,
        {**grads, **tensors, "batch_sizes": batch_sizes},
        optional=(*grads, "batch_sizes"),
    )
    _check_dtypes_and_devices(op, tensors)
    for name, t in grads.items():
        if t is not None:
            _check_dtypes_and_devices(op, {"input": input, name: t})
    packed = batch_sizes is not None
    values, directions, stacked = _sequence_head(op, input, weights, batch_sizes)
    state_layout = _DIR_STATE if stacked else _STATE
    states_layout = _DIR_STATES if stacked else _STATES
    gates_layout = _DIR_GATES if stacked else _GATES
    if packed:
        output_layout = _PACKED_OUTPUT if stacked else _PACKED_STATES
    else:
        output_layout = _OUTPUT if stacked else _STATES
    _check_dim(op, "h0", h0, 3 if stacked else 2, state_layout)
    outputs = (("output", output), ("grad_output", grad_output))
    for name, t in outputs:
        if t is not None:
            _check_dim(op, name, t, 2 if packed else 3, output_layout)
    _check_dim(op, "cells", cells, 4 if stacked else 3, states_layout)
    _check_dim(op, "gates", gates, 4 if stacked else 3, gates_layout)
    two_d = (("grad_h_n", grad_h_n), ("grad_c_n", grad_c_n))
    for name, t in two_d:
        if t is not None:
            _check_dim(op, name, t, 3 if stacked else 2, state_layout)
    steps, batch, features, state = _sequence_sizes(op, input, h0, batch_sizes, values)
    d = directions
    output_shape = (input.shape[0], d * state) if packed else (steps, batch, d * state)
    _check_shape(op, "h0", h0, _directed(stacked, d, batch, state), state_layout)
    want = _directed(stacked, d, 3 * state, state + features)
    _check_shape(op, "weights", weights, want, _DIR_WEIGHTS if stacked else _WEIGHTS)
    for name, t in outputs:
        if t is not None:
            _check_shape(op, name, t, output_shape, output_layout)
    _check_shape(op, "cells", cells, _directed(stacked, d, steps, batch, state), states_layout)
    want = _directed(stacked, d, steps, batch, 3 * state)
    _check_shape(op, "gates", gates, want, gates_layout)
    for name, t in two_d:
        if t is not None:
            _check_shape(op, name, t, _directed(stacked, d, batch, state), state_layout)
    shapes = [
        tuple(input.shape),
        tuple(weights.shape),
        _directed(stacked, d, 3 * state),
        tuple(h0.shape),
        tuple(h0.shape),
    ]
    return _empty_where(input, shapes, output_mask)
