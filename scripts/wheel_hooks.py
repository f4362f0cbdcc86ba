"""cibuildwheel's hooks for lltm's wheels: install-torch, build, repair and test-installed.

The standard library only: cibuildwheel runs them first. main runs every wheels.py command.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS, PYPROJECT = ROOT / "scripts", ROOT / "pyproject.toml"
PYTORCH_INDEX = "https://download.pytorch.org/whl"
BUILD_DEPS = ["scikit-build-core>=1.1", "ninja"]
# The repair tool cibuildwheel does not bring on Windows (it brings delocate on macOS).
REPAIR_DEPS = {"win32": ["delvewheel==1.13.2"]}
UV = "uv==0.13.9"
VARIANT_RE = re.compile(r"cpu|cu\d{3}")
# Each command's module: `wheels.py COMMAND` imports it alone (the first two: stdlib only).
COMMANDS = {
    "wheel_hooks": "install-torch build repair test-installed",
    "wheel_matrix": "matrix plan check-identifiers",
    "wheel_release": "check pypi relabel index simple-index metadata-files try-index",
}

# Never in a wheel: torch's libraries (its OpenMP runtime too) and CUDA's, which torch
# brings. Linux: SONAME globs for auditwheel; macOS: path parts for delocate; Windows:
# globs for delvewheel, with the MSVC runtime, which is the system's (torch's DLLs load it).
# fmt: off
EXCLUDE_LINUX = ["libtorch*.so*", "libc10*.so*", "libcudart.so*", "libcuda.so*", "libnvrtc*.so*",
                 "libnvToolsExt*.so*", "libgomp.so*"]
EXCLUDE_MACOS = ["libtorch", "libc10", "libomp"]
EXCLUDE_WINDOWS = ["torch*.dll", "c10*.dll", "cudart64_*.dll", "nvcuda.dll", "libiomp5md.dll",
                   "msvcp140*.dll", "vcruntime140*.dll"]
# fmt: on


class WheelError(Exception):
    """A failed step, with a message that says what is wrong and what to do."""


def require(ok: object, message: str) -> None:
    """Fail with ``message`` unless ``ok``."""
    if not ok:
        raise WheelError(message)


def log(message: str) -> None:
    """Progress, on stderr, so that stdout stays machine-readable."""
    print(f"[wheels] {message}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command, showing it, and fail with its output when it fails."""
    args = [str(c) for c in cmd]
    log("$ " + " ".join(a.replace("\n", "; ") for a in args))
    result = subprocess.run(args, text=True, check=False, **kwargs)
    output = "".join(p for p in (result.stdout, result.stderr) if isinstance(p, str)).strip()
    tail = f":\n{output[-4000:]}" if output else ""
    require(result.returncode == 0, f"`{' '.join(args)}` exited with {result.returncode}{tail}")
    return result


def tool(module: str | None, command: str, package: str | None = None) -> list[str]:
    """A tool's command: ``python -m module`` where importable, else ``command`` on PATH."""
    if module is not None and importlib.util.find_spec(module) is not None:
        return [sys.executable, "-m", module]
    found = shutil.which(command)
    require(found, f"{command} is needed, and not on PATH: pip install {package or command}")
    return [str(found)]


def is_excluded_lib(name: str) -> bool:
    """Whether ``name`` (a file name or SONAME) is one of torch's or CUDA's libraries."""
    base = Path(name).name
    if base.lower().endswith(".dll"):
        return any(fnmatch.fnmatch(base.lower(), p.lower()) for p in EXCLUDE_WINDOWS)
    if base.endswith(".dylib"):
        return any(part in base for part in EXCLUDE_MACOS)
    return any(fnmatch.fnmatch(base, pattern) for pattern in EXCLUDE_LINUX)


def install_torch_commands(
    torch: str, variant: str, *, build_deps: bool, system: str = sys.platform
) -> list[list[str]]:
    """install-torch's installs by uv: the variant's torch, then (--build-deps) the build tools."""
    # uv's cache serves the test venv's torch too (hard links).
    if importlib.util.find_spec("uv") is None:
        run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", UV])
    install = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable]
    # The variant's own index, so that the CPU build is not swapped for PyPI's CUDA one.
    commands = [[*install, f"torch=={torch}.*", "--index-url", f"{PYTORCH_INDEX}/{variant}"]]
    return commands + [[*install, *BUILD_DEPS, *REPAIR_DEPS.get(system, [])]] * build_deps


def cmd_install_torch(args: argparse.Namespace) -> None:
    """Install $LLTM_WHEEL_TORCH's torch in $LLTM_WHEEL_VARIANT (before-build, before-test)."""
    torch = os.environ.get("LLTM_WHEEL_TORCH", "")
    variant = os.environ.get("LLTM_WHEEL_VARIANT", "")
    require(
        re.fullmatch(r"\d+\.\d+", torch) and VARIANT_RE.fullmatch(variant),
        f"LLTM_WHEEL_TORCH={torch!r} LLTM_WHEEL_VARIANT={variant!r}: set both, to a torch minor "
        "and a variant of [tool.lltm.wheels], like 2.14 and cu130 (the workflow sets them per job)",
    )
    for command in install_torch_commands(torch, variant, build_deps=args.build_deps):
        run(command)


def cmd_build(args: argparse.Namespace) -> None:
    """Build a wheel with ``--python``'s torch and build tools, without isolation."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    cmd = [args.python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", out]
    run([*cmd, ROOT], cwd=ROOT)
    built = sorted(set(out.glob("*.whl")) - before)
    require(len(built) == 1, f"expected one new wheel in {out}, found {[p.name for p in built]}")
    log(f"built {built[0].name} ({built[0].stat().st_size / 1e6:.2f} MB)")
    print(built[0])


def repair_command(wheel: Path, dest: Path, system: str) -> tuple[list[str], dict[str, str]]:
    """The repair command for ``system`` (sys.platform), and the environment it needs."""
    env = dict(os.environ)
    if system.startswith("linux"):
        excludes = [arg for p in EXCLUDE_LINUX for arg in ("--exclude", p)]
        cmd = [*tool("auditwheel", "auditwheel"), "repair", "-w", str(dest), *excludes]
    elif system == "darwin":
        excludes = [arg for p in EXCLUDE_MACOS for arg in ("--exclude", p)]
        archs = os.environ.get("LLTM_DELOCATE_ARCHS", "arm64")
        cmd = [*tool(None, "delocate-wheel", "delocate"), "-w", str(dest)]
        cmd += ["--require-archs", archs, *excludes]
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.submodule_search_locations:
            # delocate resolves @rpath through it, then leaves torch's libraries out.
            env["DYLD_LIBRARY_PATH"] = str(Path(spec.submodule_search_locations[0]) / "lib")
    else:
        require(system == "win32", f"no wheel repair for platform {system!r}")
        cmd = [*tool("delvewheel", "delvewheel"), "repair", "-w", str(dest)]
        cmd += ["--exclude", ";".join(EXCLUDE_WINDOWS)]
    return [*cmd, str(wheel)], env


def cmd_repair(args: argparse.Namespace) -> None:
    """Repair a wheel for its platform, leaving torch and CUDA out."""
    dest = Path(args.dest_dir).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    cmd, env = repair_command(Path(args.wheel).resolve(), dest, sys.platform)
    run(cmd, env=env)
    repaired = ", ".join(p.name for p in sorted(set(dest.glob("*.whl")) - before))
    log(f"repaired: {repaired or '(a wheel already there was kept)'}")


def cmd_test_installed(args: argparse.Namespace) -> None:
    """Check the installed lltm and run the tests against it (not against a source tree)."""
    import torch  # noqa: PLC0415 - the test environment's; only this command needs it

    import lltm  # noqa: PLC0415 - the installed one: this is what is tested

    sys.path.insert(0, str(ROOT / "build_support"))
    from lltm_build_meta import TorchBuild, local_label  # noqa: PLC0415

    location = Path(lltm.__file__).resolve().parent
    sites = {Path(sysconfig.get_path(k)).resolve() for k in ("purelib", "platlib")}
    require(location.parent in sites, f"lltm comes from {location}, not from site-packages")
    info, version = lltm.build_info(), lltm.__version__
    label = version.split("+", 1)[1] if "+" in version else None
    now = TorchBuild(version=torch.__version__, cuda=torch.version.cuda)
    print(f"lltm {version} at {location}; torch {torch.__version__}; {info}")
    require(info["backend"] == "aot", f"lltm loaded its {info['backend']} build, not the wheel's")
    # A plain version (PyPI's wheel) names no torch: the minor and CUDA's major must match.
    built = TorchBuild(version=info["torch"], cuda=info.get("cuda"))
    same_cuda = not built.cuda or built.cuda.split(".")[0] == str(now.cuda).split(".")[0]
    plain_ok = label is None and built.minor == now.minor and same_cuda
    require(
        label == local_label(now) or plain_ok,
        f"lltm {version}, built against torch {built.version} (CUDA {built.cuda}), is "
        f"installed under torch {torch.__version__} (CUDA {torch.version.cuda})",
    )
    # In cibuildwheel's test step, the job's variant.
    expect = args.expect_variant or os.environ.get("LLTM_WHEEL_VARIANT")
    ok = not (expect and label and not label.endswith(expect))
    require(ok, f"expected the {expect} variant, lltm is {label}")
    run([sys.executable, "-m", "lltm"], capture_output=True)
    if info.get("cuda"):
        run([sys.executable, SCRIPTS / "check_cuda_build.py"])
    gpu = not args.expect_gpu or "cuda" in lltm.available_backends()
    require(gpu, "--expect-gpu: lltm has CUDA kernels but no GPU is visible (nvidia-smi?)")
    if args.import_only:
        log("import check passed (--import-only: no test suite)")
        return
    tests = ROOT / "tests"
    # From tests/, with no source tree on sys.path: conftest imports the installed lltm.
    # Test folders named among the pytest arguments (cell) replace the whole suite.
    chosen = [a for a in args.pytest_args if (tests / a).exists()]
    run([sys.executable, "-m", "pytest", *([] if chosen else [tests]), "-p", "no:cacheprovider",
         "-q", "-rs", *args.pytest_args], cwd=tests)  # fmt: skip


def command(sub: Any, func: Callable[[argparse.Namespace], None], text: str) -> Any:
    """A subcommand named after ``func`` (cmd_try_index: try-index), which it runs."""
    parser = sub.add_parser(func.__name__.removeprefix("cmd_").replace("_", "-"), help=text)
    parser.set_defaults(func=func)
    return parser


def add_commands(sub: Any) -> None:
    """The hooks' commands."""
    p = command(sub, cmd_install_torch, "torch for $LLTM_WHEEL_TORCH/$LLTM_WHEEL_VARIANT")
    p.add_argument("--build-deps", action="store_true", help=f"also {' '.join(BUILD_DEPS)}")
    p = command(sub, cmd_build, "a wheel against --python's torch, without isolation")
    p.add_argument("--out", required=True, help="where the wheel goes")
    p.add_argument("--python", default=sys.executable, help="the Python (and torch) to build with")
    p = command(sub, cmd_repair, "repair a wheel, torch and CUDA left out")
    p.add_argument("wheel")
    p.add_argument("--dest-dir", required=True)
    p = command(sub, cmd_test_installed, "checks and tests against the installed lltm")
    p.add_argument("--expect-variant", help="cpu or cuNNN (default $LLTM_WHEEL_VARIANT)")
    p.add_argument("--import-only", action="store_true", help="checks, but not the test suite")
    p.add_argument("--expect-gpu", action="store_true", help="fail unless CUDA can run")
    p.add_argument("pytest_args", nargs="*", help="after --: for pytest")


def main(argv: Sequence[str] | None = None) -> int:
    """``wheels.py COMMAND ...``: the module that holds COMMAND adds its options, then it runs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((m for m, names in COMMANDS.items() if argv[:1] and argv[0] in names.split()), None)
    if name is None:
        listing = "".join(f"\n  {m}.py: {names}" for m, names in COMMANDS.items())
        print(f"usage: wheels.py COMMAND ...; the commands:{listing}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        print(f"wheels.py {argv[0]} needs {exc.name}: `nox -s wheel_tools -- {argv[0]} ...`")
        return 1
    top = argparse.ArgumentParser(prog=Path(sys.argv[0]).name)
    module.add_commands(top.add_subparsers(dest="command"))
    args = top.parse_args(argv)
    try:
        args.func(args)
    except WheelError as exc:
        print(f"{top.prog} {args.command}: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # as wheel_hooks, the module the others import (one WheelError)
    sys.exit(importlib.import_module("wheel_hooks").main())
