"""The CPU's fused_input path: fused's step with the input's projection in it.

The conformance suite runs it at every kernel edge, in both directions and on
packed batches; here, what is its own: no projection GEMM runs before its
steps (the other paths' blocks read one), an input in any layout runs the
same bits, and its backward is fused's reverse loop.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import lltm
from sequences import assert_trains_like_the_reference, layer_and_input, plan_or_reason, train

# T * B = 1024 rows of F = 64 into 3 * 96 gate columns: a projection big
# enough to go through the measured GEMM (cpp/sequence/cpu/gemm.cpp).
SIZE = (64, 16, 64, 96)


@pytest.fixture(autouse=True)
def _fresh_choices() -> Iterator[None]:
    lltm.clear_path_choices()
    yield
    lltm.clear_path_choices()


def gemm_shapes() -> set[tuple[str, str]]:
    """(K, N) of each GEMM around the blocks that went through the measured choice."""
    keys = [c["key"].split("|") for c in lltm.path_choices() if "|gemm|" in c["key"]]
    return {(k[-2], k[-1]) for k in keys}


def matmuls_in(fn: object) -> int:
    """How many matrix products the profiler saw `fn` run (ATen's and oneDNN's)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()  # type: ignore[operator]
    names = ("aten::mm", "aten::addmm", "aten::matmul", "mkldnn::_linear_pointwise")
    return sum(e.count for e in prof.key_averages() if e.key in names)


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="the measured GEMM needs oneDNN"
)
@pytest.mark.parametrize("path", ["steps", "fused_input"])
def test_only_fused_input_runs_no_projection(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    layer, x = layer_and_input(SIZE)
    projection = ("K=64", "N=288")
    with torch.no_grad():
        ran = lltm.paths_that_ran(lambda: layer(x))
        products = matmuls_in(lambda: layer(x))
    assert ran["forward"] == [path]
    if path == "fused_input":
        assert projection not in gemm_shapes()
        assert products == 0
    else:
        assert projection in gemm_shapes()
        assert products >= 1
    # Training's backward still runs d_input = dZ W_x, after the steps.
    train(layer, x)
    assert ("K=288", "N=64") in gemm_shapes()


def test_an_input_in_any_layout_runs_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused_input")
    layer, x = layer_and_input((7, 5, 12, 40))
    batch_first = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert not batch_first.is_contiguous()
    for got, want in zip(train(layer, batch_first), train(layer, x), strict=True):
        assert torch.equal(got, want)
    assert_trains_like_the_reference(layer, batch_first)


def test_its_backward_is_fuseds_reverse_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the same saved forward, fused_input's backward and fused's give the same bits."""
    layer, x = layer_and_input((9, 6, 10, 33))
    weights, bias = (p.detach() for p in layer.parameters())
    h0 = torch.zeros(6, 33)
    saved = torch.ops.lltm.sequence_forward(x, weights, bias, h0, h0, None)
    output, _, _, cells, gates = saved
    grad = torch.randn_like(output)
    grads = {}
    for path in ("fused", "fused_input"):
        monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
        grads[path] = torch.ops.lltm.sequence_backward(
            grad,
            None,
            None,
            x,
            weights,
            h0,
            output,
            cells,
            gates,
            None,
            [True, True, True, True, True],
        )
    for a, b in zip(grads["fused"], grads["fused_input"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("path", "dtype"), [("fused_input", torch.float32), ("dpbf16_input", torch.bfloat16)]
)
def test_zero_features_project_nothing(
    path: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F = 0: the steps read no input (and no projection that nothing wrote)."""
    plan, why = plan_or_reason(path, "cpu", dtype, (3, 5, 0, 20))
    if plan is None:
        pytest.skip(why)
    layer, x = layer_and_input((3, 5, 0, 20), dtype=dtype)
    x = x.to(dtype)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "steps")
    with torch.no_grad():
        want = layer(x)[0]
        # A projection left in the op's kept buffers, which the path must not read.
        wide = lltm.LLTMLayer(4, 20, dtype=dtype)
        wide(torch.randn(3, 5, 4, dtype=dtype))
        monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
        got = layer(x)[0]
    torch.testing.assert_close(got, want, atol=1e-2 if dtype == torch.bfloat16 else 1e-6, rtol=0)
