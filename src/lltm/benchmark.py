"""``python -m lltm.benchmark``: the tutorial's benchmark.py as a command.

Times one LLTM step, forward and backward separately, for each variant on
each device, and prints a table with the speedup over the pure-PyTorch
reference measured in the same run. The defaults are the tutorial's sizes:
batch 16, 32 input features, state size 128.

Variants, the tutorial's three and the modern API:

* ``python``: :func:`lltm.reference.lltm_reference`, differentiated by autograd;
* ``aten``: the tutorial's ``torch.autograd.Function`` over the C++
  implementation in ATen operations alone (``lltm._C._forward_aten``); the
  tutorial's "C++ extension", and on CUDA its "C++ on the GPU" row. Timed on
  CUDA only by default: on the CPU it is what ``kernels`` runs;
* ``kernels``: the same Function over ``lltm._C.forward``/``backward``, which
  reach the device's kernels through the dispatcher: the CPU kernels, or the
  fused CUDA kernels (the tutorial's "custom CUDA kernels" row);
* ``lltm``: :func:`lltm.lltm`, the dispatcher op with its
  ``torch.library`` autograd formula.

Each timed iteration runs the forward, then ``(new_h.sum() + new_cell.sum())
.backward()``, as the tutorial does; on CUDA the device is synchronized
before each clock read, so the times are of finished work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

import lltm
from lltm import _C
from lltm.reference import lltm_reference

__all__ = ["Result", "main", "run"]

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

Step = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def _tutorial_function(
    forward: Callable[..., list[Tensor]], backward: Callable[..., list[Tensor]]
) -> Step:
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


VARIANTS: dict[str, Step] = {
    "python": lltm_reference,
    "aten": _tutorial_function(_C._forward_aten, _C._backward_aten),
    "kernels": _tutorial_function(_C.forward, _C.backward),
    "lltm": lltm.lltm,
}


def _default_variants(device: torch.device) -> list[str]:
    if device.type == "cpu":
        return ["python", "kernels", "lltm"]
    return list(VARIANTS)


@dataclass
class Result:
    """Per-iteration times of one variant on one device, in microseconds."""

    variant: str
    device: str
    forward_us: dict[str, float]
    backward_us: dict[str, float]
    forward_speedup: float | None = None
    backward_speedup: float | None = None


def _summary(samples: Sequence[float]) -> dict[str, float]:
    us = [s * 1e6 for s in samples]
    return {"median": statistics.median(us), "min": min(us), "mean": statistics.fmean(us)}


class _Case:
    """One variant on one device: its parameters, inputs and samples so far."""

    def __init__(
        self, step: Step, device: torch.device, args: argparse.Namespace, dtype: torch.dtype
    ) -> None:
        gen = torch.Generator(device="cpu").manual_seed(42)
        self.step = step
        self.device = device
        self.cell = lltm.LLTM(args.features, args.state_size).to(device=device, dtype=dtype)

        def draw(*shape: int) -> Tensor:
            return torch.randn(*shape, generator=gen, dtype=dtype).to(device)

        self.x = draw(args.batch_size, args.features)
        self.h = draw(args.batch_size, args.state_size)
        self.c = draw(args.batch_size, args.state_size)
        self.forward: list[float] = []
        self.backward: list[float] = []

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def iterate(self, n: int, *, record: bool = True) -> None:
        cell = self.cell
        for _ in range(n):
            cell.weights.grad = cell.bias.grad = None
            self._sync()
            t0 = time.perf_counter()
            new_h, new_cell = self.step(self.x, cell.weights, cell.bias, self.h, self.c)
            self._sync()
            t1 = time.perf_counter()
            (new_h.sum() + new_cell.sum()).backward()
            self._sync()
            t2 = time.perf_counter()
            if record:
                self.forward.append(t1 - t0)
                self.backward.append(t2 - t1)


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
    """Time every variant on every device that ``args.device`` selects.

    The variants of a device take turns, in rounds of ``runs / rounds``
    iterations, so that a change in machine load affects them alike and the
    speedups stay comparable.
    """
    dtype = DTYPES[args.dtype]
    results = []
    for device in _devices(args.device):
        names = args.variants or _default_variants(device)
        cases = {name: _Case(VARIANTS[name], device, args, dtype) for name in names}
        for case in cases.values():
            case.iterate(args.warmup, record=False)
        rounds = min(args.rounds, args.runs)
        start = time.perf_counter()
        for r in range(rounds):
            n = args.runs // rounds + (1 if r < args.runs % rounds else 0)
            for case in cases.values():
                case.iterate(n)
            print(  # noqa: T201
                f"{device}: round {r + 1}/{rounds} of {', '.join(cases)} "
                f"({time.perf_counter() - start:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
        device_results = {
            name: Result(name, str(device), _summary(case.forward), _summary(case.backward))
            for name, case in cases.items()
        }
        base = device_results.get("python")
        for result in device_results.values():
            if base is not None:
                result.forward_speedup = base.forward_us["median"] / result.forward_us["median"]
                result.backward_speedup = base.backward_us["median"] / result.backward_us["median"]
            results.append(result)
    return results


def format_table(results: Sequence[Result]) -> str:
    """Render results as a fixed-width table (median and min per iteration, in µs)."""
    header = (
        f"{'variant':<14}{'device':<8}{'fwd med':>10}{'fwd min':>10}{'speedup':>9}"
        f"{'bwd med':>10}{'bwd min':>10}{'speedup':>9}"
    )
    lines = [header, "-" * len(header)]

    def speedup(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "-"

    for r in results:
        lines.append(
            f"{r.variant:<14}{r.device:<8}"
            f"{r.forward_us['median']:>10.1f}{r.forward_us['min']:>10.1f}"
            f"{speedup(r.forward_speedup):>9}"
            f"{r.backward_us['median']:>10.1f}{r.backward_us['min']:>10.1f}"
            f"{speedup(r.backward_speedup):>9}"
        )
    return "\n".join(lines)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "batch_size": args.batch_size,
        "features": args.features,
        "state_size": args.state_size,
        "dtype": args.dtype,
        "runs": args.runs,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m lltm.benchmark",
        description="Time the LLTM forward and backward: Python reference against lltm.",
    )
    parser.add_argument("-b", "--batch-size", type=_positive, default=16)
    parser.add_argument("-f", "--features", type=_positive, default=32)
    parser.add_argument("-s", "--state-size", type=_positive, default=128)
    parser.add_argument(
        "-d",
        "--device",
        default="auto",
        help="cpu, cuda, cuda:1, a comma-separated list, or auto (every available backend)",
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("-r", "--runs", type=_positive, default=1000, help="timed iterations")
    parser.add_argument("--warmup", type=_non_negative, default=20, help="untimed iterations")
    parser.add_argument(
        "--rounds", type=_positive, default=10, help="the variants take turns this many times"
    )
    parser.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=None,
        help=f"comma-separated subset of {','.join(VARIANTS)} "
        "(default: all; on the CPU, aten is left out as it is what kernels runs)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the results as JSON to PATH ('-' prints JSON instead of the table)",
    )
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants or [] if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print the table (or JSON)."""
    args = parse_args(argv)
    results = run(args)
    report = {"config": _config(args), "results": [asdict(r) for r in results]}
    if args.json == "-":
        print(json.dumps(report, indent=2))  # noqa: T201
        return
    if args.json:
        with open(args.json, "w") as f:  # noqa: PTH123
            json.dump(report, f, indent=2)
    config = report["config"]
    print(  # noqa: T201
        f"LLTM step: batch {config['batch_size']}, features {config['features']}, "
        f"state {config['state_size']}, {config['dtype']}; torch {config['torch']}, "
        f"{config['threads']} threads{', ' + config['gpu'] if config['gpu'] else ''}\n"
        f"microseconds per iteration over {config['runs']} runs; speedup = python / variant "
        "(medians)\n"
    )
    print(format_table(results))  # noqa: T201


if __name__ == "__main__":
    main()
