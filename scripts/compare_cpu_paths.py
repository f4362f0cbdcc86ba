"""Each CPU sequence path forced, and the default, against nn.LSTM: a Markdown table.

For each size T,B,F,S (float32, the CPU): forward + backward and the
inference forward (``torch.inference_mode()``) of an LLTMLayer with
LLTM_SEQUENCE_PATH set to each CPU path, unset (the default: the measured
choice), and nn.LSTM, in one process, the variants taking turns for three
rounds. Each cell is the median of five calls, the middle round's value of
three; the last two columns are the default against the best forced path and
nn.LSTM against the default (docs/performance.md, "The CPU's paths").

    python scripts/compare_cpu_paths.py 256,1,40,300 100,8,64,512
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial

import torch

import lltm

PATHS = ("steps", "onednn", "fused")


def median_ms(fn: Callable[[], object], calls: int = 5) -> float:
    """The median wall time of ``calls`` calls after one untimed call, in ms."""
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[calls // 2] * 1e3


def train(module: torch.nn.Module, x: torch.Tensor) -> None:
    """Forward and backward."""
    module(x)[0].sum().backward()


def infer(module: torch.nn.Module, x: torch.Tensor) -> None:
    """The forward under inference mode."""
    with torch.inference_mode():
        module(x)


def main() -> None:
    """Time every variant at every size and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="+", help="T,B,F,S")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        "| T,B,F,S | mode | "
        + " | ".join(PATHS)
        + " | auto (path) | nn.LSTM | auto / best forced | nn.LSTM / auto |"
    )
    print("|---|---|" + "---:|" * (len(PATHS) + 4))
    for size in args.sizes:
        t, b, f, s = map(int, size.split(","))
        x = torch.randn(t, b, f)
        layer = lltm.LLTMLayer(f, s)
        lstm = torch.nn.LSTM(f, s)

        times: dict[str, list[tuple[float, float]]] = {}
        for _ in range(3):
            for variant in (*PATHS, "auto", "nn.LSTM"):
                os.environ["LLTM_SEQUENCE_PATH"] = variant if variant in PATHS else ""
                module = lstm if variant == "nn.LSTM" else layer
                times.setdefault(variant, []).append(
                    (median_ms(partial(train, module, x)), median_ms(partial(infer, module, x)))
                )
        os.environ.pop("LLTM_SEQUENCE_PATH")
        ran_train = lltm.paths_that_ran(partial(train, layer, x))
        ran_infer = lltm.paths_that_ran(partial(infer, layer, x))
        for mode, index, ran in (
            ("train", 0, f"{ran_train['forward'][0]}/{ran_train['backward'][0]}"),
            ("inference", 1, ran_infer["forward"][0]),
        ):
            ms = {v: sorted(r[index] for r in rounds)[1] for v, rounds in times.items()}
            best = min(ms[p] for p in PATHS)
            cells = " | ".join(f"{ms[p]:.2f}" for p in PATHS)
            print(
                f"| {size} | {mode} | {cells} | {ms['auto']:.2f} ({ran}) | {ms['nn.LSTM']:.2f} "
                f"| {ms['auto'] / best:.2f} | {ms['nn.LSTM'] / ms['auto']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
