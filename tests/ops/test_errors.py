"""Every input check: a clear error that names the argument, from every entry point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import lltm
from bad_inputs import BACKWARD, CELL
from helpers import DEVICES, make_inputs
from lltm import _C

B, F, S = 4, 3, 5

# The ways to call the forward: the tutorial API, the Python API and the
# dispatcher ops, with the op each one reports.
FORWARDS: dict[str, tuple[Callable[..., Any], str]] = {
    "_C.forward": (_C.forward, "lltm::forward"),
    "torch.ops.lltm.forward": (torch.ops.lltm.forward.default, "lltm::forward"),
    "lltm.lltm": (lltm.lltm, "lltm::cell"),
    "torch.ops.lltm.cell": (torch.ops.lltm.cell.default, "lltm::cell"),
    "torch.ops.lltm.cell_forward": (
        lambda *args: torch.ops.lltm.cell_forward.default(*args, True),
        "lltm::cell_forward",
    ),
}


def forward_args(**changes: torch.Tensor) -> list[torch.Tensor]:
    args = dict(zip(CELL, make_inputs(B, F, S), strict=True))
    args.update(changes)
    return [args[n] for n in CELL]


FORWARD_CASES = [
    # (changes, exception, message)
    (
        {"input": torch.ones(B, F, dtype=torch.long)},
        TypeError,
        r"expected input to have a floating-point dtype \(float16, bfloat16, float32 or float64\), but got int64",
    ),
    (
        {"old_cell": torch.ones(B, S, dtype=torch.int32)},
        TypeError,
        "expected old_cell to have a floating-point dtype",
    ),
    (
        {"weights": torch.randn(3 * S, S + F, dtype=torch.float64)},
        TypeError,
        r"expected weights to have the same dtype as input \(float32\), but got float64",
    ),
    (
        {"bias": torch.randn(3 * S, dtype=torch.float16)},
        TypeError,
        r"expected bias to have the same dtype as input \(float32\), but got float16",
    ),
    (
        {"input": torch.randn(B, F, 1)},
        ValueError,
        r"expected input to be a 2-D tensor \[batch, input_features\], but got a 3-D tensor of shape \[4, 3, 1\]",
    ),
    (
        {"old_h": torch.randn(B * S)},
        ValueError,
        r"expected old_h to be a 2-D tensor \[batch, state_size\], but got a 1-D tensor",
    ),
    (
        {"weights": torch.randn(3 * S * (S + F))},
        ValueError,
        r"expected weights to be a 2-D tensor \[3 \* state_size, state_size \+ input_features\]",
    ),
    (
        {"old_h": torch.randn(B + 1, S)},
        ValueError,
        r"expected old_h to have shape \[batch, state_size\] = \[4, 5\], but got \[5, 5\]",
    ),
    (
        {"old_cell": torch.randn(B, S + 1)},
        ValueError,
        r"expected old_cell to have shape \[batch, state_size\] = \[4, 5\], but got \[4, 6\]",
    ),
    (
        {"weights": torch.randn(3 * S, S + F + 1)},
        ValueError,
        r"expected weights to have shape \[3 \* state_size, state_size \+ input_features\] = \[15, 8\], but got \[15, 9\]",
    ),
    (
        {"weights": torch.randn(3 * S - 1, S + F)},
        ValueError,
        r"expected weights to have shape .* = \[15, 8\], but got \[14, 8\]",
    ),
    (
        {"bias": torch.randn(3 * S + 1)},
        ValueError,
        r"expected bias to have shape \[3 \* state_size\] = \[15\] or \[1, 3 \* state_size\] = \[1, 15\], but got \[16\]",
    ),
    ({"bias": torch.randn(3, S)}, ValueError, r"expected bias to have shape .*, but got \[3, 5\]"),
    (
        {"bias": torch.randn(1, 1, 3 * S)},
        ValueError,
        r"expected bias to have shape .*, but got \[1, 1, 15\]",
    ),
]


@pytest.mark.parametrize("entry", FORWARDS)
@pytest.mark.parametrize(("changes", "error", "message"), FORWARD_CASES)
def test_forward_rejects(
    entry: str, changes: dict[str, torch.Tensor], error: type, message: str
) -> None:
    forward, op = FORWARDS[entry]
    with pytest.raises(error, match=f"{op}: " + message):
        forward(*forward_args(**changes))


def backward_args(**changes: torch.Tensor) -> list[torch.Tensor]:
    inputs = make_inputs(B, F, S)
    saved = torch.ops.lltm.forward.default(*inputs)[1:]
    grads = [torch.randn(B, S), torch.randn(B, S)]
    args = dict(zip(BACKWARD, [*grads, *saved, inputs[1]], strict=True))
    args.update(changes)
    return [args[n] for n in BACKWARD]


BACKWARD_CASES = [
    (
        {"grad_h": torch.ones(B, S, dtype=torch.long)},
        TypeError,
        "expected grad_h to have a floating-point dtype",
    ),
    (
        {"X": torch.randn(B, S + F, dtype=torch.float64)},
        TypeError,
        r"expected X to have the same dtype as grad_h \(float32\), but got float64",
    ),
    (
        {"grad_cell": torch.randn(B, S, 2)},
        ValueError,
        r"expected grad_cell to be a 2-D tensor \[batch, state_size\]",
    ),
    (
        {"gate_weights": torch.randn(B * 3 * S)},
        ValueError,
        r"expected gate_weights to be a 2-D tensor \[batch, 3 \* state_size\]",
    ),
    (
        {"new_cell": torch.randn(B, S + 1)},
        ValueError,
        r"expected new_cell to have shape \[batch, state_size\] = \[4, 5\], but got \[4, 6\]",
    ),
    (
        {"candidate_cell": torch.randn(B - 1, S)},
        ValueError,
        r"expected candidate_cell to have shape \[batch, state_size\] = \[4, 5\], but got \[3, 5\]",
    ),
    ({"input_gate": torch.randn(B, 1)}, ValueError, "expected input_gate to have shape"),
    ({"output_gate": torch.randn(1, S)}, ValueError, "expected output_gate to have shape"),
    (
        {"X": torch.randn(B, S - 1)},
        ValueError,
        r"expected X to have shape \[batch, state_size \+ input_features\] with at least state_size = 5 columns, but got \[4, 4\]",
    ),
    (
        {"X": torch.randn(B + 1, S + F)},
        ValueError,
        r"expected X to have shape \[batch, state_size \+ input_features\] = \[4, 8\], but got \[5, 8\]",
    ),
    (
        {"gate_weights": torch.randn(B, 3 * S + 1)},
        ValueError,
        r"expected gate_weights to have shape \[batch, 3 \* state_size\] = \[4, 15\], but got \[4, 16\]",
    ),
    (
        {"weights": torch.randn(3 * S, S + F + 2)},
        ValueError,
        r"expected weights to have shape \[3 \* state_size, state_size \+ input_features\] = \[15, 8\], but got \[15, 10\]",
    ),
]


@pytest.mark.parametrize("entry", ["_C.backward", "torch.ops"])
@pytest.mark.parametrize(("changes", "error", "message"), BACKWARD_CASES)
def test_backward_rejects(
    entry: str, changes: dict[str, torch.Tensor], error: type, message: str
) -> None:
    backward = _C.backward if entry == "_C.backward" else torch.ops.lltm.backward.default
    with pytest.raises(error, match="lltm::backward: " + message):
        backward(*backward_args(**changes))


def test_none_is_rejected_by_the_binding() -> None:
    args: list[Any] = forward_args()
    args[2] = None
    with pytest.raises(TypeError, match="incompatible function arguments"):
        _C.forward(*args)


def test_fake_kernel_rejects_mixed_devices() -> None:
    """Meta tensors reach the fake kernel, which names the argument too."""
    args = forward_args()
    args[3] = args[3].to("meta")
    with pytest.raises(RuntimeError, match="expected old_h to be on the same device as input"):
        torch.ops.lltm.forward.default(*args)


@pytest.mark.cuda
@pytest.mark.parametrize("entry", FORWARDS)
def test_forward_rejects_mixed_devices(entry: str) -> None:
    args = forward_args()
    args[0] = args[0].cuda()
    forward, op = FORWARDS[entry]
    with pytest.raises(
        RuntimeError,
        match=op + r": expected weights to be on the same device as input \(cuda:0\), but got cpu",
    ):
        forward(*args)


@pytest.mark.parametrize("device", DEVICES)
def test_module_rejects_wrong_input_features(device: str) -> None:
    cell = lltm.LLTM(F, S).to(device)
    x = torch.randn(B, F + 1, device=device)
    h = torch.randn(B, S, device=device)
    # The input is what is wrong, not the cell's weights (nn.LSTMCell's view).
    with pytest.raises(
        ValueError,
        match=rf"LLTM: expected input.size\(-1\) to be input_features = {F}, but got {F + 1}",
    ):
        cell(x, (h, h))
