"""The built module: what it records about its build, its stub, its loading."""

from __future__ import annotations

import ast
import ctypes
import importlib.metadata
import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lltm
from helpers import make_inputs, run_python
from lltm import _C
from lltm._loader import mismatch_message

STUB = Path(lltm.__file__).with_name("_C.pyi")
# The module's RPATH to torch's libraries (none on Windows, where importing
# torch puts its DLL folder on the search path).
TORCH_RPATH = b"@loader_path/../torch/lib" if sys.platform == "darwin" else b"$ORIGIN/../torch/lib"

pytestmark = pytest.mark.skipif(
    lltm.build_info()["backend"] != "aot", reason="checks the prebuilt module (LLTM_BACKEND=jit)"
)


def major_minor(version: str) -> str:
    return ".".join(version.split("+", maxsplit=1)[0].split(".")[:2])


def test_build_info() -> None:
    info = lltm.build_info()
    assert {"backend", "torch", "cuda", "cuda_archs", "cxx11_abi", "version"} <= info.keys()
    assert info["backend"] == "aot"
    assert major_minor(info["torch"]) == major_minor(torch.__version__)
    assert info["cxx11_abi"] == torch._C._GLIBCXX_USE_CXX11_ABI
    assert isinstance(info["cuda_archs"], list)
    has_cuda_kernel = torch._C._dispatch_has_kernel_for_dispatch_key("lltm::forward", "CUDA")
    assert (info["cuda"] is not None) == has_cuda_kernel
    assert bool(info["cuda_archs"]) == has_cuda_kernel
    assert info["version"] == lltm.__version__ == importlib.metadata.version("lltm")


def test_compiled_against_the_recorded_torch() -> None:
    assert major_minor(_C.TORCH_VERSION) == major_minor(lltm.build_info()["torch"])


def test_one_pybind11_copy_torch_bundled() -> None:
    """The module was compiled with the pybind11 headers torch bundles, no other copy."""
    header = Path(torch.__file__).parent / "include" / "pybind11" / "detail" / "common.h"
    parts = dict(
        re.findall(r"#define PYBIND11_VERSION_(MAJOR|MINOR|MICRO) (\d+)", header.read_text())
    )
    bundled = f"{parts['MAJOR']}.{parts['MINOR']}.{parts['MICRO']}"
    assert bundled == _C.PYBIND11_VERSION
    assert lltm.build_info()["pybind11"] == bundled


def test_torch_types_cross_the_binding() -> None:
    dtypes = _C.supported_dtypes()
    assert all(isinstance(d, torch.dtype) for d in dtypes)
    assert set(dtypes) == {torch.float32, torch.float64, torch.float16, torch.bfloat16}
    inputs = make_inputs(2, 3, 4)
    outputs = _C.forward(*inputs)
    assert all(type(o) is torch.Tensor for o in outputs)
    # A tensor subclass passes through as well (the caster accepts any Tensor).
    param = torch.nn.Parameter(inputs[1])
    assert _C.forward(inputs[0], param, *inputs[2:])[0].shape == (2, 4)


def _stub_functions() -> dict[str, list[str]]:
    """Each function's parameters; ``_forward_aten = forward`` gives an alias forward's."""
    tree = ast.parse(STUB.read_text())
    functions = {
        node.name: [a.arg for a in node.args.args]
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            for target in node.targets:
                assert isinstance(target, ast.Name)
                functions[target.id] = functions[node.value.id]
    return functions


def _stub_attributes() -> set[str]:
    tree = ast.parse(STUB.read_text())
    return {
        node.target.id
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def test_stub_matches_module() -> None:
    public = {name for name in dir(_C) if not name.startswith("__")}
    functions = _stub_functions()
    assert public == set(functions) | _stub_attributes()
    for name, params in functions.items():
        # pybind11 puts the signature on the docstring's first line.
        signature = getattr(_C, name).__doc__.splitlines()[0]
        compiled_params = re.findall(r"(\w+): ", signature.split("->")[0])
        assert compiled_params == params, name


def test_requires_dist_pins_the_built_torch() -> None:
    requires = importlib.metadata.requires("lltm") or []
    pins = [r for r in requires if r.startswith("torch")]
    assert pins == [f"torch=={major_minor(lltm.build_info()['torch'])}.*"]


def test_python_m_lltm_reports_build_and_backends() -> None:
    result = run_python("-c", "import runpy; runpy.run_module('lltm', run_name='__main__')")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["backend"] == "aot"
    assert report["build"] == json.loads(json.dumps(lltm.build_info()))
    assert report["backends"] == lltm.available_backends()
    assert "cpu" in report["backends"]


def test_mismatch_message_names_both_versions() -> None:
    assert mismatch_message("2.13.0+cpu", "2.13.1") is None
    message = mismatch_message("2.13.0+cpu", "2.14.1")
    assert message is not None
    assert "built against torch 2.13.0+cpu" in message
    assert "torch 2.14.1 is installed" in message
    assert "pip install 'torch==2.13.*'" in message
    assert "--no-build-isolation" in message


def test_import_under_another_torch_raises_import_error() -> None:
    """With LLTM_BACKEND=aot, a wheel built for another torch: a clear ImportError, _C unloaded."""
    code = """
import sys, types
fake = types.ModuleType("lltm._build_info")
fake.TORCH_VERSION = "2.99.0"
sys.modules["lltm._build_info"] = fake
try:
    import lltm
except ImportError as exc:
    print(exc)
    print("loaded _C:", "lltm._C" in sys.modules)
"""
    result = run_python("-c", code, env={"LLTM_BACKEND": "aot"})
    assert result.returncode == 0, result.stderr
    assert "lltm was built against torch 2.99.0" in result.stdout
    assert f"torch {torch.__version__} is installed" in result.stdout
    assert "loaded _C: False" in result.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="no RPATH on Windows")
def test_module_loads_without_torch_imported_first() -> None:
    """RPATH $ORIGIN/../torch/lib: the .so finds libtorch with no LD_LIBRARY_PATH."""
    so = Path(_C.__file__)
    if not (so.parent.parent / "torch").is_dir():
        pytest.skip("an editable install: $ORIGIN/../torch/lib resolves only in site-packages")
    code = f"""
import ctypes, sys
ctypes.CDLL({str(so)!r})
print("torch imported:", "torch" in sys.modules)
"""
    result = run_python("-c", code)
    assert result.returncode == 0, result.stderr
    assert "torch imported: False" in result.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="no RPATH on Windows")
def test_runpath_points_at_torch() -> None:
    data = Path(_C.__file__).read_bytes()
    assert TORCH_RPATH in data
    ctypes.CDLL(_C.__file__)  # already loaded: a no-op that must not fail


# Instructions past x86-64's baseline that the AVX2 and AVX-512 kernels are
# compiled with (cpp/cpu_kernels/capabilities.txt): the VEX and EVEX encodings, with
# their ymm, zmm and mask registers, and BMI, LZCNT and POPCNT.
BEYOND_BASELINE = re.compile(
    r"^v|%[yz]mm|%k[0-7]|^(andn|bextr|blsi|blsmsk|blsr|bzhi|lzcnt|mulx|pdep|pext|popcnt|rorx|"
    r"sarx|shlx|shrx)\b"
)


def avx_reached_from_baseline_code(library: Path) -> list[str]:
    """The functions of an x86-64 ELF library that use BEYOND_BASELINE and run unasked.

    That is, that code without such instructions calls or jumps to directly,
    or static initializers, which run on loading: what a processor without
    AVX could run. A kernel is reached only through its capability's table.
    """

    def run(*command: str | Path) -> str:
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    symbols = [line.split(maxsplit=2) for line in run("nm", "--defined-only", library).splitlines()]
    if not symbols:
        pytest.skip(f"{library.name} is stripped: its functions cannot be told apart")
    # A call through the PLT reaches the global definition of its symbol.
    exported = {name: int(address, 16) for address, kind, name in symbols if kind in "TWi"}
    names: dict[int, str] = {}
    uses: dict[int, bool] = {}
    targets: dict[int, set[int]] = {}
    start = -1
    for line in run("objdump", "-d", "--no-show-raw-insn", library).splitlines():
        if label := re.fullmatch(r"([0-9a-f]+) <(.+)>:", line):
            start = int(label[1], 16)
            names[start], uses[start], targets[start] = label[2], False, set()
        elif "\t" in line and start in names:
            instruction = line.split("\t")[1]
            uses[start] |= bool(BEYOND_BASELINE.search(instruction))
            if jump := re.match(r"(?:call|jmp)\s+([0-9a-f]+) <([^+>]+)>", instruction):
                plt = jump[2].removesuffix("@plt")
                target = int(jump[1], 16) if plt == jump[2] else exported.get(plt, -1)
                targets[start].add(target)
    assert any(uses.values()), f"no function of {library.name} uses AVX"
    # A capability's own functions (lltm::cpu::AVX2::, ::AVX512::, and the
    # AVX-512 BF16 kernels, lltm::cpu::bf16::) run only from its table, also
    # those that happen to use no AVX themselves (a kernel's dispatch over
    # its row blocks).
    kernels = re.compile(r"_ZN4lltm3cpu(4AVX2|6AVX512|4bf16)")
    baseline = [a for a in names if not uses[a] and not kernels.match(names[a])]
    reached = {t for a in baseline for t in targets[a] if uses.get(t)}
    reached |= {a for a in names if uses[a] and "_GLOBAL__sub_I" in names[a]}
    return sorted(names[a] for a in reached)


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64" or shutil.which("objdump") is None,
    reason="x86-64 Linux builds the AVX2 and AVX-512 kernels; objdump reads them",
)
def test_avx_code_stays_in_the_kernels() -> None:
    """Each capability's object keeps its copies of inline functions to itself.

    See cmake/LltmCpuKernels.cmake: otherwise the linker could pick an AVX2
    copy of a header's inline function for the whole module.
    """
    assert avx_reached_from_baseline_code(Path(_C.__file__)) == []
    exported = subprocess.run(
        ["nm", "-D", "--defined-only", _C.__file__], capture_output=True, text=True, check=True
    ).stdout
    assert "lltm_cpu_kernels_" not in exported
