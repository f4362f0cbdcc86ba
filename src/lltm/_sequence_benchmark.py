"""The sequence benchmark: an LLTM layer over T steps against Python loops and ``nn.LSTM``.

``python -m lltm.benchmark --sequence T`` runs it; ``python -m
lltm._sequence_benchmark`` too, on its own. Each timed iteration runs the
forward over all T steps and the backward of ``output.sum()``, and on CUDA
synchronizes before each clock read. Variants:

* ``loop-python``: a Python loop of :func:`lltm.reference.lltm_reference`,
  the eager cell, differentiated by autograd;
* ``loop-lltm``: a Python loop of :class:`lltm.LLTM`;
* ``layer``: :class:`lltm.LLTMLayer`, one op call per direction; on CUDA
  also ``layer-persistent`` and ``layer-steps``, with ``LLTM_SEQUENCE_PATH``
  forcing each path (``layer`` takes the one ``auto`` picks);
* ``nn.LSTM``: PyTorch's LSTM at the same sizes (cuDNN on the GPU, oneDNN
  on the CPU), which does the work of 4 gates to the LLTM's 3.

All variants start from the same weights (``nn.LSTM`` from its own) and
take turns in rounds, so that a change in machine load affects them alike.
float32 is computed alike by all: cuDNN's ``torch.backends.cudnn.allow_tf32``
(on by default) is set to ``torch.backends.cuda.matmul.allow_tf32`` (off by
default), which lltm's GEMMs follow, for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

import lltm
from lltm.reference import lltm_reference

__all__ = ["format_sequence_table", "main", "run_sequence"]

Step = Callable[[], Tensor]


@contextlib.contextmanager
def _sequence_path(path: str | None) -> Iterator[None]:
    """Set LLTM_SEQUENCE_PATH for the calls inside (read by the op at each call)."""
    if path is None:
        yield
        return
    old = os.environ.get("LLTM_SEQUENCE_PATH")
    os.environ["LLTM_SEQUENCE_PATH"] = path
    try:
        yield
    finally:
        if old is None:
            del os.environ["LLTM_SEQUENCE_PATH"]
        else:
            os.environ["LLTM_SEQUENCE_PATH"] = old


def _variants(
    steps: int, batch: int, features: int, state: int, dtype: torch.dtype, device: torch.device
) -> dict[str, tuple[Step, str | None, list[Tensor]]]:
    """Each variant: (one forward + backward, LLTM_SEQUENCE_PATH, parameters to clear)."""
    gen = torch.Generator(device="cpu").manual_seed(42)
    x = torch.randn(steps, batch, features, generator=gen).to(device=device, dtype=dtype)
    layer = lltm.LLTMLayer(features, state).to(device=device, dtype=dtype)
    cell = lltm.LLTM(features, state).to(device=device, dtype=dtype)
    with torch.no_grad():
        cell.weights.copy_(layer.weights_l0)
        cell.bias.copy_(layer.bias_l0)
    lstm = nn.LSTM(features, state).to(device=device, dtype=dtype)
    zeros = torch.zeros(batch, state, device=device, dtype=dtype)

    def loop(step: Callable[..., tuple[Tensor, Tensor]]) -> Step:
        def run() -> Tensor:
            h, c = zeros, zeros
            outputs = []
            for x_t in x:
                h, c = step(x_t, cell.weights, cell.bias, h, c)
                outputs.append(h)
            return torch.stack(outputs)

        return run

    variants: dict[str, tuple[Step, str | None, list[Tensor]]] = {
        "loop-python": (loop(lltm_reference), None, list(cell.parameters())),
        "loop-lltm": (loop(lltm.lltm), None, list(cell.parameters())),
        "layer": (lambda: layer(x)[0], None, list(layer.parameters())),
    }
    if device.type == "cuda":
        variants["layer-persistent"] = (lambda: layer(x)[0], "persistent", [])
        variants["layer-steps"] = (lambda: layer(x)[0], "steps", [])
    variants["nn.LSTM"] = (lambda: lstm(x)[0], None, list(lstm.parameters()))
    return variants


@contextlib.contextmanager
def _same_float32_precision() -> Iterator[None]:
    """Set cuDNN's TF32 switch to the matmuls' for the calls inside."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = old


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_sequence(
    steps: int,
    batch: int,
    features: int,
    state: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    runs: int = 20,
    *,
    warmup: int = 3,
    rounds: int = 5,
    variants: Sequence[str] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Time forward + backward of every variant over ``steps`` steps.

    Args:
        steps: T, the sequence length.
        batch: B.
        features: F, the input features.
        state: S, the state size.
        dtype: of the inputs and parameters.
        device: where to run.
        runs: timed iterations per variant, in ``rounds`` turns.
        warmup: untimed iterations per variant first.
        rounds: how often the variants take turns.
        variants: a subset of the variant names (default: all).
        progress: report each round on stderr.

    Returns:
        One dict per variant: ``variant``, ``device``, ``dtype``, ``steps``,
        ``batch``, ``features``, ``state``, ``median_ms``, ``min_ms``,
        ``vs_lstm`` (nn.LSTM's median / this one's: above 1 is faster than
        nn.LSTM) and ``vs_loop_lltm`` (the same against the loop of
        ``lltm.LLTM``); a variant that cannot run here (a path forced where
        it does not fit) has ``error`` instead of times.
    """
    with _same_float32_precision():
        return _run_sequence(
            steps, batch, features, state, dtype, device, runs, warmup, rounds, variants, progress
        )


def _run_sequence(
    steps: int,
    batch: int,
    features: int,
    state: int,
    dtype: torch.dtype,
    device: str | torch.device,
    runs: int,
    warmup: int,
    rounds: int,
    variants: Sequence[str] | None,
    progress: bool,
) -> list[dict[str, Any]]:
    device = torch.device(device)
    cases = _variants(steps, batch, features, state, dtype, device)
    names = list(variants) if variants else list(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        msg = f"unknown variants {unknown}; choose from {list(cases)}"
        raise ValueError(msg)
    samples: dict[str, list[float]] = {n: [] for n in names}
    errors: dict[str, str] = {}

    def iterate(name: str, n: int, record: bool) -> None:
        step, path, params = cases[name]
        with _sequence_path(path):
            for _ in range(n):
                for p in params:
                    p.grad = None
                _sync(device)
                t0 = time.perf_counter()
                step().sum().backward()
                _sync(device)
                if record:
                    samples[name].append(time.perf_counter() - t0)

    for name in names:
        try:
            iterate(name, max(1, warmup), record=False)
        except RuntimeError as e:  # a forced path that does not fit
            errors[name] = str(e).splitlines()[0]
    live = [n for n in names if n not in errors]
    rounds = max(1, min(rounds, runs))
    start = time.perf_counter()
    for r in range(rounds):
        n = runs // rounds + (1 if r < runs % rounds else 0)
        for name in live:
            iterate(name, n, record=True)
        if progress:
            print(  # noqa: T201
                f"T={steps} B={batch} F={features} S={state} {dtype} {device}: "
                f"round {r + 1}/{rounds} ({time.perf_counter() - start:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    medians = {n: statistics.median(samples[n]) for n in live}
    results = []
    for name in names:
        row: dict[str, Any] = {
            "variant": name,
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "steps": steps,
            "batch": batch,
            "features": features,
            "state": state,
            "tf32": torch.backends.cuda.matmul.allow_tf32,
        }
        if name in errors:
            row["error"] = errors[name]
        else:
            row["median_ms"] = medians[name] * 1e3
            row["min_ms"] = min(samples[name]) * 1e3
            for key, base in (("vs_lstm", "nn.LSTM"), ("vs_loop_lltm", "loop-lltm")):
                row[key] = medians[base] / medians[name] if base in medians else None
        results.append(row)
    return results


def format_sequence_table(results: Sequence[dict[str, Any]]) -> str:
    """Render :func:`run_sequence`'s results as a fixed-width table."""
    header = (
        f"{'T,B,F,S':<18}{'dtype':<10}{'variant':<18}{'median ms':>11}{'min ms':>10}"
        f"{'vs LSTM':>9}{'vs loop':>9}"
    )
    lines = [header, "-" * len(header)]

    def ratio(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "-"

    for r in results:
        size = f"{r['steps']},{r['batch']},{r['features']},{r['state']}"
        if "error" in r:
            lines.append(f"{size:<18}{r['dtype']:<10}{r['variant']:<18}  n/a: {r['error']}")
            continue
        lines.append(
            f"{size:<18}{r['dtype']:<10}{r['variant']:<18}{r['median_ms']:>11.3f}"
            f"{r['min_ms']:>10.3f}{ratio(r['vs_lstm']):>9}{ratio(r['vs_loop_lltm']):>9}"
        )
    return "\n".join(lines)


_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: one size, or several with repeated ``--size T,B,F,S``."""
    parser = argparse.ArgumentParser(
        prog="python -m lltm._sequence_benchmark",
        description="Time an LLTM layer over T steps (forward + backward) against Python "
        "loops of the cell and nn.LSTM.",
    )
    parser.add_argument(
        "--size",
        action="append",
        metavar="T,B,F,S",
        help="steps, batch, features, state (repeatable; default 64,16,32,128)",
    )
    parser.add_argument("-d", "--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), action="append")
    parser.add_argument("-r", "--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", type=lambda s: s.split(","), default=None)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.size or ["64,16,32,128"]]
    results = []
    for size in sizes:
        if len(size) != 4:
            parser.error(f"--size {size}: expected T,B,F,S")
        for dtype in args.dtype or ["float32"]:
            results += run_sequence(
                *size,
                dtype=_DTYPES[dtype],
                device=args.device,
                runs=args.runs,
                warmup=args.warmup,
                variants=args.variants,
            )
    print(  # noqa: T201
        f"LLTM layer over T steps, forward + backward of output.sum(); torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, TF32 "
        f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'} (cuDNN too)"
        f"{', ' + torch.cuda.get_device_name() if args.device.startswith('cuda') else ''}\n"
        "vs LSTM = nn.LSTM's median / the variant's (above 1: faster than nn.LSTM); "
        "vs loop = the lltm.LLTM loop's median / the variant's\n"
    )
    print(format_sequence_table(results))  # noqa: T201
    if args.json:
        with open(args.json, "w") as f:  # noqa: PTH123
            json.dump({"torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
