"""The sequence ops on CUDA alone: forcing a path, the measured choice, streams, CUDA graphs, devices."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import lltm
from helpers import assert_a_graph_replays_the_layer, assert_close_to_reference
from lltm.reference import lltm_sequence_reference
from sequences import (
    CUDA_PATHS,
    make_sequence,
    plan_or_reason,
    plans_that_ran,
    reference_with_grads,
    set_device_path,
    with_grads,
)

pytestmark = pytest.mark.cuda


@pytest.fixture(params=CUDA_PATHS)
def cuda_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """LLTM_SEQUENCE_PATH for a CUDA-only test, set to each path in turn."""
    set_device_path(monkeypatch, "cuda", request.param)
    return str(request.param)


@pytest.fixture
def auto(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """auto, measuring, with no choice kept; yields what the keys say of this GPU."""
    monkeypatch.delenv("LLTM_SEQUENCE_PATH", raising=False)
    monkeypatch.delenv("LLTM_TUNING", raising=False)
    lltm.clear_path_choices()
    yield f"gpu={torch.cuda.get_device_name()}"
    lltm.clear_path_choices()


def cuda_choices() -> list[lltm.PathChoice]:
    return [c for c in lltm.path_choices() if c["key"].startswith("cuda|")]


def test_cuda_measures_every_path_that_can_run_a_block(auto: str) -> None:
    shape = (40, 8, 4, 128)
    args = make_sequence(*shape, device="cuda", dtype=torch.float32)
    ran = dict(zip(("forward", "backward"), plans_that_ran(args), strict=True))
    choices = {c["key"]: c for c in cuda_choices()}
    keys = {mode: f"cuda|Float|{mode}|{auto}|T=40|B=8|F=4|S=128" for mode in ran}
    assert set(choices) == set(keys.values())
    for mode, plans in ran.items():
        choice = choices[keys[mode]]
        assert choice["source"] == "measured"
        runs = [
            path
            for path in lltm.sequence_paths("cuda")
            if plan_or_reason(path, "cuda", torch.float32, shape, backward=mode == "backward")[0]
        ]
        assert [name for name, _ in choice["times_us"]] == runs
        assert len(runs) > 1
        assert all(t > 0 for _, t in choice["times_us"])
        assert choice["path"] == min(choice["times_us"], key=lambda nt: nt[1])[0]
        assert plans == [choice["plan"]]
    for got, want in zip(
        with_grads(lltm.lltm_sequence, args), reference_with_grads(args), strict=True
    ):
        assert_close_to_reference(got.cpu(), want)
    # The measured choice is kept: a second call repeats the first bit for bit.
    assert plans_that_ran(args) == (ran["forward"], ran["backward"])


@pytest.mark.usefixtures("auto")
def test_a_graph_capture_takes_the_kept_choice_else_the_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capture can neither time nor wait: no kept choice, the rules; the next eager call measures."""
    layer = lltm.LLTMLayer(4, 128).to("cuda")
    x = torch.randn(3, 8, 4, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        layer(torch.randn(3, 100, 4, device="cuda"))  # warm up another kind of block
    torch.cuda.current_stream().wait_stream(side)

    def capture() -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            out, _ = layer(x)
        return graph, out

    def choice_of_x() -> lltm.PathChoice:
        (choice,) = [c for c in cuda_choices() if "|B=8|" in c["key"]]
        return choice

    graph, out = capture()
    captured = choice_of_x()
    assert (captured["source"], captured["times_us"]) == ("capture", [])
    monkeypatch.setenv("LLTM_TUNING", "0")
    rules = lltm.paths.plan(
        device="cuda", steps=3, batch=8, input_features=4, state_size=128, save=False
    )
    assert captured["plan"] == rules
    monkeypatch.delenv("LLTM_TUNING")
    graph.replay()
    with torch.no_grad():
        eager, _ = layer(x)
    assert choice_of_x()["source"] == "measured"
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)  # two paths' sums
    graph, out = capture()
    assert choice_of_x()["source"] == "measured"
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager)


def test_cuda_bad_path_and_a_state_too_large_for_the_persistent_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = make_sequence(2, 2, 3, 4, device="cuda", dtype=torch.float32, requires_grad=False)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fast")
    names = ", ".join(CUDA_PATHS)
    with pytest.raises(
        ValueError,
        match=f"LLTM_SEQUENCE_PATH=fast: expected auto or a sequence path of the CUDA: {names}",
    ):
        lltm.lltm_sequence(*args)
    # W_h of state 2048 in float32 is 50 MB: more than the GPU's shared memory.
    big = make_sequence(1, 1, 1, 2048, device="cuda", dtype=torch.float32, requires_grad=False)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "persistent")
    with pytest.raises(
        RuntimeError,
        match="LLTM_SEQUENCE_PATH=persistent, but the persistent path cannot run a forward of "
        "steps = 1, batch = 1, input_features = 1, state_size = 2048 in float32 here: W_h's "
        "slices do not fit in the shared memory of its multiprocessors",
    ):
        lltm.lltm_sequence(*big)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "auto")  # falls back to the steps
    torch.testing.assert_close(
        lltm.lltm_sequence(*big)[0].double().cpu(),
        lltm_sequence_reference(*[a.double().cpu() for a in big])[0],
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.usefixtures("cuda_path")
def test_cuda_runs_on_the_current_stream() -> None:
    base = make_sequence(8, 16, 32, 128, device="cuda", dtype=torch.float32, requires_grad=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        args = [(a * 1).requires_grad_() for a in base]  # written after the sleep
        got = with_grads(lltm.lltm_sequence, args)
    side.synchronize()
    for g, w in zip(got, reference_with_grads(base), strict=True):
        assert_close_to_reference(g.cpu(), w)


@pytest.mark.usefixtures("cuda_path")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_cuda_graph_capture_and_replay(dtype: torch.dtype) -> None:
    """The fused steps' cooperative launch (one per direction) is a graph node too."""
    layer = lltm.LLTMLayer(32, 128).to("cuda", dtype)
    assert_a_graph_replays_the_layer(layer, torch.randn(16, 16, 32, device="cuda", dtype=dtype))


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs: inputs on cuda:1, current device 0"
)
@pytest.mark.usefixtures("cuda_path")
def test_cuda_on_a_second_device() -> None:
    args = make_sequence(4, 8, 5, 16, device="cuda:1", dtype=torch.float32)
    for g, w in zip(with_grads(lltm.lltm_sequence, args), reference_with_grads(args), strict=True):
        assert g.device == torch.device("cuda:1")
        assert_close_to_reference(g.cpu(), w)
