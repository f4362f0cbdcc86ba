"""lltm's prebuilt wheels, one command line: `wheels.py COMMAND --help` tells its options.

The workflows, the nox sessions and scripts/gpu-wheel-check.sh call it; each
command runs from the module that holds it. cibuildwheel's hooks and the
matrix need the standard library only (they run before anything is
installed); the gates, PyPI's wheels and the index need noxfile.py's
WHEEL_TOOLS: `nox -s wheel_tools -- COMMAND ...` installs them first.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "wheel_hooks": ("install-torch", "build", "repair", "test-installed"),
    "wheel_matrix": ("matrix", "plan", "check-identifiers"),
    "wheel_gates": ("check", "pypi", "relabel"),
    "wheel_index": ("index", "simple-index", "metadata-files", "try-index"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run COMMAND with the module that holds it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((m for m, commands in COMMANDS.items() if argv[:1] and argv[0] in commands), None)
    if name is None:
        listing = "".join(f"\n  {m}.py: {', '.join(c)}" for m, c in COMMANDS.items())
        print(f"usage: wheels.py COMMAND ...; the commands:{listing}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        print(f"wheels.py {argv[0]} needs {exc.name}: `nox -s wheel_tools -- {argv[0]} ...`")
        return 1
    return module.main(argv)


if __name__ == "__main__":
    sys.exit(main())
