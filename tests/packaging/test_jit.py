"""lltm.jit and LLTM_BACKEND: the same sources built on import, in subprocesses.

The lltm operators can be registered once per process, and this process has
the prebuilt module loaded, so each JIT case runs in a fresh interpreter. They
share one build directory: the first case builds, the others load the cache.
"""

from __future__ import annotations

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
from test_build import avx_reached_from_baseline_code

import lltm
from helpers import make_inputs, run_python
from lltm import _C, jit

ROOT = Path(__file__).resolve().parents[2]

# A stand-in _build_info: the prebuilt module "was built" for torch 2.99.
FAKE_OTHER_TORCH = """
import sys, types
fake = types.ModuleType("lltm._build_info")
fake.TORCH_VERSION = "2.99.0"
sys.modules["lltm._build_info"] = fake
"""

# Runs the tutorial's forward and backward and saves them for the parent.
RUN_AND_SAVE = """
import json, sys, time, torch
start = time.perf_counter()
import lltm
elapsed = time.perf_counter() - start
from lltm import _C
args = torch.load(sys.argv[1])
outputs = _C.forward(*args)
grads = _C.backward(torch.ones_like(outputs[0]), torch.ones_like(outputs[0]), *outputs[1:], args[1])
torch.save((outputs, grads), sys.argv[2])
print("BUILD_INFO", json.dumps(lltm.build_info()))
print(f"import lltm: {elapsed:.1f} s; module {_C.__name__} at {_C.__file__}")
"""


@pytest.fixture(scope="module")
def extensions_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("torch_extensions")


def run(code: str, *args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_python("-c", code, *args, env={"LLTM_BACKEND": "auto", **env}, timeout=900)


def build_info_of(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    line = next(x for x in result.stdout.splitlines() if x.startswith("BUILD_INFO "))
    return json.loads(line.removeprefix("BUILD_INFO "))


def test_jit_build_matches_the_prebuilt_module(extensions_dir: Path, tmp_path: Path) -> None:
    args = make_inputs(5, 7, 9, dtype=torch.float64)
    torch.save(args, tmp_path / "args.pt")
    code = RUN_AND_SAVE
    env = {
        "LLTM_BACKEND": "jit",
        "LLTM_JIT_VERBOSE": "1",
        "TORCH_EXTENSIONS_DIR": str(extensions_dir),
    }
    first = run(code, tmp_path / "args.pt", tmp_path / "out.pt", **env)
    assert first.returncode == 0, first.stderr
    outputs, grads = torch.load(tmp_path / "out.pt")
    info = build_info_of(first)
    assert info["backend"] == "jit"
    assert info["cuda"] is None or torch.cuda.is_available()
    assert Path(info["library"]).is_relative_to(extensions_dir)
    torch.testing.assert_close(outputs, _C.forward(*args), rtol=0, atol=0)
    expected = _C.backward(
        torch.ones_like(outputs[0]), torch.ones_like(outputs[0]), *outputs[1:], args[1]
    )
    torch.testing.assert_close(grads, expected, rtol=0, atol=0)
    # LLTM_JIT_VERBOSE=1 (verbose=True) shows the build steps.
    first_log = first.stdout + first.stderr
    assert "Building extension module lltm_jit" in first_log
    # A ninja step per source, whatever the compiler ($CXX) is called.
    assert re.search(r"\[\d+/\d+\] \S+ .*cpp__cell__cpu\.cpp", first_log), first_log
    if sys.platform == "linux" and platform.machine() == "x86_64" and shutil.which("objdump"):
        # The kernels of each instruction set, built with their own flags.
        assert "-DCPU_CAPABILITY=AVX2 -DCPU_CAPABILITY_AVX2 -mavx2" in first_log
        assert avx_reached_from_baseline_code(Path(info["library"])) == []

    # Unchanged sources: the second load comes from the cache, with no build.
    second = run(code, tmp_path / "args.pt", tmp_path / "out2.pt", **env)
    assert second.returncode == 0, second.stderr
    log = second.stdout + second.stderr
    assert "Loading extension module lltm_jit" in log
    assert not re.search(r"\[\d+/\d+\] ", log), log


def test_auto_falls_back_to_jit_on_a_torch_mismatch(extensions_dir: Path, tmp_path: Path) -> None:
    args = make_inputs(3, 4, 6, dtype=torch.float64)
    torch.save(args, tmp_path / "args.pt")
    code = FAKE_OTHER_TORCH + "import warnings; warnings.simplefilter('always')\n" + RUN_AND_SAVE
    result = run(
        code, tmp_path / "args.pt", tmp_path / "out.pt", TORCH_EXTENSIONS_DIR=str(extensions_dir)
    )
    assert result.returncode == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warning) == 1, result.stderr
    assert "built for torch 2.99.0" in warning[0]
    assert f"torch {torch.__version__} is installed" in warning[0]
    outputs, _ = torch.load(tmp_path / "out.pt")
    info = build_info_of(result)
    assert info["backend"] == "jit"
    torch.testing.assert_close(outputs, _C.forward(*args), rtol=0, atol=0)


def test_auto_without_a_compiler_says_how_to_get_a_wheel(tmp_path: Path) -> None:
    code = FAKE_OTHER_TORCH + "import lltm"
    result = run(code, CXX=str(tmp_path / "no-such-compiler"), TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "ImportError: lltm was built against torch 2.99.0" in result.stderr
    assert "install an lltm wheel built for torch" in result.stderr
    assert "Building lltm for the installed torch instead failed: no C++ compiler" in result.stderr


def test_backend_aot_raises_on_a_torch_mismatch() -> None:
    result = run(FAKE_OTHER_TORCH + "import lltm", LLTM_BACKEND="aot")
    assert "ImportError: lltm was built against torch 2.99.0" in result.stderr
    assert "RuntimeWarning" not in result.stderr


def test_unknown_backend_is_rejected() -> None:
    result = run("import lltm", LLTM_BACKEND="fast")
    assert "ImportError: LLTM_BACKEND='fast': expected one of auto, aot, jit" in result.stderr


def test_jit_load_refuses_a_second_registration() -> None:
    with pytest.raises(RuntimeError, match=r"the prebuilt lltm\._C is already loaded"):
        jit.load()


def test_jit_load_returns_the_loaded_module(extensions_dir: Path) -> None:
    code = (
        "import lltm, lltm.jit as j\n"
        "assert j.load() is lltm._C\n"
        "try:\n"
        "    j.load(build_directory='/elsewhere')\n"
        "except RuntimeError as e:\n"
        "    print('refused:', e)\n"
    )
    result = run(code, LLTM_BACKEND="jit", TORCH_EXTENSIONS_DIR=str(extensions_dir))
    assert result.returncode == 0, result.stderr
    # (the variant, with or without CUDA, depends on the machine)
    assert "refused: lltm.jit.load('/elsewhere', " in result.stdout
    assert "lltm is already loaded in this process from a JIT build" in result.stdout


def test_python_m_lltm_reports_the_backend(extensions_dir: Path) -> None:
    result = run(
        "import runpy; runpy.run_module('lltm', run_name='__main__')",
        LLTM_BACKEND="jit",
        TORCH_EXTENSIONS_DIR=str(extensions_dir),
    )
    assert result.returncode == 0, result.stderr
    assert '"backend": "jit"' in result.stdout


def _tree_sources() -> set[str]:
    """Every file of cpp/ and cuda/ in the checkout, and the list of sources."""
    files = {str(p.relative_to(ROOT)) for d in ("cpp", "cuda") for p in (ROOT / d).rglob("*")}
    return {f for f in files if (ROOT / f).is_file()} | {"sources.txt"}


def test_sources_list_every_compiled_file_once() -> None:
    listed = [*jit.sources("module", ROOT), *jit.sources("cpu_kernels", ROOT)]
    listed += jit.sources("cuda", ROOT)
    compiled = {s for s in _tree_sources() if s.endswith((".cpp", ".cu"))}
    assert sorted(listed) == sorted(compiled)
    assert all(s.endswith((".cpp", ".cu")) for s in listed)
    assert not [s for s in jit.sources("module", ROOT) if s.endswith(".cu")]


def test_package_data_holds_every_source() -> None:
    shipped = Path(lltm.__file__).parent / "_csrc"
    if not shipped.is_dir():
        pytest.skip("an editable install: the sources are the checkout's")
    files = {str(p.relative_to(shipped)) for p in shipped.rglob("*") if p.is_file()}
    assert files == _tree_sources()
    for name in files:
        assert (shipped / name).read_bytes() == (ROOT / name).read_bytes(), name


# lltm imported from the checkout's src/ as if it were not installed: no
# editable-install finder, no distribution metadata, no built _build_info.
FROM_SOURCE_TREE = """
import importlib.metadata as metadata, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
sys.path.insert(0, sys.argv[1])
real_version = metadata.version
def version(name):
    if name == "lltm":
        raise metadata.PackageNotFoundError(name)
    return real_version(name)
metadata.version = version
import lltm
print("FROM", lltm.__file__)
print("VERSION", lltm.__version__)
print("BUILD_INFO", __import__("json").dumps(lltm.build_info()))
"""


def test_source_tree_without_a_build_says_how_to_install() -> None:
    result = run(FROM_SOURCE_TREE, ROOT / "src", LLTM_BACKEND="auto")
    assert result.returncode != 0
    assert "PackageNotFoundError" not in result.stderr
    assert "ImportError: lltm's compiled module is missing" in result.stderr
    assert "pip install --no-build-isolation -e ." in result.stderr
    assert "LLTM_BACKEND=jit" in result.stderr


def test_package_version_without_distribution_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_found(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_found)
    assert lltm._package_version() == "0+unknown"


@pytest.mark.skipif(
    jit.source_dir() != ROOT,
    reason="the installed lltm's JIT builds lltm/_csrc: building the checkout's sources "
    "too would take minutes (the editable install shares one build)",
)
def test_source_tree_with_jit_imports_with_an_unknown_version(extensions_dir: Path) -> None:
    result = run(
        FROM_SOURCE_TREE, ROOT / "src", LLTM_BACKEND="jit", TORCH_EXTENSIONS_DIR=str(extensions_dir)
    )
    assert result.returncode == 0, result.stderr
    assert f"FROM {ROOT / 'src' / 'lltm' / '__init__.py'}" in result.stdout
    assert "VERSION 0+unknown" in result.stdout
    info = build_info_of(result)
    assert info["backend"] == "jit"
    assert info["version"] == "0+unknown"
