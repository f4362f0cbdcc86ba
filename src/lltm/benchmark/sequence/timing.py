"""The clocks of a sequence run: eager calls, and on CUDA the call replayed as a CUDA graph.

The GPU time of a call comes from a CUDA graph of it, replayed while the GPU
is kept busy, so that none of the host's launch cost is in it; the wall time
from eager calls, the device synchronized before each clock read.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .._common import first_line, gpu_operations, sync
from .variants import Variant, forcing

__all__ = ["GraphTime", "gpu_measures", "graph_time", "timed", "warm_up"]


@dataclass
class GraphTime:
    """The GPU time of one call, from CUDA-graph replays (ms), or why there is none."""

    median_ms: float | None = None
    min_ms: float | None = None
    replays: int = 0
    error: str | None = None


def _replay_times(
    replay: Callable[[], None],
    n: int,
    new_event: Callable[[], Any],
    stall: Callable[[], None] | None = None,
) -> list[float]:
    """Milliseconds of each of ``n`` back-to-back replays, from ``n + 1`` events.

    ``stall`` (a GPU spin kernel) runs first so that the host enqueues all
    replays and events while the GPU is still busy: the gaps between events
    then hold GPU work only, none of the host's launch cost.
    """
    events = [new_event() for _ in range(n + 1)]
    if stall is not None:
        stall()
    events[0].record()
    for i in range(n):
        replay()
        events[i + 1].record()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(n)]


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _capture(v: Variant, device: torch.device, warmup: int) -> torch.cuda.CUDAGraph:
    """Capture one timed call of ``v`` as a CUDA graph, as PyTorch's docs say.

    The warm-up runs on a side stream, and the capture on the same one (lazy
    per-stream state such as cuBLAS workspaces must exist before capture,
    which may not allocate it). The grads are None when the capture
    starts, so the captured backward writes fresh ``.grad`` tensors in the
    graph's pool, and each replay overwrites them rather than accumulating.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    # One per GPU for every capture: each new stream would get a cuBLAS workspace of its own.
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(index)
    side = _SIDE_STREAMS[index]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), forcing(v.path):
        for _ in range(warmup):
            v.clear_grads()
            v.call()
    torch.cuda.current_stream(device).wait_stream(side)
    sync(device)
    v.clear_grads()
    graph = torch.cuda.CUDAGraph()
    # On the warm-up's stream, whose lazy state (cuBLAS workspaces) capture cannot allocate.
    with forcing(v.path), torch.cuda.graph(graph, stream=side):
        v.call()
    return graph


# Spin-kernel cycles per millisecond, per GPU: calibrated once.
_CYCLES_PER_MS: dict[int, float] = {}


def _stall(device: torch.device, ms: float) -> Callable[[], None] | None:
    """A callable that keeps ``device`` busy for about ``ms`` (None without torch.cuda._sleep)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CYCLES_PER_MS:
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        for _ in range(2):  # the first launch loads the kernel: time the second
            start.record()
            sleep(1_000_000)
            end.record()
            end.synchronize()
        _CYCLES_PER_MS[index] = 1_000_000 / max(start.elapsed_time(end), 1e-3)
    cycles = int(_CYCLES_PER_MS[index] * ms)
    return lambda: sleep(cycles)


def _error(exc: BaseException) -> str:
    """``Type: first line`` of the exception that started it all.

    When a captured op fails, ending the capture fails too, with an error
    that says only that the capture was invalidated: the first one says why.
    """
    while exc.__context__ is not None and exc.__context__ is not exc:
        exc = exc.__context__
    return f"{type(exc).__name__}: {first_line(exc)}"


# Replays this slow outlast the host's next launch: their launch cost needs no measure.
_SLOW_REPLAY_MS = 50.0


def _graph_time_with(
    capture: Callable[[], Any],
    new_event: Callable[[], Any],
    sync: Callable[[], None],
    stall_for: Callable[[float], Callable[[], None] | None],
    *,
    replays: int | None,
    seconds: float,
    estimate_ms: float | None = None,
) -> GraphTime:
    """Capture, then time replays: the device-independent part of :func:`graph_time`.

    ``capture`` returns an object with ``replay()``; ``new_event`` makes a
    timing event; ``stall_for(ms)`` gives a callable that keeps the GPU busy for
    that long. Without ``replays``, as many as fit in ``seconds`` (3 to 50) at
    ``estimate_ms`` each (the eager wall time is an upper bound; without it one
    replay is timed first). Any failure (a capture that the op or cuDNN
    refuses, out of memory) gives a :class:`GraphTime` with ``error`` set: one
    variant that cannot be captured does not stop the benchmark.
    """
    try:
        graph = capture()
        start = time.perf_counter()
        graph.replay()  # the first replay uploads the graph
        launch_ms = (time.perf_counter() - start) * 1e3
        sync()
        if estimate_ms is None:
            (estimate_ms,) = _replay_times(graph.replay, 1, new_event)
        if estimate_ms < _SLOW_REPLAY_MS:
            start = time.perf_counter()
            graph.replay()
            launch_ms = (time.perf_counter() - start) * 1e3
            sync()
        n = replays or max(3, min(50, math.ceil(seconds * 1e3 / max(estimate_ms, 1e-3))))
        # Long enough for the host to enqueue every replay before the GPU reaches the first.
        stall = stall_for(min(200.0, 1.0 + 1.5 * n * launch_ms))
        times = _replay_times(graph.replay, n, new_event, stall)
    except Exception as exc:  # noqa: BLE001 - reported in the table, not fatal
        return GraphTime(error=_error(exc))
    return GraphTime(median_ms=statistics.median(times), min_ms=min(times), replays=n)


def graph_time(
    v: Variant,
    device: torch.device,
    *,
    replays: int | None = None,
    seconds: float = 0.2,
    warmup: int = 2,
    estimate_ms: float | None = None,
) -> GraphTime:
    """The GPU time of one timed call of ``v`` (:meth:`Variant.call`): its CUDA graph, replayed.

    ``warmup`` calls run on a side stream first; ``replays`` (default: as many
    as fit in ``seconds`` at ``estimate_ms`` each) are timed. On a device
    other than CUDA there is no graph: ``error`` says so.
    """
    if device.type != "cuda":
        return GraphTime(error="CUDA only")
    holder: list[torch.cuda.CUDAGraph] = []

    def capture() -> torch.cuda.CUDAGraph:
        holder.append(_capture(v, device, warmup))
        return holder[0]

    # Restored here: a capture that fails to end leaves its stream current.
    stream = torch.cuda.current_stream(device)
    try:
        with torch.cuda.device(device):
            return _graph_time_with(
                capture,
                lambda: torch.cuda.Event(enable_timing=True),
                lambda: sync(device),
                lambda ms: _stall(device, ms),
                replays=replays,
                seconds=seconds,
                estimate_ms=estimate_ms,
            )
    finally:
        # The graph's pool holds a whole sequence's activations: free it for the next capture.
        v.clear_grads()
        holder.clear()
        torch.cuda.set_stream(stream)
        sync(device)


def _launches(v: Variant, device: torch.device) -> int | None:
    """GPU operations (kernels, copies, memsets) of one eager timed call of ``v``."""
    if device.type != "cuda":
        return None
    try:
        v.clear_grads()
        with forcing(v.path):
            count, _ = gpu_operations(v.call, device)
    except Exception:  # noqa: BLE001 - a count is optional: none rather than a crash
        return None
    return count


# See warm_up.
_SLOW_WARMUP_S = 0.25


def timed(v: Variant, device: torch.device) -> float:
    """Seconds of one timed call of ``v``, from clean grads to finished work."""
    v.clear_grads()
    sync(device)
    t0 = time.perf_counter()
    v.call()
    sync(device)
    return time.perf_counter() - t0


def warm_up(v: Variant, device: torch.device, warmup: int) -> float:
    """Untimed calls (at least 1); returns the last one's seconds."""
    with forcing(v.path):
        for i in range(max(1, warmup)):
            elapsed = timed(v, device)
            # A call this slow set up all there is at its first: more would only cost time.
            if i and elapsed > _SLOW_WARMUP_S:
                break
    return elapsed


def gpu_measures(
    cases: dict[str, Variant],
    medians: dict[str, float],
    device: torch.device,
    seconds: float,
    *,
    gpu_time: bool,
    launches: bool,
) -> tuple[dict[str, GraphTime], dict[str, int | None]]:
    """Each variant's GPU time (on CUDA, with ``gpu_time``) and kernel count (``launches``)."""
    graphs: dict[str, GraphTime] = {}
    counts: dict[str, int | None] = {}
    for name, median in medians.items():
        if gpu_time and device.type == "cuda":
            wall_ms = median * 1e3
            graphs[name] = graph_time(
                cases[name],
                device,
                seconds=min(0.5, max(0.05, seconds / 4)),
                # One warm-up on the side stream is enough where a call is slow.
                warmup=1 if wall_ms > _SLOW_REPLAY_MS else 2,
                estimate_ms=wall_ms,
            )
        if launches:
            counts[name] = _launches(cases[name], device)
    return graphs, counts
