"""Where one LLTM training step spends its GPU time: kernel by kernel, per variant.

    python scripts/profile_step.py [BATCH FEATURES STATE [DTYPE]]

For each variant of the benchmark (eager PyTorch, the tutorial Function over
the ATen extension, and lltm.LLTM), profiles 20 steps after a warm-up and
prints the GPU operations of one step with their average time: what the
launch counts in docs/performance.md come from, and how the GEMMs compare.
Then the host side of lltm.LLTM's step: the CPU time of each operator.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from lltm.benchmark.cell import DTYPES, Problem, _Case

STEPS = 20


def main() -> None:
    """Profile each variant at the size given on the command line."""
    batch, features, state = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (16, 32, 128)
    dtype = DTYPES[sys.argv[4]] if len(sys.argv) > 4 else torch.float32
    for grad in ("params", "all"):
        problem = Problem(batch, features, state, dtype, torch.device("cuda"), grad)
        for variant in ("python", "aten", "kernels", "lltm"):
            case = _Case(variant, problem)
            case.iterate(5, record=False)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                case.iterate(STEPS, record=False)
                torch.cuda.synchronize()
            totals: dict[str, list[float]] = defaultdict(list)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    totals[e.name].append(e.device_time)
            print(f"\n{variant}, {problem.label()}: per step")
            step_total = 0.0
            for name, times in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
                per_step = len(times) / STEPS
                mean = sum(times) / len(times)
                step_total += sum(times) / STEPS
                print(f"  {per_step:4.1f} x {mean:8.2f} us  {name[:110]}")
            print(f"  GPU time per step: {step_total:.1f} us")
    host_profile(Problem(batch, features, state, dtype, torch.device("cuda")))


def host_profile(problem: Problem) -> None:
    """The host's share of lltm.LLTM's step: CPU time per operator."""
    case = _Case("lltm", problem)
    case.iterate(5, record=False)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        case.iterate(STEPS, record=False)
    print(f"\nlltm, {problem.label()}: host time over {STEPS} steps")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
