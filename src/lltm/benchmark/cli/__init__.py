"""The command line of ``python -m lltm.benchmark``: one parser for the cell and the sequences.

:mod:`.args` builds the parser, :mod:`.checks` refuses a flag that the
chosen mode cannot honour (with an error that names it) and fills in the
mode's defaults, :mod:`.runs` runs the mode and prints its tables, and
:mod:`.report` writes the JSON that both modes share. A flag that has no
effect on the devices chosen is reported in a note on stderr.
"""

from __future__ import annotations

from .args import parse_args
from .runs import main

__all__ = ["main", "parse_args"]
