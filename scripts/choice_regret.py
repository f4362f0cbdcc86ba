r"""How close the CPU's measured path choice comes to the best path, size by size.

    python scripts/choice_regret.py --threads 2 --count 40 --seed 41 [--picks 3]

For each random size (log-uniform T 1..64, B 1..512, F 16..1024, S 32..1024,
at most 0.2 GMAC: short blocks, where a candidate's run is about as long as
the noise between two runs), in inference and in training:

- the truth: every CPU path forced (``LLTM_SEQUENCE_PATH``), the forward and
  the backward timed apart, the paths taking turns over ``--rounds`` rounds,
  each timed call right after an untimed one of its own (the steady state of
  a loop of calls); medians in microseconds;
- the choice: ``--picks`` times, the kept choices cleared and one call made,
  whose forward (and backward) plans are the picks;
- a pick's regret: the truth of the picked forward (plus backward) over the
  best forward's (plus the best backward's).

Prints each size's truth and picks, then per mode the worst, the 90th
percentile and the mean regret, and how many picks were past 1.10
(docs/performance.md, "Timing the candidates").
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import statistics
import time

import torch

import lltm


def parse() -> argparse.Namespace:
    """The command line's options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--count", type=int, default=40, help="how many random sizes")
    p.add_argument("--seed", type=int, default=41, help="the random sizes' seed")
    p.add_argument("--picks", type=int, default=3, help="fresh choices per size and mode")
    p.add_argument("--rounds", type=int, default=25, help="rounds of the forced paths' truth")
    return p.parse_args()


def draw(rng: random.Random) -> tuple[int, int, int, int]:
    """A size T, B, F, S of at most 0.2 GMAC in its forward."""

    def log_uniform(lo: int, hi: int) -> int:
        return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))

    while True:
        t, b, f, s = (
            log_uniform(1, 64),
            log_uniform(1, 512),
            log_uniform(16, 1024),
            log_uniform(32, 1024),
        )
        if t * b * 3 * s * (s + f) < 2e8:
            return t, b, f, s


def timed_call(layer: lltm.LLTMLayer, x: torch.Tensor, train: bool) -> tuple[float, float]:
    """One call's forward and backward microseconds (no backward in inference)."""
    start = time.perf_counter()
    if not train:
        with torch.no_grad():
            layer(x)
        return (time.perf_counter() - start) * 1e6, 0.0
    loss = layer(x)[0].sum()
    middle = time.perf_counter()
    loss.backward()
    return (middle - start) * 1e6, (time.perf_counter() - middle) * 1e6


def truth(
    layer: lltm.LLTMLayer, x: torch.Tensor, train: bool, paths: list[str], rounds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Each path's median forward and backward microseconds, forced, the paths taking turns."""
    times: dict[str, tuple[list[float], list[float]]] = {p: ([], []) for p in paths}
    for r in range(rounds):
        for p in paths[r % len(paths) :] + paths[: r % len(paths)]:
            os.environ["LLTM_SEQUENCE_PATH"] = p
            timed_call(layer, x, train)
            forward, backward = timed_call(layer, x, train)
            times[p][0].append(forward)
            times[p][1].append(backward)
    del os.environ["LLTM_SEQUENCE_PATH"]
    return (
        {p: statistics.median(t[0]) for p, t in times.items()},
        {p: statistics.median(t[1]) for p, t in times.items()},
    )


def main() -> None:
    """Print each size's truth and picks, then the regret's summary."""
    args = parse()
    os.environ["LLTM_CACHE_DIR"] = ""
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    paths = [p for p in lltm.sequence_paths("cpu") if not p.startswith("dpbf16")]
    regrets: dict[str, list[float]] = {"inference": [], "training": []}
    for i in range(args.count):
        steps, batch, features, state = draw(rng)
        torch.manual_seed(i)
        layer = lltm.LLTMLayer(features, state)
        x = torch.randn(steps, batch, features, requires_grad=True)
        for mode, values in regrets.items():
            train = mode == "training"
            forward_us, backward_us = truth(layer, x, train, paths, args.rounds)
            best = min(forward_us.values()) + min(backward_us.values())
            picks = []
            for _ in range(args.picks):
                lltm.clear_path_choices()
                ran = lltm.paths_that_ran(functools.partial(timed_call, layer, x, train))
                forward = ran["forward"][0].split("/")[0]
                backward = ran["backward"][0].split("/")[0] if train else None
                cost = forward_us[forward] + (backward_us[backward] if backward else 0.0)
                values.append(cost / best)
                picks.append(f"{forward}{'/' + backward if backward else ''}: {cost / best:.2f}")
            table = " ".join(
                f"{p}={forward_us[p]:.0f}" + (f"+{backward_us[p]:.0f}" if train else "")
                for p in paths
            )
            print(
                f"[{i + 1}/{args.count}] {mode} {steps},{batch},{features},{state}: {table} "
                f"| picks {', '.join(picks)}",
                flush=True,
            )
    print(
        f"{args.threads} threads, {args.count} sizes, seed {args.seed}, {args.picks} picks each; "
        "regret = the pick's truth / the best's"
    )
    for mode, values in regrets.items():
        values.sort()
        p90 = values[int(0.9 * (len(values) - 1))]
        print(
            f"{mode}: n={len(values)} worst {values[-1]:.3f} p90 {p90:.3f} "
            f"mean {statistics.mean(values):.3f} past 1.10: {sum(v > 1.10 for v in values)}"
        )


if __name__ == "__main__":
    main()
