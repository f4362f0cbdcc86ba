"""The checks of the parsed options: what a mode cannot honour is refused, its defaults filled in.

A flag that the chosen mode cannot honour is refused with an error that
names it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import lltm

from .. import sequence as seq
from ..cell import VARIANTS

__all__ = ["check_cell_args", "check_sequence_args"]

# Filled in per mode, after the checks: None in the parser tells a given value from a default.
_SHAPE_DEFAULTS: dict[str, Any] = {"batch_size": 16, "features": 32, "state_size": 128}
_CELL_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",
    "grad": "params",
    "seconds": 2.0,
    "warmup": 20,
    "rounds": 10,
    "max_runs": 1000,
}
_SEQUENCE_DEFAULTS: dict[str, Any] = {"seconds": 2.0, "warmup": 3, "rounds": 5, "max_runs": 1000}
_SWEEP_DEFAULTS = {k: seq.SWEEP_OPTIONS[k] for k in ("seconds", "warmup", "rounds", "max_runs")}


def _given(args: argparse.Namespace, *names: str) -> list[str]:
    """The options among ``names`` (dests) given on the command line, spelt as options."""
    # By identity: a given 0 (--lengths-seed 0) is given, though 0 == False.
    return [
        f"--{n.replace('_', '-')}"
        for n in names
        if getattr(args, n) is not None and getattr(args, n) is not False
    ]


def _fill(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    """Set the options of ``defaults`` that the command line left out."""
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def _check_variants(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    known: Sequence[str],
    mode: str = "",
) -> None:
    """Refuse a ``--variants`` entry that is not in ``known``."""
    if unknown := [v for v in args.variants or [] if v not in known]:
        parser.error(
            f"--variants: unknown {', '.join(unknown)}; {mode}choose from {', '.join(known)}"
        )


def _shape_or_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Any]:
    """``--sizes``, or the one BATCHxFEATURESxSTATE of -b/-f/-s; both at once are refused."""
    shape = _given(args, "batch_size", "features", "state_size")
    if args.sizes is not None and shape:
        parser.error(f"{', '.join(shape)} and --sizes: give one")
    _fill(args, _SHAPE_DEFAULTS)
    return args.sizes or [(args.batch_size, args.features, args.state_size)]


def check_cell_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse the sequence-only options, then fill in the cell benchmark's defaults."""
    sequence_only = ("sweep", "steps", "batches", "fs", "precision", "no_gpu_time", "inference")
    random = ("random", "seed", "random_range", "max_gmacs")
    if wrong := _given(args, *sequence_only, *random, "bidirectional", "packed", "lengths_seed"):
        parser.error(f"{', '.join(wrong)}: only with --sequence")
    _fill(args, _CELL_DEFAULTS)
    args.sizes = _shape_or_sizes(parser, args)
    if any(len(size) != 3 for size in args.sizes):
        parser.error("--sizes: expected BATCHxFEATURESxSTATE (STEPSx... only with --sequence)")
    _check_variants(parser, args, VARIANTS)
    args.variants = args.variants or list(VARIANTS)


def check_sequence_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what ``--sequence`` cannot honour, then fill in its defaults.

    Sets ``args.precision`` (a list), ``args.sizes`` (STEPSxBATCHxFEATURESxSTATE
    tuples, without ``--sweep``) and, with ``--sweep``, ``steps``, ``batches``
    and ``fs``.
    """
    if args.grad is not None:
        parser.error("--grad: --sequence always differentiates the input and every parameter")
    if args.dtype is not None and args.precision is not None:
        parser.error("--dtype and --precision: give one (--precision takes a list)")
    if args.warmup == 0:
        parser.error("--warmup 0 with --sequence: every variant's first call is untimed")
    args.precision = args.precision or [args.dtype or "float32"]
    _check_variants(parser, args, seq.VARIANTS, "with --sequence ")
    _check_options(parser, args)
    _check_random_args(parser, args)
    check = _check_sweep_args if args.sweep else _check_sizes_args
    _fill(args, check(parser, args))


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse variants that ``--bidirectional``/``--packed`` rule out; set ``args.lengths_seed``.

    The seed stays None unpacked, so that the results record none.
    """
    if args.lengths_seed is not None and not args.packed:
        parser.error("--lengths-seed: only with --packed (the seed of its lengths)")
    if args.packed and args.lengths_seed is None:
        args.lengths_seed = 0
    flags = [
        f for f, on in (("--bidirectional", args.bidirectional), ("--packed", args.packed)) if on
    ]
    for name in args.variants or []:
        if name == "layer-padded" and not args.packed:
            parser.error("--variants layer-padded: only with --packed (the packed batch, padded)")
        if name.startswith("loop-") and flags:
            parser.error(
                f"--variants {name} with {', '.join(flags)}: the loops run one direction "
                "over every step"
            )


def _check_random_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--random``'s options without it; ``--random`` without ``--sweep``, or with a grid.

    Sets ``args.random_sizes`` to None; :func:`_check_sweep_args` draws them.
    """
    args.random_sizes = None
    if args.random is None:
        if wrong := _given(args, "seed", "random_range", "max_gmacs"):
            parser.error(f"{', '.join(wrong)}: only with --random (the sizes drawn)")
        return
    if not args.sweep:
        parser.error("--random: only with --sweep (it draws the sweep's sizes)")
    if wrong := _given(args, "steps", "batches", "fs"):
        parser.error(
            f"{', '.join(wrong)} and --random: the sizes are drawn (--random-range sets the ranges)"
        )
    if args.plot:
        parser.error("--plot with --random: the heat map needs the grid of T x B")


def _draw_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Draw ``--random``'s sizes into ``args.random_sizes``, capped as ``args.device`` wants."""
    cap, note = args.max_gmacs, ""
    if cap is None and args.device.split(":")[0] == "cpu":
        # Sizes of up to 2000 x 4096 x 2048 would take hours on a CPU.
        cap, note = seq.CPU_MAX_GMACS, "the CPU's default"
    if cap == math.inf:
        cap = None
    try:
        args.random_sizes = seq.draw_sizes(
            args.random, args.seed or 0, args.random_range, cap, cap_note=note
        )
    except ValueError as e:
        given = "" if args.max_gmacs is None else f" {args.max_gmacs:g}"
        parser.error(f"--max-gmacs{given}: {e}")


def _check_sweep_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``--sequence --sweep``: one device, the grid from --steps/--batches/--fs; its defaults.

    With ``--random``, the sizes drawn instead of the grid (``args.random_sizes``).
    """
    if args.sequence:
        parser.error("--sequence T and --sweep: the sweep takes its T from --steps")
    if wrong := _given(args, "batch_size", "features", "state_size", "sizes"):
        parser.error(f"{', '.join(wrong)} and --sweep: the sweep takes --batches and --fs")
    if args.device == "auto":
        args.device = "cuda" if "cuda" in lltm.available_backends() else "cpu"
    if "," in args.device:
        parser.error(f"--device {args.device}: --sweep runs on one device")
    if args.random is not None:
        args.seed = args.seed or 0
        _draw_sizes(parser, args)
        args.variants = args.variants or list(
            seq.PACKED_VARIANTS if args.packed else seq.SWEEP_VARIANTS
        )
        return _SWEEP_DEFAULTS
    # The packed goal has a grid of its own: its default.
    packed = args.packed
    args.steps = args.steps or list(seq.PACKED_STEPS if packed else seq.SWEEP_STEPS)
    args.batches = args.batches or list(seq.PACKED_BATCHES if packed else seq.SWEEP_BATCHES)
    args.fs = args.fs or list(seq.PACKED_FS if packed else seq.SWEEP_FS)
    args.variants = args.variants or list(seq.PACKED_VARIANTS if packed else seq.SWEEP_VARIANTS)
    return _SWEEP_DEFAULTS


def _check_sizes_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``--sequence T`` or ``--sequence --sizes TxBxFxS``: set ``args.sizes`` to 4-tuples."""
    if wrong := _given(args, "steps", "batches", "fs"):
        parser.error(f"{', '.join(wrong)}: only with --sweep")
    if args.plot:
        parser.error("--plot with --sequence: only with --sweep (a heat map of the sweep)")
    sizes = _shape_or_sizes(parser, args)
    if args.sequence:
        if any(len(size) != 3 for size in sizes):
            parser.error(
                f"--sequence {args.sequence} and --sizes STEPSx...: give T once "
                "(--sizes BATCHxFEATURESxSTATE, or --sequence without T)"
            )
        sizes = [(args.sequence, *size) for size in sizes]
    elif args.sizes is None or any(len(size) != 4 for size in sizes):
        parser.error(
            "--sequence without T: give --sweep, or --sizes STEPSxBATCHxFEATURESxSTATE[,...]"
        )
    args.sizes = sizes
    return _SEQUENCE_DEFAULTS
