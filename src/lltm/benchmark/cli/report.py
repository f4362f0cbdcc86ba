"""The JSON reports of both benchmarks: their config, their summaries, and where they go.

A report is ``{"config": ..., "results": [...]}``, plus the summaries of a
sequence run. ``--json PATH`` writes it beside the printed tables;
``--json -`` prints it instead of them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import lltm

from .. import sequence as seq

__all__ = [
    "cell_config",
    "emit",
    "save_partial",
    "sequence_config",
    "sequence_report",
    "sweep_report",
]


def _environment(*, tf32: bool = False) -> dict[str, Any]:
    """What the times ran on: torch, its threads, the GPU, lltm's build (``tf32``: its switches)."""
    switches = (
        {
            "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }
        if tf32
        else {}
    )
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **switches,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "lltm": lltm.build_info(),
    }


def cell_config(args: argparse.Namespace) -> dict[str, Any]:
    """The cell benchmark's config: its sizes, dtype, grads, iterations and environment."""
    return {
        "sizes": [list(s) for s in args.sizes],
        "dtype": args.dtype,
        "grad": args.grad,
        "runs": args.runs,
        "warmup": args.warmup,
        "rounds": args.rounds,
        **_environment(tf32=True),
    }


def sequence_config(
    args: argparse.Namespace, options: dict[str, Any], layer_options: seq.LayerOptions
) -> dict[str, Any]:
    """The sequence benchmark's config: the mode, what was timed, ``options`` and environment.

    ``options`` are :func:`lltm.benchmark.sequence.run_sequence`'s; the
    caller adds the sizes (or grid) and the variants.
    """
    return {
        "mode": "sweep" if args.sweep else "sequence",
        "timed": "the forward alone under torch.inference_mode()"
        if args.inference
        else "forward + backward of output.sum()",
        "precisions": args.precision,
        **{k: v for k, v in options.items() if k != "variants"},
        # The seed only where lengths were drawn; how they were drawn, packed.
        **layer_options.fields(),
        "lengths": "uniform in [ceil(T/4), T]" if args.packed else None,
        **_environment(),
    }


def sweep_report(
    config: dict[str, Any], results: list[dict[str, Any]], *, packed: bool
) -> dict[str, Any]:
    """A sweep's report: its rows, their summary and, ``packed``, the packed goal's summary.

    Beside forced paths, also the default path choice's summary against them.
    """
    report = {"config": config, "results": results, "summary": seq.sweep_summary(results)}
    if packed:
        report["packed_summary"] = seq.packed_summary(results)
    if (forced := seq.forced_summary(results))["precisions"]:
        report["forced_summary"] = forced
    return report


def sequence_report(
    config: dict[str, Any],
    results: list[dict[str, Any]],
    devices: Sequence[torch.device],
    *,
    packed: bool,
) -> dict[str, Any]:
    """A run at sizes: its rows and, per device, the summaries over its sizes and precisions.

    ``packed``: also the packed goal's; beside forced paths, also the default
    path choice's against them.
    """
    by_device = {str(d): [r for r in results if r["device"] == str(d)] for d in devices}
    report = {
        "config": config,
        "results": results,
        "summary": {d: seq.sweep_summary(rows) for d, rows in by_device.items()},
    }
    if packed:
        report["packed_summary"] = {d: seq.packed_summary(rows) for d, rows in by_device.items()}
    forced = {d: seq.forced_summary(rows) for d, rows in by_device.items()}
    if any(f["precisions"] for f in forced.values()):
        report["forced_summary"] = forced
    return report


def save_partial(config: dict[str, Any], rows: list[dict[str, Any]], path: str | None) -> None:
    """Write the rows so far to ``--json``'s file (not to stdout): a run cut short keeps them."""
    if path and path != "-":
        Path(path).write_text(json.dumps({"config": config, "results": rows}))


def emit(report: dict[str, Any], path: str | None) -> bool:
    """Write ``report`` where ``--json`` says; whether the tables are still to be printed.

    ``-`` prints the JSON on stdout, in place of the tables.
    """
    text = json.dumps(report, indent=2)
    if path == "-":
        print(text)  # noqa: T201
        return False
    if path:
        Path(path).write_text(text)
    return True
