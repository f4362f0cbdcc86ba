"""Build the stable-ABI prototype against one torch, load it under another.

    python docs/stable-abi/try_stable_abi.py build OUT.so   # with torch 2.13
    python docs/stable-abi/try_stable_abi.py load OUT.so    # with torch 2.14

``build`` compiles lltm_stable.cpp with g++ against this Python's torch,
targeting the stable ABI of torch 2.13 (TORCH_TARGET_VERSION), and lists the
symbols it needs from torch: only the C shim (aoti_torch_*, torch_*), no C++
symbol of c10 or ATen. ``load`` loads it with torch.ops.load_library and
checks torch.ops.lltm_stable.forward against the LLTM math written in torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

HERE = Path(__file__).resolve().parent
TARGET = "(((0ULL + 2) << 56) | ((0ULL + 13) << 48))"  # torch 2.13's stable ABI


def build(out: Path) -> None:
    """Compile the prototype against this torch; check it needs only torch's C shim."""
    prefix = Path(torch.__file__).parent
    cmd = [
        *("g++", "-std=c++17", "-O2", "-shared", "-fPIC", f"-DTORCH_TARGET_VERSION={TARGET}"),
        *(f"-I{prefix / 'include'}", str(HERE / "lltm_stable.cpp")),
        *(f"-L{prefix / 'lib'}", "-ltorch_cpu", "-o", str(out)),
    ]
    subprocess.run(cmd, check=True)
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(out)], capture_output=True, text=True, check=True
    ).stdout.split()
    from_torch = sorted({s for s in undefined if s.startswith(("aoti_torch", "torch_"))})
    cxx_torch = [s for s in undefined if s.startswith("_Z") and ("c10" in s or "at" in s[:8])]
    print(f"built {out} against torch {torch.__version__}: {len(from_torch)} C shim symbols")  # noqa: T201
    if cxx_torch:
        sys.exit(f"C++ symbols of torch needed, the ABI is not the stable one: {cxx_torch}")


def reference(*args: torch.Tensor) -> list[torch.Tensor]:
    """The tutorial's seven forward outputs, in torch."""
    x, w, b, h, c = args
    big_x = torch.cat([h, x], dim=1)
    gates = big_x @ w.t()
    i, o, g = (gates + b).chunk(3, dim=1)
    i, o, g = torch.sigmoid(i), torch.sigmoid(o), F.elu(g)
    new_c = c + g * i
    return [torch.tanh(new_c) * o, new_c, i, o, g, big_x, gates]


def load(path: Path) -> None:
    """Load the prototype under this torch and check its forward."""
    torch.ops.load_library(str(path))
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        batch, features, state = 5, 7, 11
        args = [
            torch.randn(batch, features, dtype=dtype),
            torch.randn(3 * state, state + features, dtype=dtype),
            torch.randn(1, 3 * state, dtype=dtype),
            torch.randn(batch, state, dtype=dtype),
            torch.randn(batch, state, dtype=dtype),
        ]
        got = torch.ops.lltm_stable.forward(*args)
        for name, a, e in zip(
            ("new_h", "new_cell", "input_gate", "output_gate", "candidate", "X", "gates"),
            got,
            reference(*args),
            strict=True,
        ):
            torch.testing.assert_close(a, e, msg=lambda m, n=name: f"{n}: {m}")
    print(f"loaded {path.name} under torch {torch.__version__}: forward matches")  # noqa: T201


if __name__ == "__main__":
    command, target = sys.argv[1], Path(sys.argv[2])
    {"build": build, "load": load}[command](target)
