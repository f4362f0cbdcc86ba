"""The version label and the torch pin of a wheel (build_support/lltm_build_meta.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from wheel_scripts import ROOT, load

import lltm


@pytest.fixture(scope="module")
def meta() -> ModuleType:
    return load("lltm_build_meta")


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
