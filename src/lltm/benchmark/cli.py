"""The command line of ``python -m lltm.benchmark``: one parser for the cell and the sequences.

A flag that the chosen mode cannot honour is refused with an error that
names it; a flag that has no effect on the devices chosen is reported in a
note on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import lltm

from . import sequence as seq
from ._common import DTYPES, devices, platform, progress
from .cell import GRAD_MODES, VARIANTS, format_table, plot, run

__all__ = ["main", "parse_args"]


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "sizes": [list(s) for s in args.sizes],
        "dtype": args.dtype,
        "grad": args.grad,
        "runs": args.runs,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "lltm": lltm.build_info(),
    }


def _at_least(minimum: int, name: str) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (``name`` is what argparse calls it)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            msg = f"must be at least {minimum}, got {value}"
            raise argparse.ArgumentTypeError(msg)
        return value

    # argparse names the type in "invalid <name> value: 'x'".
    parse.__name__ = name
    return parse


_positive = _at_least(1, "_positive")
_non_negative = _at_least(0, "_non_negative")


def _sizes(text: str) -> list[tuple[int, ...]]:
    """BATCHxFEATURESxSTATE[,...]; with ``--sequence``, also STEPSxBATCHxFEATURESxSTATE."""
    sizes = []
    for item in text.split(","):
        try:
            size = tuple(int(v) for v in item.lower().split("x"))
        except ValueError:
            size = ()
        if len(size) not in (3, 4):
            msg = (
                "expected BATCHxFEATURESxSTATE[,...], e.g. 16x32x128,4096x32x128 (with "
                f"--sequence, also STEPSxBATCHxFEATURESxSTATE); got {item!r}"
            )
            raise argparse.ArgumentTypeError(msg)
        if min(size) < 1:
            msg = f"sizes must be at least 1, got {item!r}"
            raise argparse.ArgumentTypeError(msg)
        sizes.append(size)
    return sizes


def _positive_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        msg = f"expected positive integers N[,N...], e.g. 16,64; got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return values


def _fs_list(text: str) -> list[tuple[int, int]]:
    pairs = []
    for item in text.split(","):
        try:
            features, state = (int(v) for v in item.lower().split("x"))
        except ValueError:
            features = state = 0
        if min(features, state) < 1:
            msg = f"expected FEATURESxSTATE[,...], e.g. 32x128,256x512; got {item!r}"
            raise argparse.ArgumentTypeError(msg)
        pairs.append((features, state))
    return pairs


def _random_range(text: str) -> dict[str, tuple[int, int]]:
    """KEY=LO:HI[,...], keys T, B, F, S: the ranges that ``--random`` draws from (inclusive)."""
    ranges: dict[str, tuple[int, int]] = {}
    for item in text.split(","):
        key, _, bounds = item.partition("=")
        key = key.strip().upper()
        low, colon, high = bounds.partition(":")
        try:
            lo, hi = int(low), int(high)
        except ValueError:
            colon = ""
        if key not in seq.RANDOM_RANGES or not colon:
            msg = (
                "expected KEY=LO:HI[,...] with keys T, B, F, S, e.g. T=1:1000,B=1:2048,S=64:1024; "
                f"got {item!r}"
            )
            raise argparse.ArgumentTypeError(msg)
        if key in ranges:
            msg = f"{key} given twice in {text!r}"
            raise argparse.ArgumentTypeError(msg)
        if lo < 1:
            msg = f"sizes must be at least 1, got {item!r}"
            raise argparse.ArgumentTypeError(msg)
        if lo > hi:
            msg = f"{item!r}: LO must be at most HI"
            raise argparse.ArgumentTypeError(msg)
        ranges[key] = (lo, hi)
    return ranges


def _gmacs(text: str) -> float:
    """A cap in GMAC: a number above 0 (``inf``: none)."""
    value = float(text)
    if not value > 0:  # NaN too
        msg = f"must be above 0 (inf: no cap), got {text}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _precision_list(text: str) -> list[str]:
    names = text.split(",")
    unknown = [n for n in names if n not in seq.PRECISIONS]
    if unknown:
        msg = f"unknown {', '.join(unknown)}; choose from {', '.join(seq.PRECISIONS)}"
        raise argparse.ArgumentTypeError(msg)
    return names


# The defaults of the options that the cell and the sequence benchmark share
# but set differently: None in the parser, so that a value given on the
# command line can be told from a default, and then filled in per mode.
# -b/-f/-s: the tutorial's sizes, in both modes.
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


_EPILOG = """\
random off-grid sizes, and inference (the forward alone):
  python -m lltm.benchmark --sequence --sweep --random 50 --seed 1
  python -m lltm.benchmark --sequence --sweep --random 20 --seed 2 \\
      --random-range T=1:1000,B=1:2048,S=64:1024 --max-gmacs 20 --inference
  python -m lltm.benchmark --sequence --sizes 64x16x32x128 --inference --device cpu
the goals of nn.LSTM's options, the layer against nn.LSTM with the same options:
  bidirectional, over the sweep, one process per precision:
    python -m lltm.benchmark --sequence --sweep --bidirectional --precision float32
    python -m lltm.benchmark --sequence --sweep --bidirectional --precision float16
  packed, over its eight sizes (T 128,512 x B 16,256 x FxS 32x128,256x512), with
  the packed / padded ratio:
    python -m lltm.benchmark --sequence --sweep --packed
  the CPU's, at T,B,F,S = 64,16,32,128:
    python -m lltm.benchmark --sequence --sizes 64x16x32x128 --bidirectional --device cpu
    python -m lltm.benchmark --sequence --sizes 64x16x32x128 --packed --device cpu
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m lltm.benchmark",
        # Wrapped by hand: the raw formatter, which keeps the epilog's command
        # lines, keeps these too (the options' help is still wrapped).
        description="Time the LLTM training step: lltm against eager PyTorch, torch.compile,\n"
        "nn.LSTMCell and the GEMM floor. With --sequence, the LLTMLayer over whole\n"
        "sequences against nn.LSTM (--inference: the forward alone), with the path\n"
        "that the layer ran.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-b", "--batch-size", type=_positive, default=None, help="default 16")
    parser.add_argument("-f", "--features", type=_positive, default=None, help="default 32")
    parser.add_argument("-s", "--state-size", type=_positive, default=None, help="default 128")
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        help="a sweep: BATCHxFEATURESxSTATE[,...] (instead of -b/-f/-s); with --sequence and "
        "no T, STEPSxBATCHxFEATURESxSTATE[,...]",
    )
    parser.add_argument(
        "-d",
        "--device",
        default="auto",
        help="cpu, cuda, cuda:1, a comma-separated list, or auto (every available backend; "
        "with --sweep, CUDA if available, else the CPU)",
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default float32")
    parser.add_argument(
        "--grad",
        choices=GRAD_MODES,
        default=None,
        help="params (default): weights and bias need grad (the tutorial's case); all: input "
        "and states too (--sequence always differentiates the input and every parameter)",
    )
    parser.add_argument(
        "-r", "--runs", type=_positive, default=None, help="timed iterations (default: --seconds)"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="without --runs, time the variants for about this long per size (default 2; "
        "with --sweep, 0.5 per point for all variants together)",
    )
    parser.add_argument("--max-runs", type=_positive, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--warmup",
        type=_non_negative,
        default=None,
        help="untimed iterations (default 20; --sequence 3, at least 1, --sweep 2)",
    )
    parser.add_argument(
        "--rounds",
        type=_positive,
        default=None,
        help="the variants take turns this many times (default 10; --sequence 5, --sweep 3)",
    )
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        default=None,
        help=f"comma-separated subset of {','.join(VARIANTS)} (default: all; with "
        f"--sequence, of {','.join(seq.VARIANTS)}, where layer-padded needs --packed and the "
        f"loops neither --packed nor --bidirectional; --sweep: {','.join(seq.SWEEP_VARIANTS)}, "
        f"with --packed {','.join(seq.PACKED_VARIANTS)})",
    )
    sequence = parser.add_argument_group("sequences (--sequence)")
    sequence.add_argument(
        "--sequence",
        type=_positive,
        nargs="?",
        const=0,
        metavar="T",
        help="time the LLTMLayer over T steps against loops of the cell and nn.LSTM (no T: "
        "with --sweep, or with --sizes STEPSxBATCHxFEATURESxSTATE)",
    )
    sequence.add_argument(
        "--sweep",
        action="store_true",
        help="with --sequence: every T x B x (F, S) of --steps, --batches and --fs (or the "
        "sizes that --random draws)",
    )
    sequence.add_argument(
        "--steps",
        type=_positive_list,
        default=None,
        help=f"the sweep's T (default {','.join(map(str, seq.SWEEP_STEPS))}; with --packed "
        f"{','.join(map(str, seq.PACKED_STEPS))})",
    )
    sequence.add_argument(
        "--batches",
        type=_positive_list,
        default=None,
        help=f"the sweep's B (default {','.join(map(str, seq.SWEEP_BATCHES))}; with --packed "
        f"{','.join(map(str, seq.PACKED_BATCHES))})",
    )
    sequence.add_argument(
        "--fs",
        type=_fs_list,
        default=None,
        help="the sweep's FEATURESxSTATE pairs (default "
        f"{','.join(f'{f}x{s}' for f, s in seq.SWEEP_FS)}; with --packed "
        f"{','.join(f'{f}x{s}' for f, s in seq.PACKED_FS)})",
    )
    sequence.add_argument(
        "--random",
        type=_positive,
        default=None,
        metavar="N",
        help="with --sweep: N sizes drawn instead of the grid, each of T, B, F and S "
        "log-uniform over its range (--random-range) and rounded, so that odd sizes occur; "
        "the same --seed gives the same sizes on every machine",
    )
    sequence.add_argument(
        "--seed",
        type=_non_negative,
        default=None,
        metavar="S",
        help="with --random: the seed of the sizes (default 0)",
    )
    sequence.add_argument(
        "--random-range",
        type=_random_range,
        default=None,
        metavar="K=LO:HI,...",
        help="with --random: the ranges to draw from, keys T, B, F, S, e.g. "
        "T=1:1000,B=1:2048,S=64:1024 (inclusive; a key left out keeps its default: "
        + ", ".join(f"{k}={lo}:{hi}" for k, (lo, hi) in seq.RANDOM_RANGES.items())
        + ")",
    )
    sequence.add_argument(
        "--max-gmacs",
        type=_gmacs,
        default=None,
        metavar="X",
        help="with --random: draw again any size whose forward work, T*B*3*S*(S+F) "
        "multiply-adds (one direction), exceeds X * 1e9 (default: none on CUDA, "
        f"{seq.CPU_MAX_GMACS:g} on the CPU, so that a CPU run ends; inf: none)",
    )
    sequence.add_argument(
        "--inference",
        action="store_true",
        help="time each variant's forward alone under torch.inference_mode() instead of "
        "forward + backward (with or without --sweep, --random, --bidirectional, --packed)",
    )
    sequence.add_argument(
        "--precision",
        type=_precision_list,
        default=None,
        help=f"comma-separated subset of {','.join(seq.PRECISIONS)} (default: --dtype's; "
        "float32 turns TF32 off for cuBLAS and cuDNN, float32-defaults keeps torch's, "
        "where cuDNN uses TF32)",
    )
    sequence.add_argument(
        "--bidirectional",
        action="store_true",
        help="the layer and nn.LSTM both run both directions",
    )
    sequence.add_argument(
        "--packed",
        action="store_true",
        help="the layer and nn.LSTM take a PackedSequence of lengths uniform in [T/4, T] "
        "(backward from its .data.sum()), beside layer-padded, the layer on the same batch "
        "padded to its longest sequence; the table gives the packed / padded time ratio",
    )
    sequence.add_argument(
        "--lengths-seed",
        type=_non_negative,
        default=None,
        metavar="SEED",
        help="with --packed: the seed of the lengths (default 0)",
    )
    sequence.add_argument(
        "--no-gpu-time",
        action="store_true",
        help="skip the CUDA-graph replays that give the GPU time",
    )
    parser.add_argument(
        "--launches",
        "--kernels",
        action="store_true",
        dest="launches",
        help="count the GPU operations of each variant's forward and backward (CUDA)",
    )
    parser.add_argument(
        "--plot",
        metavar="PNG",
        help="draw step time against batch size (with --sweep: the speedup heat map)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the results as JSON to PATH ('-' prints JSON instead of the table)",
    )
    args = parser.parse_args(argv)
    if args.sequence is None:
        _check_cell_args(parser, args)
    else:
        _check_sequence_args(parser, args)
    return args


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


def _check_cell_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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


def _check_sequence_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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
    config = {
        "mode": "sweep" if args.sweep else "sequence",
        "timed": "the forward alone under torch.inference_mode()"
        if args.inference
        else "forward + backward of output.sum()",
        "precisions": args.precision,
        **{k: v for k, v in options.items() if k != "variants"},
        # The seed only where lengths were drawn; how they were drawn, packed.
        **layer_options.fields(),
        "lengths": "uniform in [ceil(T/4), T]" if args.packed else None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "lltm": lltm.build_info(),
    }
    chosen = _devices(args)  # the sweep's is one, checked by parse_args
    drawn: seq.RandomSizes | None = args.random_sizes
    if args.sweep:
        if drawn is not None:
            config.update(sizes=[list(s) for s in drawn.sizes], random=drawn.fields())
            # Up front: a long run says what it will measure before it starts.
            progress("\n".join(drawn.describe()))
        else:
            config.update(steps=args.steps, batches=args.batches, fs=[list(p) for p in args.fs])
        config.update(variants=args.variants, device=args.device)

        def save(rows: list[dict[str, Any]]) -> None:
            # After every point: a sweep cut short keeps what it measured.
            if args.json and args.json != "-":
                Path(args.json).write_text(json.dumps({"config": config, "results": rows}))

        # Drawn sizes: no grid (the steps, batches and fs are None).
        results = seq.run_sweep(
            args.steps or (),
            args.batches or (),
            args.fs or (),
            args.precision,
            chosen[0],
            on_point=save,
            sizes=drawn.sizes if drawn is not None else None,
            **options,
        )
        report = {"config": config, "results": results, "summary": seq.sweep_summary(results)}
        if args.packed:
            report["packed_summary"] = seq.packed_summary(results)
        text = seq.format_sweep_tables(results)
    else:
        config.update(sizes=[list(s) for s in args.sizes], variants=args.variants)
        results = [
            row
            for device in chosen
            for size in args.sizes
            for precision in args.precision
            for row in seq.run_sequence(*size, device=device, precision=precision, **options)
        ]
        # Per device: the worst and median over its sizes and precisions.
        by_device = {str(d): [r for r in results if r["device"] == str(d)] for d in chosen}
        report = {
            "config": config,
            "results": results,
            "summary": {d: seq.sweep_summary(rows) for d, rows in by_device.items()},
        }
        if args.packed:
            report["packed_summary"] = {
                d: seq.packed_summary(rows) for d, rows in by_device.items()
            }
        text = seq.format_sequence_table(results)
        if summary := seq.format_sequence_summary(results):
            text += "\n\n" + summary
    if args.json == "-":
        print(json.dumps(report, indent=2))  # noqa: T201
    else:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
        for device in chosen:
            header = seq.describe(
                args.precision, device, layer_options, inference=args.inference, drawn=drawn
            )
            print(header)  # noqa: T201
        print(text, flush=True)  # noqa: T201
    # Last: without matplotlib this stops, and the tables are out already.
    if args.plot:
        seq.plot_sweep(results, args.plot)


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
    report = {"config": _config(args), "results": [asdict(r) for r in results]}
    if args.plot:
        plot(results, args.plot)
    if args.json == "-":
        print(json.dumps(report, indent=2))  # noqa: T201
        return
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    config = report["config"]
    print(  # noqa: T201
        f"LLTM training step: forward, then (new_h.sum() + new_cell.sum()).backward(); "
        f"{platform(config['gpu'])}, TF32 "
        f"{'on' if config['allow_tf32'] else 'off'}\n"
        "microseconds per iteration (medians); speedup = python / variant, "
        "x floor = variant / floor, on fwd+bwd\n"
    )
    print(format_table(results))  # noqa: T201
