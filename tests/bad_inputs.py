"""Every bad input through every entry point: the cases, and a runner for one entry point.

``python bad_inputs.py ENTRY...`` runs every case of each ENTRY (a key of
:data:`ENTRIES`) in this process and prints one JSON line per entry: the
number of cases tried and the problems found. tests/test_bad_inputs.py runs
the entry points in a few subprocesses (the ops, the Python API, torch.compile),
so that a crash fails those tests rather than killing pytest.

Each case changes one argument of a valid call: its dtype, its number of
dimensions, one of its sizes, its layout (sparse COO and CSR, MKL-DNN,
nested, quantized), its device (meta beside CPU), or makes it no tensor at
all. Every case must raise TypeError, ValueError or RuntimeError, whose
message names an argument of the op. For each ``torch.ops.lltm.*`` entry,
each case is also run with meta tensors and under FakeTensorMode, where the
fake kernels of lltm/ops.py check the arguments instead of the C++: both
must raise the same exception type with the same message.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import lltm

B, F, S, T = 4, 3, 5, 2
ERRORS = (TypeError, ValueError, RuntimeError)

CELL = ["input", "weights", "bias", "old_h", "old_cell"]
SEQUENCE = ["input", "weights", "bias", "h0", "c0"]
BACKWARD = [
    "grad_h",
    "grad_cell",
    "new_cell",
    "input_gate",
    "output_gate",
    "candidate_cell",
    "X",
    "gate_weights",
    "weights",
]
CELL_BACKWARD = ["grad_h", "grad_cell", "new_cell", "gates", "X", "weights"]
SEQUENCE_BACKWARD = [
    "grad_output",
    "grad_h_n",
    "grad_c_n",
    "input",
    "weights",
    "h0",
    "output",
    "cells",
    "gates",
]


def cell_args(bias_1d: bool = False) -> list[torch.Tensor]:
    bias = torch.randn(3 * S) if bias_1d else torch.randn(1, 3 * S)
    return [
        torch.randn(B, F),
        torch.randn(3 * S, S + F),
        bias,
        torch.randn(B, S),
        torch.randn(B, S),
    ]


def sequence_args(bias_1d: bool = False) -> list[torch.Tensor]:
    args = cell_args(bias_1d)
    args[0] = torch.randn(T, B, F)
    return args


def backward_args() -> list[torch.Tensor]:
    inputs = cell_args()
    saved = list(torch.ops.lltm.forward.default(*inputs)[1:])
    return [torch.randn(B, S), torch.randn(B, S), *saved, inputs[1]]


def cell_backward_args() -> list[torch.Tensor]:
    inputs = cell_args()
    _, new_cell, gates, X = torch.ops.lltm.cell_forward.default(*inputs, True)
    return [torch.randn(B, S), torch.randn(B, S), new_cell, gates, X, inputs[1]]


def sequence_backward_args() -> list[torch.Tensor]:
    inputs = sequence_args()
    output, _, _, cells, gates = torch.ops.lltm.sequence_forward.default(*inputs)
    grads = [torch.randn(T, B, S), torch.randn(B, S), torch.randn(B, S)]
    return [*grads, inputs[0], inputs[1], inputs[3], output, cells, gates]


MASK = [True] * 5
# The Tensor? arguments of the backward ops, for which None is valid.
OPTIONAL = {"grad_h", "grad_cell", "X", "grad_output", "grad_h_n", "grad_c_n"}


@dataclass
class Op:
    """A dispatcher op: its message prefix, argument names, valid arguments and call."""

    name: str
    arg_names: list[str]
    make_args: Callable[[], list[torch.Tensor]]
    call: Callable[..., Any]
    # (argument, dim) whose size alone may change: the steps of a forward sequence.
    free_sizes: frozenset[tuple[str, int]] = frozenset()


STEPS_FREE = frozenset({("input", 0)})
OPS = {
    "forward": Op("lltm::forward", CELL, cell_args, torch.ops.lltm.forward.default),
    "cell": Op("lltm::cell", CELL, cell_args, torch.ops.lltm.cell.default),
    "cell_forward": Op(
        "lltm::cell_forward",
        CELL,
        cell_args,
        lambda *a: torch.ops.lltm.cell_forward.default(*a, True),
    ),
    "backward": Op("lltm::backward", BACKWARD, backward_args, torch.ops.lltm.backward.default),
    "cell_backward": Op(
        "lltm::cell_backward",
        CELL_BACKWARD,
        cell_backward_args,
        lambda *a: torch.ops.lltm.cell_backward.default(*a, MASK),
    ),
    "sequence": Op(
        "lltm::sequence", SEQUENCE, sequence_args, torch.ops.lltm.sequence.default, STEPS_FREE
    ),
    "sequence_forward": Op(
        "lltm::sequence_forward",
        SEQUENCE,
        sequence_args,
        torch.ops.lltm.sequence_forward.default,
        STEPS_FREE,
    ),
    "sequence_backward": Op(
        "lltm::sequence_backward",
        SEQUENCE_BACKWARD,
        sequence_backward_args,
        lambda *a: torch.ops.lltm.sequence_backward.default(*a, None, MASK),
    ),
}


@dataclass
class Case:
    """One argument changed: ``label``, the argument, and how the error must name it."""

    label: str
    arg: str
    value: Any
    # The message must name this argument ("" for any argument of the op).
    names: str
    error: type[Exception] | None = None
    # False where the change may make a valid call (the steps of a sequence).
    must_fail: bool = True


def _layouts(t: torch.Tensor) -> Iterator[tuple[str, Callable[[], Any]]]:
    yield "sparse_coo", t.to_sparse
    if t.dim() == 2:
        yield "sparse_csr", t.to_sparse_csr
    yield "mkldnn", t.to_mkldnn
    if t.dim() >= 2:
        yield "nested", lambda: torch.nested.nested_tensor(list(t.unbind(0)))
    yield "quantized", lambda: torch.quantize_per_tensor(t, 0.1, 0, torch.qint8)


def cases(op: Op, args: list[torch.Tensor], arg_names: list[str] | None = None) -> Iterator[Case]:
    """Every change of one argument of ``args`` (named ``arg_names``, default the op's)."""
    names = arg_names or op.arg_names
    for name, t in zip(names, args, strict=True):
        for dtype in (torch.int64, torch.int32, torch.bool, torch.uint8, torch.complex64):
            yield Case(f"{name}: {dtype}", name, lambda t=t, d=dtype: t.to(d), name, TypeError)
        # A float dtype unlike the others: the message names both arguments.
        yield Case(f"{name}: float64", name, lambda t=t: t.double(), name, TypeError)
        yield Case(f"{name}: a dim more", name, lambda t=t: t.unsqueeze(-1), name, ValueError)
        fewer = (lambda t=t: t.reshape(3, -1)) if name == "bias" else (lambda t=t: t.reshape(-1))
        yield Case(f"{name}: a dim less", name, fewer, name, ValueError)
        for d in range(t.dim()):
            free = (name, d) in op.free_sizes
            for delta in (-1, 1):
                if t.shape[d] + delta < 0:
                    continue
                size = list(t.shape)
                size[d] += delta

                def resized(size: list[int] = size) -> torch.Tensor:
                    return torch.randn(size)

                yield Case(
                    f"{name}: size {delta:+d} in dim {d}",
                    name,
                    resized,
                    "",
                    ValueError,
                    must_fail=not free,
                )
        for layout, make in _layouts(t):
            yield Case(f"{name}: {layout}", name, make, name, TypeError)
        yield Case(
            f"{name}: on meta", name, lambda t=t: t.to("meta"), name, RuntimeError
        )  # beside CPU tensors
        for label, value in (("None", None), ("a float", 1.0), ("a list", [[1.0]])):
            if label == "None" and name in OPTIONAL:
                continue
            yield Case(f"{name}: {label}", name, lambda v=value: v, name, None)


def check_error(
    exc: BaseException | None, case: Case, op_name: str, arg_names: list[str]
) -> str | None:
    """What is wrong with how a call of ``case`` failed, or None.

    ``op_name`` is the prefix of the message: the op's, or ``A|B`` for either
    (a module that checks its input before its op: ``LLTM|lltm::cell``).
    """
    if exc is None:
        return "no error" if case.must_fail else None
    if not isinstance(exc, ERRORS):
        return f"{type(exc).__name__} is not TypeError, ValueError or RuntimeError: {exc}"
    message = str(exc)
    if case.error is None:  # not a tensor: the binding's or the dispatcher's words
        if not any(
            words in message
            for words in (
                f"argument '{case.names}'",  # the dispatcher's schema check
                f"expected {case.names} to be a tensor",  # None: an undefined tensor
                "incompatible function arguments",  # pybind11's, naming them all
            )
        ):
            return f"the message does not name {case.names}: {message}"
        return None
    if not isinstance(exc, case.error):
        return f"{type(exc).__name__}, not {case.error.__name__}: {message}"
    prefix = next((p for p in op_name.split("|") if f"{p}: expected " in message), None)
    if prefix is None:
        return f"the message does not start with {op_name}: expected: {message}"
    named = re.findall(r"\b\w+\b", message.split(f"{prefix}: expected ", 1)[1])
    if case.names and case.names not in named:
        return f"the message does not name {case.names}: {message}"
    if not any(n in named for n in arg_names):
        return f"the message names no argument: {message}"
    return None


def call(fn: Callable[[], Any]) -> BaseException | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - what is raised is what is checked
        return exc
    return None


def _errors_alike(a: BaseException | None, b: BaseException | None) -> bool:
    return type(a) is type(b) and str(a) == str(b)


def run_op(key: str) -> tuple[int, list[str]]:
    """``torch.ops.lltm.<key>``: each case on CPU, with meta tensors and with fake tensors."""
    op = OPS[key]
    tried, problems = 0, []
    base = op.make_args()
    for case in cases(op, base):
        try:
            value = case.value()
        except (RuntimeError, TypeError, ValueError):
            continue  # this layout does not take this tensor
        args = [value if n == case.arg else a for n, a in zip(op.arg_names, base, strict=True)]
        exc = call(lambda args=args: op.call(*args))
        tried += 1
        if (problem := check_error(exc, case, op.name, op.arg_names)) is not None:
            problems.append(f"{case.label}: {problem}")
        if case.label.endswith("on meta") or not isinstance(value, torch.Tensor):
            continue
        # The same call with meta tensors, then with fake ones: the fake kernel
        # must say what the C++ kernel said.
        for variant in ("meta", "fake"):
            try:
                if variant == "meta":
                    moved = [a.to("meta") for a in args]
                    exc2 = call(lambda moved=moved: op.call(*moved))
                else:
                    with FakeTensorMode() as mode:
                        moved = [mode.from_tensor(a) for a in args]
                        if any(
                            (m.layout, m.is_nested) != (a.layout, a.is_nested)
                            for m, a in zip(moved, args, strict=True)
                        ):
                            continue  # FakeTensorMode does not keep this layout
                        exc2 = call(lambda moved=moved: op.call(*moved))
            except Exception:  # noqa: BLE001, S112 - no meta or fake tensor of this kind
                continue
            tried += 1
            if not _errors_alike(exc, exc2):
                problems.append(f"{case.label}, {variant}: {exc2!r} where the CPU kernel: {exc!r}")
    return tried, problems


def run_api(key: str) -> tuple[int, list[str]]:
    """The Python API, the tutorial's _C and torch.compile, over the cases of their op."""
    op_key, fn = API[key]
    op = OPS[op_key]
    eager = EAGER.get(key)
    tried, problems = 0, []
    for bias_1d in (False, True):
        base = (sequence_args if op_key.startswith("sequence") else cell_args)(bias_1d)
        if op_key == "backward":
            base = backward_args()
        for case in cases(op, base):
            try:
                value = case.value()
            except (RuntimeError, TypeError, ValueError):
                continue
            args = [value if n == case.arg else a for n, a in zip(op.arg_names, base, strict=True)]
            exc = call(lambda args=args: fn(*args))
            tried += 1
            if key.startswith("torch.compile"):
                problem = check_compiled(exc, call(lambda args=args: eager(*args)), case)
            else:
                problem = check_error(exc, case, PREFIXES.get(key, op.name), op.arg_names)
            if problem is not None:
                problems.append(f"{case.label} (bias_1d={bias_1d}): {problem}")
    return tried, problems


def check_compiled(
    exc: BaseException | None, eager: BaseException | None, case: Case
) -> str | None:
    """torch.compile raises what eager raises, wrapped, or refuses the tensor itself.

    Dynamo wraps what the fake kernel raised in a TorchRuntimeError whose
    message holds the fake kernel's, which is the C++ kernel's. Sparse,
    nested and quantized tensors it does not take at all (Unsupported, a
    RuntimeError in torch's own words).
    """
    if (exc is None) != (eager is None):
        return f"compiled: {exc!r}, eager: {eager!r}"
    if exc is None:
        return None
    if type(exc) is type(eager) and str(exc) == str(eager):
        return None  # run eagerly (a graph break), raising what eager raises
    if not isinstance(exc, RuntimeError):
        return f"{type(exc).__name__} is not a RuntimeError: {exc}"
    if str(eager).splitlines()[0] in str(exc):
        return None
    if case.error is None and f"for argument '{case.names}'" in str(exc):
        return None  # not a tensor: the dispatcher's schema check, as in eager
    refused = isinstance(exc, torch._dynamo.exc.Unsupported)
    if refused and any(k in case.label for k in ("sparse", "nested", "quantized", "mkldnn")):
        return None
    return f"compiled: {exc!r} does not hold eager's {eager!r}"


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        torch._dynamo.reset()
        return torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=False)(*args)

    return run


def _module_call(*args: Any) -> Any:
    input, weights, bias, old_h, old_cell = args  # noqa: A001
    cell = lltm.LLTM(F, S)
    if isinstance(weights, torch.Tensor) and isinstance(bias, torch.Tensor):
        # Parameters hold only float tensors: put the others in as buffers.
        del cell.weights, cell.bias
        cell.weights, cell.bias = weights, bias
    else:
        return lltm.lltm(*args)
    return cell(input, (old_h, old_cell))


API: dict[str, tuple[str, Callable[..., Any]]] = {
    "lltm._C.forward": ("forward", lltm._C.forward),
    "lltm._C.backward": ("backward", lltm._C.backward),
    "lltm.lltm": ("cell", lltm.lltm),
    "lltm.LLTM": ("cell", _module_call),
    "lltm.lltm_sequence": ("sequence", lltm.lltm_sequence),
    "torch.compile(lltm.lltm)": ("cell", _compiled(lltm.lltm)),
    "torch.compile(lltm.lltm_sequence)": ("sequence", _compiled(lltm.lltm_sequence)),
}


# The module checks its input's features, dtype and device before its op,
# and blames the input, which is what the user passed.
PREFIXES = {"lltm.LLTM": "LLTM|lltm::cell"}

EAGER = {
    "torch.compile(lltm.lltm)": lltm.lltm,
    "torch.compile(lltm.lltm_sequence)": lltm.lltm_sequence,
}


def layer_cases() -> Iterator[tuple[str, Callable[[], Any], type[Exception], str]]:
    """(label, call, exception, what the message must contain) for LLTMLayer."""
    layers = 2
    for batch_first in (False, True):
        layer = lltm.LLTMLayer(F, S, num_layers=layers, batch_first=batch_first)
        x = torch.randn(B, T, F) if batch_first else torch.randn(T, B, F)
        h = torch.randn(layers, B, S)
        tag = f" (batch_first={batch_first})"

        def run(x: Any, hx: Any = None, layer: lltm.LLTMLayer = layer) -> Any:
            return layer(x) if hx is None else layer(x, hx)

        for dtype in (torch.int64, torch.bool, torch.float64, torch.complex64):
            yield f"input {dtype}{tag}", lambda d=dtype: run(x.to(d)), TypeError, "input"
            yield f"h0 {dtype}{tag}", lambda d=dtype: run(x, (h.to(d), h)), TypeError, "h0"
            yield f"c0 {dtype}{tag}", lambda d=dtype: run(x, (h, h.to(d))), TypeError, "c0"
        yield f"input 4-D{tag}", lambda: run(x.unsqueeze(0)), ValueError, "input"
        yield f"input 1-D{tag}", lambda: run(x.reshape(-1)), ValueError, "input"
        yield f"input features{tag}", lambda: run(x[..., :-1]), ValueError, "input.size(-1)"
        for name, i in (("h0", 0), ("c0", 1)):
            for label, bad in (
                ("one layer", torch.randn(1, B, S)),
                ("three layers", torch.randn(3, B, S)),
                ("batch - 1", torch.randn(layers, B - 1, S)),
                ("batch + 1", torch.randn(layers, B + 1, S)),
                ("state + 1", torch.randn(layers, B, S + 1)),
                ("2-D", torch.randn(layers, S)),
            ):
                hx = (bad, h) if i == 0 else (h, bad)
                yield f"{name} {label}{tag}", lambda hx=hx: run(x, hx), ValueError, name
            hx_meta = (h.to("meta"), h) if i == 0 else (h, h.to("meta"))
            yield f"{name} on meta{tag}", lambda hx=hx_meta: run(x, hx), RuntimeError, name
            hx_sparse = (h.to_sparse(), h) if i == 0 else (h, h.to_sparse())
            yield f"{name} sparse{tag}", lambda hx=hx_sparse: run(x, hx), TypeError, name
            hx_list = ([[0.0]], h) if i == 0 else (h, [[0.0]])
            yield f"{name} a list{tag}", lambda hx=hx_list: run(x, hx), TypeError, name
        yield f"input sparse{tag}", lambda: run(x.to_sparse()), TypeError, "input"
        yield f"input on meta{tag}", lambda: run(x.to("meta"), (h, h)), RuntimeError, "input"
        yield f"state not a pair{tag}", lambda: run(x, (h,)), TypeError, "(h0, c0)"
        yield f"state a tensor{tag}", lambda: run(x, h), TypeError, "(h0, c0)"
        yield f"input a list{tag}", lambda: run([[0.0]]), TypeError, "input"
        # Unbatched: [steps, features] with states [layers, state].
        x2 = torch.randn(T, F)
        h2 = torch.randn(layers, S)
        yield f"unbatched, batched states{tag}", lambda: run(x2, (h, h)), ValueError, "h0"
        yield (
            f"unbatched, wrong layers{tag}",
            lambda: run(x2, (torch.randn(1, S), h2)),
            ValueError,
            "h0",
        )


def run_layer() -> tuple[int, list[str]]:
    tried, problems = 0, []
    for label, fn, error, names in layer_cases():
        exc = call(fn)
        tried += 1
        if exc is None:
            problems.append(f"{label}: no error")
        elif not isinstance(exc, error) or names not in str(exc):
            problems.append(f"{label}: {exc!r}, expected {error.__name__} naming {names}")
    return tried, problems


ENTRIES: dict[str, Callable[[], tuple[int, list[str]]]] = {
    **{f"torch.ops.lltm.{k}": (lambda k=k: run_op(k)) for k in OPS},
    **{k: (lambda k=k: run_api(k)) for k in API},
    "lltm.LLTMLayer": run_layer,
}


def main(entries: list[str]) -> None:
    warnings.simplefilter("ignore")  # the prototype warnings of sparse and nested tensors
    # FakeTensorMode logs each exception a fake kernel raises, with its traceback.
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    for entry in entries:
        torch.manual_seed(0)
        tried, problems = ENTRIES[entry]()
        print(json.dumps({"entry": entry, "tried": tried, "problems": problems}), flush=True)  # noqa: T201


if __name__ == "__main__":
    main(sys.argv[1:])
