"""Every bad input through every entry point, each entry point in a subprocess.

The cases and the checks are in bad_inputs.py: each changes one argument of
a valid call (dtype, dimensions, sizes, layout, device, not a tensor), and
must raise TypeError, ValueError or RuntimeError with a message that names
the argument; for ``torch.ops.lltm.*``, meta and fake tensors must raise the
same exception with the same words as the C++ kernel. A subprocess per entry
point, so that a crash (a segfault on a bad input) fails that test alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import bad_inputs

HERE = Path(__file__).parent


@pytest.mark.parametrize("entry", list(bad_inputs.ENTRIES))
def test_bad_inputs_raise_clear_errors(entry: str) -> None:
    result = subprocess.run(
        [sys.executable, str(HERE / "bad_inputs.py"), entry],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, (
        f"{entry}: the runner died with exit status {result.returncode}:\n{result.stderr[-3000:]}"
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["tried"] > 50
    assert not report["problems"], "\n".join(report["problems"])
    print(f"{entry}: {report['tried']} bad inputs")  # noqa: T201 - the count, with -s
