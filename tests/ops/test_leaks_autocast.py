"""Leaks over 10,000 training steps, and the autocast policy.

Leaks: 10,000 forward + backward iterations of the cell and of the layer, at
small sizes, keep the process's resident memory flat on CPU (after a warm-up
that lets the allocators reach their steady state) and
``torch.cuda.memory_allocated`` exactly flat on CUDA.

Autocast (cpp/ops/autocast.cpp, docs/design.md "Autocast"): inside ``torch.autocast`` the
forward ops cast their float32/float16/bfloat16 inputs to the autocast dtype
and return that dtype; float64 tensors stay float64. Gradients reach float32
parameters as float32.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

import lltm
from helpers import DEVICES, assert_close_to_reference, make_inputs
from lltm.reference import lltm_reference

ITERATIONS = 10_000
WARMUP = 1_000
# Resident memory may grow by this much over the 10,000 iterations: a leak
# of one small tensor per step (a TensorImpl and its storage, ~400 bytes)
# would grow it by ~4 MiB.
RSS_SLACK = 2 * 2**20


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (Linux)."""
    fields = Path("/proc/self/statm").read_text().split()
    import resource  # noqa: PLC0415 - Unix only

    return int(fields[1]) * resource.getpagesize()


def cell_step() -> tuple[object, list[torch.Tensor]]:
    args = make_inputs(2, 3, 4, requires_grad=True)

    def step() -> None:
        new_h, new_cell = lltm.lltm(*args)
        (new_h.sum() + new_cell.sum()).backward()

    return step, args


def layer_step(device: str) -> tuple[object, list[torch.Tensor]]:
    layer = lltm.LLTMLayer(3, 4, num_layers=2).to(device)
    x = torch.randn(3, 2, 3, device=device, requires_grad=True)

    def step() -> None:
        output, (h_n, c_n) = layer(x)
        (output.sum() + h_n.sum() + c_n.sum()).backward()

    return step, [x, *layer.parameters()]


def run(step: object, params: list[torch.Tensor], iterations: int) -> None:
    for _ in range(iterations):
        for p in params:
            p.grad = None
        step()  # type: ignore[operator]


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm")
@pytest.mark.parametrize("what", ["cell", "layer"])
def test_cpu_memory_stays_flat(what: str) -> None:
    step, params = cell_step() if what == "cell" else layer_step("cpu")
    run(step, params, WARMUP)
    gc.collect()
    before = rss_bytes()
    run(step, params, ITERATIONS)
    gc.collect()
    growth = rss_bytes() - before
    print(f"{what}: {ITERATIONS} iterations, RSS growth {growth / 2**10:.0f} KiB")  # noqa: T201
    assert growth < RSS_SLACK, f"RSS grew by {growth} bytes over {ITERATIONS} iterations"


@pytest.mark.cuda
@pytest.mark.parametrize("what", ["cell", "layer"])
def test_cuda_memory_stays_flat(what: str) -> None:
    if what == "cell":
        args = make_inputs(2, 3, 4, device="cuda", requires_grad=True)

        def step() -> None:
            new_h, new_cell = lltm.lltm(*args)
            (new_h.sum() + new_cell.sum()).backward()

        params = args
    else:
        step, params = layer_step("cuda")  # type: ignore[assignment]
    run(step, params, 10)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    run(step, params, ITERATIONS)
    torch.cuda.synchronize()
    growth = torch.cuda.memory_allocated() - before
    print(f"{what}: {ITERATIONS} iterations, memory_allocated growth {growth} bytes")  # noqa: T201
    assert growth == 0


AUTOCAST_CASES = [
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16"),
    pytest.param("cuda", torch.bfloat16, marks=pytest.mark.cuda, id="cuda-bfloat16"),
    pytest.param("cuda", torch.float16, marks=pytest.mark.cuda, id="cuda-float16"),
]


@pytest.mark.parametrize(("device", "dtype"), AUTOCAST_CASES)
def test_cell_under_autocast(device: str, dtype: torch.dtype) -> None:
    cell = lltm.LLTM(16, 32).to(device)
    x = torch.randn(8, 16, device=device)
    h, c = torch.randn(8, 32, device=device), torch.randn(8, 32, device=device)
    # The state may come from another autocast op, in the low dtype.
    with torch.autocast(device, dtype=dtype):
        new_h, new_cell = cell(x, (h.to(dtype), c))
        h2, _ = lltm.lltm(x, cell.weights, cell.bias, h, c)
        outputs = torch.ops.lltm.forward(x, cell.weights, cell.bias, h, c)
    assert new_h.dtype == new_cell.dtype == h2.dtype == dtype
    assert all(o.dtype == dtype for o in outputs)
    # Correct: what the op computes on the inputs rounded to the dtype.
    rounded = [t.to(dtype).double() for t in (x, cell.weights, cell.bias, h, c)]
    want_h, want_cell = lltm_reference(*rounded)
    assert_close_to_reference(new_h, want_h)
    assert_close_to_reference(new_cell, want_cell)
    assert_close_to_reference(h2, want_h)
    # Gradients reach the float32 parameters in float32.
    (new_h.float().sum() + new_cell.float().sum()).backward()
    assert cell.weights.grad is not None
    assert cell.weights.grad.dtype == torch.float32
    # Outside autocast nothing is cast.
    assert lltm.lltm(x, cell.weights, cell.bias, h, c)[0].dtype == torch.float32


@pytest.mark.parametrize(("device", "dtype"), AUTOCAST_CASES)
def test_layer_under_autocast(device: str, dtype: torch.dtype) -> None:
    layer = lltm.LLTMLayer(8, 16, num_layers=2).to(device)
    x = torch.randn(5, 3, 8, device=device)
    with torch.autocast(device, dtype=dtype):
        output, (h_n, c_n) = layer(x)
    assert output.dtype == h_n.dtype == c_n.dtype == dtype
    with torch.no_grad():
        reference = lltm.LLTMLayer(8, 16, num_layers=2).to(device=device, dtype=torch.float64)
        for p, q in zip(reference.parameters(), layer.parameters(), strict=True):
            p.copy_(q.to(dtype))
        want, (want_h, want_c) = reference(x.to(dtype).double())
    assert_close_to_reference(output, want)
    assert_close_to_reference(h_n, want_h)
    assert_close_to_reference(c_n, want_c)
    output.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in layer.parameters())


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_leaves_float64_alone(device: str) -> None:
    args = make_inputs(4, 3, 5, device=device, dtype=torch.float64)
    with torch.autocast(device, dtype=torch.bfloat16):
        new_h, _ = lltm.lltm(*args)
        output, _, _ = lltm.lltm_sequence(args[0].unsqueeze(0), *args[1:])
    assert new_h.dtype == output.dtype == torch.float64
    # Mixed with float32 under autocast: float32 is cast, float64 is not, and
    # the check names the argument that disagrees.
    mixed = [*args[:3], args[3].float(), args[4]]
    with (
        torch.autocast(device, dtype=torch.bfloat16),
        pytest.raises(
            TypeError,
            match=r"expected old_h to have the same dtype as input \(float64\), but got bfloat16",
        ),
    ):
        lltm.lltm(*mixed)


def test_autocast_under_torch_compile() -> None:
    cell = lltm.LLTM(8, 16)
    x, h = torch.randn(4, 8), torch.randn(4, 16)

    def f(x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return cell(x, (h, h))

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, h)
    want = f(x, h)
    assert got[0].dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
