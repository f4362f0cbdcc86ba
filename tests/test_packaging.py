"""Packaging: the version label and torch pin, the wheel matrix, the gates, the index server.

build_support/lltm_build_meta.py and scripts/wheels.py are loaded from the
checkout (or from cibuildwheel's copy of it); nothing here builds a wheel.
The builds themselves are checked by `nox -s wheels_local` and CI.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import lltm

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path) -> ModuleType:
    if not path.is_file():
        pytest.skip(f"{path} is not here (not a checkout)")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def meta() -> ModuleType:
    return load(ROOT / "build_support" / "lltm_build_meta.py")


@pytest.fixture(scope="module")
def wheels() -> ModuleType:
    return load(ROOT / "scripts" / "wheels.py")


# --- the version label and the torch pin (build_support/lltm_build_meta.py) -----------


@pytest.mark.parametrize(
    ("version", "cuda", "label"),
    [
        ("2.14.1+cu130", "13.0", "pt214cu130"),
        ("2.13.0+cpu", None, "pt213cpu"),
        ("2.13.0", "12.6", "pt213cu126"),  # PyPI's torch carries no local label
        ("2.9.1", None, "pt29cpu"),
    ],
)
def test_local_label(meta: ModuleType, version: str, cuda: str | None, label: str) -> None:
    assert meta.local_label(meta.TorchBuild(version=version, cuda=cuda)) == label


def test_rocm_torch_is_refused(meta: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="ROCm build"):
        meta.local_label(meta.TorchBuild(version="2.14.0+rocm7.1", cuda=None, hip="7.1"))


def _provider(meta: ModuleType, state: str) -> Any:
    provider = meta.TorchVariant()
    provider.build_state(state)
    return provider


@pytest.mark.parametrize("state", ["wheel", "editable", "metadata_wheel"])
def test_wheel_gets_label_and_pin(
    meta: ModuleType, state: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # a checkout: no PKG-INFO
    monkeypatch.setattr(meta, "torch_build", lambda: meta.TorchBuild("2.14.1+cu130", "13.0"))
    fragment = _provider(meta, state).dynamic_metadata({"version": "0.1.0"}, {})
    assert fragment == {"version": "0.1.0+pt214cu130", "dependencies": ["torch==2.14.*"]}


def test_sdist_has_plain_version_and_needs_no_torch(
    meta: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_torch() -> None:
        pytest.fail("the sdist must not look for torch")

    monkeypatch.setattr(meta, "torch_build", no_torch)
    provider = _provider(meta, "sdist")
    assert provider.dynamic_metadata({"version": "0.1.0"}, {}) == {
        "version": "0.1.0",
        "dependencies": [],
    }
    assert provider.dynamic_wheel({}) == {"dependencies": True}


def test_wheel_from_sdist_keeps_plain_version(
    meta: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: lltm\nVersion: 0.1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(meta, "torch_build", lambda: meta.TorchBuild("2.13.0+cpu", None))
    fragment = _provider(meta, "wheel").dynamic_metadata({"version": "0.1.0"}, {})
    assert fragment == {"version": "0.1.0", "dependencies": ["torch==2.13.*"]}


def test_never_asks_for_torch(meta: ModuleType) -> None:
    assert meta.TorchVariant().get_requires_for_dynamic_metadata({"version": "0.1.0"}) == []


def test_no_torch_stops_with_the_working_command(
    meta: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(meta, "find_spec", lambda _name: None)
    monkeypatch.setattr(sys, "path", [*sys.path, "/tmp/pip-build-env-x/overlay/site-packages"])
    with pytest.raises(RuntimeError) as excinfo:
        _provider(meta, "wheel").dynamic_metadata({"version": "0.1.0"}, {})
    message = str(excinfo.value)
    assert "pip's isolated build environment cannot import torch" in message
    assert "pip install --no-build-isolation lltm" in message
    assert "pip install --no-build-isolation ." in message


def test_torch_build_reads_the_installed_torch(meta: ModuleType) -> None:
    found = meta.torch_build()
    assert found.version == torch.__version__
    assert found.cuda == torch.version.cuda


@pytest.mark.parametrize(
    ("settings", "match"),
    [({"version": "0.1.0+cpu"}, "public PEP 440"), ({}, "public PEP 440"), ({"v": 1}, "unknown")],
)
def test_bad_settings(
    meta: ModuleType, settings: dict[str, Any], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(meta, "torch_build", lambda: meta.TorchBuild("2.13.0+cpu", None))
    with pytest.raises(RuntimeError, match=match):
        _provider(meta, "wheel").dynamic_metadata(settings, {})


def test_installed_label_names_the_running_torch(meta: ModuleType) -> None:
    """A wheel built from a checkout names its torch; the one running must be that one."""
    if "+" not in lltm.__version__:
        pytest.skip(f"lltm {lltm.__version__} was built from an sdist: no label")
    label = lltm.__version__.split("+", 1)[1]
    running = meta.local_label(meta.TorchBuild(torch.__version__, torch.version.cuda))
    assert label == running


def test_source_build_resolves_nothing_but_lltm() -> None:
    """In this env (whatever its torch), a source build needs no other torch than the one here."""
    if (
        not (ROOT / "CMakeLists.txt").is_file()
        or importlib.util.find_spec("scikit_build_core") is None
    ):
        pytest.skip("needs the source tree and scikit-build-core (the nox sessions have both)")
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation"]
    result = subprocess.run(
        [*pip, "--no-index", "--quiet", "--report", "-", str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    installs = [item["metadata"] for item in json.loads(result.stdout)["install"]]
    assert [i["name"] for i in installs] == ["lltm"]
    minor = ".".join(torch.__version__.split(".")[:2])
    assert installs[0]["requires_dist"][0] == f"torch=={minor}.*"


# --- the wheel matrix (pyproject.toml) -------------------------------------------------

CONFIG: dict[str, Any] = {
    "tool": {
        "cibuildwheel": {
            "build": ["cp311-*", "cp312-*"],
            "linux": {"archs": ["x86_64"]},
            "macos": {"archs": ["arm64"]},
        },
        "lltm": {
            "wheels": {
                "torch": ["2.13", "2.14"],
                "variants": {"linux-x86_64": ["cpu", "cu130"], "macos-arm64": ["cpu"]},
                "runners": {"linux-x86_64": "ubuntu", "macos-arm64": "macos"},
                "size-budget-mb": {"cpu": 1, "cuda": 20},
            }
        },
    }
}


def _config(**changes: Any) -> dict[str, Any]:
    config = json.loads(json.dumps(CONFIG))
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        table = config
        for key in path:
            table = table[key]
        table[last] = value
    return config


def test_matrix_jobs(wheels: ModuleType) -> None:
    matrix = wheels.load_matrix(_config())
    jobs = matrix.jobs()
    assert len(jobs) == 2 * 2 * (2 + 1)  # Pythons x torch x (linux variants + macos)
    assert {
        "name": "cp312-manylinux_x86_64 torch 2.14 cu130",
        "runner": "ubuntu",
        "only": "cp312-manylinux_x86_64",
        "torch": "2.14",
        "variant": "cu130",
        "artifact": "wheel-cp312-manylinux_x86_64-pt214cu130",
    } in jobs
    macos = next(p for p in matrix.platforms if p.name == "macos")
    assert matrix.expected_identifiers(macos) == ["cp311-macosx_arm64", "cp312-macosx_arm64"]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"tool__cibuildwheel__build": ["cp3*"]}, "one CPython per entry"),
        ({"tool__cibuildwheel__linux": {"archs": ["aarch64"]}}, "has no 'linux-aarch64'"),
        (
            {"tool__lltm__wheels__variants": {"linux-x86_64": ["cpu"], "macos-arm64": ["cu130"]}},
            "only 'cpu' off Linux",
        ),
        ({"tool__lltm__wheels__torch": ["2"]}, "minor releases"),
        (
            {
                "tool__lltm__wheels__variants": {
                    **CONFIG["tool"]["lltm"]["wheels"]["variants"],
                    "windows-AMD64": ["cpu"],
                }
            },
            "which no \\[tool.cibuildwheel\\] archs builds",
        ),
    ],
)
def test_matrix_errors(wheels: ModuleType, changes: dict[str, Any], match: str) -> None:
    with pytest.raises(wheels.WheelError, match=match):
        wheels.load_matrix(_config(**changes))


def test_project_matrix_has_the_variants_the_issue_asks(wheels: ModuleType) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("reading pyproject.toml needs tomllib")
    matrix = wheels.load_matrix()
    assert matrix.pythons == ("3.10", "3.11", "3.12", "3.13", "3.14")
    assert {"2.13", "2.14"} <= set(matrix.torch)
    keys = {p.key: p.variants for p in matrix.platforms}
    assert set(keys) == {"linux-x86_64", "linux-aarch64", "macos-arm64", "windows-AMD64"}
    assert all("cpu" in variants for variants in keys.values())
    assert "cu130" in keys["linux-x86_64"]
    assert any(v.startswith("cu12") for v in keys["linux-x86_64"])


def test_readme_holds_the_variants_table(wheels: ModuleType) -> None:
    readme = ROOT / "README.md"
    if sys.version_info < (3, 11) or not readme.is_file():
        pytest.skip("needs the checkout's README.md and tomllib")
    assert wheels.variants_table(wheels.load_matrix()) in readme.read_text()


# --- the gates, on made-up wheels -------------------------------------------------------

BUILD_INFO = """VERSION = "0.1.0+pt214cu130" or "0.1.0"
TORCH_VERSION = "2.14.1+cu130"
CUDA_VERSION: str | None = "13.0"
CUDA_ARCHS: list[str] = ["9.0", "12.0+PTX"]
"""


def make_wheel(
    directory: Path,
    version: str = "0.1.0+pt214cu130",
    requires: str = "torch==2.14.*",
    build_info: str = BUILD_INFO,
    extra: dict[str, bytes] | None = None,
    platform: str = "manylinux_2_28_x86_64",
) -> Path:
    path = directory / f"lltm-{version}-cp312-cp312-{platform}.whl"
    files = {
        "lltm/__init__.py": b"",
        "lltm/_C.cpython-312-x86_64-linux-gnu.so": b"\x7fELF not really",
        "lltm/_build_info.py": build_info.encode(),
        f"lltm-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.4\nName: lltm\nVersion: {version}\n"
            f"Requires-Python: >=3.10\nRequires-Dist: {requires}\n"
        ).encode(),
        **(extra or {}),
    }
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def gates(wheels: ModuleType, path: Path, expect: str | None = None) -> dict[str, tuple[str, str]]:
    report = wheels.Report(path)
    info = wheels.read_wheel(path)
    wheels.gate_metadata(report, info, expect)
    wheels.gate_contents(report, info)
    wheels.gate_size(report, info, {"cpu": 1, "cuda": 0.001})
    return {gate: (status, detail) for gate, status, detail in report.results}


def test_gates_pass_a_good_wheel(wheels: ModuleType, tmp_path: Path) -> None:
    results = gates(wheels, make_wheel(tmp_path), expect="cu130")
    assert results["label"][0] == "ok", results
    assert results["contents"][0] == "ok", results
    assert results["size"][0] == "ok", results


@pytest.mark.parametrize(
    ("kwargs", "gate", "detail"),
    [
        ({"extra": {"lltm.libs/libtorch_cpu-1a2b.so": b"x"}}, "contents", "torch/CUDA"),
        ({"extra": {"lltm/.dylibs/libc10.dylib": b"x"}}, "contents", "vendored"),
        ({"requires": "torch==2.13.*"}, "label", "Requires-Dist"),
        ({"version": "0.1.0+pt213cu130"}, "label", "built against torch 2.14.1"),
        ({"version": "0.1.0"}, "label", "no +pt"),
        ({"build_info": BUILD_INFO.replace('["9.0", "12.0+PTX"]', "[]")}, "label", "without CUDA"),
        ({"extra": {"lltm/filler.bin": b"0" * 2000}}, "size", "budget cuda"),
    ],
)
def test_gates_catch(
    wheels: ModuleType, tmp_path: Path, kwargs: dict[str, Any], gate: str, detail: str
) -> None:
    status, text = gates(wheels, make_wheel(tmp_path, **kwargs))[gate]
    assert status == "FAIL"
    assert detail in text


def test_gate_expected_variant(wheels: ModuleType, tmp_path: Path) -> None:
    status, text = gates(wheels, make_wheel(tmp_path), expect="cpu")["label"]
    assert (status, text) == ("FAIL", "expected the cpu variant, got cu130")


@pytest.mark.parametrize(
    ("name", "excluded"),
    [
        ("libtorch_cpu.so", True),
        ("libc10_cuda.so", True),
        ("libcudart.so.13", True),
        ("libcuda.so.1", True),
        ("torch_python.dll", True),
        ("libtorch.dylib", True),
        ("libgfortran.so.5", False),
        ("libgomp.so.1", True),  # torch ships it (torch/lib), lltm links it
        ("libcudnn.so.9", False),
        ("libomp.dylib", True),
    ],
)
def test_torch_and_cuda_libraries(wheels: ModuleType, name: str, excluded: bool) -> None:
    assert wheels.is_excluded_lib(name) is excluded


@pytest.mark.parametrize("system", ["linux", "darwin", "win32"])
def test_repair_leaves_torch_and_cuda_out(
    wheels: ModuleType, system: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wheels, "tool", lambda *_args: ["TOOL"])
    cmd, _ = wheels.repair_command(Path("w.whl"), Path("out"), system)
    excluded = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--exclude"]
    patterns = {"linux": wheels.EXCLUDE_LINUX, "darwin": wheels.EXCLUDE_MACOS}.get(
        system, [";".join(wheels.EXCLUDE_WINDOWS)]
    )
    assert excluded == list(patterns)
    joined = " ".join(excluded)
    for library in ("torch", "c10", "cuda"):
        if system != "darwin" or library != "cuda":  # no CUDA on macOS
            assert library in joined
    assert cmd[-1] == "w.whl"


def test_serve_an_index(wheels: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "cpu" / "lltm").mkdir(parents=True)
    (tmp_path / "cpu" / "lltm" / "index.html").write_text("<a href='../x.whl'>x</a>")
    with wheels.serve(tmp_path) as url:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{url}/cpu/lltm/", timeout=10) as response:
            assert b"x.whl" in response.read()
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{url}/cu130/", timeout=10)


def test_index_per_variant(wheels: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("dumb_pypi", reason="dumb-pypi writes the index (nox wheel sessions)")
    house = tmp_path / "house"
    house.mkdir()
    cpu_info = 'VERSION = "0.1.0+pt213cpu"\nTORCH_VERSION = "2.13.0+cpu"\nCUDA_VERSION = None\n'
    make_wheel(house)
    make_wheel(house, "0.1.0+pt213cpu", "torch==2.13.*", cpu_info)
    assert wheels.main(["index", str(house), "--out", str(tmp_path / "index")]) == 0
    page = (tmp_path / "index" / "cu130" / "lltm" / "index.html").read_text()
    assert 'href="../lltm-0.1.0+pt214cu130-cp312-cp312-manylinux_2_28_x86_64.whl#sha256=' in page
    assert "data-core-metadata=" in page
    assert "pt213cpu" not in page
    assert (tmp_path / "index" / "cpu" / "lltm" / "index.html").is_file()
