"""lltm's prebuilt wheels, one command line: `wheels.py COMMAND --help` tells its options."""

from __future__ import annotations

import sys

from wheel_hooks import main  # it runs COMMAND from the module that holds it

if __name__ == "__main__":
    sys.exit(main())
