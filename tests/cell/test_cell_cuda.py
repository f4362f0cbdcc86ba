"""CUDA-only behaviour: streams, CUDA graphs, devices, large batches."""

from __future__ import annotations

import os

import pytest
import torch

import lltm
from helpers import assert_close_to_reference, lltm_step, make_inputs, reference_step
from lltm.reference import lltm_reference

pytestmark = pytest.mark.cuda


def test_runs_on_the_current_stream() -> None:
    """Inputs written on a busy side stream: a launch on another stream would read them early."""
    base = make_inputs(64, 32, 256, device="cuda", requires_grad=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # keep the side stream busy for ~50 ms
        args = [(a * 1).requires_grad_() for a in base]  # written after the sleep
        outputs = lltm_step(args)
    side.synchronize()
    for got, want in zip(outputs, reference_step(base), strict=True):
        assert_close_to_reference(got, want)


def test_cuda_graph_capture_and_replay() -> None:
    args = make_inputs(16, 32, 128, device="cuda")
    static = [a.clone() for a in args]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        lltm.lltm(*static)  # warm up outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        new_h, new_cell = lltm.lltm(*static)
    for _ in range(3):
        fresh = make_inputs(16, 32, 128, device="cuda")
        for dst, src in zip(static, fresh, strict=True):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        want_h, want_cell = lltm_reference(*[a.double() for a in fresh])
        assert_close_to_reference(new_h, want_h)
        assert_close_to_reference(new_cell, want_cell)


# Inductor's CUDA graph tree manager captures an empty graph while it sets up
# its memory pool; torch warns about that graph, not about lltm's.
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
def test_torch_compile_reduce_overhead() -> None:
    """CUDA graphs through torch.compile: the regression test of extension-cpp#118."""
    cell = lltm.LLTM(32, 128).cuda()
    linear = torch.nn.Linear(128, 128).cuda()

    def step(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        new_h, new_cell = cell(x, (linear(h), c))
        return linear(new_h) + new_cell

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for size in (64, 1000, 5000):
        x, h, c = (torch.randn(size, n, device="cuda") for n in (32, 128, 128))
        expected = step(x, h, c)
        for _ in range(3):  # the later calls replay the recorded graph
            torch.testing.assert_close(compiled(x, h, c), expected)


def test_large_batch_beyond_grid_y_limit() -> None:
    """65535 is the largest gridDim.y; the batch must not be limited by it."""
    args = make_inputs(70_000, 8, 16, device="cuda", requires_grad=True)
    for got, want in zip(lltm_step(args), reference_step(args), strict=True):
        assert_close_to_reference(got, want)


@pytest.mark.skipif(
    os.environ.get("LLTM_TEST_LARGE") != "1",
    reason="set LLTM_TEST_LARGE=1 (needs ~40 GB of GPU memory)",
)
def test_64bit_indexing() -> None:
    """3 * batch * state > 2**31: the kernels switch to 64-bit indices."""
    batch, features, state = 1_400_000, 4, 512
    assert 3 * batch * state > 2**31
    args = make_inputs(
        batch, features, state, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    new_h, new_cell = lltm.lltm(*args)
    d_input, _, _, d_old_h, d_old_cell = torch.autograd.grad(new_h.sum() + 2 * new_cell.sum(), args)
    # Every row depends only on its own inputs: check the first and last rows.
    for rows in (slice(0, 4), slice(batch - 4, batch)):
        part = [args[0][rows], args[1], args[2], args[3][rows], args[4][rows]]
        want = reference_step(part)
        assert_close_to_reference(new_h[rows], want[0])
        assert_close_to_reference(new_cell[rows], want[1])
        assert_close_to_reference(d_input[rows], want[2])
        assert_close_to_reference(d_old_h[rows], want[5])
        assert_close_to_reference(d_old_cell[rows], want[6])


def test_cpu_and_cuda_agree() -> None:
    args = make_inputs(257, 100, 300, dtype=torch.float64, requires_grad=True)
    cuda_args = [a.detach().cuda().requires_grad_() for a in args]
    for got, want in zip(lltm_step(cuda_args), lltm_step(args), strict=True):
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_another_device_than_the_current() -> None:
    assert torch.cuda.current_device() == 0
    args = make_inputs(33, 17, 65, device="cuda:1", requires_grad=True)
    outputs = lltm_step(args)
    assert all(o.device == torch.device("cuda:1") for o in outputs)
    for got, want in zip(outputs, reference_step(args), strict=True):
        assert_close_to_reference(got, want)


def test_deterministic() -> None:
    args = make_inputs(128, 64, 256, device="cuda", requires_grad=True)
    first = lltm_step(args)
    second = lltm_step(args)
    for a, b in zip(first[:2], second[:2], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(first[2:], second[2:], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_memory_returns_to_baseline() -> None:
    args = make_inputs(64, 32, 128, device="cuda", requires_grad=True)
    lltm_step(args)
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    for _ in range(50):
        lltm_step(args)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == baseline
