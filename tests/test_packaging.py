"""Packaging: the version label and torch pin, the wheel matrix, the gates, the index server.

build_support/lltm_build_meta.py and scripts/wheels.py are loaded from the
checkout (or from cibuildwheel's copy of it); nothing here builds a wheel.
The builds themselves are checked by `nox -s wheels_local` and CI.
"""

from __future__ import annotations

import base64
import hashlib
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
        "pypi": False,  # CONFIG names no PyPI variants
        "timeout": wheels.TIMEOUT_MINUTES["cuda"],
    } in jobs
    macos = next(p for p in matrix.platforms if p.name == "macos")
    assert matrix.expected_identifiers(macos) == ["cp311-macosx_arm64", "cp312-macosx_arm64"]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"tool__cibuildwheel__build": ["cp3*"]}, "one CPython per entry"),
        ({"tool__cibuildwheel__build": ["cp314td-*"]}, "one CPython per entry"),
        ({"tool__lltm__wheels__pypi": {"linux-x86_64": "cu126"}}, "one of its variants"),
        (
            {"tool__lltm__wheels__pypi": {"linux-x86_64": "cpu"}},
            "no variant for \\['macos-arm64'\\]",
        ),
        (
            {"tool__lltm__wheels__pull-request": {"pythons": ["3.9"], "variants": ["cpu"]}},
            "which the full matrix does not build",
        ),
        ({"tool__lltm__wheels__pull-request": {"pythons": [], "variants": []}}, "non-empty"),
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


def test_free_threaded_identifiers(wheels: ModuleType) -> None:
    matrix = wheels.load_matrix(_config(tool__cibuildwheel__build=["cp314-*", "cp314t-*"]))
    assert matrix.pythons == ("3.14", "3.14t")
    linux = next(p for p in matrix.platforms if p.name == "linux")
    assert matrix.expected_identifiers(linux) == [
        "cp314-manylinux_x86_64",
        "cp314t-manylinux_x86_64",
    ]


PLANS_CONFIG = _config(
    tool__cibuildwheel__build=["cp310-*", "cp312-*", "cp314-*", "cp314t-*"],
    tool__lltm__wheels__pypi={"linux-x86_64": "cu130", "macos-arm64": "cpu"},
    **{"tool__lltm__wheels__pull-request": {"pythons": ["3.10", "3.14t"], "variants": ["cu130"]}},
)


def test_pull_request_plan_is_a_subset(wheels: ModuleType) -> None:
    matrix = wheels.load_matrix(PLANS_CONFIG)
    full, pr = matrix.jobs("full"), matrix.jobs("pr")
    assert len(full) == 4 * 2 * (2 + 1)  # Pythons x torch x (linux variants + macos)
    assert all(job in full for job in pr)
    # The main platform: the PR's Pythons x its variants x the newest torch ...
    linux = [(j["only"], j["torch"], j["variant"]) for j in pr if j["runner"] == "ubuntu"]
    assert linux == [
        ("cp310-manylinux_x86_64", "2.14", "cu130"),
        ("cp314t-manylinux_x86_64", "2.14", "cu130"),
    ]
    # ... and one job per other platform: the newest CPython with the GIL, cpu.
    macos = [(j["only"], j["torch"], j["variant"]) for j in pr if j["runner"] == "macos"]
    assert macos == [("cp314-macosx_arm64", "2.14", "cpu")]
    with pytest.raises(wheels.WheelError, match="expected one of pr, full"):
        matrix.jobs("nightly")


def test_pypi_jobs_are_the_policys(wheels: ModuleType) -> None:
    matrix = wheels.load_matrix(PLANS_CONFIG)
    pypi = [(j["only"], j["torch"], j["variant"]) for j in matrix.jobs("full") if j["pypi"]]
    # One per CPython per platform: the newest torch, the variant PyPI's torch is.
    assert sorted(pypi) == sorted(
        [(f"cp{p}-manylinux_x86_64", "2.14", "cu130") for p in ("310", "312", "314", "314t")]
        + [(f"cp{p}-macosx_arm64", "2.14", "cpu") for p in ("310", "312", "314", "314t")]
    )
    assert all(
        j["timeout"] > wheels.TIMEOUT_MINUTES["cpu"] for j in matrix.jobs() if j["variant"] != "cpu"
    )


def test_plan_from_env(wheels: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLTM_WHEEL_PLAN", raising=False)
    assert wheels.plan_from_env(None) == "full"
    monkeypatch.setenv("LLTM_WHEEL_PLAN", "pr")
    assert wheels.plan_from_env(None) == "pr"
    assert wheels.plan_from_env("full") == "full"


def test_project_plans(wheels: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """The project's two plans, as `wheels.py plan` prints them: counts match the job lists."""
    if sys.version_info < (3, 11):
        pytest.skip("reading pyproject.toml needs tomllib")
    matrix = wheels.load_matrix()
    full, pr = matrix.jobs("full"), matrix.jobs("pr")
    variants = sum(len(p.variants) for p in matrix.platforms)
    assert len(full) == len(matrix.pythons) * len(matrix.torch) * variants
    assert matrix.pull_request is not None
    assert len(pr) == len(matrix.pull_request.pythons) * len(matrix.pull_request.variants) + (
        len(matrix.platforms) - 1
    )
    assert all(job in full for job in pr)
    assert {j["torch"] for j in pr} == {matrix.newest_torch}
    # cp310 and cp314 x {cpu, one CUDA} on Linux x86_64, one job per other platform.
    assert {"3.10", "3.14"} <= set(matrix.pull_request.pythons)
    assert "cpu" in matrix.pull_request.variants
    assert any(v.startswith("cu") for v in matrix.pull_request.variants)
    # Every platform gets a PyPI wheel per CPython in the full plan; the PR builds one each.
    assert sum(j["pypi"] for j in full) == len(matrix.pythons) * len(matrix.platforms)
    assert {j["runner"] for j in pr if j["pypi"]} == {p.runner for p in matrix.platforms}
    building = ROOT / "docs" / "building.md"
    if building.is_file():  # the docs' description of both plans
        assert f"and one job (CPython 3.14, torch {matrix.newest_torch}, cpu) per other" in (
            text := " ".join(building.read_text().split())
        )
        assert f"per other platform: {len(pr)} jobs;" in text
        assert f"the full matrix, {len(full)} jobs." in text
    assert wheels.main(["plan"]) == 0
    out = capsys.readouterr().out
    assert f"== pr: {len(pr)} jobs" in out
    assert f"== full: {len(full)} jobs" in out
    assert out.count(" torch ") == len(pr) + len(full)


def test_project_matrix_has_the_variants_the_issue_asks(wheels: ModuleType) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("reading pyproject.toml needs tomllib")
    matrix = wheels.load_matrix()
    assert matrix.pythons == ("3.10", "3.11", "3.12", "3.13", "3.14", "3.14t")
    # PyPI: the CUDA build of PyPI's torch on Linux x86_64, cpu elsewhere.
    assert matrix.pypi == {
        "linux-x86_64": "cu130",
        "linux-aarch64": "cpu",
        "macos-arm64": "cpu",
        "windows-AMD64": "cpu",
    }
    assert {"2.13", "2.14"} <= set(matrix.torch)
    keys = {p.key: p.variants for p in matrix.platforms}
    assert set(keys) == {"linux-x86_64", "linux-aarch64", "macos-arm64", "windows-AMD64"}
    assert all("cpu" in variants for variants in keys.values())
    assert "cu130" in keys["linux-x86_64"]
    assert any(v.startswith("cu12") for v in keys["linux-x86_64"])


def test_building_doc_holds_the_variants_table(wheels: ModuleType) -> None:
    doc = ROOT / wheels.VARIANTS_DOC
    if sys.version_info < (3, 11) or not doc.is_file():
        pytest.skip("needs the checkout's docs and tomllib")
    assert wheels.variants_table(wheels.load_matrix()) in doc.read_text()


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
        ({"version": "0.1.0"}, "label", "a plain version, but no PyPI policy"),
        ({"version": "0.1.0+cpu"}, "label", "no +pt"),
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
        ("msvcp140.dll", True),  # the MSVC runtime: the system's, as torch's is
        ("MSVCP140_1.dll", True),
        ("vcruntime140_1.dll", True),
        ("libopenblas.dll", False),
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


# --- PyPI's plain-version wheels ------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "key"),
    [
        ("manylinux_2_28_x86_64", "linux-x86_64"),
        ("manylinux_2_28_aarch64", "linux-aarch64"),
        ("manylinux_2_27_x86_64.manylinux_2_28_x86_64", "linux-x86_64"),
        ("linux_x86_64", "linux-x86_64"),
        ("macosx_11_0_arm64", "macos-arm64"),
        ("win_amd64", "windows-AMD64"),
        ("any", None),
    ],
)
def test_platform_key(wheels: ModuleType, tag: str, key: str | None) -> None:
    assert wheels.platform_key(tag) == key


def test_plain_wheel_is_the_same_wheel_under_the_plain_version(
    wheels: ModuleType, tmp_path: Path
) -> None:
    labelled = make_wheel(tmp_path, extra={"lltm/": b""})  # a folder entry, as auditwheel writes
    out = tmp_path / "pypi"
    out.mkdir()
    plain = wheels.plain_wheel(labelled, out)
    assert plain.name == "lltm-0.1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(labelled) as a, zipfile.ZipFile(plain) as b:
        assert a.read("lltm/_C.cpython-312-x86_64-linux-gnu.so") == b.read(
            "lltm/_C.cpython-312-x86_64-linux-gnu.so"
        )
        assert "Version: 0.1.0\n" in b.read("lltm-0.1.0.dist-info/METADATA").decode()
        assert 'VERSION = "0.1.0"' in b.read("lltm/_build_info.py").decode()
        assert not [n for n in b.namelist() if "+pt214" in n]
        # RECORD lists every other file with its hash and size, and itself without.
        rows = [r.split(",") for r in b.read("lltm-0.1.0.dist-info/RECORD").decode().split()]
        assert sorted(r[0] for r in rows) == sorted(b.namelist())
        assert not [r[0] for r in rows if r[0].endswith("/")]  # files only: auditwheel reads it
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = b.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == f"sha256={expected.decode()}"
            assert int(size) == len(data)
    with pytest.raises(wheels.WheelError, match="plain version already"):
        wheels.plain_wheel(plain, tmp_path)


def pypi_gate(
    wheels: ModuleType, path: Path, policy: tuple[str, dict[str, str]]
) -> tuple[str, str]:
    report = wheels.Report(path)
    wheels.gate_metadata(report, wheels.read_wheel(path), None, policy)
    return {gate: (status, detail) for gate, status, detail in report.results}["label"]


def test_gate_checks_plain_wheels_against_the_pypi_policy(
    wheels: ModuleType, tmp_path: Path
) -> None:
    out = tmp_path / "pypi"
    out.mkdir()
    plain = wheels.plain_wheel(make_wheel(tmp_path), out)
    status, detail = pypi_gate(wheels, plain, ("2.14", {"linux-x86_64": "cu130"}))
    assert status == "ok", detail
    assert "plain 0.1.0 (PyPI), cu130" in detail
    status, detail = pypi_gate(wheels, plain, ("2.15", {"linux-x86_64": "cpu"}))
    assert status == "FAIL"
    assert "not the newest, 2.15" in detail
    assert "[tool.lltm.wheels.pypi] says 'cpu'" in detail
    status, detail = pypi_gate(wheels, plain, None)  # type: ignore[arg-type]
    assert (status, "no PyPI policy" in detail) == ("FAIL", True)


def test_pypi_policy_override(wheels: ModuleType) -> None:
    matrix = wheels.load_matrix(PLANS_CONFIG)
    assert wheels.pypi_policy(matrix, None) == ("2.14", matrix.pypi)
    assert wheels.pypi_policy(matrix, "2.13:linux-x86_64=cpu") == ("2.13", {"linux-x86_64": "cpu"})
    with pytest.raises(wheels.WheelError, match="TORCH:PLATFORM=VARIANT"):
        wheels.pypi_policy(matrix, "linux-x86_64=cpu")


# --- the index of every release, and the workflow's checks -----------------------------


def test_index_url_hosts_compare_in_lowercase(wheels: ModuleType) -> None:
    wheels.check_index_url("https://OWNER.github.io/lltm/whl", "https://owner.github.io/lltm/whl/")
    with pytest.raises(wheels.WheelError, match="set index-url to it"):
        wheels.check_index_url(
            "https://owner.github.io/lltm/whl", "https://owner.github.io/LLTM/whl"
        )
    with pytest.raises(wheels.WheelError, match="set index-url to it"):
        wheels.check_index_url(
            "https://owner.github.io/lltm/whl", "https://other.github.io/lltm/whl"
        )


def _asset(tag: str, name: str, digest: str = "ab" * 32) -> dict[str, str]:
    url = f"https://github.com/o/lltm/releases/download/{tag}/{name}"
    return {"name": name, "browser_download_url": url, "digest": f"sha256:{digest}"}


def test_index_of_every_release(wheels: ModuleType, tmp_path: Path) -> None:
    wheel = "lltm-{}-cp312-cp312-manylinux_2_28_x86_64.whl"
    releases = [
        {
            "tag_name": "v0.2.0",
            "assets": [
                _asset("v0.2.0", wheel.format("0.2.0+pt214cu130")),
                _asset("v0.2.0", wheel.format("0.2.0+pt214cu130") + ".metadata", "cd" * 32),
                _asset("v0.2.0", wheel.format("0.2.0")),  # PyPI's: not in the variant index
            ],
        },
        {"tag_name": "v0.1.0", "assets": [_asset("v0.1.0", wheel.format("0.1.0+pt214cu130"))]},
        {
            "tag_name": "v0.3.0",
            "draft": True,
            "assets": [_asset("v0.3.0", wheel.format("0.3.0+pt214cu130"))],
        },
    ]
    # gh api --paginate --jq '.[]': one release per line.
    listing = tmp_path / "releases.jsonl"
    listing.write_text("".join(json.dumps(r) + "\n" for r in releases))
    assert wheels.main(["index", "--releases", str(listing), "--out", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "cu130" / "lltm" / "index.html").read_text()
    for version in ("0.1.0", "0.2.0"):
        url = f"https://github.com/o/lltm/releases/download/v{version}/" + wheel.format(
            f"{version}+pt214cu130"
        )
        assert f'href="{url}#sha256={"ab" * 32}"' in page
    assert f'data-core-metadata="sha256={"cd" * 32}"' in page
    assert "0.3.0" not in page  # a draft
    assert wheel.format("0.2.0") + "<" not in page
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["cu130"]
    # A JSON list (gh api without --jq) reads the same.
    assert wheels.read_releases(listing) == releases
    listing.write_text(json.dumps(releases[:2]) + json.dumps(releases[2:]))
    assert wheels.read_releases(listing) == releases


def test_index_refuses_a_renamed_asset(wheels: ModuleType, tmp_path: Path) -> None:
    renamed = "lltm-0.1.0.pt214cu130-cp312-cp312-manylinux_2_28_x86_64.whl"
    listing = tmp_path / "releases.json"
    listing.write_text(json.dumps([{"tag_name": "v0.1.0", "assets": [_asset("v0.1.0", renamed)]}]))
    assert wheels.main(["index", "--releases", str(listing), "--out", str(tmp_path / "o")]) == 1


def test_release_manifest_and_relabel(wheels: ModuleType, tmp_path: Path) -> None:
    """Two local releases side by side in one index, as `nox -s wheels_local` lays them out."""
    root = tmp_path / "download"
    (root / "v0.1.0").mkdir(parents=True)
    (root / "v0.2.0").mkdir()
    first = make_wheel(root / "v0.1.0")
    second = wheels.relabel(first, root / "v0.2.0", "0.2.0+pt214cu130")
    assert wheels.read_wheel(second).version == "0.2.0+pt214cu130"
    for folder in ("v0.1.0", "v0.2.0"):
        wheels.write_metadata_files(root / folder)
    manifest = wheels.release_manifest(root, "/releases/download")
    assert [r["tag_name"] for r in manifest] == ["v0.1.0", "v0.2.0"]
    files = wheels.release_files(manifest)
    assert [(f.filename, f.url.split("/")[3]) for f in files] == [
        (first.name, "v0.1.0"),
        (second.name, "v0.2.0"),
    ]
    assert all(f.sha256 and f.metadata_sha256 for f in files)
    assert files[0].sha256 == wheels.sha256(first)


# --- torch for a variant: uv, or pip -----------------------------------------------------


def test_install_torch_uses_uv_and_the_variants_index(
    wheels: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wheels, "run", lambda *_a, **_k: None)  # no pip install uv here
    monkeypatch.delenv("LLTM_WHEEL_INSTALLER", raising=False)
    torch_cmd, deps = wheels.install_torch_commands(
        "2.14", "cu130", build_deps=True, system="win32"
    )
    assert torch_cmd[1:5] == ["-m", "uv", "pip", "install"]
    assert torch_cmd[-3:] == [
        "torch==2.14.*",
        "--index-url",
        "https://download.pytorch.org/whl/cu130",
    ]
    assert "delvewheel==1.13.2" in deps  # cibuildwheel brings no repair tool on Windows
    monkeypatch.setenv("LLTM_WHEEL_INSTALLER", "pip")
    (torch_cmd,) = wheels.install_torch_commands("2.13", "cpu", build_deps=False, system="linux")
    assert torch_cmd[1:4] == ["-m", "pip", "install"]
    monkeypatch.setenv("LLTM_WHEEL_INSTALLER", "conda")
    with pytest.raises(wheels.WheelError, match="expected uv or pip"):
        wheels.install_torch_commands("2.13", "cpu", build_deps=False)
