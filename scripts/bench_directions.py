r"""A bidirectional LLTMLayer with its directions apart, together, a call each and by rule, vs nn.LSTM.

    python scripts/bench_directions.py --threads 16 --grid
    python scripts/bench_directions.py --threads 16 --seed 67 [--training] [--dtype bfloat16]
    python scripts/bench_directions.py --threads 2 --sizes "1,87,737,1086"

On the CPU, one process, the variants interleaved over rounds (each round
starts at the next variant): ``nn.LSTM``, the layer with
``LLTM_DIRECTIONS=apart``, ``=together`` (one op call, its directions on a
thread each or their steps together), ``=calls`` (an op call per direction)
and unset (the rules: the layer's, then ``Engine::together``), read at every
call. ``--grid`` runs T = 40, F = 32 over batches 1-64 and states 16-512,
the grid that placed the together rule's line; ``--sizes`` the sizes given;
otherwise the benchmark's random sizes (``--seed``, capped at 2 GMAC).
Prints one Markdown row per size: the medians (ms), the ratios over
``nn.LSTM`` and the plans the rule ran (docs/performance.md, "Both
directions' steps together" and "A call per direction").
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

import lltm
from lltm.benchmark.sequence.sizes import draw_sizes

MODES = {
    "nn.LSTM": None,
    "apart": "apart",
    "together": "together",
    "calls": "calls",
    "auto": "",
}


def parse() -> argparse.Namespace:
    """The command line's options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=67, help="the random sizes' seed")
    p.add_argument("--count", type=int, default=12, help="how many random sizes")
    p.add_argument("--grid", action="store_true", help="the step-size grid, not random sizes")
    p.add_argument("--sizes", help="T,B,F,S[;T,B,F,S...]: these sizes, not random ones")
    p.add_argument("--training", action="store_true", help="forward and backward")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--budget", type=float, default=0.25, help="seconds a variant a size, about")
    return p.parse_args()


def main() -> None:
    """Print the table: one row per size."""
    args = parse()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.grid:
        sizes = [(40, b, 32, s) for b in (1, 4, 16, 64) for s in (16, 32, 64, 128, 256, 512)]
    elif args.sizes:
        sizes = [tuple(int(n) for n in size.split(",")) for size in args.sizes.split(";")]
    else:
        sizes = draw_sizes(args.count, args.seed, max_gmacs=2.0).sizes
    mode = "training" if args.training else "inference"
    print(
        f"threads={args.threads} {args.dtype} {mode} "
        + ("grid" if args.grid else f"seed={args.seed}")
    )
    print(
        "| T,B,F,S | step MACs | nn.LSTM ms | apart ms | together ms | calls ms | auto ms "
        "| apart | together | calls | auto | auto's plans |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
    for size in sizes:
        print(row(size, dtype, args), flush=True)
    os.environ.pop("LLTM_DIRECTIONS", None)


def row(size: tuple[int, int, int, int], dtype: torch.dtype, args: argparse.Namespace) -> str:
    """One size's row: the variants timed side by side, and the plans auto ran."""
    steps, batch, features, state = size
    torch.manual_seed(0)
    layer = lltm.LLTMLayer(features, state, bidirectional=True, dtype=dtype)
    lstm = torch.nn.LSTM(features, state, bidirectional=True, dtype=dtype)
    x = torch.randn(steps, batch, features, dtype=dtype, requires_grad=args.training)

    def call(module: torch.nn.Module) -> None:
        if args.training:
            module(x)[0].sum().backward()
        else:
            with torch.inference_mode():
                module(x)

    def runner(name: str) -> Callable[[], None]:
        setting = MODES[name]

        def run() -> None:
            if setting is None:
                os.environ.pop("LLTM_DIRECTIONS", None)
                call(lstm)
            else:
                os.environ["LLTM_DIRECTIONS"] = setting
                call(layer)

        return run

    runs = {name: runner(name) for name in MODES}
    # Warm-up (the choices are measured here), and the calls that fill a sample.
    reps = {}
    for name, run in runs.items():
        run()
        run()
        start = time.perf_counter()
        run()
        took = max(time.perf_counter() - start, 1e-6)
        reps[name] = max(1, min(200, int(args.budget / args.rounds / took)))
    times: dict[str, list[float]] = {name: [] for name in MODES}
    order = list(MODES)
    for r in range(args.rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            start = time.perf_counter()
            for _ in range(reps[name]):
                runs[name]()
            times[name].append((time.perf_counter() - start) / reps[name] * 1e3)
    med = {name: statistics.median(t) for name, t in times.items()}
    os.environ["LLTM_DIRECTIONS"] = ""
    ran = lltm.paths_that_ran(lambda: call(layer))
    plans = ",".join(sorted(set(ran["forward"])))
    if args.training:
        plans += " / " + ",".join(sorted(set(ran["backward"])))
    lstm_ms = med["nn.LSTM"]
    layer_modes = [name for name in MODES if name != "nn.LSTM"]
    ms = " | ".join(f"{med[n]:.3f}" for n in layer_modes)
    ratios = " | ".join(f"{lstm_ms / med[n]:.2f}x" for n in layer_modes)
    return (
        f"| {steps},{batch},{features},{state} | {batch * 3 * state * state} | {lstm_ms:.3f} "
        f"| {ms} | {ratios} | {plans} |"
    )


if __name__ == "__main__":
    main()
