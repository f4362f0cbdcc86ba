"""The CPU's bfloat16 paths on AVX-512 BF16: dpbf16, and dpbf16_input (its step with the projection).

The conformance suite runs them at every kernel edge in bfloat16; here, what is
their own: an error against the float64 reference, outputs and gradients, no
more than twice nn.LSTM's in bfloat16 on the same input, the same bits again at each thread count,
no projection GEMM before dpbf16_input's steps, and where the processor (or
ATEN_CPU_CAPABILITY) has no AVX-512 BF16, a plan refused with the reason and
`auto` running another path.
"""

from __future__ import annotations

import pytest
import torch

import lltm
from helpers import run_python
from sequences import plan_or_reason, train

SIZE = (4, 3, 5, 8)
PLAN, WHY = plan_or_reason("dpbf16", "cpu", torch.bfloat16, SIZE)
needs_the_path = pytest.mark.skipif(PLAN is None, reason=f"dpbf16 cannot run here: {WHY}")

BF16_PATHS = ["dpbf16", "dpbf16_input"]

# Sizes where the LLTM's state grows over many steps, and an odd state.
ERROR_SIZES = [(64, 16, 32, 128), (50, 8, 64, 256), (20, 4, 16, 33)]


def relative_errors(
    make: type[torch.nn.Module],
    size: tuple[int, int, int, int],
    *,
    grads: bool,
    path: str | None = None,
) -> list[float]:
    """||bf16 - float64|| / ||float64|| of each output (and gradient), both from the same bf16 values.

    `path`: the LLTM path of the bfloat16 run (the float64 one runs auto).
    """
    steps, batch, features, state = size
    torch.manual_seed(0)
    model = make(features, state, dtype=torch.bfloat16)
    x = torch.randn(steps, batch, features, dtype=torch.bfloat16)
    reference = make(features, state, dtype=torch.float64)
    reference.load_state_dict(model.state_dict())
    results = []
    for m, value, forced in ((model, x, path), (reference, x.double(), None)):
        xx = value.clone().requires_grad_(grads)
        with pytest.MonkeyPatch.context() as env:
            if forced is not None:
                env.setenv("LLTM_SEQUENCE_PATH", forced)
            output, (h_n, c_n) = m(xx)
        got = [output, h_n, c_n]
        if grads:
            scale = torch.linspace(-1, 1, output.numel(), dtype=output.dtype).view_as(output)
            with pytest.MonkeyPatch.context() as env:
                if forced is not None:
                    env.setenv("LLTM_SEQUENCE_PATH", forced)
                ((output * scale).sum() + h_n.sum() + c_n.sum()).backward()
            got += [xx.grad, *(p.grad for p in m.parameters())]
        results.append(got)
    return [
        ((g.double() - w).norm() / w.norm()).item()
        for g, w in zip(results[0], results[1], strict=True)
    ]


@needs_the_path
@pytest.mark.parametrize("path", BF16_PATHS)
@pytest.mark.parametrize("size", ERROR_SIZES, ids=str)
def test_error_is_at_most_twice_nn_lstms(size: tuple[int, int, int, int], path: str) -> None:
    ours = relative_errors(lltm.LLTMLayer, size, grads=False, path=path)
    theirs = relative_errors(torch.nn.LSTM, size, grads=False)
    assert max(ours) <= 2 * max(theirs), (ours, theirs)


@needs_the_path
@pytest.mark.parametrize("path", BF16_PATHS)
@pytest.mark.parametrize("size", ERROR_SIZES, ids=str)
def test_gradients_error_is_at_most_twice_nn_lstms(
    size: tuple[int, int, int, int], path: str
) -> None:
    """With the projection in float32 (Plan::float32_projection): 0.6-1.0x nn.LSTM's.

    Rounded to bfloat16, the projection gave 1.84x at 64,16,32,128 (2.1x in an earlier
    run): the bound is the goal's 2x less a margin that such a build does not pass.
    """
    ours = relative_errors(lltm.LLTMLayer, size, grads=True, path=path)
    steps = relative_errors(lltm.LLTMLayer, size, grads=True, path="steps")
    theirs = relative_errors(torch.nn.LSTM, size, grads=True)
    assert max(ours) <= 1.5 * max(theirs), (ours, theirs)
    # And no worse than the steps path it replaces, which rounds c_t at every step.
    assert max(ours) <= max(steps), (ours, steps)


@needs_the_path
@pytest.mark.parametrize("path", BF16_PATHS)
@pytest.mark.parametrize("threads", [1, 2])
def test_the_same_bits_again_at_each_thread_count(
    monkeypatch: pytest.MonkeyPatch, threads: int, path: str
) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(1)
        layer = lltm.LLTMLayer(24, 67, dtype=torch.bfloat16)
        x = torch.randn(9, 21, 24, dtype=torch.bfloat16)
        first = train(layer, x)
        for a, b in zip(first, train(layer, x), strict=True):
            assert torch.equal(a, b)
    finally:
        torch.set_num_threads(before)


@needs_the_path
def test_dpbf16_input_runs_no_projection(monkeypatch: pytest.MonkeyPatch) -> None:
    """dpbf16 projects in float32 before its steps (a GEMM); dpbf16_input in its steps."""
    torch.manual_seed(2)
    layer = lltm.LLTMLayer(64, 96, dtype=torch.bfloat16)
    x = torch.randn(64, 16, 64, dtype=torch.bfloat16)
    products = {}
    for path in BF16_PATHS:
        monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
        with torch.no_grad():
            assert lltm.paths_that_ran(lambda: layer(x))["forward"] == [path]
            with torch.profiler.profile() as prof:
                layer(x)
        names = ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise")
        products[path] = sum(e.count for e in prof.key_averages() if e.key in names)
    assert products == {"dpbf16": 1, "dpbf16_input": 0}


FALLBACK = """
import torch, lltm
plan = None
try:
    plan = lltm.paths.plan("dpbf16", device="cpu", dtype=torch.bfloat16, steps=4, batch=3,
                           input_features=5, state_size=8)
except RuntimeError as e:
    print("REFUSED", e)
layer = lltm.LLTMLayer(5, 8, dtype=torch.bfloat16)
x = torch.randn(4, 3, 5, dtype=torch.bfloat16)
print("RAN", lltm.paths_that_ran(lambda: layer(x))["forward"])
"""


def test_without_avx512_bf16_the_plan_says_why_and_auto_runs_another_path() -> None:
    """ATEN_CPU_CAPABILITY=avx2 takes AVX-512 away, as from a processor without it."""
    result = run_python("-c", FALLBACK, env={"ATEN_CPU_CAPABILITY": "avx2"})
    assert result.returncode == 0, result.stderr
    assert "REFUSED" in result.stdout, result.stdout
    assert "needs AVX-512 BF16" in result.stdout, result.stdout
    ran = result.stdout.split("RAN", 1)[1]
    assert "dpbf16" not in ran, result.stdout
    assert "steps" in ran, result.stdout


@pytest.mark.skipif(PLAN is not None, reason="this processor has AVX-512 BF16")
def test_the_reason_here() -> None:
    assert "AVX-512 BF16" in WHY or "bfloat16 only" in WHY
