"""The clocks of a sequence run: the CUDA-graph replays, with stand-ins for CUDA."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch

from lltm.benchmark import sequence as seq
from lltm.benchmark.sequence import timing, variants


def test_graph_time_replays_and_failures() -> None:
    """The CUDA-graph timing logic, with fake graphs and events on the CPU."""
    clock = [0.0]
    log: list[str] = []

    class Graph:
        def replay(self) -> None:
            clock[0] += 2.0
            log.append("replay")

    class Event:
        def record(self) -> None:
            self.t = clock[0]

        def synchronize(self) -> None:
            log.append("sync")

        def elapsed_time(self, end: Event) -> float:
            return end.t - self.t

    def stall_for(ms: float) -> Callable[[], None]:
        assert ms >= 1.0
        return lambda: log.append("stall")

    g = timing._graph_time_with(Graph, Event, lambda: None, stall_for, replays=None, seconds=0.01)
    assert g.error is None
    # 2 ms per replay, 10 ms of budget: 5 replays, the GPU stalled before them.
    assert (g.median_ms, g.min_ms, g.replays) == (2.0, 2.0, 5)
    assert log[-7:] == ["stall", *["replay"] * 5, "sync"]
    g = timing._graph_time_with(Graph, Event, lambda: None, stall_for, replays=3, seconds=9.0)
    assert g.replays == 3

    def refuse() -> Graph:
        msg = "operation not permitted when stream is capturing\nmore"
        raise RuntimeError(msg)

    g = timing._graph_time_with(refuse, Event, lambda: None, stall_for, replays=None, seconds=1.0)
    assert g.median_ms is None
    assert g.error == "RuntimeError: operation not permitted when stream is capturing"
    # Not on CUDA: no graph, and why.
    assert seq.graph_time(None, torch.device("cpu")).error == "CUDA only"  # type: ignore[arg-type]


def test_graph_time_cuda_calls_with_a_fake_torch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """graph_time's CUDA path, against stand-ins for torch.cuda: the calls and their order."""
    log: list[str] = []
    clock = [0.0]

    class Stream:
        def __init__(self, index: int | None = None) -> None:
            self.index = index

        def wait_stream(self, *_: Stream) -> None:
            log.append("wait_stream")

    class Graph:
        def replay(self) -> None:
            clock[0] += 1.0
            log.append("replay")

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing

        def record(self) -> None:
            self.t = clock[0]

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: Event) -> float:
            return end.t - self.t

    @contextlib.contextmanager
    def capture(*_: Graph, stream: Stream | None = None) -> Iterator[None]:
        assert stream is not None
        assert stream.index == 0  # the warm-up's stream
        log.append("capture")
        yield

    current = Stream()
    fakes = {
        "current_device": lambda: 0,
        "Stream": Stream,
        "current_stream": lambda *_: current,
        "stream": lambda *_: contextlib.nullcontext(),
        "set_stream": lambda *_: log.append("set_stream"),
        "device": lambda *_: contextlib.nullcontext(),
        "synchronize": lambda *_: None,
        "CUDAGraph": Graph,
        "graph": capture,
        "Event": Event,
        "_sleep": lambda *_: log.append("sleep"),
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(torch.cuda, name, fake, raising=False)
    monkeypatch.setattr(timing, "_SIDE_STREAMS", {})
    monkeypatch.setattr(timing, "_CYCLES_PER_MS", {0: 1000.0})
    leaf = torch.ones(3, requires_grad=True)
    steps = []

    def forward() -> torch.Tensor:
        steps.append("step")
        return leaf * 2

    v = variants.Variant(forward, "steps", [leaf])
    g = seq.graph_time(v, torch.device("cuda"), warmup=2, estimate_ms=1.0, seconds=0.004)
    assert g.error is None
    assert (g.median_ms, g.replays) == (1.0, 4)
    # Two warm-up calls and the captured one; then the grads are cleared.
    assert len(steps) == 3
    assert leaf.grad is None
    assert log[0] == "wait_stream"
    assert log.index("capture") < log.index("sleep") < log.index("set_stream")

    def fail() -> torch.Tensor:
        msg = "CUDA error: operation not permitted when stream is capturing"
        raise RuntimeError(msg)

    # The spin kernel's calibration, once per GPU.
    timing._CYCLES_PER_MS.clear()
    assert timing._stall(torch.device("cuda"), 2.0) is not None
    assert 0 in timing._CYCLES_PER_MS
    g = seq.graph_time(variants.Variant(fail, None, [leaf]), torch.device("cuda"))
    assert g.error == "RuntimeError: CUDA error: operation not permitted when stream is capturing"
