"""The runs of ``python -m lltm.benchmark``: from the parsed options to the printed tables."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from .. import sequence as seq
from .._common import devices, platform, progress
from ..cell import format_table, plot, run
from . import report
from .args import parse_args

__all__ = ["main", "main_sequence"]


def _sweep(
    args: argparse.Namespace,
    config: dict[str, Any],
    options: dict[str, Any],
    device: torch.device,
) -> tuple[dict[str, Any], str]:
    """``--sequence --sweep``, on the grid or at the drawn sizes: its report and tables."""
    drawn: seq.RandomSizes | None = args.random_sizes
    if drawn is not None:
        config.update(sizes=[list(s) for s in drawn.sizes], random=drawn.fields())
        # Up front: a long run says what it will measure before it starts.
        progress("\n".join(drawn.describe()))
    else:
        config.update(steps=args.steps, batches=args.batches, fs=[list(p) for p in args.fs])
    config.update(variants=args.variants, device=args.device)
    # Drawn sizes: no grid (the steps, batches and fs are None).
    results = seq.run_sweep(
        args.steps or (),
        args.batches or (),
        args.fs or (),
        args.precision,
        device,
        # After every point: a sweep cut short keeps what it measured.
        on_point=lambda rows: report.save_partial(config, rows, args.json),
        sizes=drawn.sizes if drawn is not None else None,
        **options,
    )
    text = seq.format_sweep_tables(results)
    return report.sweep_report(config, results, packed=args.packed), text


def _at_sizes(
    args: argparse.Namespace,
    config: dict[str, Any],
    options: dict[str, Any],
    chosen: Sequence[torch.device],
) -> tuple[dict[str, Any], str]:
    """``--sequence T`` or ``--sequence --sizes``: every device x size x precision."""
    config.update(sizes=[list(s) for s in args.sizes], variants=args.variants)
    results = [
        row
        for device in chosen
        for size in args.sizes
        for precision in args.precision
        for row in seq.run_sequence(*size, device=device, precision=precision, **options)
    ]
    text = seq.format_sequence_table(results)
    if summary := seq.format_sequence_summary(results):
        text += "\n\n" + summary
    return report.sequence_report(config, results, chosen, packed=args.packed), text


def main_sequence(args: argparse.Namespace) -> None:
    """``--sequence``: the layer over T steps, per device, size and precision, or a sweep."""
    layer_options = seq.LayerOptions(args.bidirectional, args.packed, args.lengths_seed or 0)
    options = {
        "runs": args.runs,
        "seconds": args.seconds,
        "max_runs": args.max_runs,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "variants": args.variants,
        "gpu_time": not args.no_gpu_time,
        "launches": args.launches,
        "bidirectional": layer_options.bidirectional,
        "packed": layer_options.packed,
        "lengths_seed": layer_options.lengths_seed,
        "inference": args.inference,
    }
    config = report.sequence_config(args, options, layer_options)
    chosen = _devices(args)  # the sweep's is one, checked by parse_args
    if args.sweep:
        written, text = _sweep(args, config, options, chosen[0])
    else:
        written, text = _at_sizes(args, config, options, chosen)
    if report.emit(written, args.json):
        for device in chosen:
            header = seq.describe(
                args.precision,
                device,
                layer_options,
                inference=args.inference,
                drawn=args.random_sizes,
            )
            print(header)  # noqa: T201
        print(text, flush=True)  # noqa: T201
    # Last: without matplotlib this stops, and the tables are out already.
    if args.plot:
        seq.plot_sweep(written["results"], args.plot)


def _devices(args: argparse.Namespace) -> list[torch.device]:
    """``--device``'s devices; a note where ``--launches`` has no GPU to count on."""
    chosen = devices(args.device)
    if args.launches and all(d.type != "cuda" for d in chosen):
        progress(f"note: --launches counts GPU operations: none on {', '.join(map(str, chosen))}")
    return chosen


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print the table (or JSON)."""
    args = parse_args(argv)
    if args.sequence is not None:
        main_sequence(args)
        return
    results = run(args, _devices(args))
    config = report.cell_config(args)
    if args.plot:
        plot(results, args.plot)
    if not report.emit({"config": config, "results": [asdict(r) for r in results]}, args.json):
        return
    print(  # noqa: T201
        f"LLTM training step: forward, then (new_h.sum() + new_cell.sum()).backward(); "
        f"{platform(config['gpu'])}, TF32 "
        f"{'on' if config['allow_tf32'] else 'off'}\n"
        "microseconds per iteration (medians); speedup = python / variant, "
        "x floor = variant / floor, on fwd+bwd\n"
    )
    print(format_table(results))  # noqa: T201
