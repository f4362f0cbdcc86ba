"""``python -m lltm.benchmark``: the LLTM training step, lltm against what users would pick instead.

A step is the forward, then ``(new_h.sum() + new_cell.sum()).backward()``, as
in the tutorial's benchmark. Every variant of a size runs in the same process,
in interleaved rounds, so that the ratios hold even on a busy machine; on CUDA
the device is synchronized before each clock read, so the times are of
finished work. The defaults are the tutorial's sizes: batch 16, 32 input
features, state size 128.

Variants:

* ``python``: :func:`lltm.reference.lltm_reference`, eager PyTorch, what lltm replaces;
* ``compile``: ``torch.compile`` of that reference;
* ``lstmcell``: ``torch.nn.LSTMCell`` of the same batch, features and state,
  the cell a user would otherwise pick;
* ``floor``: the step's GEMMs alone (``X Wᵀ``, then ``dZᵀ X``, and ``dZ W``
  with ``--grad all``), on preallocated outputs: what no LLTM can beat;
* ``loss``: the loss and ``backward()`` of a step with no model at all (its
  "outputs" are two leaf tensors): the fixed cost every other variant pays;
* ``aten``: the tutorial's ``autograd.Function`` over its C++ extension in
  ATen operations (``lltm._C._forward_aten``);
* ``kernels``: the same Function over ``lltm._C.forward``/``backward``, the
  tutorial's contract over lltm's fused kernels;
* ``lltm``: :class:`lltm.LLTM`, the public module (autograd in C++);
* ``lltm-compile``: ``torch.compile`` of :class:`lltm.LLTM`.

``--grad params`` (the default, the tutorial's case) differentiates the
weights and bias only; ``--grad all`` also the input and both states, as in an
unrolled sequence. ``--sizes`` sweeps several sizes and ``--plot`` draws time
against batch size (``pip install 'lltm[plot]'`` for matplotlib).
``--launches`` counts the GPU operations of each variant's forward and
backward with ``torch.profiler``.

``--sequence T`` times whole sequences instead: :class:`lltm.LLTMLayer` over
T steps against Python loops of the cell and ``nn.LSTM``, with the GPU time
of each (the call replayed as a CUDA graph) beside its wall time (see
:mod:`lltm._sequence_benchmark`). ``--sequence --sizes TxBxFxS,...`` gives each
size its own T; ``--sequence --sweep`` runs the layer and ``nn.LSTM`` over
``--steps`` x ``--batches`` x ``--fs`` (by default the sweep of issue 12),
prints the speedup tables in Markdown and ``--plot`` draws them as a heat map.
``--precision float32,float32-defaults,float16,bfloat16`` picks the dtypes and
TF32 switches of a sequence run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import lltm
from lltm import _C
from lltm.reference import lltm_reference

__all__ = ["VARIANTS", "Problem", "Result", "main", "run"]

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
VARIANTS = (
    "python",
    "compile",
    "lstmcell",
    "floor",
    "loss",
    "aten",
    "kernels",
    "lltm",
    "lltm-compile",
)
GRAD_MODES = ("params", "all")


@dataclass(frozen=True)
class Problem:
    """One benchmark configuration."""

    batch: int
    features: int
    state: int
    dtype: torch.dtype
    device: torch.device
    grad: str = "params"

    def label(self) -> str:
        """The problem in words, for progress messages."""
        dtype = str(self.dtype).removeprefix("torch.")
        return (
            f"batch {self.batch}, features {self.features}, state {self.state}, {dtype}, "
            f"{self.device}, grad={self.grad}"
        )


@dataclass
class Result:
    """Per-iteration times of one variant on one problem, in microseconds."""

    variant: str
    batch: int
    features: int
    state: int
    dtype: str
    device: str
    grad: str
    forward_us: dict[str, float]
    backward_us: dict[str, float]
    step_us: dict[str, float]
    runs: int
    # Bytes kept alive for the backward beyond the inputs and parameters.
    saved_bytes: int | None = None
    # GPU operations (kernels, copies, memsets) per forward and backward.
    launches: dict[str, int] | None = None
    speedup: float | None = None  # python / variant, on the step medians
    vs_floor: float | None = None  # variant / floor, on the step medians
    extra: dict[str, Any] = field(default_factory=dict)


def _tutorial_function(
    forward: Callable[..., list[Tensor]], backward: Callable[..., list[Tensor]]
) -> Callable[..., tuple[Tensor, Tensor]]:
    """The tutorial's LLTMFunction over a forward/backward pair of lltm._C."""

    class LLTMFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
            outputs = forward(*args)
            ctx.save_for_backward(*outputs[1:], args[1])
            return outputs[0], outputs[1]

        @staticmethod
        def backward(ctx: Any, grad_h: Tensor, grad_cell: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
            d_old_h, d_input, d_weights, d_bias, d_old_cell = backward(
                grad_h.contiguous(), grad_cell.contiguous(), *ctx.saved_tensors
            )
            return d_input, d_weights, d_bias, d_old_h, d_old_cell

    return LLTMFunction.apply  # type: ignore[return-value]


class _Case:
    """One variant on one problem: its inputs, parameters and samples."""

    def __init__(self, variant: str, p: Problem) -> None:
        gen = torch.Generator(device="cpu").manual_seed(42)

        def draw(*shape: int) -> Tensor:
            t = torch.randn(*shape, generator=gen, dtype=p.dtype).to(p.device)
            return t.requires_grad_(p.grad == "all")

        self.variant = variant
        self.device = p.device
        self.x = draw(p.batch, p.features)
        self.h = draw(p.batch, p.state)
        self.c = draw(p.batch, p.state)
        self.inputs = [self.x, self.h, self.c]
        self.samples: dict[str, list[float]] = {"forward": [], "backward": [], "step": []}
        self.module: nn.Module = lltm.LLTM(p.features, p.state).to(p.device, p.dtype)
        self.forward: Callable[[], Any]
        self.backward: Callable[[Any], None] = self._loss_backward
        cell = self.module
        if variant == "lstmcell":
            self.module = nn.LSTMCell(p.features, p.state).to(p.device, p.dtype)
            lstm = self.module
            self.forward = lambda: lstm(self.x, (self.h, self.c))
        elif variant == "floor":
            self._setup_floor(p)
        elif variant == "loss":
            outputs = (draw(p.batch, p.state), draw(p.batch, p.state))
            for t in outputs:
                t.requires_grad_()
            self.inputs.extend(outputs)
            self.forward = lambda: outputs
        elif variant in ("lltm", "lltm-compile"):
            step = cell if variant == "lltm" else torch.compile(cell, dynamic=False)
            self.forward = lambda: step(self.x, (self.h, self.c))
        else:
            function = {
                "python": lltm_reference,
                "compile": torch.compile(lltm_reference, dynamic=False),
                "aten": _tutorial_function(_C._forward_aten, _C._backward_aten),
                "kernels": _tutorial_function(_C.forward, _C.backward),
            }[variant]
            self.forward = lambda: function(self.x, cell.weights, cell.bias, self.h, self.c)

    def _setup_floor(self, p: Problem) -> None:
        w = self.module.weights.detach()
        x_cat = torch.cat([self.h, self.x], dim=1).detach()
        z = torch.empty(p.batch, 3 * p.state, device=p.device, dtype=p.dtype)
        d_z = torch.randn_like(z)
        d_w = torch.empty_like(w)
        d_x = torch.empty_like(x_cat)

        def forward() -> None:
            torch.mm(x_cat, w.t(), out=z)

        def backward(_: Any) -> None:
            torch.mm(d_z.t(), x_cat, out=d_w)
            if p.grad == "all":
                torch.mm(d_z, w, out=d_x)

        self.forward = forward
        self.backward = backward

    @staticmethod
    def _loss_backward(out: tuple[Tensor, Tensor]) -> None:
        new_h, new_cell = out
        (new_h.sum() + new_cell.sum()).backward()

    def _zero_grad(self) -> None:
        for t in [*self.module.parameters(), *self.inputs]:
            t.grad = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def iterate(self, n: int, *, record: bool = True) -> None:
        for _ in range(n):
            self._zero_grad()
            self._sync()
            t0 = time.perf_counter()
            out = self.forward()
            self._sync()
            t1 = time.perf_counter()
            self.backward(out)
            self._sync()
            t2 = time.perf_counter()
            if record:
                self.samples["forward"].append(t1 - t0)
                self.samples["backward"].append(t2 - t1)
                self.samples["step"].append(t2 - t0)

    def saved_bytes(self) -> int | None:
        """Bytes the forward keeps alive for the backward, beyond inputs and parameters."""
        if self.variant in ("floor", "loss"):
            return None
        known = {t.untyped_storage().data_ptr() for t in [*self.module.parameters(), *self.inputs]}
        storages: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in known:
                storages[storage.data_ptr()] = storage.nbytes()
            return t

        self._zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = self.forward()
        self.backward(out)
        return sum(storages.values())

    def launches(self) -> dict[str, int]:
        """GPU operations (kernels, memcpys, memsets) of one forward and one backward."""
        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

        def count(fn: Callable[[], Any]) -> tuple[int, Any]:
            self._sync()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                result = fn()
                self._sync()
            events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            return len(events), result

        self._zero_grad()
        n_forward, out = count(self.forward)
        n_backward, _ = count(lambda: self.backward(out))
        return {"forward": n_forward, "backward": n_backward}


def _summary(samples: Sequence[float]) -> dict[str, float]:
    us = [s * 1e6 for s in samples]
    return {"median": statistics.median(us), "min": min(us), "mean": statistics.fmean(us)}


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201


def _auto_runs(cases: Sequence[_Case], seconds: float, cap: int) -> int:
    """Iterations per variant so that the slowest one takes about `seconds`."""
    probe = 3
    slowest = 0.0
    for case in cases:
        start = time.perf_counter()
        case.iterate(probe, record=False)
        slowest = max(slowest, (time.perf_counter() - start) / probe)
    return max(10, min(cap, math.ceil(seconds / max(slowest, 1e-9))))


def run_problem(p: Problem, variants: Sequence[str], args: argparse.Namespace) -> list[Result]:
    """Time the variants on one problem, interleaved in rounds."""
    if any(name.endswith("compile") for name in variants):
        # A fresh cache per problem: a sweep would otherwise hit the
        # recompilation limit, and torch.compile would fall back to eager.
        torch.compiler.reset()
    cases = []
    for name in variants:
        _progress(f"{p.label()}: setting up {name}")
        cases.append(_Case(name, p))
    for case in cases:
        if case.variant.endswith("compile"):
            _progress(f"{p.label()}: compiling {case.variant} (the first calls)")
        case.iterate(args.warmup, record=False)
    runs = args.runs or _auto_runs(cases, args.seconds, cap=args.max_runs)
    rounds = min(args.rounds, runs)
    start = time.perf_counter()
    for r in range(rounds):
        n = runs // rounds + (1 if r < runs % rounds else 0)
        for case in cases:
            case.iterate(n)
        _progress(
            f"{p.label()}: round {r + 1}/{rounds} of {runs} runs "
            f"({time.perf_counter() - start:.1f} s)"
        )
    results = []
    for case in cases:
        result = Result(
            variant=case.variant,
            batch=p.batch,
            features=p.features,
            state=p.state,
            dtype=str(p.dtype).removeprefix("torch."),
            device=str(p.device),
            grad=p.grad,
            forward_us=_summary(case.samples["forward"]),
            backward_us=_summary(case.samples["backward"]),
            step_us=_summary(case.samples["step"]),
            runs=runs,
            saved_bytes=case.saved_bytes(),
        )
        if args.launches and p.device.type == "cuda":
            result.launches = case.launches()
        results.append(result)
    by_name = {r.variant: r for r in results}
    for r in results:
        if "python" in by_name:
            r.speedup = by_name["python"].step_us["median"] / r.step_us["median"]
        if "floor" in by_name:
            r.vs_floor = r.step_us["median"] / by_name["floor"].step_us["median"]
    return results


def _devices(spec: str) -> list[torch.device]:
    available = lltm.available_backends()
    if spec == "auto":
        return [torch.device(d) for d in available]
    devices = []
    for name in spec.split(","):
        device = torch.device(name)
        if device.type not in available:
            msg = (
                f"--device {name}: lltm cannot run on {device.type} here "
                f"(available: {', '.join(available)}; see `python -m lltm`)"
            )
            raise SystemExit(msg)
        devices.append(device)
    return devices


def run(args: argparse.Namespace) -> list[Result]:
    """Time every variant on every device and size that ``args`` selects."""
    results = []
    for device in _devices(args.device):
        for batch, features, state in args.sizes:
            p = Problem(batch, features, state, DTYPES[args.dtype], device, args.grad)
            results.extend(run_problem(p, args.variants, args))
    return results


def format_table(results: Sequence[Result]) -> str:
    """Render results as fixed-width tables, one per problem (times in µs)."""
    header = (
        f"{'variant':<14}{'fwd':>10}{'bwd':>10}{'fwd+bwd':>10}{'(min)':>10}"
        f"{'speedup':>9}{'x floor':>9}{'saved KB':>10}"
    )
    with_launches = any(r.launches for r in results)
    if with_launches:
        header += f"{'launches':>10}"
    blocks: dict[tuple[Any, ...], list[Result]] = {}
    for r in results:
        blocks.setdefault((r.device, r.batch, r.features, r.state, r.dtype, r.grad), []).append(r)

    def ratio(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "-"

    lines = []
    for (device, batch, features, state, dtype, grad), rows in blocks.items():
        title = (
            f"{device}: batch {batch}, features {features}, state {state}, {dtype}, "
            f"grad={grad}, {rows[0].runs} runs"
        )
        lines += [
            title,
            header,
            "-" * len(header),
        ]
        for r in rows:
            saved = f"{r.saved_bytes / 1024:.1f}" if r.saved_bytes is not None else "-"
            line = (
                f"{r.variant:<14}{r.forward_us['median']:>10.1f}{r.backward_us['median']:>10.1f}"
                f"{r.step_us['median']:>10.1f}{r.step_us['min']:>10.1f}"
                f"{ratio(r.speedup):>9}{ratio(r.vs_floor):>9}{saved:>10}"
            )
            if with_launches:
                launches = (
                    f"{r.launches['forward']}+{r.launches['backward']}" if r.launches else "-"
                )
                line += f"{launches:>10}"
            lines.append(line)
        lines.append("")
    return "\n".join(lines)


def plot(results: Sequence[Result], path: str) -> None:
    """Step time against batch size, one line per variant, one panel per problem shape."""
    try:
        import matplotlib as mpl  # noqa: PLC0415

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        msg = f"--plot needs matplotlib: pip install 'lltm[plot]' ({exc})"
        raise SystemExit(msg) from exc
    panels: dict[tuple[Any, ...], dict[str, list[tuple[int, float]]]] = {}
    for r in results:
        key = (r.device, r.features, r.state, r.dtype, r.grad)
        panels.setdefault(key, {}).setdefault(r.variant, []).append((r.batch, r.step_us["median"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, ((device, features, state, dtype, grad), lines) in zip(
        axes[0], panels.items(), strict=True
    ):
        for variant, points in lines.items():
            batches, times = zip(*sorted(points), strict=True)
            ax.plot(batches, times, marker="o", label=variant)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="batch size",
            ylabel="forward + backward, µs (median)",
            title=f"{device}, F={features}, S={state}, {dtype}, grad={grad}",
        )
        ax.grid(visible=True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _progress(f"wrote {path}")


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


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = f"must be at least 1, got {value}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        msg = f"must be at least 0, got {value}"
        raise argparse.ArgumentTypeError(msg)
    return value


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


def _precision_list(text: str) -> list[str]:
    from ._sequence_benchmark import PRECISIONS  # noqa: PLC0415

    names = text.split(",")
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown:
        msg = f"unknown {', '.join(unknown)}; choose from {', '.join(PRECISIONS)}"
        raise argparse.ArgumentTypeError(msg)
    return names


# The defaults of the options that the cell and the sequence benchmark share
# but set differently: None in the parser, so that a value given on the
# command line can be told from a default, and then filled in per mode.
_CELL_DEFAULTS: dict[str, Any] = {
    "batch_size": 16,
    "features": 32,
    "state_size": 128,
    "dtype": "float32",
    "grad": "params",
    "seconds": 2.0,
    "warmup": 20,
    "rounds": 10,
    "max_runs": 1000,
}
_SEQUENCE_DEFAULTS: dict[str, Any] = {"seconds": 2.0, "warmup": 3, "rounds": 5, "max_runs": 1000}
_SWEEP_DEFAULTS: dict[str, Any] = {"seconds": 0.5, "warmup": 2, "rounds": 3, "max_runs": 200}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    from . import _sequence_benchmark as seq  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="python -m lltm.benchmark",
        description="Time the LLTM training step: lltm against eager PyTorch, torch.compile, "
        "nn.LSTMCell and the GEMM floor. With --sequence, the LLTMLayer over whole "
        "sequences against nn.LSTM.",
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
        help="untimed iterations (default 20; --sequence 3, --sweep 2)",
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
        f"--sequence, of {','.join(seq.VARIANTS)}; --sweep: {','.join(seq.SWEEP_VARIANTS)})",
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
        help="with --sequence: every T x B x (F, S) of --steps, --batches and --fs",
    )
    sequence.add_argument(
        "--steps",
        type=_positive_list,
        default=None,
        help=f"the sweep's T (default {','.join(map(str, seq.SWEEP_STEPS))})",
    )
    sequence.add_argument(
        "--batches",
        type=_positive_list,
        default=None,
        help=f"the sweep's B (default {','.join(map(str, seq.SWEEP_BATCHES))})",
    )
    sequence.add_argument(
        "--fs",
        type=_fs_list,
        default=None,
        help="the sweep's FEATURESxSTATE pairs (default "
        f"{','.join(f'{f}x{s}' for f, s in seq.SWEEP_FS)})",
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
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) not in (None, False)]


def _check_cell_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse the sequence-only options, then fill in the cell benchmark's defaults."""
    if wrong := _given(args, "sweep", "steps", "batches", "fs", "precision", "no_gpu_time"):
        parser.error(f"{', '.join(wrong)}: only with --sequence")
    for key, value in _CELL_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.sizes is None:
        args.sizes = [(args.batch_size, args.features, args.state_size)]
    if any(len(size) != 3 for size in args.sizes):
        parser.error("--sizes: expected BATCHxFEATURESxSTATE (STEPSx... only with --sequence)")
    unknown = [v for v in args.variants or [] if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    args.variants = args.variants or list(VARIANTS)


def _check_sequence_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what ``--sequence`` cannot honour, then fill in its defaults.

    Sets ``args.precision`` (a list), ``args.sizes`` (STEPSxBATCHxFEATURESxSTATE
    tuples, without ``--sweep``) and, with ``--sweep``, ``steps``, ``batches``
    and ``fs``.
    """
    from . import _sequence_benchmark as seq  # noqa: PLC0415

    if args.grad is not None:
        parser.error("--grad: --sequence always differentiates the input and every parameter")
    if args.dtype is not None and args.precision is not None:
        parser.error("--dtype and --precision: give one (--precision takes a list)")
    args.precision = args.precision or [args.dtype or "float32"]
    unknown = [v for v in args.variants or [] if v not in seq.VARIANTS]
    if unknown:
        parser.error(
            f"--variants: unknown {', '.join(unknown)}; with --sequence choose from "
            f"{', '.join(seq.VARIANTS)}"
        )
    check = _check_sweep_args if args.sweep else _check_sizes_args
    defaults = check(parser, args)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def _check_sweep_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``--sequence --sweep``: one device, the grid from --steps/--batches/--fs; its defaults."""
    from . import _sequence_benchmark as seq  # noqa: PLC0415

    if args.sequence:
        parser.error("--sequence T and --sweep: the sweep takes its T from --steps")
    if wrong := _given(args, "batch_size", "features", "state_size", "sizes"):
        parser.error(f"{', '.join(wrong)} and --sweep: the sweep takes --batches and --fs")
    if args.device == "auto":
        args.device = "cuda" if "cuda" in lltm.available_backends() else "cpu"
    if "," in args.device:
        parser.error(f"--device {args.device}: --sweep runs on one device")
    args.steps = args.steps or list(seq.SWEEP_STEPS)
    args.batches = args.batches or list(seq.SWEEP_BATCHES)
    args.fs = args.fs or list(seq.SWEEP_FS)
    args.variants = args.variants or list(seq.SWEEP_VARIANTS)
    return _SWEEP_DEFAULTS


def _check_sizes_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``--sequence T`` or ``--sequence --sizes TxBxFxS``: set ``args.sizes`` to 4-tuples."""
    if wrong := _given(args, "steps", "batches", "fs"):
        parser.error(f"{', '.join(wrong)}: only with --sweep")
    if args.plot:
        parser.error("--plot with --sequence: only with --sweep (a heat map of the sweep)")
    shape = _given(args, "batch_size", "features", "state_size")
    if args.sizes is not None and shape:
        parser.error(f"{', '.join(shape)} and --sizes: give one")
    sizes = args.sizes or [(args.batch_size or 16, args.features or 32, args.state_size or 128)]
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
    from . import _sequence_benchmark as seq  # noqa: PLC0415

    options = {
        "runs": args.runs,
        "seconds": args.seconds,
        "max_runs": args.max_runs,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "variants": args.variants,
        "gpu_time": not args.no_gpu_time,
        "launches": args.launches,
    }
    config = {
        "mode": "sweep" if args.sweep else "sequence",
        "precisions": args.precision,
        **{k: v for k, v in options.items() if k != "variants"},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "lltm": lltm.build_info(),
    }
    devices = _devices(args.device)  # the sweep's is one, checked by parse_args
    if args.sweep:
        config.update(
            steps=args.steps,
            batches=args.batches,
            fs=[list(p) for p in args.fs],
            variants=args.variants,
            device=args.device,
        )

        def save(rows: list[dict[str, Any]]) -> None:
            # After every point: a sweep cut short keeps what it measured.
            if args.json and args.json != "-":
                Path(args.json).write_text(json.dumps({"config": config, "results": rows}))

        results = seq.run_sweep(
            args.steps, args.batches, args.fs, args.precision, devices[0], on_point=save, **options
        )
        report = {"config": config, "results": results, "summary": seq.sweep_summary(results)}
        text = seq.format_sweep_tables(results)
    else:
        config.update(sizes=[list(s) for s in args.sizes], variants=args.variants)
        results = [
            row
            for device in devices
            for size in args.sizes
            for precision in args.precision
            for row in seq.run_sequence(*size, device=device, precision=precision, **options)
        ]
        report = {"config": config, "results": results}
        text = seq.format_sequence_table(results)
    if args.json == "-":
        print(json.dumps(report, indent=2))  # noqa: T201
    else:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
        for device in devices:
            print(seq.describe(args.precision, device))  # noqa: T201
        print(text, flush=True)  # noqa: T201
    # Last: without matplotlib this stops, and the tables are out already.
    if args.plot:
        seq.plot_sweep(results, args.plot)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print the table (or JSON)."""
    args = parse_args(argv)
    if args.sequence is not None:
        main_sequence(args)
        return
    results = run(args)
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
        f"torch {config['torch']}, {config['threads']} threads"
        f"{', ' + config['gpu'] if config['gpu'] else ''}, TF32 "
        f"{'on' if config['allow_tf32'] else 'off'}\n"
        "microseconds per iteration (medians); speedup = python / variant, "
        "x floor = variant / floor, on fwd+bwd\n"
    )
    print(format_table(results))  # noqa: T201


if __name__ == "__main__":
    main()
