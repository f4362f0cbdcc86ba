"""lltm's prebuilt wheels: build, repair, check, index and install-test, one script for all.

The same commands run in the GitHub workflows (through cibuildwheel and nox), in
`nox -s wheels_local` and in scripts/gpu-wheel-check.sh:

    wheels.py matrix [--github]          the wheel jobs: cibuildwheel's builds x [tool.lltm.wheels]
    wheels.py check-identifiers          cibuildwheel selects exactly the intended builds
    wheels.py variants-table             the README's table of variants
    wheels.py install-torch [--build-deps]   torch for $LLTM_WHEEL_TORCH and $LLTM_WHEEL_VARIANT
    wheels.py build --out DIR [--python PY]  a wheel against PY's torch, without isolation
    wheels.py repair WHEEL --dest-dir DIR    auditwheel / delocate / delvewheel, torch and CUDA left out
    wheels.py check DIST...              the gates, on wheels and the sdist
    wheels.py index WHEELHOUSE --out DIR     a PEP 503 index per variant (dumb-pypi)
    wheels.py try-index --index DIR --variant V --venv DIR ...
                                         serve the index on 127.0.0.1, pip install lltm from it
                                         into a fresh venv, run test-installed there
    wheels.py test-installed             checks and tests against the installed lltm

It runs on Python >= 3.10 with the standard library, so that cibuildwheel's
hooks can call it with the Python being built for; the commands that read
pyproject.toml need Python >= 3.11 (tomllib). The tools each gate uses
(auditwheel, twine, check-wheel-contents, dumb-pypi, cuobjdump) are the
caller's to install: nox's wheel sessions do.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import functools
import hashlib
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
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
PYTORCH_INDEX = "https://download.pytorch.org/whl"
BUILD_DEPS = ["scikit-build-core>=1.1", "ninja"]

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
# Windows: DLL name globs for delvewheel.
EXCLUDE_WINDOWS = ["torch*.dll", "c10*.dll", "cudart64_*.dll", "nvcuda.dll", "libiomp5md.dll"]

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


@dataclass(frozen=True)
class Matrix:
    """The wheel matrix: cibuildwheel's Python x platform, lltm's torch x variant."""

    pythons: tuple[str, ...]
    torch: tuple[str, ...]
    platforms: tuple[Platform, ...]
    size_budget_mb: dict[str, float]
    index_url: str

    def jobs(self) -> list[dict[str, str]]:
        """One job per identifier x torch x variant: what the wheels workflow runs."""
        jobs = []
        for platform in self.platforms:
            for python in self.pythons:
                for torch in self.torch:
                    for variant in platform.variants:
                        only = platform.identifier(python)
                        jobs.append(
                            {
                                "name": f"{only} torch {torch} {variant}",
                                "runner": platform.runner,
                                "only": only,
                                "torch": torch,
                                "variant": variant,
                                "artifact": f"wheel-{only}-pt{torch.replace('.', '')}{variant}",
                            }
                        )
        return jobs

    def expected_identifiers(self, platform: Platform) -> list[str]:
        """What cibuildwheel must select for ``platform``."""
        return sorted(platform.identifier(python) for python in self.pythons)


def _python_from_pattern(pattern: str) -> str:
    match = re.fullmatch(r"cp3(\d+)-\*", pattern)
    if match is None:
        msg = (
            f"[tool.cibuildwheel] build: {pattern!r}: expected one CPython per entry, like "
            '"cp312-*", so that the matrix is explicit'
        )
        raise WheelError(msg)
    return f"3.{match[1]}"


def _as_list(value: Any) -> list[str]:
    return value.split() if isinstance(value, str) else list(value)


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
    return Matrix(
        pythons=pythons,
        torch=torch,
        platforms=tuple(platforms),
        size_budget_mb=dict(wheels.get("size-budget-mb", {})),
        index_url=str(wheels.get("index-url", "")).rstrip("/"),
    )


def cmd_matrix(args: argparse.Namespace) -> None:
    """Print the wheel jobs: a GitHub Actions matrix (--github) or a readable list."""
    matrix = load_matrix()
    if args.pythons:
        print(json.dumps(list(matrix.pythons)))
        return
    jobs = matrix.jobs()
    if args.github:
        print(json.dumps({"include": jobs}, separators=(",", ":")))
        return
    for job in jobs:
        print(f"{job['runner']:18} {job['only']:26} torch {job['torch']:5} {job['variant']}")
    log(f"{len(jobs)} jobs")


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
    log(f"cibuildwheel selects exactly the intended {len(matrix.jobs())}-job matrix")


PLATFORM_NAMES = {
    "linux-x86_64": "Linux x86_64",
    "linux-aarch64": "Linux aarch64",
    "macos-arm64": "macOS arm64",
    "windows-AMD64": "Windows x86_64",
}


def variants_table(matrix: Matrix) -> str:
    """The README's table of variants and one install line per variant."""
    by_variant: dict[str, list[str]] = {}
    for platform in matrix.platforms:
        for variant in platform.variants:
            by_variant.setdefault(variant, []).append(
                PLATFORM_NAMES.get(platform.key, platform.key)
            )
    variants = sorted(by_variant, key=lambda v: (v != "cpu", v))
    torch = ", ".join(matrix.torch)
    newest = matrix.torch[-1]
    pythons = f"{matrix.pythons[0]} to {matrix.pythons[-1]}"
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


def cmd_variants_table(args: argparse.Namespace) -> None:
    """Print the README's table of variants, or check that the README holds it."""
    table = variants_table(load_matrix())
    if not args.check:
        print(table, end="")
        return
    if table not in (ROOT / "README.md").read_text():
        msg = (
            "README.md does not hold the current table of variants; replace it with the "
            f"output of `python scripts/wheels.py variants-table`:\n{table}"
        )
        raise WheelError(msg)
    log("README.md holds the current table of variants")


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


def cmd_install_torch(args: argparse.Namespace) -> None:
    """Install the variant's torch (cibuildwheel's before-build and before-test)."""
    torch, variant = wheel_variant_from_env()
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    # The variant's own index, so that the CPU build is not swapped for PyPI's CUDA one.
    run([*pip, f"torch=={torch}.*", "--index-url", f"{PYTORCH_INDEX}/{variant}"])
    if args.build_deps:
        run([*pip, *BUILD_DEPS])


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
        """``cpu`` or ``cuNNN``, from the local label."""
        match = LABEL_RE.match(self.label or "")
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


def gate_metadata(report: Report, wheel: WheelInfo, expect_variant: str | None) -> None:
    """The label, the torch pin and the recorded build agree, and name the intended variant."""
    label = LABEL_RE.match(wheel.label or "")
    if label is None:
        report.add("label", ok=False, detail=f"version {wheel.version}: no +pt{{XY}}cpu/cu{{NNN}}")
        return
    problems = []
    info = wheel.build_info
    torch_version = str(info.get("TORCH_VERSION", ""))
    minor = _torch_minor(torch_version)
    if label["torch"] != minor.replace(".", ""):
        problems.append(f"label pt{label['torch']} but built against torch {torch_version}")
    if wheel.requires_torch != [f"torch=={minor}.*"]:
        problems.append(f"Requires-Dist {wheel.requires_torch}, expected ['torch=={minor}.*']")
    variant = label["variant"]
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
        f"{wheel.label}: torch {torch_version}, Requires-Dist torch=={minor}.*, "
        f"CUDA {info.get('CUDA_VERSION')}"
    )
    report.add("label", ok=not problems, detail=detail)


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


def check_file(path: Path, args: argparse.Namespace, budgets: dict[str, float]) -> Report:
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
    gate_metadata(report, wheel, args.expect_variant)
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
    budgets = load_matrix().size_budget_mb
    paths = [Path(p) for p in args.dists]
    if not paths:
        msg = "no wheels or sdists to check"
        raise WheelError(msg)
    failed = []
    for path in paths:
        report = check_file(path, args, budgets)
        print(f"{path.name}")
        for gate, status, detail in report.results:
            print(f"  {status:4} {gate:20} {detail}")
        if report.failed:
            failed.append(path.name)
    if failed:
        msg = f"{len(failed)} of {len(paths)} failed the gates: {', '.join(failed)}"
        raise WheelError(msg)
    log(f"all {len(paths)} passed the gates")


# --- the index -------------------------------------------------------------------------


def sha256(path: Path) -> str:
    """The file's SHA-256, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cmd_index(args: argparse.Namespace) -> None:
    """Write a PEP 503 index per variant, like PyTorch's: OUT/cpu/, OUT/cu130/, ...

    Each sub-index holds its wheels, their METADATA files (PEP 658) and dumb-pypi's
    simple pages: OUT/cu130/index.html lists the projects, OUT/cu130/lltm/ links
    each wheel with its #sha256=.
    """
    if args.expect_url is not None:
        configured = load_matrix().index_url
        if configured != args.expect_url.rstrip("/"):
            msg = (
                f"[tool.lltm.wheels] index-url is {configured!r}, but this index is published "
                f"at {args.expect_url!r}: set index-url to it (the README's install lines use it)"
            )
            raise WheelError(msg)
    out = Path(args.out).resolve()
    wheels = sorted(Path(args.wheelhouse).glob("*.whl"))
    if not wheels:
        msg = f"no wheels in {args.wheelhouse}"
        raise WheelError(msg)
    by_variant: dict[str, list[Path]] = {}
    for wheel in wheels:
        variant = read_wheel(wheel).variant
        if variant is None:
            msg = f"{wheel.name} has no +pt{{XY}}{{variant}} label: it belongs in no sub-index"
            raise WheelError(msg)
        by_variant.setdefault(variant, []).append(wheel)
    if out.exists():
        shutil.rmtree(out)
    for variant, files in sorted(by_variant.items()):
        sub = out / variant
        sub.mkdir(parents=True)
        lines = []
        for wheel in files:
            shutil.copy2(wheel, sub / wheel.name)
            with zipfile.ZipFile(wheel) as archive:
                name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
                (sub / f"{wheel.name}.metadata").write_bytes(archive.read(name))
            entry = {
                "filename": wheel.name,
                "hash": f"sha256={sha256(wheel)}",
                "core_metadata": f"sha256={sha256(sub / f'{wheel.name}.metadata')}",
            }
            requires_python = read_wheel(wheel).requires_python
            if requires_python:
                entry["requires_python"] = requires_python
            lines.append(json.dumps(entry))
        with tempfile.TemporaryDirectory() as tmp:
            package_list = Path(tmp) / "packages.json"
            package_list.write_text("\n".join(lines) + "\n")
            site = Path(tmp) / "site"
            run(
                [
                    *tool("dumb_pypi.main", "dumb-pypi"),
                    "--package-list-json",
                    package_list,
                    "--output-dir",
                    site,
                    # Pages at <variant>/<project>/: the wheels sit beside the project folders.
                    "--packages-url",
                    "..",
                    "--title",
                    f"lltm wheels: {variant}",
                    "--no-generate-timestamp",
                ],
                capture_output=True,
            )
            # The simple pages at the variant's root, so that pip's --index-url is
            # OUT/<variant>/ as with PyTorch's index.
            shutil.copytree(site / "simple", sub, dirs_exist_ok=True)
        log(f"{variant}/: {len(files)} wheel(s)")
    print(out)


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


def cmd_try_index(args: argparse.Namespace) -> None:
    """Serve the index, pip install lltm from it into a fresh venv, and test that install."""
    index = Path(args.index).resolve()
    if not (index / args.variant / "lltm" / "index.html").is_file():
        msg = f"{index}/{args.variant}/lltm/ is missing: run `wheels.py index` first"
        raise WheelError(msg)
    venv = Path(args.venv).resolve()
    if venv.exists():
        shutil.rmtree(venv)
    run([sys.executable, "-m", "venv", *(["--system-site-packages"] * args.system_site_packages),
         venv])  # fmt: skip
    python = venv_python(venv)
    if args.system_site_packages and sys.prefix != sys.base_prefix:
        # This Python is a venv itself (as on the GPU machine's image), whose
        # packages --system-site-packages does not reach: it means the base
        # interpreter's. A .pth file puts this one's after the new venv's own.
        site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   capture_output=True).stdout.strip()  # fmt: skip
        ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
        (Path(site) / "lltm-parent-site.pth").write_text("".join(f"{p}\n" for p in ours))
    if args.install:
        run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args.install])
    torch_before = installed_version(python, "torch")
    if torch_before is None:
        msg = (
            f"the venv {venv} has no torch: give --install 'torch==X.Y.Z' or --system-site-packages"
        )
        raise WheelError(msg)
    with serve(index) as url, tempfile.TemporaryDirectory() as tmp:
        index_url = f"{url}/{args.variant}/"
        report_path = Path(tmp) / "report.json"
        # --isolated: no pip configuration or PIP_* variables, so lltm can only come
        # from this index, and torch only from what the venv holds.
        cmd = [python, "-m", "pip", "--isolated", "install", "--disable-pip-version-check"]
        cmd += ["--no-cache-dir", "--index-url", index_url, "--report", report_path, "lltm"]
        run(cmd)
        report = json.loads(report_path.read_text())
    installed = [
        (item["metadata"]["name"], item["metadata"]["version"], item["download_info"]["url"])
        for item in report["install"]
    ]
    log(f"pip installed: {installed}")
    if len(installed) != 1 or installed[0][0] != "lltm":
        msg = f"pip install lltm from {index_url} installed {installed}: expected lltm alone"
        raise WheelError(msg)
    if not installed[0][2].startswith(index_url):
        msg = f"lltm came from {installed[0][2]}, not from {index_url}"
        raise WheelError(msg)
    torch_after = installed_version(python, "torch")
    if torch_after != torch_before:
        msg = f"installing lltm changed torch from {torch_before} to {torch_after}"
        raise WheelError(msg)
    log(f"lltm {installed[0][1]} from {installed[0][2]}; torch {torch_after} unchanged")
    test = [python, SCRIPTS / "wheels.py", "test-installed", "--expect-variant", args.variant]
    test += ["--import-only"] * args.import_only + ["--expect-gpu"] * args.expect_gpu
    run([*test, *(["--", *args.pytest_args] if args.pytest_args else [])])


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
    if label != running:
        msg = f"lltm {lltm.__version__} is installed under torch {torch.__version__} ({running})"
        raise WheelError(msg)
    # In cibuildwheel's test step, the job's variant.
    expect = args.expect_variant or os.environ.get("LLTM_WHEEL_VARIANT")
    if expect and not running.endswith(expect):
        msg = f"expected the {expect} variant, lltm is {label}"
        raise WheelError(msg)
    run([sys.executable, "-m", "lltm"], capture_output=True)
    if not running.endswith("cpu"):
        run([sys.executable, SCRIPTS / "check_cuda_build.py"])
    if args.expect_gpu and "cuda" not in lltm.available_backends():
        msg = "--expect-gpu: lltm has CUDA kernels but no GPU is visible (nvidia-smi?)"
        raise WheelError(msg)
    if args.import_only:
        log("import check passed (--import-only: no test suite)")
        return
    tests = ROOT / "tests"
    # From tests/, with no source tree on sys.path: conftest imports the installed lltm.
    run([sys.executable, "-m", "pytest", tests, "-p", "no:cacheprovider", "-q", "-rs",
         *args.pytest_args], cwd=tests)  # fmt: skip


# --- command line ----------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """The command line."""
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("matrix", help="the wheel jobs")
    p.add_argument("--github", action="store_true", help="as a GitHub Actions matrix (JSON)")
    p.add_argument("--pythons", action="store_true", help="only the Python versions (JSON)")
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("check-identifiers", help="cibuildwheel selects the intended builds")
    p.add_argument("--cibuildwheel", nargs="+", default=["cibuildwheel"], help="its command")
    p.set_defaults(func=cmd_check_identifiers)

    p = sub.add_parser("variants-table", help="the README's table of variants")
    p.add_argument("--check", action="store_true", help="check that README.md holds it")
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
    return top


def _add_pipeline_commands(sub: Any) -> None:
    p = sub.add_parser("check", help="the gates")
    p.add_argument("dists", nargs="*", help="wheels and sdists")
    p.add_argument("--expect-variant", help="cpu or cuNNN: every wheel must be this variant")
    p.add_argument("--expect-plat", help="the platform tag (a glob) Linux wheels must carry")
    gates = ["twine", "check-wheel-contents", "auditwheel", "cuda-archs"]
    p.add_argument("--skip", action="append", default=[], choices=gates, help="a gate not to run")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("index", help="a PEP 503 index per variant")
    p.add_argument("wheelhouse")
    p.add_argument("--out", required=True)
    p.add_argument("--expect-url", help="where it is published: must be the configured index-url")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("try-index", help="serve the index, install lltm into a fresh venv, test")
    p.add_argument("--index", required=True)
    p.add_argument("--variant", required=True)
    p.add_argument("--venv", required=True, help="made afresh (removed first if it exists)")
    p.add_argument("--install", nargs="*", default=[], help="what the venv gets first (torch)")
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
