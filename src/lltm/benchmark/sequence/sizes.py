"""The sizes of a sequence run: the sweep's grids, nn.LSTM's options, packed lengths, draws."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Context, Decimal, localcontext
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "CPU_MAX_GMACS",
    "PACKED_BATCHES",
    "PACKED_FS",
    "PACKED_STEPS",
    "RANDOM_RANGES",
    "SWEEP_BATCHES",
    "SWEEP_FS",
    "SWEEP_STEPS",
    "LayerOptions",
    "RandomSizes",
    "draw_sizes",
    "forward_macs",
    "lengths_fields",
    "packed_lengths",
]

# The grid of the speedup goals: T x B x (F, S), the layer against nn.LSTM.
SWEEP_STEPS = (16, 64, 128, 512)
SWEEP_BATCHES = (1, 16, 64, 256, 1024, 4096)
SWEEP_FS = ((32, 128), (128, 256), (256, 512))
# The packed goal's grid: what `--sweep --packed` runs by default.
PACKED_STEPS = (128, 512)
PACKED_BATCHES = (16, 256)
PACKED_FS = ((32, 128), (256, 512))
# --random's default ranges of T, B, F and S, each drawn log-uniform.
RANDOM_RANGES: dict[str, tuple[int, int]] = {
    "T": (1, 2000),
    "B": (1, 4096),
    "F": (16, 1024),
    "S": (32, 2048),
}
# The CPU's default cap on a drawn size's forward GMAC: a CPU run then ends in minutes.
CPU_MAX_GMACS = 2.0
# Draws of one size that may all exceed the cap before draw_sizes gives up.
_MAX_DRAWS = 10_000


@dataclass(frozen=True)
class LayerOptions:
    """nn.LSTM's options that the layer and ``nn.LSTM`` both take in a run."""

    bidirectional: bool = False
    packed: bool = False
    # The seed of the packed batch's lengths (packed_lengths).
    lengths_seed: int = 0

    @property
    def label(self) -> str:
        """``bidirectional, packed``: the options set, as the tables name them ('' for none)."""
        return ", ".join(n for n in ("bidirectional", "packed") if getattr(self, n))

    def fields(self) -> dict[str, Any]:
        """What each result row records of the options (the seed only where it was used)."""
        return {
            "bidirectional": self.bidirectional,
            "packed": self.packed,
            "lengths_seed": self.lengths_seed if self.packed else None,
        }


def packed_lengths(steps: int, batch: int, seed: int = 0) -> Tensor:
    """``batch`` lengths drawn uniform in ``[ceil(steps / 4), steps]`` (int64, CPU).

    Drawn by a generator of their own, on the CPU: the same ``seed`` gives
    the same lengths to every variant, run and device.
    """
    shortest = max(1, math.ceil(steps / 4))
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(shortest, steps + 1, (batch,), generator=gen)


def lengths_fields(steps: int, batch: int, options: LayerOptions) -> dict[str, Any]:
    """A packed point's lengths: the shortest, the longest (the padded batch's T), the fill."""
    if not options.packed:
        return {}
    lengths = packed_lengths(steps, batch, options.lengths_seed)
    longest = int(lengths.max())
    return {
        "shortest": int(lengths.min()),
        "padded_steps": longest,
        # The packed / padded ratio that a time proportional to the tokens would give.
        "fill": int(lengths.sum()) / (batch * longest),
    }


def forward_macs(steps: int, batch: int, features: int, state: int) -> int:
    """The multiply-adds of one direction's forward: T x B x 3S x (S + F), the gates' matmuls."""
    return steps * batch * 3 * state * (state + features)


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    """An integer of ``[low, high]``: a log-uniform draw, rounded half to even.

    In ``decimal``, whose ``ln`` and ``exp`` are correctly rounded: ``math``'s
    come from the platform's libm, whose last bit may differ between
    machines, and so may the integer a value near ``n + 0.5`` rounds to.
    """
    u = Decimal(rng.random())  # exact: the float's binary value
    with localcontext(Context(prec=34)):
        lo, hi = Decimal(low).ln(), Decimal(high).ln()
        value = (lo + u * (hi - lo)).exp()
        n = int(value.to_integral_value(rounding=ROUND_HALF_EVEN))
    return min(high, max(low, n))


@dataclass(frozen=True)
class RandomSizes:
    """The sizes (T, B, F, S) of a random sweep, and how they were drawn (:func:`draw_sizes`)."""

    count: int
    seed: int
    ranges: dict[str, tuple[int, int]]
    # The cap on a size's forward work (GMAC, one direction); None: no cap.
    max_gmacs: float | None
    sizes: list[tuple[int, int, int, int]]
    # Draws over the cap, thrown away.
    redraws: int = 0
    # Why the cap is what it is, where it was not given ("the CPU's default").
    cap_note: str = ""

    def fields(self) -> dict[str, Any]:
        """What the JSON's config records of the draw."""
        return {
            "count": self.count,
            "seed": self.seed,
            "ranges": {k: list(v) for k, v in self.ranges.items()},
            "distribution": "log-uniform, rounded to the nearest integer",
            "max_gmacs": self.max_gmacs,
            "max_gmacs_note": self.cap_note or None,
            "redraws": self.redraws,
        }

    def describe(self) -> list[str]:
        """The header's lines: the ranges, the cap, and every size drawn."""
        ranges = ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in self.ranges.items())
        if self.max_gmacs is None:
            cap = "no cap on the forward work"
        else:
            note = f" ({self.cap_note}; --max-gmacs sets it)" if self.cap_note else ""
            cap = (
                f"sizes whose forward work T*B*3*S*(S+F) exceeds {self.max_gmacs:g} GMAC "
                f"redrawn{note}: {self.redraws} redrawn"
            )
        sizes = [",".join(map(str, size)) for size in self.sizes]
        # Ten to a line: a long draw stays readable.
        rows = [" ".join(sizes[i : i + 10]) for i in range(0, len(sizes), 10)]
        return [
            (
                f"random sizes: {self.count} drawn with seed {self.seed}, each of T,B,F,S "
                f"log-uniform over {ranges}, rounded; {cap}"
            ),
            *(f"T,B,F,S drawn: {row}" for row in rows),
        ]


def draw_sizes(
    count: int,
    seed: int = 0,
    ranges: dict[str, tuple[int, int]] | None = None,
    max_gmacs: float | None = None,
    *,
    cap_note: str = "",
) -> RandomSizes:
    """``count`` sizes (T, B, F, S), each log-uniform over its range and rounded.

    ``ranges`` overrides :data:`RANDOM_RANGES` per key (``T``, ``B``, ``F``,
    ``S``: inclusive ``(low, high)``). A size whose :func:`forward_macs`
    exceeds ``max_gmacs`` x 1e9 is drawn again, all four at once, from the
    same generator: ``random.Random(seed)``, whose ``random()`` gives the same
    numbers on every machine and Python version, so the same seed gives the
    same sizes everywhere. ValueError where a range is empty or the cap leaves
    (next to) nothing to draw.
    """
    bounds = {**RANDOM_RANGES, **(ranges or {})}
    if set(bounds) != set(RANDOM_RANGES):
        msg = f"ranges: unknown keys {sorted(set(bounds) - set(RANDOM_RANGES))}; use T, B, F, S"
        raise ValueError(msg)
    bounds = {k: bounds[k] for k in RANDOM_RANGES}  # T, B, F, S, whatever the order given
    for key, (lo, hi) in bounds.items():
        if not 1 <= lo <= hi:
            msg = f"{key}={lo}:{hi}: expected 1 <= LO <= HI"
            raise ValueError(msg)
    cap = None if max_gmacs is None else max_gmacs * 1e9
    smallest = forward_macs(*(lo for lo, _ in bounds.values()))
    if cap is not None and smallest > cap:
        msg = (
            f"the cap of {max_gmacs:g} GMAC is below the smallest size of the ranges "
            f"({smallest / 1e9:.3g} GMAC)"
        )
        raise ValueError(msg)
    rng = random.Random(seed)
    sizes: list[tuple[int, int, int, int]] = []
    redraws = 0
    for _ in range(count):
        for _ in range(_MAX_DRAWS):
            t, b, f, s = (_log_uniform(rng, lo, hi) for lo, hi in bounds.values())
            if cap is None or forward_macs(t, b, f, s) <= cap:
                sizes.append((t, b, f, s))
                break
            redraws += 1
        else:
            msg = (
                f"{_MAX_DRAWS} draws in a row over the cap of {max_gmacs:g} GMAC: raise it "
                "or narrow the ranges"
            )
            raise ValueError(msg)
    return RandomSizes(count, seed, bounds, max_gmacs, sizes, redraws, cap_note)
