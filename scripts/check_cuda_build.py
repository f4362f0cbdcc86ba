"""Check a CUDA build of lltm on a machine that may have no GPU.

It must import and serve the CPU; build_info() must report CUDA; and the
module must carry machine code for every architecture it claims, sm_90
among them by default, and PTX where the list asks for it (+PTX).
cuobjdump comes from PATH, or from the PyPI package nvidia-cuda-cuobjdump.

    python scripts/check_cuda_build.py

scripts/wheel_release.py runs the same architecture check on a wheel's module,
before it is installed (cuda_archs_in and missing_archs).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def find_cuobjdump() -> str:
    """Return the path of cuobjdump, from PATH or the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else []:
        for candidate in Path(root).glob("cu*/bin/cuobjdump"):
            return str(candidate)
    sys.exit("cuobjdump not found: pip install nvidia-cuda-cuobjdump")


def cuda_archs_in(binary: str | Path) -> tuple[set[str], set[str]]:
    """The architectures with machine code (ELF) and with PTX in ``binary``: {'90', '120', ...}."""
    cuobjdump = find_cuobjdump()
    listing = ""
    for flag in ("--list-elf", "--list-ptx"):
        result = subprocess.run(
            [cuobjdump, flag, str(binary)], capture_output=True, text=True, check=True
        )
        listing += result.stdout
    elf = set(re.findall(r"\.sm_(\d+[af]?)\.cubin", listing))
    ptx = set(re.findall(r"\.sm_(\d+[af]?)\.ptx", listing))
    return elf, ptx


def missing_archs(claimed: list[str], elf: set[str], ptx: set[str]) -> list[str]:
    """What ``claimed`` (build_info's cuda_archs, e.g. ['9.0', '12.0+PTX']) lacks in the binary."""
    failures = []
    for arch in claimed:
        sm = arch.replace("+PTX", "").replace(".", "")
        if sm not in elf:
            failures.append(f"no machine code for {arch} (sm_{sm})")
        if arch.endswith("+PTX") and sm not in ptx:
            failures.append(f"no PTX for {arch}")
    return failures


def main() -> None:
    """Run the checks and exit non-zero on the first failure."""
    import torch  # noqa: PLC0415 - the helpers above serve scripts/wheels.py without torch

    import lltm  # noqa: PLC0415

    info = lltm.build_info()
    print(f"build_info: torch {info['torch']}, cuda {info['cuda']}, archs {info['cuda_archs']}")
    if info["cuda"] is None:
        sys.exit("FAIL: build_info() reports no CUDA: the CUDA kernels were not built")
    if not torch._C._dispatch_has_kernel_for_dispatch_key("lltm::forward", "CUDA"):
        sys.exit("FAIL: no CUDA kernel is registered for lltm::forward")

    # The CPU path works in this process, GPU or not.
    args = [
        torch.randn(2, 3),
        torch.randn(12, 7),
        torch.randn(1, 12),
        torch.randn(2, 4),
        torch.randn(2, 4),
    ]
    new_h, new_cell = lltm.lltm(*args)
    expected = lltm.reference.lltm_reference(*args)
    torch.testing.assert_close((new_h, new_cell), expected)
    print(f"CPU forward OK; backends available here: {lltm.available_backends()}")

    elf, ptx = cuda_archs_in(lltm._C.__file__)
    print(f"cuobjdump: machine code for sm_{', sm_'.join(sorted(elf))}; PTX for {sorted(ptx)}")

    failures = missing_archs(info["cuda_archs"], elf, ptx)
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and "90" not in elf:
        failures.append("the default architectures lack sm_90 machine code")
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))
    print("OK: the CUDA build imports, serves the CPU and carries the architectures it claims")


if __name__ == "__main__":
    main()
