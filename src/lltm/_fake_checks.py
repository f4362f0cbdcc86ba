"""The checks of the fake kernels, which mirror the C++ check helpers.

The same order as cpp/cell/cell.cpp, cpp/sequence/checks.cpp and
cpp/ops/layouts.cpp's rejection of non-strided tensors, the same exception
types (torch._check_type raises TypeError, _check_value ValueError, _check
RuntimeError) and the same words, so that meta tensors, FakeTensorMode and
torch.compile report a mistake as the kernels do. tests/ops/test_bad_inputs.py
compares the two for every case.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

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
