"""The wheel matrix of pyproject.toml: cibuildwheel's CPython x platform, lltm's torch x variant.

The standard library only: the workflows ask for the matrix with the runner's
Python, before anything is installed. Reading pyproject.toml needs Python >= 3.11.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from wheel_hooks import PYTORCH_INDEX, ROOT, VARIANT_RE, WheelError, log, run

PLANS = ("pr", "full")
# A CUDA job builds nvcc code for a dozen architectures, after a 3 GB torch; a
# CPU job takes minutes. A hung job fails at this bound, not GitHub's 6 hours.
TIMEOUT_MINUTES = {"cpu": 45, "cuda": 100}
# Where the install lines of the variants are documented.
VARIANTS_DOC = "docs/building.md"
PLATFORM_NAMES = {
    "linux-x86_64": "Linux x86_64",
    "linux-aarch64": "Linux aarch64",
    "macos-arm64": "macOS arm64",
    "windows-AMD64": "Windows x86_64",
}


@dataclass(frozen=True)
class Platform:
    """One cibuildwheel platform and arch, and what it builds."""

    name: str  # cibuildwheel's --platform: linux, macos, windows
    arch: str  # cibuildwheel's arch: x86_64, aarch64, arm64, AMD64
    runner: str
    variants: tuple[str, ...]

    @property
    def key(self) -> str:
        """``linux-x86_64``, as [tool.lltm.wheels] names it."""
        return f"{self.name}-{self.arch}"

    def identifier(self, python: str) -> str:
        """The cibuildwheel identifier of CPython ``python`` ("3.12") here."""
        windows = {"AMD64": "win_amd64", "ARM64": "win_arm64", "x86": "win32"}
        tag = {"linux": f"manylinux_{self.arch}", "macos": f"macosx_{self.arch}"}.get(
            self.name, windows.get(self.arch, self.arch)
        )
        return f"cp{python.replace('.', '')}-{tag}"


@dataclass(frozen=True)
class PullRequestPlan:
    """What a pull request builds: a subset of the full matrix ([tool.lltm.wheels.pull-request])."""

    main: str  # the platform key built with several Pythons and variants: linux-x86_64
    pythons: tuple[str, ...]
    variants: tuple[str, ...]


@dataclass(frozen=True)
class Matrix:
    """The wheel matrix: cibuildwheel's Python x platform, lltm's torch x variant."""

    pythons: tuple[str, ...]
    torch: tuple[str, ...]
    platforms: tuple[Platform, ...]
    size_budget_mb: dict[str, float]
    index_url: str
    pypi: dict[str, str] = field(default_factory=dict)  # platform key -> the PyPI wheel's variant
    pull_request: PullRequestPlan | None = None

    @property
    def newest_torch(self) -> str:
        """The torch minor of the PyPI wheels and of the pull-request builds."""
        return self.torch[-1]

    def _job(self, platform: Platform, python: str, torch: str, variant: str) -> dict[str, Any]:
        only = platform.identifier(python)
        # This job also makes the plain-version wheel for PyPI (wheels.py pypi).
        pypi = torch == self.newest_torch and self.pypi.get(platform.key) == variant
        return {
            "name": f"{only} torch {torch} {variant}" + (" (+PyPI)" if pypi else ""),
            "runner": platform.runner,
            "only": only,
            "torch": torch,
            "variant": variant,
            "artifact": f"wheel-{only}-pt{torch.replace('.', '')}{variant}",
            "pypi": pypi,
            "timeout": TIMEOUT_MINUTES["cpu" if variant == "cpu" else "cuda"],
        }

    def jobs(self, plan: str = "full") -> list[dict[str, Any]]:
        """The wheels workflow's jobs: every identifier x torch x variant, or the PR subset."""
        if plan not in PLANS:
            msg = f"plan {plan!r}: expected one of {', '.join(PLANS)} (LLTM_WHEEL_PLAN)"
            raise WheelError(msg)
        pr = self.pull_request
        if plan == "pr" and pr is None:
            msg = "pyproject.toml has no [tool.lltm.wheels.pull-request] table (the PR plan)"
            raise WheelError(msg)
        jobs = []
        for platform in self.platforms:
            if plan == "full":
                jobs += [
                    self._job(platform, python, torch, variant)
                    for python in self.pythons
                    for torch in self.torch
                    for variant in platform.variants
                ]
            elif platform.key == pr.main:  # type: ignore[union-attr]
                jobs += [
                    self._job(platform, python, self.newest_torch, variant)
                    for python in pr.pythons  # type: ignore[union-attr]
                    for variant in pr.variants  # type: ignore[union-attr]
                ]
            else:  # one job: the newest CPython with the GIL, the newest torch, cpu
                newest = [p for p in self.pythons if not p.endswith("t")][-1]
                jobs.append(self._job(platform, newest, self.newest_torch, "cpu"))
        return jobs

    def expected_identifiers(self, platform: Platform) -> list[str]:
        """What cibuildwheel must select for ``platform``."""
        return sorted(platform.identifier(python) for python in self.pythons)


def _python_from_pattern(pattern: str) -> str:
    # cp314t-*: the free-threaded build, "3.14t".
    match = re.fullmatch(r"cp3(\d+)(t?)-\*", pattern)
    if match is None:
        msg = (
            f"[tool.cibuildwheel] build: {pattern!r}: expected one CPython per entry, like "
            '"cp312-*" or "cp314t-*", so that the matrix is explicit'
        )
        raise WheelError(msg)
    return f"3.{match[1]}{match[2]}"


def _as_list(value: Any) -> list[str]:
    return value.split() if isinstance(value, str) else list(value)


def _check_plans(
    platforms: list[Platform], pythons: tuple[str, ...], wheels: dict[str, Any]
) -> tuple[dict[str, str], PullRequestPlan | None]:
    by_key = {p.key: p.variants for p in platforms}
    pypi: dict[str, str] = dict(wheels.get("pypi", {}))
    for key, variant in pypi.items():
        if variant not in by_key.get(key, ()):
            msg = (
                f"[tool.lltm.wheels.pypi] {key} = {variant!r}: expected a platform of the matrix "
                f"and one of its variants ({list(by_key.get(key, ()))})"
            )
            raise WheelError(msg)
    if missing := sorted(set(by_key) - set(pypi)) if pypi else []:
        msg = f"[tool.lltm.wheels.pypi] has no variant for {missing}: PyPI gets one per platform"
        raise WheelError(msg)
    table = wheels.get("pull-request")
    if table is None:
        return pypi, None
    main = table.get("platform", "linux-x86_64")
    pr = PullRequestPlan(main, tuple(table.get("pythons", [])), tuple(table.get("variants", [])))
    if main not in by_key or not pr.pythons or not pr.variants:
        msg = (
            f"[tool.lltm.wheels.pull-request]: platform {main!r}, pythons {list(pr.pythons)}, "
            f"variants {list(pr.variants)}: expected a platform of the matrix and non-empty lists"
        )
        raise WheelError(msg)
    if stray := sorted(set(pr.pythons) - set(pythons)) + sorted(set(pr.variants) - {*by_key[main]}):
        msg = f"[tool.lltm.wheels.pull-request] has {stray}, which the full matrix does not build"
        raise WheelError(msg)
    return pypi, pr


def load_matrix(config: dict[str, Any] | None = None) -> Matrix:
    """Read and check the wheel matrix from pyproject.toml (or ``config``, its contents)."""
    if config is None:
        import tomllib  # noqa: PLC0415 - Python >= 3.11; a given config needs none

        config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    cibw = config.get("tool", {}).get("cibuildwheel", {})
    wheels = config.get("tool", {}).get("lltm", {}).get("wheels")
    if wheels is None:
        msg = "pyproject.toml has no [tool.lltm.wheels] table (the torch x variant matrix)"
        raise WheelError(msg)
    pythons = tuple(_python_from_pattern(p) for p in _as_list(cibw.get("build", [])))
    if not pythons:
        msg = '[tool.cibuildwheel] build is empty: list the CPythons, like ["cp312-*"]'
        raise WheelError(msg)
    variants: dict[str, list[str]] = wheels.get("variants", {})
    runners: dict[str, str] = wheels.get("runners", {})
    platforms = []
    for name in ("linux", "macos", "windows"):
        for arch in _as_list(cibw.get(name, {}).get("archs", [])):
            key = f"{name}-{arch}"
            if key not in variants or key not in runners:
                msg = (
                    f"[tool.cibuildwheel.{name}] archs has {arch!r}, but "
                    f"[tool.lltm.wheels] variants or runners has no {key!r}"
                )
                raise WheelError(msg)
            bad = [v for v in variants[key] if not VARIANT_RE.fullmatch(v)]
            if bad or (name != "linux" and variants[key] != ["cpu"]):
                msg = (
                    f"[tool.lltm.wheels] variants {key!r} = {variants[key]}: expected 'cpu' and "
                    "'cuNNN' entries, and only 'cpu' off Linux (no CUDA toolkit is set up there)"
                )
                raise WheelError(msg)
            platforms.append(Platform(name, arch, runners[key], tuple(variants[key])))
    if stray := sorted(set(variants) - {p.key for p in platforms}):
        msg = f"[tool.lltm.wheels] variants has {stray}, which no [tool.cibuildwheel] archs builds"
        raise WheelError(msg)
    torch = tuple(wheels.get("torch", []))
    if not torch or not all(re.fullmatch(r"\d+\.\d+", t) for t in torch):
        msg = f"[tool.lltm.wheels] torch = {list(torch)}: expected minor releases like '2.14'"
        raise WheelError(msg)
    pypi, pull_request = _check_plans(platforms, pythons, wheels)
    return Matrix(
        pythons=pythons,
        torch=torch,
        platforms=tuple(platforms),
        size_budget_mb=dict(wheels.get("size-budget-mb", {})),
        index_url=str(wheels.get("index-url", "")).rstrip("/"),
        pypi=pypi,
        pull_request=pull_request,
    )


def plan_from_env(plan: str | None) -> str:
    """--plan, else $LLTM_WHEEL_PLAN (the wheels workflow sets it per event), else full."""
    return plan or os.environ.get("LLTM_WHEEL_PLAN") or "full"


def format_job(job: dict[str, Any]) -> str:
    """One readable line per job."""
    pypi = " +PyPI" if job["pypi"] else ""
    return (
        f"{job['runner']:18} {job['only']:26} torch {job['torch']:5} {job['variant']:6} "
        f"{job['timeout']:3} min{pypi}"
    )


def cmd_matrix(args: argparse.Namespace) -> None:
    """Print the wheel jobs: a GitHub Actions matrix (--github) or a readable list."""
    matrix = load_matrix()
    if args.pythons:
        print(json.dumps(list(matrix.pythons)))
        return
    plan = plan_from_env(args.plan)
    jobs = matrix.jobs(plan)
    if args.github:
        print(json.dumps({"include": jobs}, separators=(",", ":")))
        return
    print("\n".join(map(format_job, jobs)))
    log(f"{plan}: {len(jobs)} jobs")


def cmd_plan(args: argparse.Namespace) -> None:
    """Print both plans, the pull-request subset and the full matrix, job by job, with counts."""
    del args
    matrix = load_matrix()
    events = {
        "pr": "pull requests that touch the build (path filters in wheels.yml)",
        "full": "version tags, the weekly schedule, a manual run",
    }
    for plan in PLANS:
        jobs = matrix.jobs(plan)
        pypi = sum(1 for job in jobs if job["pypi"])
        cuda = sum(1 for job in jobs if job["variant"] != "cpu")
        print(
            f"== {plan}: {len(jobs)} jobs ({cuda} CUDA, {len(jobs) - cuda} CPU; "
            f"{pypi} also make a PyPI wheel), for {events[plan]}"
        )
        print("\n".join(f"  {format_job(job)}" for job in jobs))


def cmd_check_identifiers(args: argparse.Namespace) -> None:
    """Check, per platform, that cibuildwheel selects exactly the intended builds."""
    matrix = load_matrix()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    failures = []
    for platform in matrix.platforms:
        options = ["--platform", platform.name, "--archs", platform.arch, ROOT]
        listing = run([*args.cibuildwheel, "--print-build-identifiers", *options],
                      capture_output=True, env=env)  # fmt: skip
        actual, expected = sorted(listing.stdout.split()), matrix.expected_identifiers(platform)
        print(f"{platform.key}: {' '.join(actual)}")
        if actual != expected:
            failures.append(
                f"{platform.key}: cibuildwheel selects {actual}, but the matrix intends "
                f"{expected} (extra: {sorted(set(actual) - set(expected))}, missing: "
                f"{sorted(set(expected) - set(actual))}); fix [tool.cibuildwheel] build/skip, "
                "or the cibuildwheel version"
            )
    if failures:
        raise WheelError("\n".join(failures))
    log(f"cibuildwheel selects exactly the intended {len(matrix.jobs())}-job full matrix")


def variants_table(matrix: Matrix) -> str:
    """The table of variants and one install line per variant (docs/building.md)."""
    by_variant: dict[str, list[str]] = {}
    for platform in matrix.platforms:
        for variant in platform.variants:
            by_variant.setdefault(variant, []).append(
                PLATFORM_NAMES.get(platform.key, platform.key)
            )
    variants = sorted(by_variant, key=lambda v: (v != "cpu", v))
    torch = ", ".join(matrix.torch)
    gil = [p for p in matrix.pythons if not p.endswith("t")]
    pythons = ", ".join([f"{gil[0]} to {gil[-1]}", *(p for p in matrix.pythons if p not in gil)])
    rows = [
        "| variant | version labels | needs torch | CUDA | platforms | Python |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for variant in variants:
        labels = ", ".join(f"`+pt{t.replace('.', '')}{variant}`" for t in matrix.torch)
        if variant == "cpu":
            needs, cuda = f"{torch}, CPU build (`+cpu`)", "none"
        else:
            needs, cuda = f"{torch}, `+{variant}` build", f"{variant[2:-1]}.{variant[-1]}"
        platforms = ", ".join(by_variant[variant])
        rows.append(f"| `{variant}` | {labels} | {needs} | {cuda} | {platforms} | {pythons} |")
    lines = [
        f'pip install lltm "torch=={matrix.newest_torch}.*" --index-url {matrix.index_url}/'
        f"{variant}/ --extra-index-url {PYTORCH_INDEX}/{variant}"
        for variant in variants
    ]
    return "\n".join(rows) + "\n\n```bash\n" + "\n".join(lines) + "\n```\n"


def cmd_variants_table(args: argparse.Namespace) -> None:
    """Print the table of variants, or check that docs/building.md holds it."""
    table = variants_table(load_matrix())
    if not args.check:
        print(table, end="")
        return
    if table not in (ROOT / VARIANTS_DOC).read_text():
        msg = (
            f"{VARIANTS_DOC} does not hold the current table of variants; replace it with "
            f"the output of `python scripts/wheels.py variants-table`:\n{table}"
        )
        raise WheelError(msg)
    log(f"{VARIANTS_DOC} holds the current table of variants")
