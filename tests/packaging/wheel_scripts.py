"""The checkout's scripts/ and build_support/ modules, for the packaging tests.

They are imported from the checkout (or cibuildwheel's copy of it), under
their own names, as scripts/wheels.py imports them; nothing here builds lltm.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """scripts/NAME.py or build_support/NAME.py; the test module is skipped without a checkout."""
    for folder in (ROOT / "scripts", ROOT / "build_support"):
        if (folder / f"{name}.py").is_file():
            if str(folder) not in sys.path:
                sys.path.insert(0, str(folder))
            return importlib.import_module(name)
    pytest.skip(f"{name}.py is not here (not a checkout)", allow_module_level=True)
    raise AssertionError  # pytest.skip raised


BUILD_INFO = """VERSION = "0.1.0+pt214cu130" or "0.1.0"
TORCH_VERSION = "2.14.1+cu130"
CUDA_VERSION: str | None = "13.0"
CUDA_ARCHS: list[str] = ["9.0", "12.0+PTX"]
"""
MODULE = "lltm/_C.cpython-312-x86_64-linux-gnu.so"


def make_wheel(
    directory: Path,
    version: str = "0.1.0+pt214cu130",
    requires: str = "torch==2.14.*",
    build_info: str = BUILD_INFO,
    extra: dict[str, bytes] | None = None,
    platform: str = "manylinux_2_28_x86_64",
) -> Path:
    """A made-up lltm wheel, packed by `wheel pack` (so its RECORD is right)."""
    dist_info = f"lltm-{version}.dist-info"
    files = {
        "lltm/__init__.py": b"",
        MODULE: b"\x7fELF not really",
        "lltm/_build_info.py": build_info.encode(),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.4\nName: lltm\nVersion: {version}\n"
            f"Requires-Python: >=3.10\nRequires-Dist: {requires}\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\n"
            f"Tag: cp312-cp312-{platform}\n"
        ).encode(),
        **(extra or {}),
    }
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tree:
        for name, data in files.items():
            (Path(tree) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(tree) / name).write_bytes(data)
        pack = [sys.executable, "-m", "wheel", "pack", "--dest-dir", str(directory), tree]
        subprocess.run(pack, check=True, capture_output=True)
    return directory / f"lltm-{version}-cp312-cp312-{platform}.whl"
