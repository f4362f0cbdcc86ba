"""The LLTM operators: the Python API over the ``torch.ops.lltm`` dispatcher ops.

The schemas, the CPU/CUDA kernels and the autograd kernels are registered in
C++ (``cpp/``). This module adds what ``torch.compile`` needs on top of them:
a fake kernel for each op, so that the compiler can trace shapes without
running a kernel. The fake kernels mirror the C++ checks with
``torch._check``, so that ``torch.compile`` rejects bad shapes with the same
wording at trace time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

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


# --- fake kernels -------------------------------------------------------------------------
#
# The checks below mirror the C++ check helpers (cpp/cell/cell.cpp, cpp/sequence/checks.cpp)
# and cpp/ops/layouts.cpp's rejection of non-strided tensors: the same order, the
# same exception types (torch._check_type raises TypeError, _check_value
# ValueError, _check RuntimeError) and the same words, so that meta tensors,
# FakeTensorMode and torch.compile report a mistake as the kernels do.
# tests/test_bad_inputs.py compares the two for every case.

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape_str(sizes: object) -> str:
    return "[" + ", ".join(str(s) for s in sizes) + "]"  # type: ignore[attr-defined]


def _expect(check: Callable[..., None], ok: object, op: str, expected: str, got: object) -> None:
    """``check(ok)``, failing in the C++ checks' words: ``{op}: expected ..., but got ...``.

    ``check`` is ``torch._check_type``, ``_check_value`` or ``_check``: it
    picks the exception type.
    """
    check(ok, lambda: f"{op}: expected {expected}, but got {got}")


def _check_layouts(
    op: str, tensors: dict[str, Tensor | None], optional: tuple[str, ...] = ()
) -> None:
    """Tensors where the schema says so, then cpp/ops/layouts.cpp: each one strided, not nested.

    The dispatcher checks the argument types before any kernel runs, but
    torch.compile calls the fake kernel with whatever it traced: the words
    are the dispatcher's.
    """
    for name, t in tensors.items():
        if t is None and name in optional:
            continue
        if t is None:  # the dispatcher passes it on as an undefined tensor
            msg = f"{op}: expected {name} to be a tensor, but got an undefined tensor"
            raise RuntimeError(msg)
        if not isinstance(t, Tensor):
            msg = (
                f"{op}() Expected a value of type 'Tensor' for argument '{name}' but "
                f"instead found type '{type(t).__name__}'."
            )
            raise RuntimeError(msg)  # noqa: TRY004 - the dispatcher's type
        strided = f"{name} to be a strided tensor"
        _expect(torch._check_type, not t.is_nested, op, strided, "a nested tensor")
        layout = f"a tensor of layout {t.layout}"
        _expect(torch._check_type, t.layout == torch.strided, op, strided, layout)


def _check_dtypes_and_devices(op: str, tensors: dict[str, Tensor]) -> None:
    """checks::check_dtypes_and_devices."""
    first_name, first = next(iter(tensors.items()))
    floating = "a floating-point dtype (float16, bfloat16, float32 or float64)"
    for name, t in tensors.items():
        dtype = _dtype_name(t.dtype)
        _expect(torch._check_type, t.dtype in _DTYPES, op, f"{name} to have {floating}", dtype)
        same = f"the same dtype as {first_name} ({_dtype_name(first.dtype)})"
        _expect(torch._check_type, t.dtype == first.dtype, op, f"{name} to have {same}", dtype)
        device = f"{name} to be on the same device as {first_name} ({first.device})"
        _expect(torch._check, t.device == first.device, op, device, t.device)


def _check_dim(op: str, name: str, t: Tensor, dim: int, layout: str) -> None:
    """checks::check_dim."""
    got = f"a {t.dim()}-D tensor of shape {_shape_str(t.shape)}"
    _expect(torch._check_value, t.dim() == dim, op, f"{name} to be a {dim}-D tensor {layout}", got)


def _check_shape(op: str, name: str, t: Tensor, expected: tuple[int, ...], layout: str) -> None:
    """checks::check_shape."""
    ok = tuple(t.shape) == tuple(expected)
    want = f"{name} to have shape {layout} = {_shape_str(expected)}"
    _expect(torch._check_value, ok, op, want, _shape_str(t.shape))


def _check_bias(op: str, bias: Tensor, state: int) -> None:
    """checks::check_bias."""
    g = 3 * state
    ok = (bias.dim() == 1 and bias.shape[0] == g) or (
        bias.dim() == 2 and bias.shape[0] == 1 and bias.shape[1] == g
    )
    want = (
        f"bias to have shape [3 * state_size] = {_shape_str([g])} or "
        f"[1, 3 * state_size] = {_shape_str([1, g])}"
    )
    _expect(torch._check_value, ok, op, want, _shape_str(bias.shape))


_BATCH_FEATURES = "[batch, input_features]"
_STATE = "[batch, state_size]"
_X = "[batch, state_size + input_features]"
_CELL_GATES = "[batch, 3 * state_size]"
_WEIGHTS = "[3 * state_size, state_size + input_features]"
_STEPS = "[steps, batch, input_features]"
_STATES = "[steps, batch, state_size]"
_GATES = "[steps, batch, 3 * state_size]"


def _check_forward(op: str, *args: Tensor) -> tuple[int, ...]:
    """lltm::check_forward_args, or for the ``lltm::sequence*`` ops sequence::check_forward_args.

    ``args`` are the op's: ``input, weights, bias`` and the state, ``old_h,
    old_cell`` for a cell (input ``[batch, input_features]``), ``h0, c0`` for
    a sequence (input ``[steps, batch, input_features]``). Returns the input's
    sizes, then state_size.
    """
    steps = op.startswith("lltm::sequence")
    names = ("input", "weights", "bias", *(("h0", "c0") if steps else ("old_h", "old_cell")))
    tensors = dict(zip(names, args, strict=True))
    x, weights, bias, *states = args
    _check_layouts(op, tensors)
    _check_dtypes_and_devices(op, tensors)
    _check_dim(op, "input", x, 3 if steps else 2, _STEPS if steps else _BATCH_FEATURES)
    for name, t in zip(names[3:], states, strict=True):
        _check_dim(op, name, t, 2, _STATE)
    _check_dim(op, "weights", weights, 2, _WEIGHTS)
    batch, features, state = x.shape[-2], x.shape[-1], states[0].shape[1]
    for name, t in zip(names[3:], states, strict=True):
        _check_shape(op, name, t, (batch, state), _STATE)
    _check_shape(op, "weights", weights, (3 * state, state + features), _WEIGHTS)
    _check_bias(op, bias, state)
    return (*x.shape, state)


def _empty_where(
    like: Tensor, shapes: list[tuple[int, ...]], output_mask: list[bool]
) -> tuple[Tensor | None, ...]:
    """A backward's gradients: an empty tensor of each shape that ``output_mask`` asks for."""
    return tuple(
        like.new_empty(shape) if wanted else None
        for shape, wanted in zip(shapes, output_mask, strict=True)
    )


# The fake kernels of the forward ops take their tensors as the dispatcher
# passes them, positionally: input, weights, bias and the state.


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


# --- fake kernels of the sequence ops ---------------------------------------------------

_PACKED = "[sum(batch_sizes), input_features]"
_DIR_STATE = "[directions, batch, state_size]"
_DIR_STATES = "[directions, steps, batch, state_size]"
_DIR_GATES = "[directions, steps, batch, 3 * state_size]"
_DIR_WEIGHTS = "[directions, 3 * state_size, state_size + input_features]"
_OUTPUT = "[steps, batch, directions * state_size]"
_PACKED_OUTPUT = "[sum(batch_sizes), directions * state_size]"
_PACKED_STATES = "[sum(batch_sizes), state_size]"


def _batch_sizes(op: str, batch_sizes: Tensor) -> list[int] | None:
    """sequence.cpp's check_batch_sizes: the values, where they can be read (not fake)."""
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
    """sequence.cpp's check_directions: (directions, whether the arguments carry them)."""
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
    """A sequence op's problem, as sequence.cpp's checks find it."""

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
