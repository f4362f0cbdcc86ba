"""``python -m lltm.benchmark``: see :mod:`lltm.benchmark`."""

from __future__ import annotations

from lltm.benchmark.cli import main

if __name__ == "__main__":
    main()
