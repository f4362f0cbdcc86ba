"""What the cell and the sequence benchmark both need: dtypes, devices, clocks, rounds, plots.

And a profiler that keeps its log lines out of the output.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import lltm

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``: the dtype as the reports spell it."""
    return str(dtype).removeprefix("torch.")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name where it has none), for a table cell."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def progress(message: str) -> None:
    """A progress line on stderr, so that stdout holds the report alone."""
    print(message, file=sys.stderr, flush=True)  # noqa: T201


def sync(device: torch.device) -> None:
    """Wait for ``device``'s work, so that a clock read after it times finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def devices(spec: str) -> list[torch.device]:
    """The devices of ``--device``: a comma-separated list, or ``auto`` for every backend."""
    available = lltm.available_backends()
    if spec == "auto":
        return [torch.device(d) for d in available]
    chosen = []
    for name in spec.split(","):
        device = torch.device(name)
        if device.type not in available:
            msg = (
                f"--device {name}: lltm cannot run on {device.type} here "
                f"(available: {', '.join(available)}; see `python -m lltm`)"
            )
            raise SystemExit(msg)
        chosen.append(device)
    return chosen


def platform(gpu: str | None) -> str:
    """``torch X, N threads[, GPU]``: what a report's header says the times ran on."""
    return (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads{', ' + gpu if gpu else ''}"
    )


def in_rounds(runs: int, rounds: int, label: str, *, report: bool = True) -> Iterator[int]:
    """``runs`` split into ``rounds`` turns: yields each turn's share, then reports the turn.

    Every variant runs its share in each turn, so that a change in machine
    load affects them alike.
    """
    start = time.perf_counter()
    for r in range(rounds):
        yield runs // rounds + (1 if r < runs % rounds else 0)
        if report:
            progress(
                f"{label}: round {r + 1}/{rounds} of {runs} runs "
                f"({time.perf_counter() - start:.1f} s)"
            )


def gpu_operations(fn: Callable[[], Any], device: torch.device) -> tuple[int, Any]:
    """The GPU operations (kernels, copies, memsets) that ``fn`` runs, and what it returns."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    sync(device)
    with lltm.paths.profiler_logs_hidden(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = fn()
        sync(device)
    count = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return count, result


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed).

    Without matplotlib, SystemExit says how to install it.
    """
    try:
        import matplotlib as mpl  # noqa: PLC0415

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        msg = f"--plot needs matplotlib: pip install 'lltm[plot]' ({exc})"
        raise SystemExit(msg) from exc
    return plt
