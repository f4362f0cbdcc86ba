"""lltm's prebuilt wheels, one command line: `wheels.py COMMAND --help` tells its options.

wheel_hooks.main runs COMMAND from its module. The gates, PyPI's wheels and the index
need noxfile.py's WHEEL_TOOLS: `nox -s wheel_tools -- COMMAND ...` installs them first.
"""

from __future__ import annotations

import sys

from wheel_hooks import main

if __name__ == "__main__":
    sys.exit(main())
