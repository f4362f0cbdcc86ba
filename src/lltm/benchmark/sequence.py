"""The sequence benchmark: an LLTM layer over T steps against Python loops and ``nn.LSTM``.

``python -m lltm.benchmark --sequence T`` runs it at one T, ``--sequence
--sizes TxBxFxS,...`` at sizes of their own T, and ``--sequence --sweep`` over a
grid of T x B x (F, S), or ``--sequence --sweep --random N`` over N sizes drawn
log-uniform (:func:`draw_sizes`). Each timed iteration runs the forward over
all T steps and the backward of ``output.sum()``; the input and every
parameter need grad. With ``inference``, it runs the forward alone under
``torch.inference_mode()`` instead. On CUDA the device is synchronized
before each clock read. Variants:

* ``loop-python``: :func:`lltm.reference.lltm_sequence_reference`, a Python
  loop of the eager cell, differentiated by autograd;
* ``loop-lltm``: the same loop of :func:`lltm.lltm`;
* ``layer``: :class:`lltm.LLTMLayer`, one op call per direction; on CUDA
  also ``layer-persistent``, ``layer-cluster``, ``layer-steps`` and
  ``layer-fused``, with ``LLTM_SEQUENCE_PATH`` forcing each path (``layer``
  takes the one ``auto`` picks). A forced path that does not fit, or that this build does not know,
  is reported as n/a;
* ``layer-padded`` (``packed`` only): the same layer on the same batch
  padded to its longest sequence, the lengths ignored;
* ``nn.LSTM``: PyTorch's LSTM at the same sizes (cuDNN on the GPU, oneDNN
  on the CPU), which does the work of 4 gates to the LLTM's 3.

nn.LSTM's options (:class:`LayerOptions`), for the layer and ``nn.LSTM``
alike; the loops run one direction over every step, so they are n/a with
either:

* ``bidirectional``: both run both directions (output ``2S`` features);
* ``packed``: a batch of B sequences whose lengths are drawn uniform in
  ``[ceil(T/4), T]`` with ``lengths_seed`` (:func:`packed_lengths`: every
  variant and run sees the same lengths), zero past each end, packed once
  outside the timed call (``pack_padded_sequence(..., enforce_sorted=False)``).
  The variants take the ``PackedSequence``, whose ``.data`` is the leaf that
  needs grad, and the backward runs from ``output.data.sum()``.
  ``packed_vs_padded`` = the ``layer``'s wall time / ``layer-padded``'s: the
  issue's goal is at most :data:`PACKED_GOAL`. ``fill`` = the tokens / the
  padded batch's cells, the ratio that a time proportional to the tokens
  would give (about 0.63 for these lengths). The packed layer refuses
  CUDA-graph capture, so its GPU time is n/a.

Each variant that runs the sequence op (``layer`` and its kin) also records
the path that each block of steps ran (:func:`lltm.paths_that_ran`, one call
outside the timed loop): ``paths`` in full, ``path`` compactly (:func:`path_label`).

Two times per variant:

* the **wall time**: the median of eager calls, host work included;
* on CUDA, the **GPU time**: the same call captured once as a
  CUDA graph and replayed, timed with CUDA events while the host is ahead of
  the GPU, so that no host cost is in it. ``host_ratio`` = wall / GPU time:
  1.0 means the host adds nothing.

All variants start from the same weights (``nn.LSTM`` from its own) and take
turns in rounds, so that a change in machine load affects them alike (on the
H200 the medians move 2x between runs, their ratios do not).

Precisions (see :data:`PRECISIONS`): ``float32`` turns TF32 off for both
cuBLAS and cuDNN, so all variants compute in fp32; ``float32-defaults`` keeps
torch's defaults, under which cuDNN (and so ``nn.LSTM``) uses TF32 while the
matmuls that lltm follows do not; ``float16``; ``bfloat16``, where PyTorch
does not flatten ``nn.LSTM``'s weights and cuDNN copies them at every call
(so the reduced-precision anchor is ``float16``).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Context, Decimal, localcontext
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import lltm
from lltm.reference import lltm_reference, lltm_sequence_reference

from ._common import DTYPES, dtype_name, gpu_operations, in_rounds, platform, pyplot, sync
from ._common import progress as _progress

__all__ = [
    "CUDA_VARIANTS",
    "HOST_RATIO_GOAL",
    "PACKED_BATCHES",
    "PACKED_FS",
    "PACKED_GOAL",
    "PACKED_STEPS",
    "PACKED_VARIANTS",
    "PRECISIONS",
    "RANDOM_RANGES",
    "SPEEDUP_GOAL_MEDIAN",
    "SPEEDUP_GOAL_WORST",
    "SWEEP_BATCHES",
    "SWEEP_FS",
    "SWEEP_OPTIONS",
    "SWEEP_STEPS",
    "SWEEP_VARIANTS",
    "VARIANTS",
    "GraphTime",
    "LayerOptions",
    "Precision",
    "RandomSizes",
    "default_variants",
    "draw_sizes",
    "format_sequence_markdown",
    "format_sequence_summary",
    "format_sequence_table",
    "format_sweep_tables",
    "forward_macs",
    "graph_time",
    "not_applicable",
    "packed_lengths",
    "packed_summary",
    "path_label",
    "plot_sweep",
    "run_sequence",
    "run_sweep",
    "sweep_summary",
]

VARIANTS = (
    "loop-python",
    "loop-lltm",
    "layer",
    "layer-padded",
    "layer-persistent",
    "layer-cluster",
    "layer-steps",
    "layer-fused",
    "nn.LSTM",
)
# The forced paths: LLTM_SEQUENCE_PATH for each, which exists on CUDA only.
_FORCED_PATHS = {
    "layer-persistent": "persistent",
    "layer-cluster": "cluster",
    "layer-steps": "steps",
    "layer-fused": "fused",
}
CUDA_VARIANTS = tuple(_FORCED_PATHS)
# The goal: T x B x (F, S), the layer against cuDNN.
SWEEP_STEPS = (16, 64, 128, 512)
SWEEP_BATCHES = (1, 16, 64, 256, 1024, 4096)
SWEEP_FS = ((32, 128), (128, 256), (256, 512))
SWEEP_VARIANTS = ("layer", "nn.LSTM")
# run_sequence's options in a sweep: a short budget per point, for its hundreds of points.
SWEEP_OPTIONS: dict[str, Any] = {
    "runs": None,
    "seconds": 0.5,
    "min_runs": 3,
    "max_runs": 200,
    "warmup": 2,
    "rounds": 3,
}
# Issue 12's goals: at least 1.0x everywhere, a median of 1.3x, and eager wall
# time at most 1.15x the CUDA-graph replay's.
SPEEDUP_GOAL_WORST, SPEEDUP_GOAL_MEDIAN, HOST_RATIO_GOAL = 1.0, 1.3, 1.15
# The packed goal's grid (what `--sweep --packed` runs by default), its
# variants, and its bound on the packed layer's time / the padded layer's.
PACKED_STEPS = (128, 512)
PACKED_BATCHES = (16, 256)
PACKED_FS = ((32, 128), (256, 512))
PACKED_VARIANTS = ("layer", "layer-padded", "nn.LSTM")
PACKED_GOAL = 0.75
# --random's default ranges of T, B, F and S (each drawn log-uniform), and the
# CPU's default cap on a drawn size's forward work, in GMAC, that keeps a CPU
# run to minutes (CUDA has none).
RANDOM_RANGES: dict[str, tuple[int, int]] = {
    "T": (1, 2000),
    "B": (1, 4096),
    "F": (16, 1024),
    "S": (32, 2048),
}
CPU_MAX_GMACS = 2.0
# Draws of one size that may all exceed the cap before draw_sizes gives up.
_MAX_DRAWS = 10_000

Step = Callable[[], Tensor]


@dataclass(frozen=True)
class Precision:
    """A dtype and the TF32 switches under which it is timed."""

    name: str
    dtype: torch.dtype
    matmul_tf32: bool = False
    cudnn_tf32: bool = False
    note: str = ""


PRECISIONS = {
    p.name: p
    for p in (
        Precision("float32", torch.float32),
        Precision(
            "float32-defaults",
            torch.float32,
            cudnn_tf32=True,
            note="torch's defaults: nn.LSTM computes in TF32 (cuDNN's switch), "
            "lltm in fp32 (it follows the matmul switch)",
        ),
        Precision("float16", torch.float16),
        Precision(
            "bfloat16",
            torch.bfloat16,
            note="PyTorch does not flatten bf16 nn.LSTM weights: cuDNN copies them at "
            "every call (the reduced-precision anchor is float16)",
        ),
        Precision("float64", torch.float64),
    )
}
# A dtype's own precision: its name, TF32 off.
_DTYPE_PRECISION = {dtype: name for name, dtype in DTYPES.items()}
# What nn.LSTM says at every bf16 call (its weights cannot be flattened):
# reported once in the output instead.
_UNFLATTENED_WARNING = r"RNN module weights are not part of single contiguous chunk"


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


@contextlib.contextmanager
def _precision(p: Precision) -> Iterator[None]:
    """Set both TF32 switches as ``p`` says for the calls inside, and hush bf16 nn.LSTM."""
    old = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    torch.backends.cuda.matmul.allow_tf32 = p.matmul_tf32
    torch.backends.cudnn.allow_tf32 = p.cudnn_tf32
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_UNFLATTENED_WARNING)
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old[0]
        torch.backends.cudnn.allow_tf32 = old[1]
        torch.set_float32_matmul_precision(old[2])


@dataclass(frozen=True)
class LayerOptions:
    """nn.LSTM's options that the layer and ``nn.LSTM`` both take in a run."""

    bidirectional: bool = False
    packed: bool = False
    # The seed of the packed batch's lengths (packed_lengths).
    lengths_seed: int = 0

    @property
    def label(self) -> str:
        """``bidirectional, packed``: the options set, as the tables name them ('' for none)."""
        return ", ".join(n for n in ("bidirectional", "packed") if getattr(self, n))

    def fields(self) -> dict[str, Any]:
        """What each result row records of the options (the seed only where it was used)."""
        return {
            "bidirectional": self.bidirectional,
            "packed": self.packed,
            "lengths_seed": self.lengths_seed if self.packed else None,
        }


def packed_lengths(steps: int, batch: int, seed: int = 0) -> Tensor:
    """``batch`` lengths drawn uniform in ``[ceil(steps / 4), steps]`` (int64, CPU).

    Drawn by a generator of their own, on the CPU: the same ``seed`` gives
    the same lengths to every variant, run and device.
    """
    shortest = max(1, math.ceil(steps / 4))
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(shortest, steps + 1, (batch,), generator=gen)


def _lengths_fields(steps: int, batch: int, options: LayerOptions) -> dict[str, Any]:
    """A packed point's lengths: the shortest, the longest (the padded batch's T), the fill."""
    if not options.packed:
        return {}
    lengths = packed_lengths(steps, batch, options.lengths_seed)
    longest = int(lengths.max())
    return {
        "shortest": int(lengths.min()),
        "padded_steps": longest,
        # The tokens / the padded batch's cells: a time proportional to the
        # tokens would give this packed / padded ratio.
        "fill": int(lengths.sum()) / (batch * longest),
    }


def forward_macs(steps: int, batch: int, features: int, state: int) -> int:
    """The multiply-adds of one direction's forward: T x B x 3S x (S + F), the gates' matmuls."""
    return steps * batch * 3 * state * (state + features)


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    """An integer of ``[low, high]``: a log-uniform draw, rounded half to even.

    In ``decimal``, whose ``ln`` and ``exp`` are correctly rounded: ``math``'s
    come from the platform's libm, whose last bit may differ between
    machines, and so may the integer a value near ``n + 0.5`` rounds to.
    """
    u = Decimal(rng.random())  # exact: the float's binary value
    with localcontext(Context(prec=34)):
        lo, hi = Decimal(low).ln(), Decimal(high).ln()
        value = (lo + u * (hi - lo)).exp()
        n = int(value.to_integral_value(rounding=ROUND_HALF_EVEN))
    return min(high, max(low, n))


@dataclass(frozen=True)
class RandomSizes:
    """The sizes (T, B, F, S) of a random sweep, and how they were drawn (:func:`draw_sizes`)."""

    count: int
    seed: int
    ranges: dict[str, tuple[int, int]]
    # The cap on a size's forward work (GMAC, one direction); None: no cap.
    max_gmacs: float | None
    sizes: list[tuple[int, int, int, int]]
    # Draws over the cap, thrown away.
    redraws: int = 0
    # Why the cap is what it is, where it was not given ("the CPU's default").
    cap_note: str = ""

    def fields(self) -> dict[str, Any]:
        """What the JSON's config records of the draw."""
        return {
            "count": self.count,
            "seed": self.seed,
            "ranges": {k: list(v) for k, v in self.ranges.items()},
            "distribution": "log-uniform, rounded to the nearest integer",
            "max_gmacs": self.max_gmacs,
            "max_gmacs_note": self.cap_note or None,
            "redraws": self.redraws,
        }

    def describe(self) -> list[str]:
        """The header's lines: the ranges, the cap, and every size drawn."""
        ranges = ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in self.ranges.items())
        if self.max_gmacs is None:
            cap = "no cap on the forward work"
        else:
            note = f" ({self.cap_note}; --max-gmacs sets it)" if self.cap_note else ""
            cap = (
                f"sizes whose forward work T*B*3*S*(S+F) exceeds {self.max_gmacs:g} GMAC "
                f"redrawn{note}: {self.redraws} redrawn"
            )
        sizes = [",".join(map(str, size)) for size in self.sizes]
        # Ten to a line: a long draw stays readable.
        rows = [" ".join(sizes[i : i + 10]) for i in range(0, len(sizes), 10)]
        return [
            (
                f"random sizes: {self.count} drawn with seed {self.seed}, each of T,B,F,S "
                f"log-uniform over {ranges}, rounded; {cap}"
            ),
            *(f"T,B,F,S drawn: {row}" for row in rows),
        ]


def draw_sizes(
    count: int,
    seed: int = 0,
    ranges: dict[str, tuple[int, int]] | None = None,
    max_gmacs: float | None = None,
    *,
    cap_note: str = "",
) -> RandomSizes:
    """``count`` sizes (T, B, F, S), each log-uniform over its range and rounded.

    ``ranges`` overrides :data:`RANDOM_RANGES` per key (``T``, ``B``, ``F``,
    ``S``: inclusive ``(low, high)``). A size whose :func:`forward_macs`
    exceeds ``max_gmacs`` x 1e9 is drawn again, all four at once, from the
    same generator: ``random.Random(seed)``, whose ``random()`` gives the same
    numbers on every machine and Python version, so the same seed gives the
    same sizes everywhere. ValueError where a range is empty or the cap leaves
    (next to) nothing to draw.
    """
    bounds = {**RANDOM_RANGES, **(ranges or {})}
    if set(bounds) != set(RANDOM_RANGES):
        msg = f"ranges: unknown keys {sorted(set(bounds) - set(RANDOM_RANGES))}; use T, B, F, S"
        raise ValueError(msg)
    bounds = {k: bounds[k] for k in RANDOM_RANGES}  # T, B, F, S, whatever the order given
    for key, (lo, hi) in bounds.items():
        if not 1 <= lo <= hi:
            msg = f"{key}={lo}:{hi}: expected 1 <= LO <= HI"
            raise ValueError(msg)
    cap = None if max_gmacs is None else max_gmacs * 1e9
    smallest = forward_macs(*(lo for lo, _ in bounds.values()))
    if cap is not None and smallest > cap:
        msg = (
            f"the cap of {max_gmacs:g} GMAC is below the smallest size of the ranges "
            f"({smallest / 1e9:.3g} GMAC)"
        )
        raise ValueError(msg)
    rng = random.Random(seed)
    sizes: list[tuple[int, int, int, int]] = []
    redraws = 0
    for _ in range(count):
        for _ in range(_MAX_DRAWS):
            t, b, f, s = (_log_uniform(rng, lo, hi) for lo, hi in bounds.values())
            if cap is None or forward_macs(t, b, f, s) <= cap:
                sizes.append((t, b, f, s))
                break
            redraws += 1
        else:
            msg = (
                f"{_MAX_DRAWS} draws in a row over the cap of {max_gmacs:g} GMAC: raise it "
                "or narrow the ranges"
            )
            raise ValueError(msg)
    return RandomSizes(count, seed, bounds, max_gmacs, sizes, redraws, cap_note)


def not_applicable(name: str, options: LayerOptions) -> str | None:
    """Why variant ``name`` cannot run with ``options`` (None: it can)."""
    if name.startswith("loop-") and (options.bidirectional or options.packed):
        return f"the loops run one direction over every step: not with {options.label}"
    if name == "layer-padded" and not options.packed:
        return "only with packed (the layer on the packed batch, padded)"
    return None


def default_variants(device: str | torch.device, options: LayerOptions | None = None) -> list[str]:
    """The variants that :func:`run_sequence` runs when given none: all that apply here."""
    device = torch.device(device)
    options = options or LayerOptions()
    return [
        n
        for n in VARIANTS
        if (device.type == "cuda" or n not in CUDA_VARIANTS) and not_applicable(n, options) is None
    ]


@dataclass
class _Variant:
    """One variant's forward, its forced path and the leaves whose grads it clears."""

    forward: Step
    path: str | None
    leaves: list[Tensor]
    # Facts for the variant's row (nn.LSTM: whether its weights are flat).
    info: dict[str, Any] = field(default_factory=dict)
    # Whether it calls the sequence op, whose paths its row then names.
    sequence_op: bool = False
    # Time the forward alone, under torch.inference_mode(), instead of step().
    inference: bool = False

    def clear_grads(self) -> None:
        for t in self.leaves:
            t.grad = None

    def step(self) -> None:
        """One forward + backward; the grads land in the leaves' ``.grad``."""
        self.forward().sum().backward()

    def call(self) -> None:
        """What is timed: :meth:`step`, or with ``inference`` the forward alone, no graph."""
        if self.inference:
            with torch.inference_mode():
                self.forward()
        else:
            self.step()


def _inputs(
    x: Tensor, options: LayerOptions
) -> tuple[Tensor | PackedSequence, Tensor, Tensor | None]:
    """What the layer and nn.LSTM take, the leaf of it that needs grad, and the padded batch.

    Unpacked, ``x`` itself (made a leaf), and no padded batch. Packed, the
    batch zeroed past each sequence's end and packed once, here, so that the
    timed calls hold no packing; and a copy of it cut at the longest
    sequence (what ``pad_packed_sequence`` would give) for ``layer-padded``.
    """
    if not options.packed:
        return x.requires_grad_(), x, None
    steps, batch = x.shape[:2]
    lengths = packed_lengths(steps, batch, options.lengths_seed)
    inside = torch.arange(steps)[:, None] < lengths[None, :]
    x = x * inside.to(device=x.device, dtype=x.dtype).unsqueeze(-1)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    data = packed.data.detach().requires_grad_()
    sequences = PackedSequence(
        data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices
    )
    padded = x[: int(lengths.max())].detach().clone().requires_grad_()
    return sequences, data, padded


def _variants(
    names: Sequence[str],
    steps: int,
    batch: int,
    features: int,
    state: int,
    dtype: torch.dtype,
    device: torch.device,
    options: LayerOptions | None = None,
) -> tuple[dict[str, _Variant], dict[str, str]]:
    """The variants in ``names`` that can run here, and why the others cannot.

    Only what the named variants need is allocated: a sweep of the layer and
    nn.LSTM builds no cell.
    """
    options = options or LayerOptions()
    # Drawn where it is used: on the CPU, the sweep's largest inputs (half a
    # billion numbers) would take seconds each.
    gen = torch.Generator(device=device).manual_seed(42)
    x = torch.randn(steps, batch, features, generator=gen, device=device).to(dtype)
    source, leaf, padded = _inputs(x, options)

    def output_of(module: nn.Module) -> Step:
        # A packed output's data is all its steps (no padding to sum over).
        if isinstance(source, PackedSequence):
            return lambda: module(source)[0].data
        return lambda: module(source)[0]

    cases: dict[str, _Variant] = {}
    errors = {n: why for n in names if (why := not_applicable(n, options)) is not None}
    names = [n for n in names if n not in errors]
    layer: lltm.LLTMLayer | None = None
    if any(n in ("layer", "layer-padded") or n in _FORCED_PATHS for n in names):
        layer = lltm.LLTMLayer(features, state, bidirectional=options.bidirectional)
        layer.to(device=device, dtype=dtype)
    if any(n.startswith("loop-") for n in names):
        cell = lltm.LLTM(features, state).to(device=device, dtype=dtype)
        if layer is not None:
            with torch.no_grad():
                cell.weights.copy_(layer.weights_l0)
                cell.bias.copy_(layer.bias_l0)
        zeros = torch.zeros(batch, state, device=device, dtype=dtype)

        def loop(step: Callable[..., tuple[Tensor, Tensor]]) -> Step:
            return lambda: lltm_sequence_reference(
                x, cell.weights, cell.bias, zeros, zeros, cell=step
            )[0]

        leaves = [*cell.parameters(), x]
        loops = {"loop-python": lltm_reference, "loop-lltm": lltm.lltm}
        for name, fn in loops.items():
            if name in names:
                cases[name] = _Variant(loop(fn), None, leaves)
    if layer is not None:
        leaves = [*layer.parameters(), leaf]
        for name in ("layer", *_FORCED_PATHS):
            if name not in names:
                continue
            if name in _FORCED_PATHS and device.type != "cuda":
                errors[name] = "CUDA only"
                continue
            cases[name] = _Variant(
                output_of(layer), _FORCED_PATHS.get(name), leaves, sequence_op=True
            )
        if "layer-padded" in names and padded is not None:
            cases["layer-padded"] = _Variant(
                lambda: layer(padded)[0], None, [*layer.parameters(), padded], sequence_op=True
            )
    if "nn.LSTM" in names:
        lstm = nn.LSTM(features, state, bidirectional=options.bidirectional)
        lstm.to(device=device, dtype=dtype)
        # .to() may leave the weights in separate chunks; cuDNN then copies
        # them at every call. bf16 cannot be flattened (it stays a no-op).
        lstm.flatten_parameters()
        # One storage for all weights is what cuDNN needs not to copy them
        # (the CPU has no such thing: None).
        weights = getattr(lstm, "_flat_weights", None) or list(lstm.parameters())
        storages = {w.untyped_storage().data_ptr() for w in weights}
        flat = len(storages) == 1 if device.type == "cuda" else None
        cases["nn.LSTM"] = _Variant(
            output_of(lstm), None, [*lstm.parameters(), leaf], {"weights_flat": flat}
        )
    return cases, errors


# --- GPU time: one forward + backward as a CUDA graph, replayed ---------------------


@dataclass
class GraphTime:
    """The GPU time of one call, from CUDA-graph replays (ms), or why there is none."""

    median_ms: float | None = None
    min_ms: float | None = None
    replays: int = 0
    error: str | None = None


def _replay_times(
    replay: Callable[[], None],
    n: int,
    new_event: Callable[[], Any],
    stall: Callable[[], None] | None = None,
) -> list[float]:
    """Milliseconds of each of ``n`` back-to-back replays, from ``n + 1`` events.

    ``stall`` (a GPU spin kernel) runs first so that the host enqueues all
    replays and events while the GPU is still busy: the gaps between events
    then hold GPU work only, none of the host's launch cost.
    """
    events = [new_event() for _ in range(n + 1)]
    if stall is not None:
        stall()
    events[0].record()
    for i in range(n):
        replay()
        events[i + 1].record()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(n)]


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _capture(v: _Variant, device: torch.device, warmup: int) -> torch.cuda.CUDAGraph:
    """Capture one timed call of ``v`` as a CUDA graph, as PyTorch's docs say.

    The warm-up runs on a side stream, and the capture on the same one (lazy
    per-stream state such as cuBLAS workspaces must exist before capture,
    which may not allocate it). The grads are None when the capture
    starts, so the captured backward writes fresh ``.grad`` tensors in the
    graph's pool, and each replay overwrites them rather than accumulating.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    # One per GPU for every capture: each new stream would get its own cuBLAS
    # workspace.
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(index)
    side = _SIDE_STREAMS[index]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), _sequence_path(v.path):
        for _ in range(warmup):
            v.clear_grads()
            v.call()
    torch.cuda.current_stream(device).wait_stream(side)
    sync(device)
    v.clear_grads()
    graph = torch.cuda.CUDAGraph()
    # The capture runs on the warm-up's stream: per-stream state made lazily
    # (cuBLAS workspaces, hipBLASLt handles) then exists before the capture.
    with _sequence_path(v.path), torch.cuda.graph(graph, stream=side):
        v.call()
    return graph


# Spin-kernel cycles per millisecond, per GPU: calibrated once.
_CYCLES_PER_MS: dict[int, float] = {}


def _stall(device: torch.device, ms: float) -> Callable[[], None] | None:
    """A callable that keeps ``device`` busy for about ``ms`` (None without ``torch.cuda._sleep``)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CYCLES_PER_MS:
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        for _ in range(2):  # the first launch loads the kernel: time the second
            start.record()
            sleep(1_000_000)
            end.record()
            end.synchronize()
        _CYCLES_PER_MS[index] = 1_000_000 / max(start.elapsed_time(end), 1e-3)
    cycles = int(_CYCLES_PER_MS[index] * ms)
    return lambda: sleep(cycles)


def _error(exc: BaseException) -> str:
    """``Type: first line`` of the exception that started it all.

    When a captured op fails, ending the capture fails too, with an error
    that says only that the capture was invalidated: the first one says why.
    """
    while exc.__context__ is not None and exc.__context__ is not exc:
        exc = exc.__context__
    return f"{type(exc).__name__}: {_first_line(exc)}"


# Replays slower than this keep the GPU busy for longer than the host takes to
# launch the next one: no need to measure the launch cost.
_SLOW_REPLAY_MS = 50.0


def _graph_time_with(
    capture: Callable[[], Any],
    new_event: Callable[[], Any],
    sync: Callable[[], None],
    stall_for: Callable[[float], Callable[[], None] | None],
    *,
    replays: int | None,
    seconds: float,
    estimate_ms: float | None = None,
) -> GraphTime:
    """Capture, then time replays: the device-independent part of :func:`graph_time`.

    ``capture`` returns an object with ``replay()``; ``new_event`` makes a
    timing event; ``stall_for(ms)`` gives a callable that keeps the GPU busy for
    that long. Without ``replays``, as many as fit in ``seconds`` (3 to 50) at
    ``estimate_ms`` each (the eager wall time is an upper bound; without it one
    replay is timed first). Any failure (a capture that the op or cuDNN
    refuses, out of memory) gives a :class:`GraphTime` with ``error`` set: one
    variant that cannot be captured does not stop the benchmark.
    """
    try:
        graph = capture()
        start = time.perf_counter()
        graph.replay()  # the first replay uploads the graph
        launch_ms = (time.perf_counter() - start) * 1e3
        sync()
        if estimate_ms is None:
            (estimate_ms,) = _replay_times(graph.replay, 1, new_event)
        if estimate_ms < _SLOW_REPLAY_MS:
            start = time.perf_counter()
            graph.replay()
            launch_ms = (time.perf_counter() - start) * 1e3
            sync()
        n = replays or max(3, min(50, math.ceil(seconds * 1e3 / max(estimate_ms, 1e-3))))
        # Long enough for the host to enqueue every replay before the GPU
        # gets to the first one.
        stall = stall_for(min(200.0, 1.0 + 1.5 * n * launch_ms))
        times = _replay_times(graph.replay, n, new_event, stall)
    except Exception as exc:  # noqa: BLE001 - reported in the table, not fatal
        return GraphTime(error=_error(exc))
    return GraphTime(median_ms=statistics.median(times), min_ms=min(times), replays=n)


def graph_time(
    v: _Variant,
    device: torch.device,
    *,
    replays: int | None = None,
    seconds: float = 0.2,
    warmup: int = 2,
    estimate_ms: float | None = None,
) -> GraphTime:
    """The GPU time of one timed call of ``v`` (:meth:`_Variant.call`): its CUDA graph, replayed.

    ``warmup`` calls run on a side stream first; ``replays`` (default: as many
    as fit in ``seconds`` at ``estimate_ms`` each) are timed. On a device
    other than CUDA there is no graph: ``error`` says so.
    """
    if device.type != "cuda":
        return GraphTime(error="CUDA only")
    holder: list[torch.cuda.CUDAGraph] = []

    def capture() -> torch.cuda.CUDAGraph:
        holder.append(_capture(v, device, warmup))
        return holder[0]

    # torch.cuda.graph's exit ends the capture before it restores the stream:
    # when ending the capture raises, the capture stream would stay current.
    stream = torch.cuda.current_stream(device)
    try:
        with torch.cuda.device(device):
            return _graph_time_with(
                capture,
                lambda: torch.cuda.Event(enable_timing=True),
                lambda: sync(device),
                lambda ms: _stall(device, ms),
                replays=replays,
                seconds=seconds,
                estimate_ms=estimate_ms,
            )
    finally:
        # The graph's pool holds the activations of a whole sequence: free it
        # before the next variant captures.
        v.clear_grads()
        holder.clear()
        torch.cuda.set_stream(stream)
        sync(device)


def _launches(v: _Variant, device: torch.device) -> int | None:
    """GPU operations (kernels, copies, memsets) of one eager timed call of ``v``."""
    if device.type != "cuda":
        return None
    try:
        v.clear_grads()
        with _sequence_path(v.path):
            count, _ = gpu_operations(v.call, device)
    except Exception:  # noqa: BLE001 - a count is optional: none rather than a crash
        return None
    return count


def _paths(v: _Variant) -> lltm.PathsThatRan | None:
    """The path of each block of steps in one timed call of ``v``.

    Under ``torch.profiler``, so never inside the timed loop. None where ``v``
    calls no sequence op, or the profiler failed.
    """
    if not v.sequence_op:
        return None
    try:
        v.clear_grads()
        with _sequence_path(v.path):
            return lltm.paths_that_ran(v.call)
    except Exception:  # noqa: BLE001 - the path is a note: none rather than a crash
        return None
    finally:
        v.clear_grads()


def path_label(paths: lltm.PathsThatRan | None) -> str | None:
    """The paths of :func:`lltm.paths_that_ran`, compactly, as the tables show them.

    ``fused/onednn``: every forward block ran ``fused``, every backward one
    ``onednn``; ``fused``: both the same, or a forward alone (inference);
    where blocks ran different paths, their distinct names joined by ``+``
    (forward's first). None without paths; ``-`` where no block was marked.
    """
    if paths is None:
        return None
    forward = list(dict.fromkeys(paths["forward"]))
    backward = list(dict.fromkeys(paths["backward"]))
    if len(forward) > 1 or len(backward) > 1:
        return "+".join(dict.fromkeys(forward + backward))
    if forward and backward and forward != backward:
        return f"{forward[0]}/{backward[0]}"
    return (forward or backward or ["-"])[0]


# --- the wall time: eager calls, interleaved ----------------------------------------


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def run_sequence(
    steps: int,
    batch: int,
    features: int,
    state: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    runs: int | None = 20,
    *,
    precision: str | None = None,
    seconds: float = 1.0,
    min_runs: int = 5,
    max_runs: int = 1000,
    warmup: int = 3,
    rounds: int = 5,
    variants: Sequence[str] | None = None,
    gpu_time: bool = True,
    launches: bool = False,
    progress: bool = True,
    bidirectional: bool = False,
    packed: bool = False,
    lengths_seed: int = 0,
    inference: bool = False,
) -> list[dict[str, Any]]:
    """Time forward + backward (or with ``inference``, the forward) of every variant over T steps.

    Args:
        steps: T, the sequence length.
        batch: B.
        features: F, the input features.
        state: S, the state size.
        dtype: of the inputs and parameters (when ``precision`` is not given).
        device: where to run.
        runs: timed iterations per variant, in ``rounds`` turns; None: as many
            as fit in ``seconds`` for all variants together (``min_runs`` to
            ``max_runs``).
        precision: a key of :data:`PRECISIONS` (dtype and TF32 switches);
            default: ``dtype``'s, with TF32 off.
        seconds: the time budget of the timed runs, when ``runs`` is None.
        min_runs: the fewest runs, when ``runs`` is None.
        max_runs: the most runs, when ``runs`` is None.
        warmup: untimed iterations per variant first (at least 1).
        rounds: how often the variants take turns.
        variants: a subset of :data:`VARIANTS` (default: all that run on
            ``device`` with these options, :func:`default_variants`; one for
            CUDA only is n/a elsewhere, as is one that the options rule out).
        gpu_time: on CUDA, also time each variant as a CUDA graph replay.
        launches: on CUDA, count each variant's GPU operations (torch.profiler).
        progress: report each round on stderr.
        bidirectional: the layer and nn.LSTM run both directions.
        packed: the layer and nn.LSTM take a ``PackedSequence`` of lengths
            uniform in ``[ceil(T/4), T]``; ``layer-padded`` the same batch
            padded (see the module's docstring).
        lengths_seed: the seed of the packed batch's lengths.
        inference: time the forward alone under ``torch.inference_mode()``
            (GPU time, kernels and paths too) instead of forward + backward.

    Returns:
        One dict per variant: ``variant``, ``device``, ``dtype``,
        ``precision``, ``steps``, ``batch``, ``features``, ``state``,
        ``matmul_tf32``, ``cudnn_tf32``, ``runs``, ``median_ms``, ``min_ms``
        (wall), ``gpu_ms``, ``gpu_min_ms``, ``gpu_replays``,
        ``gpu_us_per_step`` (graph replay / T), ``host_ratio`` (wall median /
        GPU time), ``gpu_error`` (why there is no GPU time), ``launches``,
        ``vs_lstm`` (nn.LSTM's wall median / this one's: above 1 is faster
        than nn.LSTM), ``gpu_vs_lstm`` (the same on GPU times) and
        ``vs_loop_lltm`` (against the loop of ``lltm.LLTM``); nn.LSTM's row
        also has ``weights_flat`` (on CUDA: whether its weights share the one
        buffer that cuDNN needs, else it copies them per call). Every row
        records the options, ``bidirectional``, ``packed`` and
        ``lengths_seed`` (None unpacked); packed, also ``shortest`` and
        ``padded_steps`` (the longest length: ``layer-padded``'s T) and
        ``fill`` (the tokens / ``batch * padded_steps``), and the ``layer``
        row ``packed_vs_padded`` (its wall median / ``layer-padded``'s: below
        1 the packing saves time). A variant that cannot run here (a path
        forced where it does not fit, or unknown to this build; CUDA-only;
        ruled out by the options; out of memory) has ``error`` instead of times.
        Every row records ``inference``; a variant that calls the sequence op
        (``layer``, ``layer-padded``, the forced paths) also ``paths``, the
        path of each block of steps (:func:`lltm.paths_that_ran`), and
        ``path``, the same compactly (:func:`path_label`).
    """
    name = precision or _DTYPE_PRECISION.get(dtype)
    if name not in PRECISIONS:
        msg = f"precision {name!r}: choose from {', '.join(PRECISIONS)}"
        raise ValueError(msg)
    device = torch.device(device)
    options = LayerOptions(bidirectional, packed, lengths_seed)
    # By default, what runs here; a CUDA-only variant asked for on the CPU is n/a.
    names = list(variants) if variants else default_variants(device, options)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        msg = f"unknown variants {unknown}; choose from {list(VARIANTS)}"
        raise ValueError(msg)
    with _precision(PRECISIONS[name]):
        rows = _run_point(
            (steps, batch, features, state),
            PRECISIONS[name],
            device,
            names,
            runs=runs,
            seconds=seconds,
            min_runs=min_runs,
            max_runs=max_runs,
            warmup=warmup,
            rounds=rounds,
            gpu_time=gpu_time,
            launches=launches,
            progress=progress,
            options=options,
            inference=inference,
        )
    if device.type == "cuda":
        # A sweep's sizes differ by 1000x: give the cached blocks back (the
        # point's tensors are gone now) rather than let the pool grow. A full
        # gc.collect() costs a fifth of a second: only where an error's
        # traceback may hold tensors in a cycle.
        if any("error" in r for r in rows):
            gc.collect()
        torch.cuda.empty_cache()
    return rows


# See _run_point's warm-up.
_SLOW_WARMUP_S = 0.25


def _timed(v: _Variant, device: torch.device) -> float:
    """Seconds of one timed call of ``v``, from clean grads to finished work."""
    v.clear_grads()
    sync(device)
    t0 = time.perf_counter()
    v.call()
    sync(device)
    return time.perf_counter() - t0


def _warm_up(v: _Variant, device: torch.device, warmup: int) -> float:
    """Untimed calls (at least 1); returns the last one's seconds."""
    with _sequence_path(v.path):
        for i in range(max(1, warmup)):
            elapsed = _timed(v, device)
            # Where one call takes a quarter second, its first call has set
            # up all there is: more warm-up would only cost time.
            if i and elapsed > _SLOW_WARMUP_S:
                break
    return elapsed


def _gpu_measures(
    cases: dict[str, _Variant],
    medians: dict[str, float],
    device: torch.device,
    seconds: float,
    *,
    gpu_time: bool,
    launches: bool,
) -> tuple[dict[str, GraphTime], dict[str, int | None]]:
    """Each variant's GPU time (on CUDA, with ``gpu_time``) and kernel count (``launches``)."""
    graphs: dict[str, GraphTime] = {}
    counts: dict[str, int | None] = {}
    for name, median in medians.items():
        if gpu_time and device.type == "cuda":
            wall_ms = median * 1e3
            graphs[name] = graph_time(
                cases[name],
                device,
                seconds=min(0.5, max(0.05, seconds / 4)),
                # One warm-up on the side stream is enough where a call is slow.
                warmup=1 if wall_ms > _SLOW_REPLAY_MS else 2,
                estimate_ms=wall_ms,
            )
        if launches:
            counts[name] = _launches(cases[name], device)
    return graphs, counts


def _run_point(
    size: tuple[int, int, int, int],
    precision: Precision,
    device: torch.device,
    names: list[str],
    *,
    runs: int | None,
    seconds: float,
    min_runs: int,
    max_runs: int,
    warmup: int,
    rounds: int,
    gpu_time: bool,
    launches: bool,
    progress: bool,
    options: LayerOptions,
    inference: bool = False,
) -> list[dict[str, Any]]:
    steps, batch, features, state = size
    mode = "inference" if inference else ""
    setting = ", ".join(filter(None, (precision.name, options.label, mode)))
    label = f"T={steps} B={batch} F={features} S={state} {setting} {device}"
    cases, errors = _variants(names, *size, precision.dtype, device, options)
    for case in cases.values():
        case.inference = inference
    probe: dict[str, float] = {}
    for name in names:
        if name in errors:
            continue
        try:
            probe[name] = _warm_up(cases[name], device, warmup)
        except (RuntimeError, ValueError) as e:
            # RuntimeError: a forced path that does not fit, or out of memory;
            # ValueError: a path this build does not know.
            errors[name] = _first_line(e)
            cases[name].clear_grads()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    live = [n for n in names if n not in errors]
    if runs is None:
        per_round = sum(probe[n] for n in live) or 1e-9
        runs = max(min_runs, min(max_runs, math.ceil(seconds / per_round)))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for n in in_rounds(runs, max(1, min(rounds, runs)), label, report=progress):
        for name in list(live):
            try:
                with _sequence_path(cases[name].path):
                    samples[name] += [_timed(cases[name], device) for _ in range(n)]
            except RuntimeError as e:  # out of memory, once both variants' caches fill it
                errors[name] = _first_line(e)
                live.remove(name)
                cases[name].clear_grads()
    medians = {n: statistics.median(samples[n]) for n in live}
    # After the timed loop: the profiler's own cost stays out of the times.
    paths = {n: ran for n in live if (ran := _paths(cases[n])) is not None}
    graphs, counts = _gpu_measures(
        cases, medians, device, seconds, gpu_time=gpu_time, launches=launches
    )
    rows = _rows(size, precision, device, names, errors, samples, runs, graphs, counts, options)
    for row in rows:
        row["inference"] = inference
        if row["variant"] in cases:
            row.update(cases[row["variant"]].info)
        if row["variant"] in paths:
            row.update(paths=paths[row["variant"]], path=path_label(paths[row["variant"]]))
    return rows


def _rows(
    size: tuple[int, int, int, int],
    precision: Precision,
    device: torch.device,
    names: list[str],
    errors: dict[str, str],
    samples: dict[str, list[float]],
    runs: int,
    graphs: dict[str, GraphTime],
    counts: dict[str, int | None],
    options: LayerOptions | None = None,
) -> list[dict[str, Any]]:
    """The result rows of one point, as :func:`run_sequence` documents them."""
    options = options or LayerOptions()
    lengths = _lengths_fields(size[0], size[1], options)
    steps, batch, features, state = size
    live = [n for n in names if n not in errors]
    medians = {n: statistics.median(samples[n]) for n in live}
    gpu = {n: g.median_ms for n, g in graphs.items() if g.median_ms is not None}
    results = []
    for name in names:
        row: dict[str, Any] = {
            "variant": name,
            "device": str(device),
            "dtype": dtype_name(precision.dtype),
            "precision": precision.name,
            "steps": steps,
            "batch": batch,
            "features": features,
            "state": state,
            "matmul_tf32": precision.matmul_tf32,
            "cudnn_tf32": precision.cudnn_tf32,
            "tf32": precision.matmul_tf32,
            **options.fields(),
            **lengths,
        }
        if name in errors:
            row["error"] = errors[name]
            results.append(row)
            continue
        g = graphs.get(
            name, GraphTime(error="not measured" if device.type == "cuda" else "CUDA only")
        )
        row.update(
            runs=runs,
            median_ms=medians[name] * 1e3,
            min_ms=min(samples[name]) * 1e3,
            gpu_ms=g.median_ms,
            gpu_min_ms=g.min_ms,
            gpu_replays=g.replays,
            gpu_us_per_step=g.median_ms * 1e3 / steps if g.median_ms is not None else None,
            host_ratio=medians[name] * 1e3 / g.median_ms if g.median_ms else None,
            gpu_error=g.error,
            launches=counts.get(name),
        )
        for key, base in (("vs_lstm", "nn.LSTM"), ("vs_loop_lltm", "loop-lltm")):
            row[key] = medians[base] / medians[name] if base in medians else None
        row["gpu_vs_lstm"] = (
            gpu["nn.LSTM"] / gpu[name] if name in gpu and "nn.LSTM" in gpu else None
        )
        if name == "layer" and options.packed:
            # The packed goal's ratio: below 1, the layer gains from the lengths.
            padded = medians.get("layer-padded")
            row["packed_vs_padded"] = medians[name] / padded if padded else None
        results.append(row)
    return results


def run_sweep(
    steps: Sequence[int] = SWEEP_STEPS,
    batches: Sequence[int] = SWEEP_BATCHES,
    fs: Sequence[tuple[int, int]] = SWEEP_FS,
    precisions: Sequence[str] = ("float32", "float16"),
    device: str | torch.device = "cpu",
    *,
    variants: Sequence[str] | None = None,
    progress: bool = True,
    on_point: Callable[[list[dict[str, Any]]], None] | None = None,
    sizes: Sequence[tuple[int, int, int, int]] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Time the variants at every point of ``steps`` x ``batches`` x ``fs`` x ``precisions``.

    With ``sizes`` (T, B, F, S; :func:`draw_sizes`'s), at those sizes x
    ``precisions`` instead, in their order; their rows have ``off_grid``
    set, so that the tables list them rather than lay them on a grid.
    Each point is :func:`run_sequence` with ``options`` (its ``runs``,
    ``seconds``, ``min_runs``, ``max_runs``, ``warmup``, ``rounds``,
    ``gpu_time``, ``launches``, ``bidirectional``, ``packed``,
    ``lengths_seed`` and ``inference``), by default those of
    :data:`SWEEP_OPTIONS`: a budget of ``seconds`` for the timed runs of
    each point. ``variants`` defaults to :data:`SWEEP_VARIANTS`, packed to
    :data:`PACKED_VARIANTS`. Progress goes to stderr, one line per point, and
    ``on_point`` gets the rows so far after each point (to save them: a sweep
    cut short by a timeout keeps what it measured). Returns the rows of every
    point, as :func:`run_sequence` does.
    """
    options = {**SWEEP_OPTIONS, **options}
    if variants is None:
        variants = PACKED_VARIANTS if options.get("packed") else SWEEP_VARIANTS
    if sizes is None:
        points = [
            (p, f, s, t, b) for p in precisions for f, s in fs for t in steps for b in batches
        ]
    else:
        points = [(p, f, s, t, b) for p in precisions for t, b, f, s in sizes]
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    for i, (p, f, s, t, b) in enumerate(points):
        rows = run_sequence(
            t,
            b,
            f,
            s,
            device=device,
            precision=p,
            variants=variants,
            progress=False,
            **options,
        )
        if sizes is not None:
            for row in rows:
                row["off_grid"] = True
        results += rows
        if on_point is not None:
            on_point(results)
        if progress:
            elapsed = time.perf_counter() - start
            by = {r["variant"]: r for r in rows}
            parts = []
            for name in variants:
                r = by[name]
                if "error" in r:
                    parts.append(f"{name} n/a")
                    continue
                gpu = f", gpu {r['gpu_ms']:.3g}" if r.get("gpu_ms") is not None else ""
                path = f" [{r['path']}]" if r.get("path") else ""
                parts.append(f"{name} {r['median_ms']:.3g} ms{gpu}{path}")
            speedup = by.get("layer", {}).get("vs_lstm")
            padded = by.get("layer", {}).get("packed_vs_padded")
            setting = _setting(rows[0]) if rows else p
            _progress(
                f"[{i + 1}/{len(points)}] {setting} T={t} B={b} F={f} S={s}: {'; '.join(parts)}"
                f"{f' -> {speedup:.2f}x' if speedup else ''}"
                f"{f', packed/padded {padded:.2f}' if padded else ''} "
                f"({elapsed:.0f} s, ~{elapsed / (i + 1) * (len(points) - i - 1):.0f} s left)"
            )
    return results


# --- reports ------------------------------------------------------------------------


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _num(value: float | None, spec: str = ".3f") -> str:
    return format(value, spec) if value is not None else "-"


def _setting(r: dict[str, Any]) -> str:
    """A row's precision, options and mode: ``float32``, ``float16, packed, inference``.

    The tables and summaries group by it, so that runs with other options,
    or of the forward alone, never share a cell.
    """
    options = [n for n in ("bidirectional", "packed", "inference") if r.get(n)]
    return ", ".join([r.get("precision", r["dtype"]), *options])


def _cells(r: dict[str, Any]) -> tuple[str, str, str, str]:
    """A row's size, setting, host ratio and kernel count, as both tables print them."""
    size = f"{r['steps']},{r['batch']},{r['features']},{r['state']}"
    host = f"{r['host_ratio']:.2f}" if r.get("host_ratio") is not None else "-"
    kernels = str(r["launches"]) if r.get("launches") is not None else "-"
    return size, _setting(r), host, kernels


def _lengths_notes(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per packed point: its lengths, the padded batch's T and the fill."""
    notes = {}
    for r in results:
        if r.get("packed") and r.get("padded_steps") is not None:
            size, *_ = _cells(r)
            notes[size] = (
                f"{size}: lengths in [{r['shortest']}, {r['padded_steps']}] of T={r['steps']} "
                f"(seed {r['lengths_seed']}); layer-padded runs {r['padded_steps']} steps; "
                f"fill {r['fill']:.2f}"
            )
    return list(notes.values())


def format_sequence_table(results: Sequence[dict[str, Any]]) -> str:
    """Render :func:`run_sequence`'s results as a fixed-width table.

    Packed, the ``layer`` row's ``/padded`` column is its wall time / the
    padded layer's, and a line per point gives the lengths. ``path``, beside
    the variant, is the sequence path of those that call the op
    (:func:`path_label`).
    """
    with_launches = any(r.get("launches") is not None for r in results)
    with_padded = any(r.get("packed") for r in results)
    with_paths = any(r.get("path") for r in results)
    width = max([18, *(len(_setting(r)) + 2 for r in results)])
    # Left out where no row names a path (a run of the loops and nn.LSTM alone).
    paths = max([6, *(len(r.get("path") or "") + 2 for r in results)]) if with_paths else 0
    header = (
        f"{'T,B,F,S':<18}{'precision':<{width}}{'variant':<18}{'path' if paths else '':<{paths}}"
        f"{'wall ms':>10}{'min ms':>10}"
        f"{'gpu ms':>10}{'host x':>8}{'vs LSTM':>9}{'gpu vs':>8}{'vs loop':>9}{'runs':>6}"
    )
    if with_padded:
        header += f"{'/padded':>9}"
    if with_launches:
        header += f"{'kernels':>9}"
    lines = [header, "-" * len(header)]
    for r in results:
        size, setting, host, kernels = _cells(r)
        prefix = f"{size:<18}{setting:<{width}}{r['variant']:<18}"
        if "error" in r:
            lines.append(f"{prefix}  n/a: {r['error']}")
            continue
        path = (r.get("path") or "-") if paths else ""
        line = (
            f"{prefix}{path:<{paths}}"
            f"{r['median_ms']:>10.3f}{r['min_ms']:>10.3f}{_num(r.get('gpu_ms')):>10}"
            f"{host:>8}{_ratio(r.get('vs_lstm')):>9}{_ratio(r.get('gpu_vs_lstm')):>8}"
            f"{_ratio(r.get('vs_loop_lltm')):>9}{r.get('runs', '-'):>6}"
        )
        if with_padded:
            line += f"{_num(r.get('packed_vs_padded'), '.2f'):>9}"
        if with_launches:
            line += f"{kernels:>9}"
        lines.append(line)
    errors = sorted(
        {
            r["gpu_error"]
            for r in results
            if r.get("gpu_error") and r["gpu_error"] not in ("CUDA only", "not measured")
        }
    )
    lines += [f"no GPU time: {e}" for e in errors]
    unflat = sorted(
        {r.get("precision", r["dtype"]) for r in results if r.get("weights_flat") is False}
    )
    if unflat:
        lines.append(
            f"nn.LSTM's weights are not flat in {', '.join(unflat)}: cuDNN copies them at "
            "every call"
        )
    if with_padded:
        lines.append(
            f"/padded: the packed layer's wall time / layer-padded's (the goal: at most "
            f"{PACKED_GOAL}); fill: the tokens / the padded batch's cells"
        )
        lines += _lengths_notes(results)
    return "\n".join(lines)


def format_sequence_markdown(results: Sequence[dict[str, Any]]) -> str:
    """:func:`run_sequence`'s results as one Markdown table (times in ms)."""
    with_padded = any(r.get("packed") for r in results)
    with_paths = any(r.get("path") for r in results)
    extra = (" packed / padded |" if with_padded else "") + (" path |" if with_paths else "")
    lines = [
        "| T,B,F,S | precision | variant | wall ms | GPU ms | host ratio | vs nn.LSTM | "
        + "GPU vs nn.LSTM | kernels |"
        + extra,
        "|---|---|---|---:|---:|---:|---:|---:|---:|"
        + ("---:|" if with_padded else "")
        + ("---|" if with_paths else ""),
    ]
    for r in results:
        size, setting, host, kernels = _cells(r)
        head = f"| {size} | {setting} | {r['variant']} |"
        if "error" in r:
            lines.append(f"{head} n/a | | | | | |" + " |" * (with_padded + with_paths))
            continue
        line = (
            f"{head} {r['median_ms']:.3f} | {_num(r.get('gpu_ms'))} | {host} | "
            f"{_ratio(r.get('vs_lstm'))} | {_ratio(r.get('gpu_vs_lstm'))} | {kernels} |"
        )
        if with_padded:
            line += f" {_num(r.get('packed_vs_padded'), '.2f')} |"
        if with_paths:
            line += f" {r.get('path') or '-'} |"
        lines.append(line)
    notes = [f"- {n}" for n in _lengths_notes(results)]
    return "\n".join(lines + (["", *notes] if notes else []))


Grid = dict[tuple[str, int, int], dict[tuple[int, int], dict[str, dict[str, Any]]]]


def _grid(results: Sequence[dict[str, Any]]) -> Grid:
    """The rows by (setting: the precision and options, F, S), then (T, B), then variant."""
    grid: Grid = {}
    for r in results:
        key = (_setting(r), r["features"], r["state"])
        grid.setdefault(key, {}).setdefault((r["steps"], r["batch"]), {})[r["variant"]] = r
    return grid


def _speedup(
    point: dict[str, dict[str, Any]], variant: str, base: str, metric: str = "wall"
) -> float | None:
    """``base``'s time / ``variant``'s at one point: above 1, ``variant`` is faster."""
    key = {"wall": "median_ms", "gpu": "gpu_ms"}[metric]
    a, b = point.get(variant, {}).get(key), point.get(base, {}).get(key)
    return b / a if a and b else None


def sweep_summary(
    results: Sequence[dict[str, Any]], variant: str = "layer", base: str = "nn.LSTM"
) -> dict[str, Any]:
    """The worst and median speedup of ``variant`` over ``base``, per precision and overall.

    ``precisions`` is keyed by the precision and the options it ran with
    (``float32``, ``float16, bidirectional``). Each entry: ``points`` (measured), ``missing`` (n/a), ``below_1``,
    ``worst`` and ``best`` (``speedup`` and where), ``median``; the same on GPU
    times as ``gpu_worst``/``gpu_median``/``gpu_below_1``; and
    ``host_ratio_max`` of ``variant`` (the worst eager / graph-replay ratio,
    and where) and ``host_ratio_above_goal`` (how many exceed
    :data:`HOST_RATIO_GOAL`).
    """

    def summarize(
        points: list[tuple[tuple[Any, ...], dict[str, dict[str, Any]]]],
    ) -> dict[str, Any]:
        def where(key: tuple[Any, ...], value: float) -> dict[str, Any]:
            precision, features, state, steps, batch = key
            return {
                "value": value,
                "precision": precision,
                "steps": steps,
                "batch": batch,
                "features": features,
                "state": state,
            }

        out: dict[str, Any] = {"points": 0, "missing": 0, "below_1": 0}
        for metric, prefix in (("wall", ""), ("gpu", "gpu_")):
            values = [(k, _speedup(p, variant, base, metric)) for k, p in points]
            found = [(k, v) for k, v in values if v is not None]
            out[f"{prefix}below_1"] = sum(1 for _, v in found if v < 1.0)
            if metric == "wall":
                out["points"] = len(found)
                out["missing"] = len(values) - len(found)
            if found:
                worst = min(found, key=lambda kv: kv[1])
                best = max(found, key=lambda kv: kv[1])
                out[f"{prefix}worst"] = where(*worst)
                out[f"{prefix}best"] = where(*best)
                out[f"{prefix}median"] = statistics.median(v for _, v in found)
            else:
                out[f"{prefix}worst"] = out[f"{prefix}best"] = out[f"{prefix}median"] = None
        ratios = [
            (k, p[variant]["host_ratio"])
            for k, p in points
            if p.get(variant, {}).get("host_ratio") is not None
        ]
        out["host_ratio_max"] = where(*max(ratios, key=lambda kv: kv[1])) if ratios else None
        out["host_ratio_above_goal"] = sum(1 for _, v in ratios if v > HOST_RATIO_GOAL)
        return out

    grid = _grid(results)
    every = [((*key, *tb), point) for key, cells in grid.items() for tb, point in cells.items()]
    precisions = list(dict.fromkeys(k[0] for k in grid))
    return {
        "variant": variant,
        "base": base,
        "precisions": {p: summarize([kp for kp in every if kp[0][0] == p]) for p in precisions},
        "overall": summarize(every),
    }


def packed_summary(results: Sequence[dict[str, Any]], variant: str = "layer") -> dict[str, Any]:
    """The packed goal's ratio: ``variant``'s packed wall time / ``layer-padded``'s.

    Per precision (with its options, as :func:`sweep_summary` keys them) and
    overall: ``points`` (measured), ``missing`` (packed points without a
    ratio), ``above_goal`` (above :data:`PACKED_GOAL`), ``worst`` (the
    largest ratio, and where), ``best``, ``median`` and ``fill_median`` (what
    a time proportional to the tokens would give). No packed rows: no
    precisions, and ``overall`` counts none.
    """

    def where(r: dict[str, Any]) -> dict[str, Any]:
        return {
            "value": r["packed_vs_padded"],
            "precision": _setting(r),
            "steps": r["steps"],
            "batch": r["batch"],
            "features": r["features"],
            "state": r["state"],
        }

    def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
        found = [r for r in rows if r.get("packed_vs_padded") is not None]
        ratios = [r["packed_vs_padded"] for r in found]
        fills = [r["fill"] for r in rows if r.get("fill") is not None]
        return {
            "points": len(found),
            "missing": len(rows) - len(found),
            "above_goal": sum(1 for v in ratios if v > PACKED_GOAL),
            "worst": where(max(found, key=lambda r: r["packed_vs_padded"])) if found else None,
            "best": where(min(found, key=lambda r: r["packed_vs_padded"])) if found else None,
            "median": statistics.median(ratios) if ratios else None,
            "fill_median": statistics.median(fills) if fills else None,
        }

    rows = [r for r in results if r["variant"] == variant and r.get("packed")]
    settings = list(dict.fromkeys(_setting(r) for r in rows))
    return {
        "variant": variant,
        "base": "layer-padded",
        "goal": PACKED_GOAL,
        "precisions": {p: summarize([r for r in rows if _setting(r) == p]) for p in settings},
        "overall": summarize(rows),
    }


def format_sequence_summary(results: Sequence[dict[str, Any]]) -> str:
    """The worst and median over the points of each device, where it ran several ('' if none).

    The speedup of the layer over nn.LSTM and, packed, the packed / padded ratio.
    """
    lines = []
    for device in dict.fromkeys(r["device"] for r in results):
        rows = [r for r in results if r["device"] == device]
        speedups = sweep_summary(rows)["precisions"]
        padded = packed_summary(rows)["precisions"]
        for setting, s in speedups.items():
            if s["points"] + s["missing"] < 2:
                continue
            median = f"{s['median']:.2f}x" if s["median"] is not None else "n/a"
            missing = f", {s['missing']} n/a" if s["missing"] else ""
            lines.append(
                f"{device}, {setting}, {s['points']} sizes: LLTMLayer over nn.LSTM: worst "
                f"{_where(s['worst'])}, median {median}, {s['below_1']} below 1.0{missing}"
            )
            if (p := padded.get(setting)) and p["points"]:
                lines.append(
                    f"{device}, {setting}, {p['points']} sizes: packed / padded: worst "
                    f"{_where(p['worst'], '')}, median {p['median']:.2f}, {p['above_goal']} "
                    f"above {PACKED_GOAL} (median fill {p['fill_median']:.2f})"
                )
    return "\n".join(lines)


def _us(value: float | None) -> str:
    """Microseconds with three significant digits, never in exponent notation."""
    if value is None:
        return "n/a"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _gmac(macs: int) -> str:
    """Multiply-adds in billions, three significant digits, never in exponent notation."""
    value = macs / 1e9
    if value < 0.001:
        return "<0.001"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _label(variant: str, results: Sequence[dict[str, Any]]) -> str:
    """A variant's name in a title: cuDNN's nn.LSTM when every row is on CUDA."""
    if variant == "layer":
        return "LLTMLayer"
    on_cuda = bool(results) and all(r["device"].startswith("cuda") for r in results)
    return "cuDNN nn.LSTM" if variant == "nn.LSTM" and on_cuda else variant


def _where(w: dict[str, Any] | None, unit: str = "x") -> str:
    if w is None:
        return "n/a"
    return (
        f"{w['value']:.2f}{unit} at T={w['steps']}, B={w['batch']}, F={w['features']}, "
        f"S={w['state']} ({w['precision']})"
    )


def _grid_table(
    grid: Grid,
    key: tuple[str, int, int],
    title: str,
    cell: Callable[[dict[str, dict[str, Any]]], str],
) -> str:
    """One Markdown table of ``grid[key]``: rows T, columns B, each ``cell(point)``."""
    cells = grid[key]
    ts = sorted({t for t, _ in cells})
    bs = sorted({b for _, b in cells})
    precision, features, state = key
    lines = [
        f"| {precision}, F={features}, S={state}{title} | "
        + " | ".join(f"B={b}" for b in bs)
        + " |",
        "|---|" + "---:|" * len(bs),
    ]
    for t in ts:
        row = [cell(cells[(t, b)]) if (t, b) in cells else "" for b in bs]
        lines.append(f"| T={t} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def _speedup_goals(results: Sequence[dict[str, Any]], base: str) -> str:
    """The speedup goals that apply to ``results``: issue 12's, and that of nn.LSTM's options.

    Both are of forward + backward: inference rows have none.
    """
    results = [r for r in results if not r.get("inference")]
    goals = []
    options = sorted({o for r in results for o in ("bidirectional", "packed") if r.get(o)})
    if any(not (r.get("bidirectional") or r.get("packed")) for r in results):
        goals.append(
            f"The goal: at least {SPEEDUP_GOAL_WORST:.1f}x everywhere, a median of at "
            f"least {SPEEDUP_GOAL_MEDIAN:.1f}x (float32 and float16)."
        )
    if options:
        goals.append(
            f"The goal {' and '.join(options)}: at least {SPEEDUP_GOAL_WORST:.1f}x everywhere "
            f"against {base} with the same options."
        )
    return " ".join(goals)


def _packed_tables(results: Sequence[dict[str, Any]], grid: Grid, variant: str) -> list[str]:
    """The sweep's packed / padded tables of ``variant`` and their summary (none unpacked)."""
    packed = packed_summary(results, variant)
    if not packed["precisions"]:
        return []

    def cell(point: dict[str, dict[str, Any]]) -> str:
        v = point.get(variant, {}).get("packed_vs_padded")
        return f"{v:.2f}" if v is not None else "n/a"

    out = [
        (
            f"Packed / padded: {_label(variant, results)}'s median wall time on the packed "
            "batch / on the same batch padded to its longest sequence (layer-padded, the "
            "lengths ignored); below 1 the lengths save time."
        ),
        *(
            _grid_table(grid, key, ", packed / padded", cell)
            for key, cells in grid.items()
            if any(p.get(variant, {}).get("packed") for p in cells.values())
        ),
    ]
    lines = [
        f"| precision | points | worst | median | above {PACKED_GOAL} | n/a | fill |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    entries = [*packed["precisions"].items()]
    if len(entries) > 1:
        entries.append(("all", packed["overall"]))
    for p, s in entries:
        median = f"{s['median']:.2f}" if s["median"] is not None else "n/a"
        fill = f"{s['fill_median']:.2f}" if s["fill_median"] is not None else "n/a"
        lines.append(
            f"| {p} | {s['points']} | {_where(s['worst'], '')} | {median} | "
            f"{s['above_goal']} | {s['missing']} | {fill} |"
        )
    out.append(
        "\n".join(lines)
        + f"\n\nThe goal: at most {PACKED_GOAL} everywhere. fill: the median of the tokens "
        "/ the padded batch's cells, the ratio of a time proportional to the tokens."
    )
    return out


def _timed_call(results: Sequence[dict[str, Any]], *, short: bool = False) -> str:
    """What the rows timed, for a title: forward + backward, the forward alone, or both."""
    modes = {bool(r.get("inference")) for r in results}
    training = "forward + backward"
    if not short:
        training += " (the input and every parameter need grad)"
    inference = "forward alone" if short else "the forward alone, under torch.inference_mode()"
    if modes == {True}:
        return inference
    if modes == {True, False}:
        return f"{training}, or where the setting says inference, {inference}"
    return training


def _drawn_table(results: Sequence[dict[str, Any]], variant: str, base: str, a: str, b: str) -> str:
    """Off-grid points (a random sweep's): a Markdown row each, in the order they ran.

    The columns that the grid gives tables of: the speedup, the packed /
    padded ratio, the GPU time per step, the host ratio and the path.
    """
    points: dict[tuple[str, int, int, int, int], dict[str, dict[str, Any]]] = {}
    for r in results:
        key = (_setting(r), r["steps"], r["batch"], r["features"], r["state"])
        points.setdefault(key, {})[r["variant"]] = r
    ours = [r for r in results if r["variant"] == variant]
    with_padded = any(r.get("packed") for r in ours)
    with_gpu = any(r.get("gpu_us_per_step") is not None for r in results)
    with_host = any(r.get("host_ratio") is not None for r in results)
    with_paths = any(r.get("path") for r in ours)
    head = f"| T,B,F,S | precision | GMAC | {a} ms | {b} ms | speedup |"
    rule = "|---|---|---:|---:|---:|---:|"
    for on, title, align in (
        (with_padded, "packed / padded", "---:|"),
        (with_gpu, f"µs/step {a} / {b}", "---:|"),
        (with_host, f"host ratio {a} / {b}", "---:|"),
        (with_paths, "path", "---|"),
    ):
        if on:
            head += f" {title} |"
            rule += align
    lines = [head, rule]
    for (setting, t, batch, f, s), point in points.items():
        ours_row, base_row = point.get(variant, {}), point.get(base, {})
        speedup = _speedup(point, variant, base)
        line = (
            f"| {t},{batch},{f},{s} | {setting} | {_gmac(forward_macs(t, batch, f, s))} | "
            f"{_num(ours_row.get('median_ms'))} | {_num(base_row.get('median_ms'))} | "
            f"{f'{speedup:.2f}' if speedup is not None else 'n/a'} |"
        )
        if with_padded:
            line += f" {_num(ours_row.get('packed_vs_padded'), '.2f')} |"
        if with_gpu:
            per_step = (_us(r.get("gpu_us_per_step")) for r in (ours_row, base_row))
            line += f" {' / '.join(per_step)} |"
        if with_host:
            host = (_num(r.get("host_ratio"), ".2f") for r in (ours_row, base_row))
            line += f" {' / '.join(host)} |"
        if with_paths:
            line += f" {ours_row.get('path') or 'n/a'} |"
        lines.append(line)
    return "\n".join(lines) + (
        "\n\nGMAC: the forward's multiply-adds per direction, T*B*3*S*(S+F), in billions."
    )


def format_sweep_tables(
    results: Sequence[dict[str, Any]], variant: str = "layer", base: str = "nn.LSTM"
) -> str:
    """Markdown: the speedup of ``variant`` over ``base`` per (precision, F, S), rows T, columns B.

    Then the worst and median speedup; the sequence path that ``variant``
    ran at each point (where the rows name it); for packed batches,
    ``variant``'s packed / padded time ratio and its worst and median; the
    GPU time per step of both (graph replay / T, in µs) and the host ratio
    (eager wall / graph replay) of both, when measured. A precision that ran
    with options, or in inference, is named with them (``float16,
    bidirectional``). Off-grid rows (a random sweep's) are one table of a row
    per point instead, with those figures as columns; the summaries count them.
    """
    grid = _grid([r for r in results if not r.get("off_grid")])
    drawn = [r for r in results if r.get("off_grid")]

    def table(
        key: tuple[str, int, int], title: str, cell: Callable[[dict[str, dict[str, Any]]], str]
    ) -> str:
        return _grid_table(grid, key, title, cell)

    def speedup_cell(point: dict[str, dict[str, Any]]) -> str:
        s = _speedup(point, variant, base)
        return f"{s:.2f}" if s is not None else "n/a"

    def per_step(point: dict[str, dict[str, Any]]) -> str:
        values = [point.get(n, {}).get("gpu_us_per_step") for n in (variant, base)]
        return " / ".join(_us(v) for v in values)

    def host(point: dict[str, dict[str, Any]]) -> str:
        values = [point.get(n, {}).get("host_ratio") for n in (variant, base)]
        return " / ".join(f"{v:.2f}" if v is not None else "n/a" for v in values)

    def path(point: dict[str, dict[str, Any]]) -> str:
        return point.get(variant, {}).get("path") or "n/a"

    def grid_rows(key: str) -> bool:
        # Whether any grid point has ``key`` measured (the drawn points have columns).
        return any(r.get(key) is not None for r in results if not r.get("off_grid"))

    a, b = _label(variant, results), _label(base, results)
    notes = {
        r["precision"]: PRECISIONS[r["precision"]].note
        for r in results
        if r.get("precision") in PRECISIONS and PRECISIONS[r["precision"]].note
    }
    out = [
        (
            f"Speedup of {a} over {b}: {b}'s median wall time / {a}'s, "
            f"{_timed_call(results)}. Above 1 means the layer is faster."
        ),
        *(f"{p}: {note}." for p, note in notes.items()),
    ]
    out += [table(key, "", speedup_cell) for key in grid]
    if drawn:
        out.append(_drawn_table(drawn, variant, base, a, b))
    summary = sweep_summary(results, variant, base)
    lines = [
        "| precision | points | worst | median | below 1.0 | n/a |",
        "|---|---:|---|---:|---:|---:|",
    ]
    entries = [*summary["precisions"].items()]
    if len(entries) > 1:
        entries.append(("all", summary["overall"]))
    for p, s in entries:
        median = f"{s['median']:.2f}x" if s["median"] is not None else "n/a"
        lines.append(
            f"| {p} | {s['points']} | {_where(s['worst'])} | {median} | {s['below_1']} | "
            f"{s['missing']} |"
        )
    goals = _speedup_goals(results, b)
    out.append("\n".join(lines) + (f"\n\n{goals}" if goals else ""))
    if any(r.get("path") for r in results if r["variant"] == variant and not r.get("off_grid")):
        out.append(
            f"The sequence path that {a} ran at each point: forward/backward, one name where "
            "both ran the same or the forward ran alone (inference), a+b where blocks of steps "
            "(directions, packed segments) ran different paths."
        )
        out += [table(key, ", path", path) for key in grid]
    out += _packed_tables(results, grid, variant)
    if any(r.get("gpu_us_per_step") is not None for r in results):
        if grid_rows("gpu_us_per_step"):
            out.append(
                f"GPU time per step, µs: {a} / {b} (the {_timed_call(results, short=True)} "
                "replayed as a CUDA graph, divided by T)."
            )
            out += [table(key, ", µs/step", per_step) for key in grid]
        lines = ["| precision | worst | median | below 1.0 |", "|---|---|---:|---:|"]
        for p, s in entries:
            median = f"{s['gpu_median']:.2f}x" if s["gpu_median"] is not None else "n/a"
            lines.append(f"| {p} | {_where(s['gpu_worst'])} | {median} | {s['gpu_below_1']} |")
        out.append(
            f"Speedup of {a} over {b} in GPU time (the goal: {a}'s GPU time per step at most "
            f"{b}'s):\n\n" + "\n".join(lines)
        )
    if any(r.get("host_ratio") is not None for r in results):
        if grid_rows("host_ratio"):
            out.append(
                f"Host overhead: eager wall time / CUDA-graph replay time, {a} / {b} "
                "(1.00: the host adds nothing)."
            )
            out += [table(key, ", host ratio", host) for key in grid]
        worst = [
            f"{p}: {_where(s['host_ratio_max'])}, {s['host_ratio_above_goal']} above "
            f"{HOST_RATIO_GOAL}"
            for p, s in entries
        ]
        out.append(f"Largest host ratio of {a}: " + "; ".join(worst) + ".")
    return "\n\n".join(out)


def plot_sweep(
    results: Sequence[dict[str, Any]],
    path: str,
    *,
    variant: str = "layer",
    base: str = "nn.LSTM",
    metric: str = "wall",
) -> None:
    """A heat map of the speedup over ``base``: one panel per (precision, F, S), rows T, columns B.

    The colormap diverges at 1.0 (red: slower than ``base``, blue: faster), on
    a log scale shared by all panels; each cell is annotated. ``metric``:
    ``wall`` (eager medians) or ``gpu`` (graph replays).
    """
    plt = pyplot()
    import numpy as np  # noqa: PLC0415 - matplotlib's own dependency
    from matplotlib.colors import LogNorm  # noqa: PLC0415

    grid = _grid(results)
    precisions = list(dict.fromkeys(k[0] for k in grid))
    shapes = list(dict.fromkeys((f, s) for _, f, s in grid))
    values = [
        v
        for cells in grid.values()
        for p in cells.values()
        if (v := _speedup(p, variant, base, metric))
    ]
    # Symmetric around 1 on a log scale, so that 2x and 0.5x look alike;
    # beyond 8x the colour saturates (the annotation still tells).
    span = min(8.0, max([2.0, *(max(v, 1 / v) for v in values)]))
    norm = LogNorm(vmin=1 / span, vmax=span)
    cmap = plt.get_cmap("RdBu")
    fig, axes = plt.subplots(
        len(precisions),
        len(shapes),
        figsize=(4.2 * len(shapes) + 1.2, 3.4 * len(precisions) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    image = None
    for i, precision in enumerate(precisions):
        for j, (features, state) in enumerate(shapes):
            ax = axes[i][j]
            cells = grid.get((precision, features, state))
            if not cells:
                ax.set_axis_off()
                continue
            ts = sorted({t for t, _ in cells})
            bs = sorted({b for _, b in cells})
            data = np.full((len(ts), len(bs)), np.nan)
            for (t, b), point in cells.items():
                s = _speedup(point, variant, base, metric)
                if s is not None:
                    data[ts.index(t), bs.index(b)] = s
            image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto")
            for (y, x), v in np.ndenumerate(data):
                text = "n/a" if np.isnan(v) else f"{v:.2f}"
                dark = not np.isnan(v) and abs(math.log(v)) > 0.6 * math.log(span)
                ax.text(
                    x,
                    y,
                    text,
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if dark else "black",
                )
            ax.set_xticks(range(len(bs)), [str(b) for b in bs])
            ax.set_yticks(range(len(ts)), [str(t) for t in ts])
            ax.set(
                xlabel="batch B", ylabel="steps T", title=f"{precision}, F={features}, S={state}"
            )
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.8, label=f"speedup over {base} ({metric} time)")
        # Powers of two, written out: LogNorm's default ticks read 2 x 10^-1.
        ticks = [2.0**k for k in range(-3, 4) if 1 / span <= 2.0**k <= span]
        bar.ax.minorticks_off()
        bar.set_ticks(ticks, labels=[f"{t:g}x" for t in ticks])
    fig.suptitle(
        f"{_label(variant, results)} over {_label(base, results)}: "
        f"{_timed_call(results, short=True)}, "
        f"{'wall' if metric == 'wall' else 'GPU'} time (above 1: faster)"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    _progress(f"wrote {path}")


def describe(
    precisions: Sequence[str],
    device: str | torch.device,
    options: LayerOptions | None = None,
    *,
    inference: bool = False,
    drawn: RandomSizes | None = None,
) -> str:
    """The header of a report: torch, the GPU, what the columns, precisions and options mean.

    ``inference``: the forward alone was timed; ``drawn``: the sizes of a
    random sweep, and how they were drawn.
    """
    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    options = options or LayerOptions()
    if inference:
        timed = "inference: the forward alone under torch.inference_mode() (no backward)"
    else:
        timed = "forward + backward of output.sum() (input and parameters need grad)"
    lines = [
        f"LLTM layer over T steps, {timed}; {platform(gpu)}",
        (
            "wall = eager median; gpu = the same call replayed as a CUDA graph; host x = "
            "wall / gpu; vs LSTM = nn.LSTM's wall / the variant's (above 1: faster); gpu vs = "
            "the same on GPU times; vs loop = against the lltm.LLTM loop"
        ),
        (
            "path = the sequence path that the layer ran (lltm.paths_that_ran, one call "
            "outside the timed loop): forward/backward, one name where both ran the same or "
            "the forward ran alone, a+b where blocks of steps ran different paths"
        ),
    ]
    for p in precisions:
        prec = PRECISIONS[p]
        tf32 = (
            f"matmul TF32 {'on' if prec.matmul_tf32 else 'off'}, "
            f"cuDNN TF32 {'on' if prec.cudnn_tf32 else 'off'}"
        )
        lines.append(f"{p}: {tf32}{'; ' + prec.note if prec.note else ''}")
    if options.bidirectional:
        lines.append(
            "bidirectional: the layer and nn.LSTM run both directions in one call "
            "(output 2 x state features)"
        )
    if options.packed:
        lines.append(
            f"packed: B sequences of lengths uniform in [ceil(T/4), T] (seed "
            f"{options.lengths_seed}), packed once outside the timed call; the layer and "
            "nn.LSTM take the PackedSequence, backward from output.data.sum(); layer-padded = "
            "the layer on the same batch padded to its longest sequence; /padded = the "
            "layer's wall / layer-padded's"
        )
    if drawn is not None:
        lines += drawn.describe()
    return "\n".join(lines) + "\n"
