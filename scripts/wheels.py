"""lltm's prebuilt wheels: the matrix, the gates, PyPI's wheels and the index.

The same commands run in the GitHub workflows, in the nox sessions and in
scripts/gpu-wheel-check.sh; cibuildwheel's hooks are scripts/wheel_hooks.py.
The matrix commands need the standard library only (the workflows call them
before installing anything); the others need the wheel tools that noxfile.py
pins (WHEEL_TOOLS): `nox -s wheel_tools -- COMMAND ...` runs any of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from wheel_hooks import WheelError, main


def _command(
    sub: argparse._SubParsersAction, name: str, target: str, text: str
) -> argparse.ArgumentParser:
    """A command that runs ``module:function``, imported when it runs."""
    module, function = target.split(":")

    def call(args: argparse.Namespace) -> None:
        try:
            implementation = getattr(importlib.import_module(module), function)
        except ModuleNotFoundError as exc:
            msg = f"{name} needs {exc.name}: run it as `nox -s wheel_tools -- {name} ...`"
            raise WheelError(msg) from None
        implementation(args)

    command = sub.add_parser(name, help=text)
    command.set_defaults(func=call)
    return command


def parser() -> argparse.ArgumentParser:
    """The command line."""
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)
    p = _command(sub, "matrix", "wheel_matrix:cmd_matrix", "the wheel jobs of a plan")
    p.add_argument("--github", action="store_true", help="as a GitHub Actions matrix (JSON)")
    p.add_argument("--pythons", action="store_true", help="only the Python versions (JSON)")
    p.add_argument("--plan", choices=("pr", "full"), help="default: $LLTM_WHEEL_PLAN, else full")
    _command(sub, "plan", "wheel_matrix:cmd_plan", "both plans (pull request, full), job counts")
    p = _command(sub, "check-identifiers", "wheel_matrix:cmd_check_identifiers",
                 "cibuildwheel selects exactly the intended builds")  # fmt: skip
    p.add_argument("--cibuildwheel", nargs="+", default=["cibuildwheel"], help="its command")
    p = _command(sub, "variants-table", "wheel_matrix:cmd_variants_table",
                 "the table of variants (docs/building.md)")  # fmt: skip
    p.add_argument("--check", action="store_true", help="check that docs/building.md holds it")
    _gate_commands(sub)
    _index_commands(sub)
    return top


def _gate_commands(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "check", "wheel_gates:cmd_check", "the gates, on wheels and sdists")
    p.add_argument("dists", nargs="*", help="wheels and sdists")
    p.add_argument("--expect-variant", help="cpu or cuNNN: every wheel must be this variant")
    p.add_argument("--expect-plat", help="the platform tag (a glob) Linux wheels must carry")
    p.add_argument("--expect-pypi", action="store_true", help="every wheel must be a PyPI one")
    p.add_argument(
        "--policy", help="TORCH:PLATFORM=VARIANT,...: the PyPI policy, for a local proof"
    )
    gates = ["twine", "check-wheel-contents", "auditwheel", "cuda-archs"]
    p.add_argument("--skip", action="append", default=[], choices=gates, help="a gate not to run")
    p = _command(sub, "pypi", "wheel_gates:cmd_pypi", "PyPI's plain-version wheels")
    p.add_argument("wheels", nargs="+", help="labelled wheels; PyPI's are relabelled")
    p.add_argument("--out", required=True)
    p.add_argument("--expect", action="store_true", help="fail unless one is PyPI's")
    p.add_argument("--policy", help="TORCH:PLATFORM=VARIANT,... instead of pyproject.toml's")
    p = _command(sub, "relabel", "wheel_gates:cmd_relabel", "a wheel under another version")
    p.add_argument("wheel")
    p.add_argument("--version", required=True)
    p.add_argument("--out", required=True)


def _index_commands(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "index", "wheel_index:cmd_index", "a PEP 503 index per variant")
    p.add_argument("wheelhouse", nargs="?", help="labelled wheels, copied into the index")
    p.add_argument("--releases", help="GitHub's release list (gh api .../releases), JSON")
    p.add_argument("--out", required=True)
    p.add_argument("--expect-url", help="where it is published: must be the configured index-url")
    p = _command(sub, "simple-index", "wheel_index:cmd_simple_index", "a flat local PyPI")
    p.add_argument("directory")
    p = _command(sub, "metadata-files", "wheel_index:cmd_metadata_files",
                 "WHEEL.metadata beside each wheel (release assets)")  # fmt: skip
    p.add_argument("directory")
    p = _command(sub, "release-manifest", "wheel_index:cmd_release_manifest",
                 "GitHub's release list for ROOT/<tag>/ folders")  # fmt: skip
    p.add_argument("root")
    p.add_argument("--base-url", required=True, help="where ROOT is served")
    p = _command(sub, "try-index", "wheel_index:cmd_try_index",
                 "serve the index, install lltm into a fresh venv, test that install")  # fmt: skip
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


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Run a command; a failure prints its message and returns 1."""
    return main(argv, parser())


if __name__ == "__main__":
    sys.exit(run_cli())
