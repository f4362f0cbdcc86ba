"""cibuildwheel's hooks for lltm's wheels: torch for the variant, the build, the repair, the tests.

    wheel_hooks.py install-torch [--build-deps]   torch for $LLTM_WHEEL_TORCH and $LLTM_WHEEL_VARIANT
    wheel_hooks.py build --out DIR [--python PY]  a wheel against PY's torch, without isolation
    wheel_hooks.py repair WHEEL --dest-dir DIR    auditwheel / delocate / delvewheel, torch and
                                                  CUDA left out
    wheel_hooks.py test-installed                 checks and tests against the installed lltm

cibuildwheel runs them with the Python being built for (>= 3.10), in its build
and test environments, so this file imports the standard library only. The
repair tools are the caller's (cibuildwheel brings auditwheel and delocate;
install-torch --build-deps brings delvewheel). scripts/wheels.py (the matrix,
the gates, the index) builds on this file.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
PYTORCH_INDEX = "https://download.pytorch.org/whl"
BUILD_DEPS = ["scikit-build-core>=1.1", "ninja"]
# The repair tool cibuildwheel does not bring on Windows (it brings delocate on macOS).
REPAIR_DEPS = {"win32": ["delvewheel==1.13.2"]}
UV = "uv==0.13.9"
VARIANT_RE = re.compile(r"cpu|cu\d{3}")

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
# The MSVC C++ runtime too: torch's DLLs import msvcp140.dll from the system
# (torch needs the Visual C++ Redistributable) and lltm loads after torch, so a
# copy in lltm.libs/ would be a second runtime in the process; the gates reject it.
EXCLUDE_WINDOWS = [
    "torch*.dll",
    "c10*.dll",
    "cudart64_*.dll",
    "nvcuda.dll",
    "libiomp5md.dll",
    "msvcp140*.dll",
    "vcruntime140*.dll",
]


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
        output = "".join(p for p in (result.stdout, result.stderr) if isinstance(p, str)).strip()
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


def is_excluded_lib(name: str) -> bool:
    """Whether ``name`` (a file name or SONAME) is one of torch's or CUDA's libraries."""
    base = Path(name).name
    if base.lower().endswith(".dll"):
        return any(fnmatch.fnmatch(base.lower(), p.lower()) for p in EXCLUDE_WINDOWS)
    if base.endswith(".dylib"):
        return any(part in base for part in EXCLUDE_MACOS)
    return any(fnmatch.fnmatch(base, pattern) for pattern in EXCLUDE_LINUX)


def torch_minor(version: str) -> str:
    """``2.14`` of ``2.14.1+cu130``."""
    return ".".join(version.split("+", 1)[0].split(".")[:2])


# --- install-torch: the variant's torch, from PyTorch's index ------------------------------


def wheel_variant_from_env() -> tuple[str, str]:
    """$LLTM_WHEEL_TORCH ("2.14") and $LLTM_WHEEL_VARIANT ("cu130"), checked."""
    torch = os.environ.get("LLTM_WHEEL_TORCH", "")
    variant = os.environ.get("LLTM_WHEEL_VARIANT", "")
    if not re.fullmatch(r"\d+\.\d+", torch) or not VARIANT_RE.fullmatch(variant):
        msg = (
            f"LLTM_WHEEL_TORCH={torch!r} LLTM_WHEEL_VARIANT={variant!r}: set both, to a torch "
            "minor release and a variant of [tool.lltm.wheels], e.g. LLTM_WHEEL_TORCH=2.14 "
            "LLTM_WHEEL_VARIANT=cu130 (the wheels workflow sets them per job)"
        )
        raise WheelError(msg)
    return torch, variant


def installer(python: str = sys.executable) -> list[str]:
    """How install-torch installs: uv's pip (the default), or pip ($LLTM_WHEEL_INSTALLER=pip).

    uv installs from its cache by hard links: the test venv's torch, the second
    install of the job, then costs neither the download nor another few GB of disk.
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


# --- build and repair -------------------------------------------------------------------


def new_wheels(folder: Path, before: set[Path]) -> list[Path]:
    """The wheels in ``folder`` that were not in ``before``."""
    return sorted(set(folder.glob("*.whl")) - before)


def cmd_build(args: argparse.Namespace) -> None:
    """Build a wheel with ``--python``'s torch and build tools, without isolation."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    cmd = [args.python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", out]
    run([*cmd, *(["-v"] if args.verbose else []), ROOT], cwd=ROOT)
    built = new_wheels(out, before)
    if len(built) != 1:
        msg = f"expected one new wheel in {out}, found {[p.name for p in built]}"
        raise WheelError(msg)
    log(f"built {built[0].name} ({built[0].stat().st_size / 1e6:.2f} MB)")
    print(built[0])


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
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.submodule_search_locations:
            # delocate resolves @rpath through it, then leaves torch's libraries out.
            torch_lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
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
    repaired = new_wheels(dest, before)
    log(f"repaired: {', '.join(p.name for p in repaired) or '(a wheel already there was kept)'}")


# --- test-installed: the installed lltm, not a source tree --------------------------------


def check_plain_install(version: str, info: dict[str, Any], torch: str, cuda: str | None) -> None:
    """A plain version (PyPI's wheel) has no label: the torch minor, and CUDA major, must match."""
    built = info["torch"]
    if torch_minor(built) != torch_minor(torch):
        msg = f"lltm {version} was built against torch {built}, torch {torch} runs"
        raise WheelError(msg)
    if info.get("cuda") and (cuda or "").split(".")[0] != info["cuda"].split(".")[0]:
        msg = f"lltm {version} has CUDA {info['cuda']} kernels, torch {torch} CUDA {cuda}"
        raise WheelError(msg)


def cmd_test_installed(args: argparse.Namespace) -> None:
    """Check the installed lltm and run the tests against it (not against a source tree)."""
    import torch  # noqa: PLC0415 - the test environment's, which only this command needs

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


def parser() -> argparse.ArgumentParser:
    """The command line."""
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)
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
    p = sub.add_parser("test-installed", help="checks and tests against the installed lltm")
    p.add_argument("--expect-variant", help="cpu or cuNNN (default $LLTM_WHEEL_VARIANT)")
    p.add_argument("--import-only", action="store_true", help="checks, but not the test suite")
    p.add_argument("--expect-gpu", action="store_true", help="fail unless CUDA can run")
    p.add_argument("pytest_args", nargs="*", help="after --: for pytest")
    p.set_defaults(func=cmd_test_installed)
    return top


def main(argv: Sequence[str] | None = None, top: argparse.ArgumentParser | None = None) -> int:
    """Run a command; a failure prints its message and returns 1."""
    args = (top or parser()).parse_args(argv)
    try:
        args.func(args)
    except WheelError as exc:
        print(f"{Path(sys.argv[0]).name} {args.command}: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
