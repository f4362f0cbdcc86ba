"""Helpers shared by the test modules."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

import lltm
from lltm.reference import lltm_reference

# Parametrize with this: CUDA cases run where a GPU and a CUDA build exist,
# and are reported as skipped elsewhere (see conftest.py).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# Tolerances against a float64 reference, by the dtype the op computed in.
TOLERANCES = {
    torch.float64: {"rtol": 1e-7, "atol": 1e-7},
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
    torch.float16: {"rtol": 5e-3, "atol": 5e-3},
    torch.bfloat16: {"rtol": 4e-2, "atol": 4e-2},
}


def make_inputs(
    batch: int,
    features: int,
    state: int,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    bias_1d: bool = False,
    requires_grad: bool = False,
) -> list[torch.Tensor]:
    """``[input, weights, bias, old_h, old_cell]`` drawn from N(0, 1)."""
    return [
        torch.randn(shape, device=device, dtype=dtype).requires_grad_(requires_grad)
        for shape in input_shapes(batch, features, state, bias_1d=bias_1d)
    ]


def input_shapes(
    batch: int, features: int, state: int, *, steps: int | None = None, bias_1d: bool = False
) -> list[tuple[int, ...]]:
    """The shapes of a cell's ``[input, weights, bias, old_h, old_cell]``.

    With ``steps``, of a sequence's ``[input, weights, bias, h0, c0]``.
    """
    x = (batch, features) if steps is None else (steps, batch, features)
    bias = (3 * state,) if bias_1d else (1, 3 * state)
    return [x, (3 * state, state + features), bias, (batch, state), (batch, state)]


def assert_close_to_reference(got: torch.Tensor, want: torch.Tensor) -> None:
    """Compare with a float64 reference, at the tolerance of ``got``'s dtype.

    The absolute tolerance scales with the largest reference value: GEMM
    outputs and weight gradients sum hundreds of terms, so their rounding
    error grows with their magnitude.
    """
    assert want.dtype == torch.float64
    tol = TOLERANCES[got.dtype]
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=tol["rtol"], atol=tol["atol"] * scale)


def check_activations_over_their_range(device: str, dtype: torch.dtype) -> None:
    """The pointwise math, at close to its dtype's rounding, from -100 to 100.

    The bias alone makes the pre-activations (the weights are zero): dense
    near zero, where ELU's e^z - 1 cancels, and out to where the sigmoids and
    tanh saturate. Each activation is compared with float64 elementwise, at a
    few units in the last place of float32 (1e-6): far tighter than
    TOLERANCES, which are for whole steps. Then NaN, inf and -inf.
    """

    def pointwise(z: torch.Tensor, old_cell: torch.Tensor) -> list[torch.Tensor]:
        """``_C.forward``'s first five outputs, in float64, with z in every gate."""
        state = z.numel()
        args = [
            torch.zeros(1, 0),
            torch.zeros(3 * state, state),
            z.repeat(3)[None],
            torch.zeros(1, state),
            old_cell[None],
        ]
        outs = lltm._C.forward(*(a.to(device, dtype) for a in args))
        return [t[0].double().cpu() for t in outs[:5]]

    z = torch.cat(
        [
            torch.linspace(-100, 100, 4001),
            torch.linspace(-1, 1, 4001),
            torch.logspace(-30, 0, 301).neg(),
        ]
    )
    old_cell = torch.linspace(-3, 3, z.numel())
    outs = pointwise(z, old_cell)
    z64, c64 = z.double(), old_cell.double()
    i = o = torch.sigmoid(z64)
    g = torch.nn.functional.elu(z64)
    cell = c64 + g * i
    # The cell's sum rounds to its terms' scale, and tanh carries that on.
    terms = c64.abs() + (g * i).abs()
    want = {
        "new_h": (torch.tanh(cell) * o, terms),
        "new_cell": (cell, terms),
        "input_gate": (i, i),
        "output_gate": (o, o),
        "candidate_cell": (g, g.abs()),
    }
    eps = 1e-6 if dtype == torch.float32 else 1e-12
    for name, got in zip(want, outs, strict=True):
        value, scale = want[name]
        # 2e-38, the smallest normal float: the sigmoids may flush below it.
        error = (got - value).abs() - eps * scale.abs() - 2e-38
        worst = int(error.argmax())
        assert error[worst] <= 0, (
            f"{name} at z={z[worst].item():.6g}: got {got[worst].item():.9g}, "
            f"want {value[worst].item():.9g}"
        )
    # NaN stays NaN, and the infinities saturate.
    special = torch.tensor([float("nan"), float("inf"), -float("inf")])
    new_h, new_cell, i, o, g = pointwise(special, torch.zeros(3))
    nan = float("nan")
    for name, got, expected in (
        ("input_gate", i, [nan, 1.0, 0.0]),
        ("candidate_cell", g, [nan, float("inf"), -1.0]),
        ("new_cell", new_cell, [nan, float("inf"), 0.0]),
        ("new_h", new_h, [nan, 1.0, 0.0]),
    ):
        torch.testing.assert_close(
            got, torch.tensor(expected, dtype=torch.float64), equal_nan=True, msg=name
        )


def reference_step(args: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The reference's ``(new_h, new_cell, *input grads)`` in float64.

    The gradients are of ``sum(new_h) + 2 * sum(new_cell)``, so that the two
    outputs reach the backward with different upstream gradients.
    """
    args64 = [a.detach().double().requires_grad_() for a in args]
    new_h, new_cell = lltm_reference(*args64)
    grads = torch.autograd.grad(new_h.sum() + 2 * new_cell.sum(), args64)
    return new_h, new_cell, *grads


def lltm_step(args: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``lltm.lltm``'s ``(new_h, new_cell, *input grads)``, as :func:`reference_step`."""
    new_h, new_cell = lltm.lltm(*args)
    grads = torch.autograd.grad(new_h.sum() + 2 * new_cell.sum(), args)
    return new_h, new_cell, *grads


def run_python(
    *args: str | Path,
    env: Mapping[str, str | None] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with this interpreter in a subprocess, its output captured as text.

    ``env`` sets variables over this process's environment; None unsets one.
    """
    environ = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        cwd=cwd,
        env={k: v for k, v in environ.items() if v is not None},
    )


def assert_a_graph_replays_the_layer(layer: torch.nn.Module, static_x: torch.Tensor) -> None:
    """Capture ``layer(static_x)`` (no grad) as a CUDA graph, then replay it on new inputs.

    Warmed up on a side stream first, as PyTorch's docs say; each replay must
    give what an eager call gives.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        layer(static_x)  # warm up outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_out, _ = layer(static_x)
    for _ in range(2):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            want, _ = layer(static_x)
        torch.testing.assert_close(static_out, want)
