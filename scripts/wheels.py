"""lltm's prebuilt wheels, one command line: `wheels.py COMMAND --help` tells its options.

The workflows, the nox sessions and scripts/gpu-wheel-check.sh call it;
wheel_hooks.main runs each command from the module that holds it. The gates,
PyPI's wheels and the index need noxfile.py's WHEEL_TOOLS: `nox -s wheel_tools
-- COMMAND ...` installs them first.
"""

from __future__ import annotations

import sys

from wheel_hooks import main

if __name__ == "__main__":
    sys.exit(main())
