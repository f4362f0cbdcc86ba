"""Which path ran each block of steps of the sequence ops.

The ops mark each block of steps with a range in ``torch.profiler``,
``lltm::sequence_path::<name>`` in the forward and
``lltm::sequence_backward_path::<name>`` in the backward, on every device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

import torch.profiler

__all__ = ["PathsThatRan", "paths_that_ran"]

_FORWARD = "lltm::sequence_path::"
_BACKWARD = "lltm::sequence_backward_path::"


class PathsThatRan(TypedDict):
    """The paths of one run, one entry per block of steps, in the order they ran."""

    forward: list[str]
    backward: list[str]


def paths_that_ran(fn: Callable[[], object]) -> PathsThatRan:
    """Run ``fn()`` once under ``torch.profiler`` and name the sequence paths it ran.

    Each direction of each layer is one block of steps (a packed batch's
    segments are a block each); a forward's blocks are in ``forward``, a
    backward's (when ``fn`` runs one) in ``backward``.

    Example:
        >>> layer = lltm.LLTMLayer(32, 128)
        >>> paths_that_ran(lambda: layer(torch.randn(16, 4, 32))[0].sum().backward())
        {'forward': ['fused'], 'backward': ['fused']}
    """
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    ran: PathsThatRan = {"forward": [], "backward": []}
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    for event in events:
        if event.name.startswith(_FORWARD):
            ran["forward"].append(event.name[len(_FORWARD) :])
        elif event.name.startswith(_BACKWARD):
            ran["backward"].append(event.name[len(_BACKWARD) :])
    return ran
