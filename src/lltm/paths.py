"""The paths of the ops: which a device has, which plan runs a block, and which ran.

A sequence op runs each block of steps (a direction, or a packed batch's
segment) on one path of its device, by a plan: ``"fused"`` on the CPU,
``"fused/held"`` or ``"cluster/mma"`` on CUDA, where a path has ways of its
own (docs/design.md, "Paths and plans"). ``LLTM_SEQUENCE_PATH`` forces a path;
one that cannot run a block raises, with its reason.

The ops mark each block with a range in ``torch.profiler``,
``lltm::sequence_path::<plan>`` in the forward and
``lltm::sequence_backward_path::<plan>`` in the backward, on every device; the
cell ops on CUDA mark theirs with ``lltm::cell_path::<path>`` (small, tiled or
cublas) and ``lltm::cell_backward_path::<path>``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import TypedDict

import torch
import torch.profiler

# Set on the package before this module's import (lltm/__init__.py).
from . import _C

__all__ = ["PathsThatRan", "paths_that_ran", "plan", "profiler_logs_hidden", "sequence_paths"]

_RANGES = {
    "lltm::sequence_path::": "forward",
    "lltm::sequence_backward_path::": "backward",
    "lltm::cell_path::": "cell",
    "lltm::cell_backward_path::": "cell_backward",
}


class PathsThatRan(TypedDict):
    """The plans of one run, one entry per block of steps (per cell op), in the order they ran."""

    forward: list[str]
    backward: list[str]
    cell: list[str]
    cell_backward: list[str]


def sequence_paths(device: str | torch.device = "cpu") -> list[str]:
    """The sequence paths of ``device``'s type, as ``LLTM_SEQUENCE_PATH`` names them.

    In the order of the device's table; empty where lltm has no kernels for it.
    """
    return list(_C._sequence_paths(torch.device(device)))


def plan(
    path: str = "auto",
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    steps: int,
    batch: int,
    input_features: int,
    state_size: int,
    backward: bool = False,
    save: bool = True,
) -> str:
    """The plan that runs a block of these sizes on ``path`` (``"auto"``: the choice's).

    The choice of ``"auto"`` is the ops' own: it measures the paths (and keeps
    the result), as the block's first run would.

    Raises:
        ValueError: ``path`` names no path of the device.
        RuntimeError: ``path`` cannot run such a block; the message says why.

    Example:
        >>> lltm.paths.plan("onednn", steps=16, batch=4, input_features=32, state_size=64)
        'onednn'
    """
    name, why_not = _C._sequence_plan(
        path,
        torch.device(device),
        dtype,
        steps,
        batch,
        input_features,
        state_size,
        backward,
        save,
    )
    if name is None:
        msg = f"the {path} path cannot run this block on {device}: {why_not}"
        raise RuntimeError(msg)
    return name


# kineto's log lines below its warnings, as ``USDT:<time> <pid>:<tid> <file>.cpp:52] ...``.
_KINETO_LOG = re.compile(r"^(USDT|STAGE|INFO|VERBOSE):\d{4}-\d\d-\d\d .*\.cpp:\d+\] ")


@contextlib.contextmanager
def profiler_logs_hidden() -> Iterator[None]:
    """Keep torch.profiler's log lines (``USDT: ... profiler_start``) out of stderr.

    Some torch releases also warn, once, that a cycle's events are cleared:
    each profile here is one cycle, read whole, so that warning is dropped too.
    """
    with warnings.catch_warnings(), _kineto_lines_hidden():
        # The message may open with "Warning: "; the filter matches from its start.
        warnings.filterwarnings("ignore", ".*Profiler clears events", UserWarning)
        yield


@contextlib.contextmanager
def _kineto_lines_hidden() -> Iterator[None]:
    """Keep kineto's log lines out of stderr.

    kineto writes them from C++ to file descriptor 2 at each profiler start
    and stop, at a level its Python API cannot set: the descriptor goes to a
    temporary file for the calls inside, and every other line is written back.
    """
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2 (a windowed process): nothing to hide
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            if kept := [line for line in lines if not _KINETO_LOG.match(line)]:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def paths_that_ran(fn: Callable[[], object]) -> PathsThatRan:
    """Run ``fn()`` once under ``torch.profiler`` and name the plans it ran.

    Each direction of each layer is one block of steps (a packed batch's
    segments are a block each), and a bidirectional layer whose directions
    ran their steps together is one, ``<plan>/together``
    (``LLTM_DIRECTIONS``); a forward's blocks are in ``forward``, a
    backward's (when ``fn`` runs one) in ``backward``; the cell ops' paths on
    CUDA in ``cell`` and ``cell_backward``. The profiler's own lines at its
    start and stop are kept out of stderr.

    Example:
        >>> layer = lltm.LLTMLayer(32, 128)
        >>> paths_that_ran(lambda: layer(torch.randn(16, 4, 32))[0].sum().backward())
        {'forward': ['fused'], 'backward': ['fused'], 'cell': [], 'cell_backward': []}
    """
    # Every step of the profiler's own, not fn(), under the filter: which
    # step warns moves between torch releases.
    with profiler_logs_hidden():
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.start()
    try:
        fn()
    finally:
        with profiler_logs_hidden():
            prof.stop()
    with profiler_logs_hidden():
        events = sorted(prof.events(), key=lambda e: e.time_range.start)
    ran: dict[str, list[str]] = {kind: [] for kind in _RANGES.values()}
    for event in events:
        for prefix, kind in _RANGES.items():
            if event.name.startswith(prefix):
                ran[kind].append(event.name[len(prefix) :])
    return PathsThatRan(
        forward=ran["forward"],
        backward=ran["backward"],
        cell=ran["cell"],
        cell_backward=ran["cell_backward"],
    )
