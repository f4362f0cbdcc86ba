"""The cell benchmark: the LLTM training step, lltm against what users would pick instead.

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
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

import lltm
from lltm import _C
from lltm.reference import lltm_reference

from ._common import DTYPES, devices, dtype_name, gpu_operations, in_rounds, progress, pyplot, sync

__all__ = [
    "GRAD_MODES",
    "VARIANTS",
    "Problem",
    "Result",
    "format_markdown",
    "format_table",
    "plot",
    "run",
]

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
        return (
            f"batch {self.batch}, features {self.features}, state {self.state}, "
            f"{dtype_name(self.dtype)}, "
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

    def iterate(self, n: int, *, record: bool = True) -> None:
        for _ in range(n):
            self._zero_grad()
            sync(self.device)
            t0 = time.perf_counter()
            out = self.forward()
            sync(self.device)
            t1 = time.perf_counter()
            self.backward(out)
            sync(self.device)
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
        self._zero_grad()
        n_forward, out = gpu_operations(self.forward, self.device)
        n_backward, _ = gpu_operations(lambda: self.backward(out), self.device)
        return {"forward": n_forward, "backward": n_backward}


def _summary(samples: Sequence[float]) -> dict[str, float]:
    us = [s * 1e6 for s in samples]
    return {"median": statistics.median(us), "min": min(us), "mean": statistics.fmean(us)}


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
        # A fresh cache per problem, or a sweep hits the recompile limit and runs eager.
        torch.compiler.reset()
    cases = []
    for name in variants:
        progress(f"{p.label()}: setting up {name}")
        cases.append(_Case(name, p))
    for case in cases:
        if case.variant.endswith("compile"):
            progress(f"{p.label()}: compiling {case.variant} (the first calls)")
        case.iterate(args.warmup, record=False)
    runs = args.runs or _auto_runs(cases, args.seconds, cap=args.max_runs)
    for n in in_rounds(runs, min(args.rounds, runs), p.label()):
        for case in cases:
            case.iterate(n)
    results = []
    for case in cases:
        result = Result(
            variant=case.variant,
            batch=p.batch,
            features=p.features,
            state=p.state,
            dtype=dtype_name(p.dtype),
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


def run(args: argparse.Namespace, on: Sequence[torch.device] | None = None) -> list[Result]:
    """Time every variant on every device and size that ``args`` selects.

    ``on``: the devices, when the caller has resolved ``args.device`` already.
    """
    results = []
    for device in devices(args.device) if on is None else on:
        for batch, features, state in args.sizes:
            p = Problem(batch, features, state, DTYPES[args.dtype], device, args.grad)
            results.extend(run_problem(p, args.variants, args))
    return results


def format_table(results: Sequence[Result]) -> str:
    """Render results as fixed-width tables, one per problem (times in microseconds)."""
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


def format_markdown(report: dict[str, Any]) -> str:
    """A JSON report of the cell benchmark as Markdown: a titled table per problem (microseconds).

    The same columns as :func:`format_table`, from the report's rows (the
    dicts of :class:`Result`) and its config; GPU operations where counted.
    """
    config = report["config"]
    problems: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in report["results"]:
        key = (r["device"], r["batch"], r["features"], r["state"], r["dtype"], r["grad"])
        problems.setdefault(key, []).append(r)
    out = []
    for (device, batch, features, state, dtype, grad), rows in problems.items():
        out.append(
            f"\n**{device}, batch {batch}, features {features}, state {state}, "
            f"{dtype}, grad={grad}** ({rows[0]['runs']} runs; torch {config['torch']}, "
            f"{config['threads']} threads{', ' + config['gpu'] if config['gpu'] else ''})"
            f"\n\n{_markdown_table(rows)}"
        )
    return "\n".join(out)


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    """One Markdown table of the rows of one problem."""
    launches = any(r.get("launches") for r in rows)
    head = "| variant | fwd | bwd | fwd+bwd | speedup | x floor | saved KB |"
    rule = "|---|---:|---:|---:|---:|---:|---:|"
    if launches:
        head += " launches fwd+bwd |"
        rule += "---:|"
    lines = [head, rule]
    for r in rows:
        saved = "-" if r["saved_bytes"] is None else f"{r['saved_bytes'] / 1024:,.0f}"
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        floor = "-" if r["vs_floor"] is None else f"{r['vs_floor']:.2f}x"
        line = (
            f"| {r['variant']} | {r['forward_us']['median']:,.0f} | "
            f"{r['backward_us']['median']:,.0f} | {r['step_us']['median']:,.0f} | "
            f"{speedup} | {floor} | {saved} |"
        )
        if launches:
            n = r.get("launches")
            line += f" {n['forward']}+{n['backward']} |" if n else " - |"
        lines.append(line)
    return "\n".join(lines)


def plot(results: Sequence[Result], path: str) -> None:
    """Step time against batch size, one line per variant, one panel per problem shape."""
    plt = pyplot()
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
    progress(f"wrote {path}")
