"""lltm's prebuilt wheels: build, repair, check, index and install-test, one script for all.

The same commands run in the GitHub workflows (through cibuildwheel and nox), in
`nox -s wheels_local` and in scripts/gpu-wheel-check.sh:

    wheels.py matrix [--github] [--plan P]   the wheel jobs of plan P (pr or full; default
                                         $LLTM_WHEEL_PLAN, else full)
    wheels.py plan                       both plans, each job and the job counts
    wheels.py check-identifiers          cibuildwheel selects exactly the intended builds
    wheels.py variants-table             the table of variants (docs/building.md)
    wheels.py install-torch [--build-deps]   torch for $LLTM_WHEEL_TORCH and $LLTM_WHEEL_VARIANT
    wheels.py build --out DIR [--python PY]  a wheel against PY's torch, without isolation
    wheels.py repair WHEEL --dest-dir DIR    auditwheel / delocate / delvewheel, torch and CUDA left out
    wheels.py check DIST...              the gates, on wheels and the sdist
    wheels.py pypi WHEELS... --out DIR   the plain-version PyPI wheels, from the labelled ones
    wheels.py index [WHEELHOUSE] [--releases JSON] --out DIR
                                         a PEP 503 index per variant, of local
                                         wheels and of every GitHub release's assets
    wheels.py metadata-files DIR         WHEEL.metadata beside each wheel (release assets)
    wheels.py release-manifest ROOT --base-url URL   GitHub's release list for ROOT/<tag>/
    wheels.py simple-index DIR           a flat PEP 503 index of a folder: a local PyPI
    wheels.py relabel WHEEL --version V --out DIR    a wheel under another version
    wheels.py try-index --index DIR --variant V --venv DIR ...
                                         serve the index on 127.0.0.1, pip install lltm from it
                                         into a fresh venv, run test-installed there
    wheels.py test-installed             checks and tests against the installed lltm

It runs on Python >= 3.10 with the standard library, so that cibuildwheel's
hooks can call it with the Python being built for; the commands that read
pyproject.toml need Python >= 3.11 (tomllib). The tools each gate uses
(auditwheel, twine, check-wheel-contents, cuobjdump) are the caller's
to install: nox's wheel sessions do (install-torch installs uv itself).
"""

from __future__ import annotations

import argparse
import ast
import base64
import contextlib
import fnmatch
import functools
import hashlib
import html
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
PYTORCH_INDEX = "https://download.pytorch.org/whl"
BUILD_DEPS = ["scikit-build-core>=1.1", "ninja"]
# The repair tool cibuildwheel does not bring on Windows (it brings delocate on macOS).
REPAIR_DEPS = {"win32": ["delvewheel==1.13.2"]}
UV = "uv==0.13.9"

# Never in a wheel: torch's libraries and the CUDA driver and runtime, which
# torch brings (its wheel, or its nvidia-* dependencies). The repair leaves
# them out and the gates check that nothing else stays outside the wheel.
# Linux: SONAME globs for auditwheel.
EXCLUDE_LINUX = [
    "libtorch*.so*",
    "libc10*.so*",
    "libcudart.so*",
    "libcuda.so*",
    "libnvrtc*.so*",
    "libnvToolsExt*.so*",
    "libgomp.so*",  # torch's OpenMP runtime (torch/lib/libgomp.so.1), which lltm links
]
# macOS: delocate excludes any library whose path contains one of these.
EXCLUDE_MACOS = ["libtorch", "libc10", "libomp"]
# Windows: DLL name globs for delvewheel (which lower-cases names and takes *).
# And the MSVC C++ runtime: delvewheel leaves vcruntime140*.dll out for CPython
# (CPython ships it) but vendors msvcp140.dll from the Visual C++
# Redistributable. torch does neither: its DLLs import msvcp140.dll from the
# system, so torch needs the Redistributable installed, and lltm loads only
# after torch, in a process that already has that runtime. A copy in
# lltm.libs/ would be a second, older or newer, runtime in the same process
# for nothing; the gate rejects it (no library but lltm/_C in the wheel).
EXCLUDE_WINDOWS = [
    "torch*.dll",
    "c10*.dll",
    "cudart64_*.dll",
    "nvcuda.dll",
    "libiomp5md.dll",
    "msvcp140*.dll",
    "vcruntime140*.dll",
]

BINARY_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
WHEEL_RE = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
    r"-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$"
)
LABEL_RE = re.compile(r"^pt(?P<torch>\d+)(?P<variant>cpu|cu\d{3})$")
VARIANT_RE = re.compile(r"^(cpu|cu\d{3})$")


class WheelError(Exception):
    """A failed step, with a message that says what is wrong and what to do."""


def log(message: str) -> None:
    """Progress, on stderr, so that stdout stays machine-readable."""
    print(f"[wheels] {message}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command, showing it, and fail with its output when it fails."""
    args = [str(c) for c in cmd]
    log("$ " + " ".join(a.replace("\n", "; ") for a in args))
    result = subprocess.run(args, text=True, check=False, **kwargs)
    if result.returncode != 0:
        output = "".join(
            part for part in (result.stdout, result.stderr) if isinstance(part, str)
        ).strip()
        msg = f"`{' '.join(args)}` exited with {result.returncode}" + (
            f":\n{output[-4000:]}" if output else ""
        )
        raise WheelError(msg)
    return result


def tool(module: str | None, command: str, package: str | None = None) -> list[str]:
    """A tool's command: ``python -m module`` where importable, else ``command`` on PATH."""
    if module is not None and importlib.util.find_spec(module) is not None:
        return [sys.executable, "-m", module]
    found = shutil.which(command)
    if found is None:
        msg = (
            f"{command} is needed here, and "
            + (f"neither `{sys.executable} -m {module}` nor " if module else "")
            + f"`{command}` on PATH is there: pip install {package or command}"
        )
        raise WheelError(msg)
    return [found]


# --- pyproject.toml: the matrix ---------------------------------------------------------


def pyproject() -> dict[str, Any]:
    """The project's pyproject.toml (needs Python >= 3.11)."""
    try:
        import tomllib  # noqa: PLC0415 - Python >= 3.11, and only these commands need it
    except ModuleNotFoundError:
        msg = f"this command reads pyproject.toml and needs Python >= 3.11 (tomllib): {sys.version}"
        raise WheelError(msg) from None
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


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
        tag = {
            "linux": f"manylinux_{self.arch}",
            "macos": f"macosx_{self.arch}",
            "windows": {"AMD64": "win_amd64", "ARM64": "win_arm64", "x86": "win32"}.get(
                self.arch, self.arch
            ),
        }[self.name]
        return f"cp{python.replace('.', '')}-{tag}"


PLANS = ("pr", "full")
# A CUDA job builds nvcc code for a dozen architectures, after a 3 GB torch; a
# CPU job takes minutes. A hung job fails at this bound, not GitHub's 6 hours.
TIMEOUT_MINUTES = {"cpu": 45, "cuda": 100}


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
        pypi = torch == self.newest_torch and self.pypi.get(platform.key) == variant
        return {
            "name": f"{only} torch {torch} {variant}" + (" (+PyPI)" if pypi else ""),
            "runner": platform.runner,
            "only": only,
            "torch": torch,
            "variant": variant,
            "artifact": f"wheel-{only}-pt{torch.replace('.', '')}{variant}",
            # This job also makes the plain-version wheel for PyPI (wheels.py pypi).
            "pypi": pypi,
            "timeout": TIMEOUT_MINUTES["cpu" if variant == "cpu" else "cuda"],
        }

    def jobs(self, plan: str = "full") -> list[dict[str, Any]]:
        """The wheels workflow's jobs: every identifier x torch x variant, or the PR subset."""
        if plan not in PLANS:
            msg = f"plan {plan!r}: expected one of {', '.join(PLANS)} (LLTM_WHEEL_PLAN)"
            raise WheelError(msg)
        jobs = []
        for platform in self.platforms:
            if plan == "full":
                for python in self.pythons:
                    for torch in self.torch:
                        jobs.extend(
                            self._job(platform, python, torch, v) for v in platform.variants
                        )
                continue
            pr = self.pull_request
            if pr is None:
                msg = "pyproject.toml has no [tool.lltm.wheels.pull-request] table (the PR plan)"
                raise WheelError(msg)
            if platform.key == pr.main:
                for python in pr.pythons:
                    jobs.extend(
                        self._job(platform, python, self.newest_torch, v) for v in pr.variants
                    )
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
    by_key = {p.key: p for p in platforms}
    pypi: dict[str, str] = dict(wheels.get("pypi", {}))
    for key, variant in pypi.items():
        if key not in by_key or variant not in by_key[key].variants:
            msg = (
                f"[tool.lltm.wheels.pypi] {key} = {variant!r}: expected a platform of the matrix "
                f"and one of its variants ({list(by_key.get(key, Platform('', '', '', ())).variants)})"
            )
            raise WheelError(msg)
    missing = sorted(set(by_key) - set(pypi)) if pypi else []
    if missing:
        msg = f"[tool.lltm.wheels.pypi] has no variant for {missing}: PyPI gets one per platform"
        raise WheelError(msg)
    table = wheels.get("pull-request")
    if table is None:
        return pypi, None
    main = table.get("platform", "linux-x86_64")
    pr = PullRequestPlan(
        main=main,
        pythons=tuple(table.get("pythons", [])),
        variants=tuple(table.get("variants", [])),
    )
    if main not in by_key or not pr.pythons or not pr.variants:
        msg = (
            f"[tool.lltm.wheels.pull-request]: platform {main!r}, pythons {list(pr.pythons)}, "
            f"variants {list(pr.variants)}: expected a platform of the matrix and non-empty lists"
        )
        raise WheelError(msg)
    stray = sorted(set(pr.pythons) - set(pythons)) + sorted(
        set(pr.variants) - set(by_key[main].variants)
    )
    if stray:
        msg = f"[tool.lltm.wheels.pull-request] has {stray}, which the full matrix does not build"
        raise WheelError(msg)
    return pypi, pr


def load_matrix(config: dict[str, Any] | None = None) -> Matrix:
    """Read and check the wheel matrix from pyproject.toml."""
    config = pyproject() if config is None else config
    tool_config = config.get("tool", {})
    cibw = tool_config.get("cibuildwheel", {})
    wheels = tool_config.get("lltm", {}).get("wheels")
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
            bad = [v for v in variants[key] if not VARIANT_RE.match(v)]
            if bad or (name != "linux" and variants[key] != ["cpu"]):
                msg = (
                    f"[tool.lltm.wheels] variants {key!r} = {variants[key]}: expected 'cpu' and "
                    "'cuNNN' entries, and only 'cpu' off Linux (no CUDA toolkit is set up there)"
                )
                raise WheelError(msg)
            platforms.append(Platform(name, arch, runners[key], tuple(variants[key])))
    declared = {p.key for p in platforms}
    stray = sorted(set(variants) - declared)
    if stray:
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
    for job in jobs:
        print(format_job(job))
    log(f"{plan}: {len(jobs)} jobs")


def format_job(job: dict[str, Any]) -> str:
    """One readable line per job."""
    pypi = " +PyPI" if job["pypi"] else ""
    return (
        f"{job['runner']:18} {job['only']:26} torch {job['torch']:5} {job['variant']:6} "
        f"{job['timeout']:3} min{pypi}"
    )


def plan_summary(matrix: Matrix) -> str:
    """Both plans, job by job, with their counts: what `wheels.py plan` prints."""
    out = []
    events = {
        "pr": "pull requests that touch the build (path filters in wheels.yml)",
        "full": "version tags, the weekly schedule, a manual run",
    }
    for plan in PLANS:
        jobs = matrix.jobs(plan)
        pypi = sum(1 for job in jobs if job["pypi"])
        cuda = sum(1 for job in jobs if job["variant"] != "cpu")
        out.append(
            f"== {plan}: {len(jobs)} jobs ({cuda} CUDA, {len(jobs) - cuda} CPU; "
            f"{pypi} also make a PyPI wheel), for {events[plan]}"
        )
        out.extend(f"  {format_job(job)}" for job in jobs)
    return "\n".join(out)


def cmd_plan(args: argparse.Namespace) -> None:
    """Print both plans, the pull-request subset and the full matrix, with job counts."""
    del args
    print(plan_summary(load_matrix()))


def cmd_check_identifiers(args: argparse.Namespace) -> None:
    """Check, per platform, that cibuildwheel selects exactly the intended builds."""
    matrix = load_matrix()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    failures = []
    for platform in matrix.platforms:
        result = run(
            [
                *args.cibuildwheel,
                "--print-build-identifiers",
                "--platform",
                platform.name,
                "--archs",
                platform.arch,
                ROOT,
            ],
            capture_output=True,
            env=env,
        )
        actual = sorted(result.stdout.split())
        expected = matrix.expected_identifiers(platform)
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


PLATFORM_NAMES = {
    "linux-x86_64": "Linux x86_64",
    "linux-aarch64": "Linux aarch64",
    "macos-arm64": "macOS arm64",
    "windows-AMD64": "Windows x86_64",
}


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
    newest = matrix.torch[-1]
    gil = [p for p in matrix.pythons if not p.endswith("t")]
    free = [p for p in matrix.pythons if p.endswith("t")]
    pythons = ", ".join([f"{gil[0]} to {gil[-1]}", *free])
    rows = [
        "| variant | version labels | needs torch | CUDA | platforms | Python |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for variant in variants:
        label = ", ".join(f"`+pt{t.replace('.', '')}{variant}`" for t in matrix.torch)
        if variant == "cpu":
            needs, cuda = f"{torch}, CPU build (`+cpu`)", "none"
        else:
            needs, cuda = f"{torch}, `+{variant}` build", f"{variant[2:-1]}.{variant[-1]}"
        platforms = ", ".join(by_variant[variant])
        rows.append(f"| `{variant}` | {label} | {needs} | {cuda} | {platforms} | {pythons} |")
    lines = [
        f'pip install lltm "torch=={newest}.*" --index-url {matrix.index_url}/{variant}/ '
        f"--extra-index-url {PYTORCH_INDEX}/{variant}"
        for variant in variants
    ]
    return "\n".join(rows) + "\n\n```bash\n" + "\n".join(lines) + "\n```\n"


# Where the install lines of the variants are documented.
VARIANTS_DOC = "docs/building.md"


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


# --- torch for a variant ---------------------------------------------------------------


def wheel_variant_from_env() -> tuple[str, str]:
    """$LLTM_WHEEL_TORCH ("2.14") and $LLTM_WHEEL_VARIANT ("cu130"), checked."""
    torch = os.environ.get("LLTM_WHEEL_TORCH", "")
    variant = os.environ.get("LLTM_WHEEL_VARIANT", "")
    if not re.fullmatch(r"\d+\.\d+", torch) or not VARIANT_RE.match(variant):
        msg = (
            f"LLTM_WHEEL_TORCH={torch!r} LLTM_WHEEL_VARIANT={variant!r}: set both, to a torch "
            "minor release and a variant of [tool.lltm.wheels], e.g. LLTM_WHEEL_TORCH=2.14 "
            "LLTM_WHEEL_VARIANT=cu130 (the wheels workflow sets them per job)"
        )
        raise WheelError(msg)
    return torch, variant


def installer(python: str = sys.executable) -> list[str]:
    """How install-torch installs: uv's pip (the default), or pip ($LLTM_WHEEL_INSTALLER=pip).

    uv downloads torch's wheels in parallel and installs from its cache by hard
    links: the test venv's torch, the second install of the job, then costs
    neither the download nor another few GB of disk (a CUDA torch is ~5 GB).
    """
    choice = os.environ.get("LLTM_WHEEL_INSTALLER", "uv")
    if choice == "pip":
        return [python, "-m", "pip", "install", "--disable-pip-version-check"]
    if choice != "uv":
        msg = f"LLTM_WHEEL_INSTALLER={choice!r}: expected uv or pip"
        raise WheelError(msg)
    if importlib.util.find_spec("uv") is None:
        run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", UV])
    return [python, "-m", "uv", "pip", "install", "--python", python]


def install_torch_commands(
    torch: str, variant: str, *, build_deps: bool, system: str = sys.platform
) -> list[list[str]]:
    """The installs of install-torch: the variant's torch, then (--build-deps) the build tools."""
    install = installer()
    # The variant's own index, so that the CPU build is not swapped for PyPI's CUDA one.
    commands = [[*install, f"torch=={torch}.*", "--index-url", f"{PYTORCH_INDEX}/{variant}"]]
    if build_deps:
        commands.append([*install, *BUILD_DEPS, *REPAIR_DEPS.get(system, [])])
    return commands


def cmd_install_torch(args: argparse.Namespace) -> None:
    """Install the variant's torch (cibuildwheel's before-build and before-test)."""
    torch, variant = wheel_variant_from_env()
    for command in install_torch_commands(torch, variant, build_deps=args.build_deps):
        run(command)


# --- build and repair ------------------------------------------------------------------


def cmd_build(args: argparse.Namespace) -> None:
    """Build a wheel with ``--python``'s torch and build tools, without isolation."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    cmd = [args.python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", out]
    run([*cmd, *(["-v"] if args.verbose else []), ROOT], cwd=ROOT)
    built = sorted(set(out.glob("*.whl")) - before)
    if len(built) != 1:
        msg = f"expected one new wheel in {out}, found {[p.name for p in built]}"
        raise WheelError(msg)
    log(f"built {built[0].name} ({built[0].stat().st_size / 1e6:.2f} MB)")
    print(built[0])


def _torch_lib_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def repair_command(wheel: Path, dest: Path, system: str) -> tuple[list[str], dict[str, str]]:
    """The repair command for ``system`` (sys.platform), and the environment it needs."""
    env = dict(os.environ)
    if system.startswith("linux"):
        cmd = [*tool("auditwheel", "auditwheel"), "repair", "-w", str(dest)]
        for pattern in EXCLUDE_LINUX:
            cmd += ["--exclude", pattern]
    elif system == "darwin":
        cmd = [*tool(None, "delocate-wheel", "delocate"), "-w", str(dest)]
        cmd += ["--require-archs", os.environ.get("LLTM_DELOCATE_ARCHS", "arm64")]
        for pattern in EXCLUDE_MACOS:
            cmd += ["--exclude", pattern]
        torch_lib = _torch_lib_dir()
        if torch_lib is not None:
            # delocate resolves @rpath through it, then leaves torch's libraries out.
            env["DYLD_LIBRARY_PATH"] = str(torch_lib)
    elif system == "win32":
        cmd = [*tool("delvewheel", "delvewheel"), "repair", "-w", str(dest)]
        cmd += ["--exclude", ";".join(EXCLUDE_WINDOWS)]
    else:
        msg = f"no wheel repair for platform {system!r}"
        raise WheelError(msg)
    return [*cmd, str(wheel)], env


def cmd_repair(args: argparse.Namespace) -> None:
    """Repair a wheel for its platform, leaving torch and CUDA out."""
    dest = Path(args.dest_dir).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    cmd, env = repair_command(Path(args.wheel).resolve(), dest, sys.platform)
    run(cmd, env=env)
    repaired = sorted(set(dest.glob("*.whl")) - before)
    log(f"repaired: {', '.join(p.name for p in repaired) or '(a wheel already there was kept)'}")


# --- the gates -------------------------------------------------------------------------


@dataclass
class Report:
    """The gates' results for one file."""

    path: Path
    results: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, gate: str, *, ok: bool, detail: str) -> None:
        """Record a pass or failure."""
        self.results.append((gate, "ok" if ok else "FAIL", detail))

    def skip(self, gate: str, reason: str) -> None:
        """Record a gate that was not run, and why."""
        self.results.append((gate, "skip", reason))

    @property
    def failed(self) -> bool:
        """Whether any gate failed."""
        return any(status == "FAIL" for _, status, _ in self.results)


@dataclass(frozen=True)
class WheelInfo:
    """What a wheel says about itself."""

    version: str
    label: str | None
    platform: str
    requires_torch: list[str]
    requires_python: str | None
    build_info: dict[str, Any]
    names: list[str]

    @property
    def variant(self) -> str | None:
        """``cpu`` or ``cuNNN``: from the local label, or for a plain version from _build_info."""
        if self.label is None:
            return built_variant(self.build_info) if self.build_info else None
        match = LABEL_RE.match(self.label)
        return match["variant"] if match else None


def _literal(node: ast.expr) -> Any:
    # _build_info.py holds literals, and `"full" or "plain"` for VERSION.
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        values = [_literal(v) for v in node.values]
        return next((v for v in values if v), values[-1])
    return ast.literal_eval(node)


def read_wheel(path: Path) -> WheelInfo:
    """Read the name, METADATA and lltm/_build_info.py of a wheel."""
    match = WHEEL_RE.match(path.name)
    if match is None:
        msg = f"{path.name} is not a wheel file name"
        raise WheelError(msg)
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        metadata_name = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if metadata_name is None:
            msg = f"{path.name} has no .dist-info/METADATA"
            raise WheelError(msg)
        metadata = archive.read(metadata_name).decode()
        info_source = (
            archive.read("lltm/_build_info.py").decode() if "lltm/_build_info.py" in names else ""
        )
    fields = [line.split(": ", 1) for line in metadata.splitlines() if ": " in line]
    version = next((v for k, v in fields if k == "Version"), "")
    requires = [v for k, v in fields if k == "Requires-Dist" and re.match(r"torch\b", v)]
    requires_python = next((v for k, v in fields if k == "Requires-Python"), None)
    build_info: dict[str, Any] = {}
    for node in ast.parse(info_source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None:
            with contextlib.suppress(ValueError):
                build_info[target.id] = _literal(value)
    if version != match["version"]:
        msg = f"{path.name}: METADATA says version {version!r}"
        raise WheelError(msg)
    return WheelInfo(
        version=version,
        label=version.split("+", 1)[1] if "+" in version else None,
        platform=match["platform"],
        requires_torch=requires,
        requires_python=requires_python,
        build_info=build_info,
        names=names,
    )


def _torch_minor(version: str) -> str:
    return ".".join(version.split("+", 1)[0].split(".")[:2])


def gate_metadata(
    report: Report,
    wheel: WheelInfo,
    expect_variant: str | None,
    pypi_policy: tuple[str, dict[str, str]] | None = None,
) -> None:
    """The label, the torch pin and the recorded build agree, and name the intended variant.

    A wheel with a plain version is a PyPI wheel: ``pypi_policy`` (the newest
    torch minor, and the variant per platform) says which it must be.
    """
    info = wheel.build_info
    torch_version = str(info.get("TORCH_VERSION", ""))
    minor = _torch_minor(torch_version)
    label = LABEL_RE.match(wheel.label or "")
    problems = []
    if label is None and wheel.label is not None:
        report.add("label", ok=False, detail=f"version {wheel.version}: no +pt{{XY}}cpu/cu{{NNN}}")
        return
    if label is None:
        # A plain version: a PyPI wheel, which must be the one [tool.lltm.wheels.pypi] names.
        variant = built_variant(info)
        problems += pypi_problems(wheel, variant, minor, pypi_policy)
    else:
        variant = label["variant"]
        if label["torch"] != minor.replace(".", ""):
            problems.append(f"label pt{label['torch']} but built against torch {torch_version}")
    if wheel.requires_torch != [f"torch=={minor}.*"]:
        problems.append(f"Requires-Dist {wheel.requires_torch}, expected ['torch=={minor}.*']")
    torch_local = torch_version.split("+", 1)[1] if "+" in torch_version else None
    if torch_local is not None and torch_local != variant:
        problems.append(f"label says {variant}, torch {torch_version} is {torch_local}")
    if variant == "cpu" and info.get("CUDA_VERSION") is not None:
        problems.append(f"a cpu wheel built with CUDA {info['CUDA_VERSION']}")
    if variant != "cpu" and not (info.get("CUDA_VERSION") and info.get("CUDA_ARCHS")):
        problems.append("a CUDA wheel without CUDA kernels (LLTM_CUDA was off, or no nvcc)")
    if info.get("VERSION") != wheel.version:
        problems.append(f"_build_info.VERSION {info.get('VERSION')!r} != {wheel.version!r}")
    if expect_variant is not None and variant != expect_variant:
        problems.append(f"expected the {expect_variant} variant, got {variant}")
    detail = "; ".join(problems) or (
        f"{wheel.label or f'plain {wheel.version} (PyPI), {variant}'}: torch {torch_version}, "
        f"Requires-Dist torch=={minor}.*, CUDA {info.get('CUDA_VERSION')}"
    )
    report.add("label", ok=not problems, detail=detail)


def built_variant(info: dict[str, Any]) -> str:
    """Cpu or cuNNN, from a wheel's _build_info (for a plain-version wheel, which has no label)."""
    cuda = info.get("CUDA_VERSION")
    return f"cu{str(cuda).replace('.', '')}" if cuda else "cpu"


def platform_key(platform_tag: str) -> str | None:
    """``linux-x86_64``, ``macos-arm64``, ``windows-AMD64``: a wheel platform tag's matrix key."""
    tag = platform_tag.split(".", maxsplit=1)[0]
    if match := re.fullmatch(r"(?:many)?linux(?:_\d+_\d+|2014)?_(\w+)", tag):
        return f"linux-{match[1]}"
    if match := re.fullmatch(r"macosx_\d+_\d+_(\w+)", tag):
        return f"macos-{match[1]}"
    windows = {"win_amd64": "AMD64", "win_arm64": "ARM64", "win32": "x86"}
    return f"windows-{windows[tag]}" if tag in windows else None


def pypi_problems(
    wheel: WheelInfo, variant: str, minor: str, policy: tuple[str, dict[str, str]] | None
) -> list[str]:
    """Why a plain-version wheel is not the PyPI wheel of its platform, if it is not."""
    if policy is None:
        return [f"version {wheel.version}: a plain version, but no PyPI policy to check it against"]
    newest, variants = policy
    key = platform_key(wheel.platform)
    problems = []
    if minor != newest:
        problems.append(f"a PyPI wheel built against torch {minor}, not the newest, {newest}")
    if variants.get(key or "") != variant:
        problems.append(
            f"a PyPI wheel for {key or wheel.platform} in the {variant} variant, but "
            f"[tool.lltm.wheels.pypi] says {variants.get(key or '')!r}"
        )
    return problems


def is_excluded_lib(name: str) -> bool:
    """Whether ``name`` (a file name or SONAME) is one of torch's or CUDA's libraries."""
    base = Path(name).name
    if base.lower().endswith(".dll"):
        return any(fnmatch.fnmatch(base.lower(), p.lower()) for p in EXCLUDE_WINDOWS)
    if base.endswith(".dylib"):
        return any(part in base for part in EXCLUDE_MACOS)
    return any(fnmatch.fnmatch(base, pattern) for pattern in EXCLUDE_LINUX)


def gate_contents(report: Report, wheel: WheelInfo) -> None:
    """One compiled module, lltm/_C, and no other library: torch and CUDA stay outside."""
    binaries = [n for n in wheel.names if n.endswith(BINARY_SUFFIXES) or re.search(r"\.so\.\d", n)]
    modules = [n for n in binaries if re.fullmatch(r"lltm/_C\.[^/]+", n)]
    others = sorted(set(binaries) - set(modules))
    vendored = sorted(
        {n.split("/")[0] + "/" for n in wheel.names if n.split("/")[0].endswith(".libs")}
        | {n for n in wheel.names if "/.dylibs/" in n}
    )
    problems = []
    if len(modules) != 1:
        problems.append(f"expected one lltm/_C module, found {modules}")
    if others:
        torch_cuda = [n for n in others if is_excluded_lib(n)]
        problems.append(
            f"libraries bundled: {others}" + (f" (torch/CUDA: {torch_cuda})" if torch_cuda else "")
        )
    if vendored:
        problems.append(f"vendored library folders: {vendored}")
    report.add("contents", ok=not problems, detail="; ".join(problems) or f"only {modules[0]}")


def gate_size(report: Report, wheel: WheelInfo, budgets: dict[str, float]) -> None:
    """The size budget of the wheel's kind: cpu or cuda."""
    kind = "cpu" if wheel.variant == "cpu" else "cuda"
    budget = budgets.get(kind)
    size = report.path.stat().st_size / 1e6
    if budget is None:
        report.add("size", ok=False, detail=f"[tool.lltm.wheels] size-budget-mb has no {kind!r}")
        return
    report.add("size", ok=size < budget, detail=f"{size:.3f} MB, budget {kind} < {budget} MB")


def gate_auditwheel(report: Report, wheel: WheelInfo, expect_plat: str | None) -> None:
    """The platform tag is the one the manylinux policy allows; only torch/CUDA stay external."""
    result = run([*tool("auditwheel", "auditwheel"), "show", "--json", report.path],
                 capture_output=True)  # fmt: skip
    shown = json.loads(result.stdout)
    tags = wheel.platform.split(".")
    external = sorted(shown.get("external_libs", {}))
    problems = []
    if shown["sym_tag"] not in tags or not all(t.startswith("manylinux_") for t in tags):
        problems.append(
            f"tag {wheel.platform}, but auditwheel says its symbols allow {shown['sym_tag']}"
        )
    if expect_plat is not None and not any(fnmatch.fnmatch(t, expect_plat) for t in tags):
        problems.append(f"expected the platform tag {expect_plat}")
    stray = [lib for lib in external if not is_excluded_lib(lib)]
    if stray:
        problems.append(f"external libraries that are not torch's or CUDA's: {stray}")
    detail = "; ".join(problems) or (
        f"{shown['sym_tag']} (symbols), external only torch/CUDA: {', '.join(external)}"
    )
    report.add("auditwheel", ok=not problems, detail=detail)


def gate_cuda_archs(report: Report, wheel: WheelInfo) -> None:
    """The module carries machine code (and PTX) for every architecture it claims."""
    sys.path.insert(0, str(SCRIPTS))
    from check_cuda_build import cuda_archs_in, missing_archs  # noqa: PLC0415

    claimed = list(wheel.build_info.get("CUDA_ARCHS", []))
    module = next((n for n in wheel.names if re.fullmatch(r"lltm/_C\.[^/]+", n)), None)
    if module is None:
        report.add("cuda-archs", ok=False, detail="no lltm/_C module to inspect")
        return
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(report.path) as archive:
        try:
            elf, ptx = cuda_archs_in(archive.extract(module, tmp))
        except SystemExit as exc:  # check_cuda_build's "cuobjdump not found"
            raise WheelError(str(exc)) from None
    failures = missing_archs(claimed, elf, ptx)
    detail = "; ".join(failures) or (
        f"claims {' '.join(claimed)}; has sm_{' sm_'.join(sorted(elf))}, PTX {sorted(ptx)}"
    )
    report.add("cuda-archs", ok=not failures and bool(claimed), detail=detail)


def _tool_gate(
    report: Report, gate: str, skip: set[str], command: Callable[[], list[str | Path]]
) -> None:
    if gate in skip:
        report.skip(gate, f"--skip {gate}")
        return
    try:
        run(command(), capture_output=True)
    except WheelError as exc:  # the tool's complaint, or the tool missing
        report.add(gate, ok=False, detail=str(exc))
    else:
        report.add(gate, ok=True, detail="passed")


def gate_tools(report: Report, skip: set[str]) -> None:
    """The gates of twine (check --strict) and check-wheel-contents."""
    path = report.path
    _tool_gate(report, "twine", skip, lambda: [*tool("twine", "twine"), "check", "--strict", path])
    if path.suffix != ".whl":
        return
    config = ROOT / "pyproject.toml"
    _tool_gate(
        report,
        "check-wheel-contents",
        skip,
        lambda: [*tool("check_wheel_contents", "check-wheel-contents"), "--config", config, path],
    )


def check_sdist(report: Report, skip: set[str]) -> None:
    """The sdist (for PyPI): the plain version, and twine's check."""
    match = re.fullmatch(r"(?P<name>[^-]+)-(?P<version>.+)\.tar\.gz", report.path.name)
    version = match["version"] if match else "?"
    report.add("version", ok="+" not in version, detail=f"{version} (PyPI refuses local labels)")
    gate_tools(report, skip)


def check_file(
    path: Path,
    args: argparse.Namespace,
    budgets: dict[str, float],
    pypi_policy: tuple[str, dict[str, str]] | None = None,
) -> Report:
    """Run every gate that applies to ``path``; one gate's failure does not stop the others."""
    report = Report(path)
    skip = set(args.skip)
    if path.name.endswith(".tar.gz"):
        check_sdist(report, skip)
        return report
    try:
        wheel = read_wheel(path)
    except (WheelError, zipfile.BadZipFile) as exc:
        report.add("read", ok=False, detail=str(exc))
        return report
    if args.expect_pypi and wheel.label is not None:
        report.add("pypi", ok=False, detail=f"{wheel.version}: PyPI refuses local labels")
    gate_metadata(report, wheel, args.expect_variant, pypi_policy)
    gate_contents(report, wheel)
    gate_size(report, wheel, budgets)
    gate_tools(report, skip)
    if "linux" not in wheel.platform:
        report.skip("auditwheel", f"not a Linux wheel ({wheel.platform})")
    elif "auditwheel" in skip:
        report.skip("auditwheel", "--skip auditwheel")
    else:
        try:
            gate_auditwheel(report, wheel, args.expect_plat)
        except WheelError as exc:
            report.add("auditwheel", ok=False, detail=str(exc))
    if wheel.variant in {None, "cpu"}:
        return report
    if "cuda-archs" in skip:
        report.skip("cuda-archs", "--skip cuda-archs")
    else:
        try:
            gate_cuda_archs(report, wheel)
        except (WheelError, subprocess.SubprocessError) as exc:
            report.add("cuda-archs", ok=False, detail=str(exc))
    return report


def cmd_check(args: argparse.Namespace) -> None:
    """The gates, on each wheel and sdist given."""
    matrix = load_matrix()
    budgets = matrix.size_budget_mb
    policy = pypi_policy(matrix, args.policy)
    paths = [Path(p) for p in args.dists]
    if not paths:
        msg = "no wheels or sdists to check"
        raise WheelError(msg)
    failed = []
    for path in paths:
        report = check_file(path, args, budgets, policy)
        print(f"{path.name}")
        for gate, status, detail in report.results:
            print(f"  {status:4} {gate:20} {detail}")
        if report.failed:
            failed.append(path.name)
    if failed:
        msg = f"{len(failed)} of {len(paths)} failed the gates: {', '.join(failed)}"
        raise WheelError(msg)
    log(f"all {len(paths)} passed the gates")


# --- PyPI's plain-version wheels -------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def relabel(wheel: Path, out: Path, version: str) -> Path:
    """The same wheel under another version, into ``out``: for PyPI, the plain version.

    The compiled module is the very one built, repaired and tested under the
    label; only the version changes, in the file name, the .dist-info folder,
    METADATA and lltm/_build_info.py, and RECORD is written anew for them (as
    PyTorch's release process strips +cpu from the wheels it puts on PyPI).
    """
    info = read_wheel(wheel)
    plain = version
    old_info_dir, new_info_dir = f"lltm-{info.version}.dist-info/", f"lltm-{plain}.dist-info/"
    target = out / wheel.name.replace(f"-{info.version}-", f"-{plain}-", 1)
    with zipfile.ZipFile(wheel) as source:
        entries = [(item, source.read(item.filename)) for item in source.infolist()]
    records = []
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as dest:
        for item, raw in entries:
            if item.is_dir():  # auditwheel's folder entries: RECORD lists files only
                continue
            data = raw
            name = item.filename.replace(old_info_dir, new_info_dir, 1)
            if name == f"{new_info_dir}RECORD":
                continue
            if name == f"{new_info_dir}METADATA":
                data = re.sub(rb"(?m)^Version: .*$", f"Version: {plain}".encode(), data, count=1)
            elif name == "lltm/_build_info.py":
                data = re.sub(
                    rb"(?m)^VERSION = .*$", f'VERSION = "{plain}"'.encode(), data, count=1
                )
            new_item = zipfile.ZipInfo(name, date_time=item.date_time)
            new_item.external_attr = item.external_attr
            new_item.compress_type = zipfile.ZIP_DEFLATED
            dest.writestr(new_item, data)
            records.append(f"{name},{_record_hash(data)},{len(data)}")
        records.append(f"{new_info_dir}RECORD,,")
        dest.writestr(f"{new_info_dir}RECORD", "\n".join(records) + "\n")
    log(f"{wheel.name} -> {target.name}")
    return target


def plain_wheel(wheel: Path, out: Path) -> Path:
    """The PyPI wheel of a labelled one: the plain version (PyPI refuses local labels)."""
    version = read_wheel(wheel).version
    if "+" not in version:
        msg = f"{wheel.name} has a plain version already"
        raise WheelError(msg)
    return relabel(wheel, out, version.split("+", 1)[0])


def pypi_policy(matrix: Matrix, override: str | None) -> tuple[str, dict[str, str]]:
    """The newest torch and [tool.lltm.wheels.pypi]; or --policy TORCH:KEY=VARIANT,... instead.

    The override is for the local proof, whose machine has the CPU build of an
    older torch, not the CUDA build that PyPI's Linux x86_64 wheel is.
    """
    if override is None:
        return matrix.newest_torch, matrix.pypi
    match = re.fullmatch(r"(\d+\.\d+):((?:[\w-]+=\w+,?)+)", override)
    if match is None:
        msg = f"--policy {override!r}: expected TORCH:PLATFORM=VARIANT[,...], like 2.13:linux-x86_64=cpu"
        raise WheelError(msg)
    return match[1], dict(item.split("=") for item in match[2].strip(",").split(","))


def cmd_pypi(args: argparse.Namespace) -> None:
    """Of the wheels given, write the plain-version one of each that PyPI gets, into --out."""
    newest, variants = pypi_policy(load_matrix(), args.policy)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for path in map(Path, args.wheels):
        info = read_wheel(path)
        key = platform_key(info.platform)
        minor = _torch_minor(str(info.build_info.get("TORCH_VERSION", "")))
        if variants.get(key or "") == info.variant and minor == newest:
            made.append(plain_wheel(path, out))
        else:
            log(
                f"{path.name}: not PyPI's ({key} {info.variant} torch {minor}; PyPI gets "
                f"{variants.get(key or '')} torch {newest})"
            )
    if args.expect and not made:
        msg = f"none of {[Path(w).name for w in args.wheels]} is a PyPI wheel ([tool.lltm.wheels.pypi])"
        raise WheelError(msg)
    for path in made:
        print(path)


# --- the index -------------------------------------------------------------------------


def sha256(path: Path) -> str:
    """The file's SHA-256, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class IndexFile:
    """One file of a simple index: where it is, its hashes, what it needs."""

    filename: str
    url: str
    sha256: str | None
    metadata_sha256: str | None = None
    requires_python: str | None = None

    @property
    def project(self) -> str:
        """The PEP 503 normalized project name, from the file name."""
        name = self.filename.split("-", 1)[0]
        return re.sub(r"[-_.]+", "-", name).lower()


def wheel_metadata(wheel: Path) -> bytes:
    """A wheel's METADATA file (PEP 658 serves it beside the wheel)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name)


def write_metadata_files(directory: Path) -> None:
    """WHEEL.metadata beside each wheel: the release assets pip reads before downloading."""
    for wheel in sorted(directory.glob("*.whl")):
        (directory / f"{wheel.name}.metadata").write_bytes(wheel_metadata(wheel))


def cmd_metadata_files(args: argparse.Namespace) -> None:
    """Write WHEEL.metadata beside each wheel of the folder (for the release assets)."""
    write_metadata_files(Path(args.directory))
    log(f"metadata files written in {args.directory}")


def local_file(path: Path, url: str) -> IndexFile:
    """An index entry for a file on disk, linked at ``url``."""
    metadata = path.with_name(path.name + ".metadata")
    requires_python = None
    if path.suffix == ".whl":
        if not metadata.is_file():
            metadata.write_bytes(wheel_metadata(path))
        text = metadata.read_text(errors="replace")
        requires_python = next(
            (
                line.split(": ", 1)[1]
                for line in text.splitlines()
                if line.startswith("Requires-Python: ")
            ),
            None,
        )
    return IndexFile(
        filename=path.name,
        url=url,
        sha256=sha256(path),
        metadata_sha256=sha256(metadata) if metadata.is_file() else None,
        requires_python=requires_python,
    )


def read_releases(path: Path) -> list[dict[str, Any]]:
    """GitHub's releases, as `gh api --paginate repos/OWNER/REPO/releases` writes them.

    A JSON list, several (one per page), or one release per line (`--jq '.[]'`).
    """
    text = path.read_text()
    decoder = json.JSONDecoder()
    releases: list[dict[str, Any]] = []
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            return releases
        value, position = decoder.raw_decode(text, position)
        releases.extend(value if isinstance(value, list) else [value])


def release_files(releases: list[dict[str, Any]]) -> list[IndexFile]:
    """The wheels of every published release, linked where GitHub serves them."""
    files = []
    for release in releases:
        if release.get("draft"):
            continue
        assets = {asset["name"]: asset for asset in release.get("assets", [])}
        for name, asset in sorted(assets.items()):
            if not name.endswith(".whl"):
                continue
            digest = asset.get("digest") or ""
            if not digest.startswith("sha256:"):
                log(
                    f"{release.get('tag_name')}/{name}: no sha256 digest from GitHub; linked without"
                )
            metadata = assets.get(f"{name}.metadata", {}).get("digest") or ""
            files.append(
                IndexFile(
                    filename=name,
                    url=asset["browser_download_url"],
                    sha256=digest.removeprefix("sha256:") or None,
                    metadata_sha256=metadata.removeprefix("sha256:") or None,
                )
            )
    return files


def release_manifest(root: Path, base_url: str) -> list[dict[str, Any]]:
    """GitHub's release list, for releases laid out as ROOT/<tag>/<assets> (the local proof)."""
    releases = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        assets = [
            {
                "name": asset.name,
                "browser_download_url": f"{base_url.rstrip('/')}/{folder.name}/{asset.name}",
                "digest": f"sha256:{sha256(asset)}",
            }
            for asset in sorted(folder.iterdir())
            if asset.is_file()
        ]
        releases.append({"tag_name": folder.name, "draft": False, "assets": assets})
    return releases


def cmd_release_manifest(args: argparse.Namespace) -> None:
    """Print GitHub's release list (JSON) for local release folders ROOT/<tag>/."""
    print(json.dumps(release_manifest(Path(args.root), args.base_url), indent=1))


def _link(file: IndexFile) -> str:
    href = html.escape(file.url + (f"#sha256={file.sha256}" if file.sha256 else ""))
    attrs = [f'href="{href}"']
    if file.requires_python:
        attrs.append(f'data-requires-python="{html.escape(file.requires_python)}"')
    if file.metadata_sha256:
        # PEP 714's name, and PEP 658's older one that pip before 23.3 reads.
        value = f"sha256={file.metadata_sha256}"
        attrs += [f'data-core-metadata="{value}"', f'data-dist-info-metadata="{value}"']
    return f"    <a {' '.join(attrs)}>{html.escape(file.filename)}</a><br>"


def write_simple_index(out: Path, files: list[IndexFile], title: str) -> None:
    """A PEP 503 simple index at ``out``: out/index.html, out/<project>/index.html."""
    by_project: dict[str, list[IndexFile]] = {}
    for file in files:
        by_project.setdefault(file.project, []).append(file)
    page = "<!DOCTYPE html>\n<html><head><title>{}</title></head><body>\n{}\n</body></html>\n"
    for project, entries in by_project.items():
        names = [f.filename for f in entries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            msg = f"{duplicates} appear more than once (two releases with the same file?)"
            raise WheelError(msg)
        (out / project).mkdir(parents=True, exist_ok=True)
        body = "\n".join(_link(f) for f in sorted(entries, key=lambda f: f.filename))
        (out / project / "index.html").write_text(page.format(f"{title}: {project}", body))
    links = "\n".join(f'    <a href="{p}/">{p}</a><br>' for p in sorted(by_project))
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(page.format(title, links))


def _host_lower(url: str) -> str:
    # Host names are case-insensitive, and Pages' is lowercase (the owner's name
    # lower-cased); the path is compared as it is.
    parts = urllib.parse.urlsplit(url.rstrip("/"))
    return urllib.parse.urlunsplit(
        parts._replace(scheme=parts.scheme.lower(), netloc=parts.netloc.lower())
    )


def check_index_url(configured: str, published: str) -> None:
    """The configured index-url is where the index is published (host names in lowercase)."""
    if _host_lower(configured) != _host_lower(published):
        msg = (
            f"[tool.lltm.wheels] index-url is {configured!r}, but this index is published "
            f"at {published!r}: set index-url to it (the install lines of docs/building.md use it)"
        )
        raise WheelError(msg)


def _wheelhouse_entries(wheelhouse: Path, out: Path) -> list[tuple[str, IndexFile]]:
    """The wheels of a local folder, copied into OUT/<variant>/ and linked there."""
    wheels = sorted(wheelhouse.glob("*.whl"))
    if not wheels:
        msg = f"no wheels in {wheelhouse}"
        raise WheelError(msg)
    entries = []
    for wheel in wheels:
        label = LABEL_RE.match(read_wheel(wheel).label or "")
        if label is None:
            msg = f"{wheel.name} has no +pt{{XY}}{{variant}} label: it belongs in no sub-index"
            raise WheelError(msg)
        sub = out / label["variant"]
        sub.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, sub / wheel.name)
        # Pages at <variant>/<project>/: the wheels sit beside the project folders.
        entries.append((label["variant"], local_file(sub / wheel.name, f"../{wheel.name}")))
    return entries


def _release_entries(releases: Path) -> list[tuple[str, IndexFile]]:
    """The labelled wheels of every release, linked where GitHub serves them."""
    entries = []
    for entry in release_files(read_releases(releases)):
        match = WHEEL_RE.match(entry.filename)
        label = LABEL_RE.match((match["version"].partition("+")[2]) if match else "")
        if label is None and match and re.fullmatch(r"[\d.]+", match["version"]):
            log(f"{entry.filename}: the plain version, left to PyPI")
            continue
        if label is None:
            msg = (
                f"release asset {entry.filename}: neither a +pt{{XY}}{{variant}} label nor "
                "a plain version (did the upload rename it? GitHub once turned + into .)"
            )
            raise WheelError(msg)
        entries.append((label["variant"], entry))
    return entries


def cmd_index(args: argparse.Namespace) -> None:
    """Write a PEP 503 index per variant, like PyTorch's: OUT/cpu/, OUT/cu130/, ...

    Of the wheels of WHEELHOUSE (copied into the index, as the local proof
    does) and of every release in --releases (linked where GitHub serves them:
    the publish workflow, so that the index keeps every version). Each wheel
    is linked with its #sha256= and its METADATA (PEP 658); OUT/cu130/ is the
    --index-url, OUT/cu130/lltm/ the project page.
    """
    if args.expect_url is not None:
        check_index_url(load_matrix().index_url, args.expect_url)
    if args.wheelhouse is None and args.releases is None:
        msg = "give a WHEELHOUSE, --releases RELEASES.json, or both"
        raise WheelError(msg)
    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    by_variant: dict[str, list[IndexFile]] = {}
    if args.wheelhouse is not None:
        for variant, entry in _wheelhouse_entries(Path(args.wheelhouse), out):
            by_variant.setdefault(variant, []).append(entry)
    if args.releases is not None:
        for variant, entry in _release_entries(Path(args.releases)):
            by_variant.setdefault(variant, []).append(entry)
    if not by_variant:
        msg = "no labelled wheels to index"
        raise WheelError(msg)
    for variant, files in sorted(by_variant.items()):
        write_simple_index(out / variant, files, f"lltm wheels: {variant}")
        versions = sorted({WHEEL_RE.match(f.filename)["version"] for f in files})  # type: ignore[index]
        log(f"{variant}/: {len(files)} wheel(s), versions {', '.join(versions)}")
    print(out)


def cmd_simple_index(args: argparse.Namespace) -> None:
    """A flat PEP 503 index of every wheel and sdist in DIR, linked in place: a local PyPI."""
    root = Path(args.directory).resolve()
    files = [
        local_file(path, f"../{path.name}")
        for path in sorted(root.iterdir())
        if path.name.endswith((".whl", ".tar.gz"))
    ]
    if not files:
        msg = f"no wheels or sdists in {root}"
        raise WheelError(msg)
    write_simple_index(root, files, "a local PyPI")
    log(f"{root}: {len(files)} file(s) of {len({f.project for f in files})} project(s)")


# --- serving and installing from the index ---------------------------------------------


class _IndexHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt: str, *args: Any) -> None:
        log(f"index: {fmt % args}")


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port) while the block runs; yield its URL."""
    handler = functools.partial(_IndexHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    log(f"serving {directory} at {url}/")
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def venv_python(venv: Path) -> Path:
    """The venv's interpreter."""
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def installed_version(python: Path, distribution: str) -> str | None:
    """The version of ``distribution`` in ``python``'s environment, or None."""
    code = (
        "import importlib.metadata as m, sys\n"
        "try: print(m.version(sys.argv[1]))\n"
        "except m.PackageNotFoundError: print('')"
    )
    out = run([python, "-c", code, distribution], capture_output=True).stdout.strip()
    return out or None


def _make_venv(venv: Path, *, system_site_packages: bool) -> Path:
    if venv.exists():
        shutil.rmtree(venv)
    run([sys.executable, "-m", "venv", *(["--system-site-packages"] * system_site_packages), venv])
    python = venv_python(venv)
    if system_site_packages and sys.prefix != sys.base_prefix:
        # This Python is a venv itself (as on the GPU machine's image), whose
        # packages --system-site-packages does not reach: it means the base
        # interpreter's. A .pth file puts this one's after the new venv's own.
        site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   capture_output=True).stdout.strip()  # fmt: skip
        ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
        (Path(site) / "lltm-parent-site.pth").write_text("".join(f"{p}\n" for p in ours))
    return python


def check_install(
    args: argparse.Namespace,
    installed: dict[str, tuple[str, str]],
    url: str,
    python: Path,
    torch_before: str | None,
) -> str:
    """What pip installed from the index is what try-index asked for; lltm's version."""
    log(f"pip installed: {sorted((name, version) for name, (version, _) in installed.items())}")
    if "lltm" not in installed or (not args.no_torch and len(installed) != 1):
        msg = f"pip install {args.spec} from {url}/{args.variant}/ installed {sorted(installed)}: expected lltm alone"
        raise WheelError(msg)
    version, lltm_url = installed["lltm"]
    strays = [f"{name} from {where}" for name, (_, where) in installed.items()
              if not where.startswith(url)]  # fmt: skip
    if strays:
        msg = f"installed from outside the index {url}/: {strays}"
        raise WheelError(msg)
    if args.expect_version and version != args.expect_version:
        msg = f"pip install {args.spec} installed lltm {version}, expected {args.expect_version}"
        raise WheelError(msg)
    torch_after = installed_version(python, "torch")
    if args.no_torch:
        if "torch" not in installed:
            msg = f"pip install {args.spec} into a venv without torch did not install torch"
            raise WheelError(msg)
        log(f"lltm {version} from {lltm_url}; torch {torch_after} from the same index")
    elif torch_after != torch_before:
        msg = f"installing lltm changed torch from {torch_before} to {torch_after}"
        raise WheelError(msg)
    else:
        log(f"lltm {version} from {lltm_url}; torch {torch_after} unchanged")
    return version


def cmd_try_index(args: argparse.Namespace) -> None:
    """Serve the index, pip install lltm from it into a fresh venv, and test that install.

    The venv holds torch (--install, --system-site-packages) and pip must leave
    it alone; or, with --no-torch, it holds none, as on a clean machine, and pip
    must bring torch from the same index: the PyPI layout.
    """
    index = Path(args.index).resolve()
    page = index / args.variant / "lltm" / "index.html"
    if not page.is_file():
        msg = f"{page} is missing: run `wheels.py index` (or simple-index) first"
        raise WheelError(msg)
    python = _make_venv(Path(args.venv).resolve(), system_site_packages=args.system_site_packages)
    if args.install:
        run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args.install])
    torch_before = installed_version(python, "torch")
    if args.no_torch and torch_before is not None:
        msg = f"--no-torch, but the venv has torch {torch_before} (from --install?)"
        raise WheelError(msg)
    if not args.no_torch and torch_before is None:
        msg = "the venv has no torch: give --install 'torch==X.Y.Z', --system-site-packages or --no-torch"
        raise WheelError(msg)
    with serve(index) as url, tempfile.TemporaryDirectory() as tmp:
        index_url = f"{url}/{args.variant}/"
        report_path = Path(tmp) / "report.json"
        # --isolated: no pip configuration or PIP_* variables, so lltm (and, with
        # --no-torch, torch and its dependencies) can only come from this index.
        cmd = [python, "-m", "pip", "--isolated", "install", "--disable-pip-version-check"]
        cmd += ["--no-cache-dir", "--index-url", index_url, "--report", report_path, args.spec]
        run(cmd)
        report = json.loads(report_path.read_text())
    installed = {
        item["metadata"]["name"].lower(): (
            item["metadata"]["version"],
            item["download_info"]["url"],
        )
        for item in report["install"]
    }
    version = check_install(args, installed, url, python, torch_before)
    if args.then_install:
        run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *args.then_install,
            ]
        )
    test = [python, SCRIPTS / "wheels.py", "test-installed"]
    if "+" in version:  # a plain (PyPI) version names no variant
        test += ["--expect-variant", args.variant.rstrip("/").rsplit("/", 1)[-1]]
    test += ["--import-only"] * args.import_only + ["--expect-gpu"] * args.expect_gpu
    run([*test, *(["--", *args.pytest_args] if args.pytest_args else [])])


def check_plain_install(version: str, info: dict[str, Any], torch: str, cuda: str | None) -> None:
    """A plain version (PyPI's wheel) has no label: the torch minor, and CUDA major, must match."""
    built = info["torch"]
    if _torch_minor(built) != _torch_minor(torch):
        msg = f"lltm {version} was built against torch {built}, torch {torch} runs"
        raise WheelError(msg)
    if info.get("cuda") and (cuda or "").split(".")[0] != info["cuda"].split(".")[0]:
        msg = f"lltm {version} has CUDA {info['cuda']} kernels, torch {torch} CUDA {cuda}"
        raise WheelError(msg)


def cmd_test_installed(args: argparse.Namespace) -> None:
    """Check the installed lltm and run the tests against it (not against a source tree)."""
    import torch  # noqa: PLC0415

    import lltm  # noqa: PLC0415 - the installed one: this is what is tested

    sys.path.insert(0, str(ROOT / "build_support"))
    from lltm_build_meta import TorchBuild, local_label  # noqa: PLC0415

    location = Path(lltm.__file__).resolve().parent
    site_dirs = {Path(sysconfig.get_path(k)).resolve() for k in ("purelib", "platlib")}
    if location.parent not in site_dirs:
        msg = (
            f"lltm was imported from {location}, not from this environment's site-packages "
            f"{sorted(map(str, site_dirs))}: the tests would not test the installed wheel"
        )
        raise WheelError(msg)
    info = lltm.build_info()
    label = lltm.__version__.split("+", 1)[1] if "+" in lltm.__version__ else None
    running = local_label(TorchBuild(version=torch.__version__, cuda=torch.version.cuda))
    print(f"lltm {lltm.__version__} at {location}; torch {torch.__version__}; {info}")
    if info["backend"] != "aot":
        msg = f"lltm loaded its {info['backend']} build, not the wheel's prebuilt module"
        raise WheelError(msg)
    if label is None:
        check_plain_install(lltm.__version__, info, torch.__version__, torch.version.cuda)
    elif label != running:
        msg = f"lltm {lltm.__version__} is installed under torch {torch.__version__} ({running})"
        raise WheelError(msg)
    # In cibuildwheel's test step, the job's variant.
    expect = args.expect_variant or os.environ.get("LLTM_WHEEL_VARIANT")
    if expect and label is not None and not running.endswith(expect):
        msg = f"expected the {expect} variant, lltm is {label}"
        raise WheelError(msg)
    run([sys.executable, "-m", "lltm"], capture_output=True)
    if info.get("cuda"):
        run([sys.executable, SCRIPTS / "check_cuda_build.py"])
    if args.expect_gpu and "cuda" not in lltm.available_backends():
        msg = "--expect-gpu: lltm has CUDA kernels but no GPU is visible (nvidia-smi?)"
        raise WheelError(msg)
    if args.import_only:
        log("import check passed (--import-only: no test suite)")
        return
    tests = ROOT / "tests"
    # From tests/, with no source tree on sys.path: conftest imports the installed lltm.
    # Test files named among the pytest arguments (test_cuda.py) replace the whole suite.
    chosen = [a for a in args.pytest_args if (tests / a).is_file()]
    run([sys.executable, "-m", "pytest", *([] if chosen else [tests]), "-p", "no:cacheprovider",
         "-q", "-rs", *args.pytest_args], cwd=tests)  # fmt: skip


# --- command line ----------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """The command line."""
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("matrix", help="the wheel jobs")
    p.add_argument("--github", action="store_true", help="as a GitHub Actions matrix (JSON)")
    p.add_argument("--pythons", action="store_true", help="only the Python versions (JSON)")
    p.add_argument("--plan", choices=PLANS, help="default: $LLTM_WHEEL_PLAN, else full")
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("plan", help="both plans (pull request, full) with job counts")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("check-identifiers", help="cibuildwheel selects the intended builds")
    p.add_argument("--cibuildwheel", nargs="+", default=["cibuildwheel"], help="its command")
    p.set_defaults(func=cmd_check_identifiers)

    p = sub.add_parser("variants-table", help="the table of variants (docs/building.md)")
    p.add_argument("--check", action="store_true", help="check that docs/building.md holds it")
    p.set_defaults(func=cmd_variants_table)

    p = sub.add_parser("install-torch", help="torch for $LLTM_WHEEL_TORCH/$LLTM_WHEEL_VARIANT")
    p.add_argument("--build-deps", action="store_true", help=f"also {' '.join(BUILD_DEPS)}")
    p.set_defaults(func=cmd_install_torch)

    p = sub.add_parser("build", help="a wheel against --python's torch, without isolation")
    p.add_argument("--out", required=True, help="where the wheel goes")
    p.add_argument("--python", default=sys.executable, help="the Python (and torch) to build with")
    p.add_argument("--verbose", action="store_true", help="show the build's output")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("repair", help="repair a wheel, torch and CUDA left out")
    p.add_argument("wheel")
    p.add_argument("--dest-dir", required=True)
    p.set_defaults(func=cmd_repair)

    _add_pipeline_commands(sub)
    _add_release_commands(sub)
    return top


def _add_release_commands(sub: Any) -> None:
    p = sub.add_parser("pypi", help="the plain-version PyPI wheels, from the labelled ones")
    p.add_argument("wheels", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--expect", action="store_true", help="fail unless one is PyPI's")
    p.add_argument("--policy", help="TORCH:PLATFORM=VARIANT,... instead of pyproject.toml's")
    p.set_defaults(func=cmd_pypi)

    p = sub.add_parser("relabel", help="a wheel under another version (the local proof)")
    p.add_argument("wheel")
    p.add_argument("--version", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=lambda a: print(relabel(Path(a.wheel), Path(a.out), a.version)))

    p = sub.add_parser("metadata-files", help="WHEEL.metadata beside each wheel")
    p.add_argument("directory")
    p.set_defaults(func=cmd_metadata_files)

    p = sub.add_parser("release-manifest", help="GitHub's release list for ROOT/<tag>/ folders")
    p.add_argument("root")
    p.add_argument("--base-url", required=True, help="where ROOT is served")
    p.set_defaults(func=cmd_release_manifest)

    p = sub.add_parser("simple-index", help="a flat PEP 503 index of a folder (a local PyPI)")
    p.add_argument("directory")
    p.set_defaults(func=cmd_simple_index)


def _add_pipeline_commands(sub: Any) -> None:
    p = sub.add_parser("check", help="the gates")
    p.add_argument("dists", nargs="*", help="wheels and sdists")
    p.add_argument("--expect-variant", help="cpu or cuNNN: every wheel must be this variant")
    p.add_argument("--expect-plat", help="the platform tag (a glob) Linux wheels must carry")
    p.add_argument("--expect-pypi", action="store_true", help="every wheel must be a PyPI one")
    p.add_argument(
        "--policy", help="TORCH:PLATFORM=VARIANT,...: the PyPI policy, for a local proof"
    )
    gates = ["twine", "check-wheel-contents", "auditwheel", "cuda-archs"]
    p.add_argument("--skip", action="append", default=[], choices=gates, help="a gate not to run")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("index", help="a PEP 503 index per variant")
    p.add_argument("wheelhouse", nargs="?")
    p.add_argument("--releases", help="GitHub's release list (gh api .../releases), JSON")
    p.add_argument("--out", required=True)
    p.add_argument("--expect-url", help="where it is published: must be the configured index-url")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("try-index", help="serve the index, install lltm into a fresh venv, test")
    p.add_argument("--index", required=True)
    p.add_argument("--variant", required=True, help="the index's folder under --index: cpu, ...")
    p.add_argument("--venv", required=True, help="made afresh (removed first if it exists)")
    p.add_argument("--install", nargs="*", default=[], help="what the venv gets first (torch)")
    p.add_argument("--no-torch", action="store_true", help="no torch: the index must bring it")
    p.add_argument("--spec", default="lltm", help="what to pip install: lltm==0.1.0+pt213cpu")
    p.add_argument("--expect-version", help="the lltm version pip must install")
    p.add_argument("--then-install", nargs="*", default=[], help="what the tests need")
    p.add_argument("--system-site-packages", action="store_true", help="reuse this Python's torch")
    p.add_argument("--import-only", action="store_true", help="checks, but not the test suite")
    p.add_argument("--expect-gpu", action="store_true", help="fail unless CUDA can run")
    p.add_argument("pytest_args", nargs="*", help="after --: for pytest")
    p.set_defaults(func=cmd_try_index)

    p = sub.add_parser("test-installed", help="checks and tests against the installed lltm")
    p.add_argument("--expect-variant")
    p.add_argument("--import-only", action="store_true")
    p.add_argument("--expect-gpu", action="store_true")
    p.add_argument("pytest_args", nargs="*", help="after --: for pytest")
    p.set_defaults(func=cmd_test_installed)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a failure prints its message and returns 1."""
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except WheelError as exc:
        print(f"wheels.py {args.command}: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
