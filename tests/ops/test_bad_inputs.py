"""Every bad input through every entry point, in subprocesses.

The cases and the checks are in bad_inputs.py: each changes one argument of
a valid call (dtype, dimensions, sizes, layout, device, not a tensor), and
must raise TypeError, ValueError or RuntimeError with a message that names
the argument; for ``torch.ops.lltm.*``, meta and fake tensors must raise the
same exception with the same words as the C++ kernel. The entry points run
in three subprocesses (the ops, the Python API, torch.compile), so that a
crash on a bad input fails their tests rather than killing pytest.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

import bad_inputs
from helpers import run_python

HERE = Path(__file__).resolve().parents[1]  # tests/, where bad_inputs.py is


def group_of(entry: str) -> str:
    """The subprocess an entry point runs in: the ops, torch.compile or the Python API."""
    if entry.startswith("torch.ops."):
        return "ops"
    return "compile" if entry.startswith("torch.compile") else "api"


@cache
def run_group(group: str) -> dict[str, object]:
    entries = [e for e in bad_inputs.ENTRIES if group_of(e) == group]
    result = run_python(HERE / "bad_inputs.py", *entries, timeout=900)
    reports = {r["entry"]: r for r in map(json.loads, result.stdout.strip().splitlines())}
    return {"returncode": result.returncode, "stderr": result.stderr, "reports": reports}


@pytest.mark.parametrize("entry", list(bad_inputs.ENTRIES))
def test_bad_inputs_raise_clear_errors(entry: str) -> None:
    run = run_group(group_of(entry))
    report = run["reports"].get(entry)  # type: ignore[attr-defined]
    assert report is not None, (
        f"{entry}: the runner died (exit status {run['returncode']}) before reporting:\n"
        f"{str(run['stderr'])[-3000:]}"
    )
    assert report["tried"] > 50
    assert not report["problems"], "\n".join(report["problems"])
    print(f"{entry}: {report['tried']} bad inputs")  # noqa: T201 - the count, with -s
