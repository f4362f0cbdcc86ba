"""The wheel matrix of pyproject.toml: the jobs of both plans, and what the docs say of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from wheel_scripts import ROOT, load

hooks = load("wheel_hooks")
wm = load("wheel_matrix")
wheels = load("wheels")
needs_tomllib = pytest.mark.skipif(sys.version_info < (3, 11), reason="pyproject.toml: tomllib")

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


def test_matrix_jobs() -> None:
    matrix = wm.load_matrix(_config())
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
        "timeout": wm.TIMEOUT_MINUTES["cuda"],
    } in jobs
    macos = next(p for p in matrix.platforms if p.key.startswith("macos"))
    assert [macos.identifier(p) for p in matrix.pythons] == [
        "cp311-macosx_arm64",
        "cp312-macosx_arm64",
    ]


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
            "outside the full matrix",
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
            "built by no \\[tool.cibuildwheel\\] archs",
        ),
    ],
)
def test_matrix_errors(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(hooks.WheelError, match=match):
        wm.load_matrix(_config(**changes))


def test_free_threaded_identifiers() -> None:
    matrix = wm.load_matrix(_config(tool__cibuildwheel__build=["cp314-*", "cp314t-*"]))
    assert matrix.pythons == ("3.14", "3.14t")
    linux = next(p for p in matrix.platforms if p.key.startswith("linux"))
    assert [linux.identifier(p) for p in matrix.pythons] == [
        "cp314-manylinux_x86_64",
        "cp314t-manylinux_x86_64",
    ]


PLANS_CONFIG = _config(
    tool__cibuildwheel__build=["cp310-*", "cp312-*", "cp314-*", "cp314t-*"],
    tool__lltm__wheels__pypi={"linux-x86_64": "cu130", "macos-arm64": "cpu"},
    **{"tool__lltm__wheels__pull-request": {"pythons": ["3.10", "3.14t"], "variants": ["cu130"]}},
)


def test_pull_request_plan_is_a_subset() -> None:
    matrix = wm.load_matrix(PLANS_CONFIG)
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
    with pytest.raises(hooks.WheelError, match="expected one of pr, full"):
        matrix.jobs("nightly")


def test_pypi_jobs_are_the_policys() -> None:
    matrix = wm.load_matrix(PLANS_CONFIG)
    pypi = [(j["only"], j["torch"], j["variant"]) for j in matrix.jobs("full") if j["pypi"]]
    # One per CPython per platform: the newest torch, the variant PyPI's torch is.
    assert sorted(pypi) == sorted(
        [(f"cp{p}-manylinux_x86_64", "2.14", "cu130") for p in ("310", "312", "314", "314t")]
        + [(f"cp{p}-macosx_arm64", "2.14", "cpu") for p in ("310", "312", "314", "314t")]
    )
    assert all(
        j["timeout"] > wm.TIMEOUT_MINUTES["cpu"] for j in matrix.jobs() if j["variant"] != "cpu"
    )


@needs_tomllib
def test_the_workflow_matrix_follows_the_event(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """LLTM_WHEEL_PLAN (the wheels workflow sets it per event) picks the jobs; --plan wins."""
    matrix = wm.load_matrix()
    for env, argv, plan in (("pr", [], "pr"), ("", [], "full"), ("pr", ["--plan", "full"], "full")):
        monkeypatch.setenv("LLTM_WHEEL_PLAN", env)
        assert wheels.main(["matrix", "--github", *argv]) == 0
        assert json.loads(capsys.readouterr().out) == {"include": matrix.jobs(plan)}
    assert wheels.main(["matrix", "--pythons"]) == 0
    assert json.loads(capsys.readouterr().out) == list(matrix.pythons)


@needs_tomllib
def test_project_plans(capsys: pytest.CaptureFixture[str]) -> None:
    """The project's two plans, as `wheels.py plan` prints them: counts match the job lists."""
    matrix = wm.load_matrix()
    full, pr = matrix.jobs("full"), matrix.jobs("pr")
    variants = sum(len(p.variants) for p in matrix.platforms)
    assert len(full) == len(matrix.pythons) * len(matrix.torch) * variants
    plan = matrix.wheels["pull-request"]
    assert len(pr) == len(plan["pythons"]) * len(plan["variants"]) + len(matrix.platforms) - 1
    assert all(job in full for job in pr)
    assert {j["torch"] for j in pr} == {matrix.newest_torch}
    # cp310 and cp314 x {cpu, one CUDA} on Linux x86_64, one job per other platform.
    assert {"3.10", "3.14"} <= set(plan["pythons"])
    assert "cpu" in plan["variants"]
    assert any(v.startswith("cu") for v in plan["variants"])
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


@needs_tomllib
def test_project_matrix_has_the_documented_variants() -> None:
    matrix = wm.load_matrix()
    assert matrix.pythons == ("3.10", "3.11", "3.12", "3.13", "3.14", "3.14t")
    # PyPI: the CUDA build of PyPI's torch on Linux x86_64, cpu elsewhere.
    assert matrix.wheels["pypi"] == {
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


def variants_table(matrix: Any) -> str:
    """The table of variants, and one install line per variant, that docs/building.md shows."""
    names = {"linux": "Linux", "macos": "macOS", "windows": "Windows", "AMD64": "x86_64"}
    where = {v: [p.key.split("-") for p in matrix.platforms if v in p.variants]
             for p in matrix.platforms for v in p.variants}  # fmt: skip
    torch = ", ".join(matrix.torch)
    gil = [p for p in matrix.pythons if not p.endswith("t")]
    pythons = ", ".join([f"{gil[0]} to {gil[-1]}", *(p for p in matrix.pythons if p not in gil)])
    rows = ["| variant | version labels | needs torch | CUDA | platforms | Python |",
            "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    lines = []
    for variant in sorted(where, key=lambda v: (v != "cpu", v)):
        labels = ", ".join(f"`+pt{t.replace('.', '')}{variant}`" for t in matrix.torch)
        needs, cuda = f"{torch}, `+{variant}` build", f"{variant[2:-1]}.{variant[-1]}"
        if variant == "cpu":
            needs, cuda = f"{torch}, CPU build (`+cpu`)", "none"
        platforms = ", ".join(f"{names[n]} {names.get(a, a)}" for n, a in where[variant])
        rows.append(f"| `{variant}` | {labels} | {needs} | {cuda} | {platforms} | {pythons} |")
        index = f"{matrix.wheels['index-url'].rstrip('/')}/{variant}/"
        lines.append(f'pip install lltm "torch=={matrix.newest_torch}.*" --index-url {index} '
                     f"--extra-index-url https://download.pytorch.org/whl/{variant}")  # fmt: skip
    return "\n".join(rows) + "\n\n```bash\n" + "\n".join(lines) + "\n```\n"


@needs_tomllib
def test_building_doc_holds_the_variants_table() -> None:
    """docs/building.md's table of variants and install lines is the matrix's."""
    doc = ROOT / "docs" / "building.md"
    if not doc.is_file():
        pytest.skip("needs the checkout's docs")
    table = variants_table(wm.load_matrix())
    assert table in doc.read_text(), f"paste this table into docs/building.md:\n{table}"


@pytest.mark.parametrize(
    "name", [name for names in hooks.COMMANDS.values() for name in names.split()]
)
def test_each_command_runs_from_its_module(name: str) -> None:
    """wheels.py (wheel_hooks.main) sends each command to the module that defines it."""
    with pytest.raises(SystemExit) as exited:
        wheels.main([name, "--help"])
    assert exited.value.code == 0
    assert wheels.main(["no-such-command"]) == 2


@needs_tomllib
@pytest.mark.parametrize("script", ["wheels.py", "wheel_hooks.py"])
def test_a_failure_is_reported_from_either_script(script: str) -> None:
    """wheel_hooks.py runs as the wheel_hooks that the other modules import: one WheelError."""
    env = {**os.environ, "LLTM_WHEEL_PLAN": "nightly"}
    cmd = [sys.executable, str(ROOT / "scripts" / script), "matrix"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 1, result.stderr
    assert f"{script} matrix: FAILED: plan 'nightly'" in result.stderr
