"""The gates on made-up wheels, PyPI's plain-version wheels, and the repair's exclusions."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.tags import parse_tag
from wheel_scripts import BUILD_INFO, MODULE, load, make_wheel

hooks = load("wheel_hooks")
wg = load("wheel_release")
wm = load("wheel_matrix")
wheels = load("wheels")


CONFIG = {
    "tool": {
        "cibuildwheel": {"build": ["cp312-*"], "linux": {"archs": ["x86_64"]}},
        "lltm": {
            "wheels": {
                "torch": ["2.13", "2.14"],
                "variants": {"linux-x86_64": ["cpu", "cu130"]},
                "runners": {"linux-x86_64": "ubuntu"},
                "pypi": {"linux-x86_64": "cu130"},
                "size-budget-mb": {"cpu": 1, "cuda": 0.003},
            }
        },
    }
}
TOOLS = ["twine", "check-wheel-contents", "auditwheel", "cuda-archs"]  # not here, nor needed


def gates(
    path: Path, expect: str | None = None, policy: tuple[str, dict[str, str]] | None = None
) -> dict[str, tuple[str, str]]:
    """The gates of `wheels.py check`, but those that run a tool."""
    args = argparse.Namespace(skip=TOOLS, expect_pypi=False, expect_variant=expect)
    results = wg.check_file(path, args, wm.load_matrix(CONFIG), policy)
    return {gate: (status, detail) for gate, status, detail in results}


def test_gates_pass_a_good_wheel(tmp_path: Path) -> None:
    results = gates(make_wheel(tmp_path), expect="cu130")
    assert results["label"][0] == "ok", results
    assert results["contents"] == ("ok", f"only {MODULE}"), results
    assert results["size"][0] == "ok", results


@pytest.mark.parametrize(
    ("kwargs", "gate", "detail"),
    [
        ({"extra": {"lltm.libs/libtorch_cpu-1a2b.so": b"x"}}, "contents", "torch/CUDA"),
        ({"extra": {"lltm/.dylibs/libc10.dylib": b"x"}}, "contents", "libraries bundled"),
        ({"extra": {"lltm/_C.abi3.so": b"x"}}, "contents", "expected one lltm/_C module"),
        ({"requires": "torch==2.13.*"}, "label", "Requires-Dist"),
        ({"version": "0.1.0+pt213cu130"}, "label", "built against torch 2.14.1"),
        ({"version": "0.1.0"}, "label", "a plain version, but no PyPI policy"),
        ({"version": "0.1.0+cpu"}, "label", "no +pt"),
        ({"build_info": BUILD_INFO.replace('["9.0", "12.0+PTX"]', "[]")}, "label", "for []"),
        ({"build_info": BUILD_INFO.replace("+cu130", "+cu126")}, "label", "is cu126"),
        ({"extra": {"lltm/filler.bin": os.urandom(4000)}}, "size", "budget cuda"),
    ],
)
def test_gates_catch(tmp_path: Path, kwargs: dict[str, Any], gate: str, detail: str) -> None:
    status, text = gates(make_wheel(tmp_path, **kwargs))[gate]
    assert status == "FAIL"
    assert detail in text


def test_gate_expected_variant(tmp_path: Path) -> None:
    status, text = gates(make_wheel(tmp_path), expect="cpu")["label"]
    assert (status, text) == ("FAIL", "expected the cpu variant, got cu130")


def test_read_wheel_refuses_bad_metadata(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path)
    with zipfile.ZipFile(wheel, "a") as archive:  # a second METADATA, elsewhere
        archive.writestr("lltm-0.1.0+pt214cu130.dist-info/METADATA.orig", b"")
    assert wg.read_wheel(wheel).version.local == "pt214cu130"
    bad = tmp_path / "lltm-0.1.0-cp312-cp312-any.whl"
    bad.write_bytes(wheel.read_bytes())
    with pytest.raises(hooks.WheelError, match=r"METADATA says version 0\.1\.0"):
        wg.read_wheel(bad)
    with pytest.raises(ValueError, match="Invalid wheel filename"):
        wg.read_wheel(tmp_path / "lltm.whl")


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
def test_torch_and_cuda_libraries(name: str, excluded: bool) -> None:
    assert hooks.is_excluded_lib(name) is excluded


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
def test_platform_key(tag: str, key: str | None) -> None:
    assert wg.platform_key(parse_tag(f"cp312-cp312-{tag}")) == key


@pytest.mark.skipif(sys.version_info < (3, 11), reason="pyproject.toml: tomllib")
def test_pypi_wheel_is_the_same_wheel_under_the_plain_version(tmp_path: Path) -> None:
    labelled, out = make_wheel(tmp_path), tmp_path / "pypi"
    policy = ["--policy", "2.14:linux-x86_64=cu130"]
    assert wheels.main(["pypi", str(labelled), "--out", str(out), "--expect", *policy]) == 0
    (plain,) = out.iterdir()
    assert plain.name == "lltm-0.1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    info = wg.read_wheel(plain)
    assert (str(info.version), info.build_info["VERSION"]) == ("0.1.0", "0.1.0")
    with zipfile.ZipFile(labelled) as a, zipfile.ZipFile(plain) as b:
        assert a.read(MODULE) == b.read(MODULE)
        assert not [n for n in b.namelist() if "+pt214" in n]
    # `wheel unpack` checks each file against RECORD's hash and size.
    unpack = [sys.executable, "-m", "wheel", "unpack", "--dest", str(tmp_path / "u"), str(plain)]
    subprocess.run(unpack, check=True, capture_output=True)
    # The policy's gate passes it; another policy's does not; no policy, no plain version.
    status, detail = gates(plain, policy=("2.14", {"linux-x86_64": "cu130"}))["label"]
    assert (status, "plain 0.1.0 (PyPI), cu130" in detail) == ("ok", True), detail
    status, detail = gates(plain, policy=("2.15", {"linux-x86_64": "cpu"}))["label"]
    assert status == "FAIL"
    assert "not the newest, 2.15" in detail
    assert "[tool.lltm.wheels.pypi] says 'cpu'" in detail
    assert "no PyPI policy" in gates(plain)["label"][1]
    # Not PyPI's variant, or already plain: no PyPI wheel, which --expect refuses.
    other = ["--policy", "2.14:linux-x86_64=cpu", "--out", str(tmp_path / "none"), "--expect"]
    assert wheels.main(["pypi", str(labelled), str(plain), *other]) == 1


def test_relabel_to_another_version(tmp_path: Path) -> None:
    newer = wg.relabel(make_wheel(tmp_path), tmp_path / "out", "0.2.0+pt214cu130")
    assert newer.name == "lltm-0.2.0+pt214cu130-cp312-cp312-manylinux_2_28_x86_64.whl"
    assert gates(newer)["label"][0] == "ok"


def test_pypi_policy_override() -> None:
    matrix = wm.load_matrix(CONFIG)
    assert wg.pypi_policy(matrix, None) == ("2.14", {"linux-x86_64": "cu130"})
    assert wg.pypi_policy(matrix, "2.13:linux-x86_64=cpu") == ("2.13", {"linux-x86_64": "cpu"})
    with pytest.raises(hooks.WheelError, match="TORCH:PLATFORM=VARIANT"):
        wg.pypi_policy(matrix, "linux-x86_64=cpu")


# --- cibuildwheel's hooks: the repair and torch for a variant ---------------------------


@pytest.mark.parametrize("system", ["linux", "darwin", "win32"])
def test_repair_leaves_torch_and_cuda_out(system: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "tool", lambda *_args: ["TOOL"])
    cmd, _ = hooks.repair_command(Path("w.whl"), Path("out"), system)
    excluded = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--exclude"]
    patterns = {"linux": hooks.EXCLUDE_LINUX, "darwin": hooks.EXCLUDE_MACOS}.get(
        system, [";".join(hooks.EXCLUDE_WINDOWS)]
    )
    assert excluded == list(patterns)
    joined = " ".join(excluded)
    for library in ("torch", "c10", "cuda"):
        if system != "darwin" or library != "cuda":  # no CUDA on macOS
            assert library in joined
    assert cmd[-1] == "w.whl"


def test_install_torch_uses_uv_and_the_variants_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "run", lambda *_a, **_k: None)  # no pip install uv here
    torch_cmd, deps = hooks.install_torch_commands("2.14", "cu130", build_deps=True, system="win32")
    assert torch_cmd[1:5] == ["-m", "uv", "pip", "install"]
    assert torch_cmd[-3:] == [
        "torch==2.14.*",
        "--index-url",
        "https://download.pytorch.org/whl/cu130",
    ]
    assert "delvewheel==1.13.2" in deps  # cibuildwheel brings no repair tool on Windows
    (torch_cmd,) = hooks.install_torch_commands("2.13", "cpu", build_deps=False, system="linux")
    assert torch_cmd[-1] == "https://download.pytorch.org/whl/cpu"


def test_hooks_need_the_standard_library_only() -> None:
    """cibuildwheel runs them before anything is installed: no third-party import at load."""
    code = (
        "import sys; before = set(sys.modules); sys.path.insert(0, sys.argv[1]); "
        "import wheel_hooks; new = set(sys.modules) - before; "
        "print(sorted(m for m in new if m.split('.')[0] not in sys.stdlib_module_names))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", code, str(Path(hooks.__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "['wheel_hooks']"
