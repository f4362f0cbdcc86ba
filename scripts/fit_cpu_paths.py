"""Fit the CPU paths' cost model (``cpu_model`` in cpp/sequence/cpu/engine.cpp) to measurements.

Draws random sizes, lets each block's choice measure every candidate path
(the measurements lltm.path_choices() reports), and fits per path and
direction of autograd, by least squares,

    microseconds = per_call * S^2 / 1e6 + steps * (per_step + per_gmac * gmacs)
                   + per_io_gmac * io_gmacs

gmacs being one step's recurrent multiply-adds (B * 3S * S) in billions, S^2
what a path packs of W_h once a call, and io_gmacs the input's GEMMs
(T * B * 3S * F), which every path runs alike. Prints the
constants, and how the fitted model's choice compares with the measured one:
how often it picks the fastest path, and the worst ratio of its pick's time
to the fastest.

    python scripts/fit_cpu_paths.py --sizes 40 --seed 1
    python scripts/fit_cpu_paths.py --sizes 24 --seed 1 --dtype bfloat16   # dpbf16 against steps
"""

from __future__ import annotations

import argparse
import math
import random
from collections import defaultdict

import torch

import lltm


def draw(rng: random.Random, lo: int, hi: int) -> int:
    """An integer log-uniform in [lo, hi]."""
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def main() -> None:
    """Measure, fit and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-gmacs", type=float, default=0.5, help="forward work cap per size")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="the blocks' dtype"
    )
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rng = random.Random(args.seed)
    # (direction, path) -> rows of (steps, gmacs, microseconds); and per key
    # the measured times, to judge the fit.
    rows: dict[tuple[str, str], list[tuple[list[float], float]]] = defaultdict(list)
    measured: list[tuple[str, list[float], dict[str, float]]] = []
    done = 0
    while done < args.sizes:
        t, b, f, s = draw(rng, 17, 512), draw(rng, 1, 512), draw(rng, 16, 512), draw(rng, 16, 1024)
        if t * b * 3 * s * (s + f) > args.max_gmacs * 1e9:
            continue
        done += 1
        print(f"[{done}/{args.sizes}] T={t} B={b} F={f} S={s}", flush=True)
        lltm.clear_path_choices()
        layer = lltm.LLTMLayer(f, s, dtype=dtype)
        x = torch.randn(t, b, f, dtype=dtype)
        layer(x)[0].sum().backward()
        with torch.inference_mode():
            layer(x)
        features = [s * s / 1e6, t, t * 1e-9 * b * 3 * s * s, 1e-9 * t * b * 3 * s * f]
        for choice in lltm.path_choices():
            direction = choice["key"].split("|")[2]
            times = dict(choice["times_us"])
            for path, us in times.items():
                rows[direction, path].append((features, us))
            measured.append((direction, features, times))
    fitted: dict[tuple[str, str], list[float]] = {}
    for (direction, path), data in sorted(rows.items()):
        xs = torch.tensor([x for x, _ in data], dtype=torch.float64)
        ys = torch.tensor([us for _, us in data], dtype=torch.float64)
        # Relative errors count alike at every size: rows weighted by 1 / us.
        w = 1 / ys
        coef = torch.linalg.lstsq(xs * w[:, None], ys * w).solution.clamp_min(0).tolist()
        fitted[direction, path] = coef
        print(
            f"{direction:9} {path:7} per_call {coef[0]:9.2f}  per_step {coef[1]:7.2f}  "
            f"per_gmac {coef[2]:10.1f}  per_io_gmac {coef[3]:10.1f}  ({len(data)} blocks)"
        )
    for direction in sorted({d for d, _ in fitted}):
        picks = 0
        worst = 0.0
        cases = [m for m in measured if m[0] == direction]
        for _, features, times in cases:
            model = {
                p: sum(c * x for c, x in zip(fitted[direction, p], features, strict=True))
                for p in times
            }
            pick = min(model, key=model.__getitem__)
            picks += pick == min(times, key=times.__getitem__)
            worst = max(worst, times[pick] / min(times.values()))
        print(
            f"{direction}: the model picks the fastest in {picks} of {len(cases)}, "
            f"its pick at worst {worst:.2f}x the fastest"
        )
        for path in sorted({p for _, _, times in cases for p in times}):
            ratios = [times[path] / min(times.values()) for _, _, times in cases]
            wins = sum(r == 1 for r in ratios)
            print(f"  {path} alone: fastest in {wins}, at worst {max(ratios):.2f}x the fastest")


if __name__ == "__main__":
    main()
