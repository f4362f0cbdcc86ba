"""The parser of ``python -m lltm.benchmark``: the options of both benchmarks and their types."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from .. import sequence as seq
from .._common import DTYPES
from ..cell import GRAD_MODES, VARIANTS
from .checks import check_cell_args, check_sequence_args

__all__ = ["parse_args"]


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
each sequence path of the CPU forced, beside the default choice and nn.LSTM, in
turns (/forced: the default's time / the best forced path's; vs LSTM: nn.LSTM's
time / the variant's; --inference for the forward alone):
  python -m lltm.benchmark --sequence --sizes 256x1x40x300,100x8x64x512 --device cpu \\
      --variants {cpu_paths}
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m lltm.benchmark",
        # Wrapped by hand: the raw formatter that keeps the epilog's lines keeps these too.
        description="Time the LLTM training step: lltm against eager PyTorch, torch.compile,\n"
        "nn.LSTMCell and the GEMM floor. With --sequence, the LLTMLayer over whole\n"
        "sequences against nn.LSTM (--inference: the forward alone), with the path\n"
        "that the layer ran.",
        epilog=_EPILOG.format(
            cpu_paths=",".join(["layer", *seq.forced_variants("cpu"), "nn.LSTM"])
        ),
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
        f"--sequence, of {','.join(seq.VARIANTS)}, where layer-padded needs --packed, the "
        "loops neither --packed nor --bidirectional, and layer-PATH forces a path of the "
        f"device: CUDA's {','.join(seq.forced_paths('cuda'))} (run by default), the CPU's "
        f"{','.join(seq.forced_paths('cpu'))}; --sweep: {','.join(seq.SWEEP_VARIANTS)}, "
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
        check_cell_args(parser, args)
    else:
        check_sequence_args(parser, args)
    return args
