"""Free-threaded CPython: `import lltm` keeps the GIL off, and the ops run from many threads.

The GIL checks need a free-threaded interpreter (CPython 3.14t) and are skipped
elsewhere; the threaded calls run everywhere: the ops release the GIL, so even
with one their C++ runs concurrently.
"""

from __future__ import annotations

import sys
import sysconfig
import threading
from pathlib import Path

import pytest
import torch

from helpers import make_inputs, run_python
from lltm import _C

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
needs_free_threading = pytest.mark.skipif(
    not FREE_THREADED,
    reason=f"needs a free-threaded CPython (3.14t); this is {sys.version.split()[0]} with the GIL",
)

# Import torch, then lltm, with warnings as errors: importing a module that has
# not declared it runs without the GIL turns the GIL on, with a RuntimeWarning.
PROBE = """
import sys, warnings
warnings.simplefilter("error", RuntimeWarning)
import torch
after_torch = sys._is_gil_enabled()
import lltm
print(after_torch, sys._is_gil_enabled())
"""


def _probe(tmp_path: Path, **env: str) -> tuple[str, str]:
    # Not the source tree (cwd): the installed lltm.
    result = run_python("-c", PROBE, env={"PYTHON_GIL": None, **env}, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    after_torch, after_lltm = result.stdout.split()[-2:]
    return after_torch, after_lltm


@needs_free_threading
def test_gil_stays_disabled_after_import_under_python_gil_0(tmp_path: Path) -> None:
    assert _probe(tmp_path, PYTHON_GIL="0") == ("False", "False")


@needs_free_threading
def test_import_lltm_does_not_turn_the_gil_on(tmp_path: Path) -> None:
    """Without PYTHON_GIL, a module that does not declare gil_not_used would turn it on."""
    after_torch, after_lltm = _probe(tmp_path)
    if after_torch == "True":
        pytest.skip("this torch turns the GIL on itself: lltm cannot be told apart")
    assert after_lltm == "False"


THREADS = 8
ROUNDS = 50


def test_ops_from_many_threads_match_one_thread() -> None:
    """THREADS threads call forward and backward at once, ROUNDS times each, on their inputs."""
    inputs = [
        make_inputs(16 + i, 32, 64, device="cpu", dtype=torch.float64) for i in range(THREADS)
    ]
    expected = []
    for x, w, b, h, c in inputs:
        out = _C.forward(x, w, b, h, c)
        grads = _C.backward(torch.ones_like(out[0]), torch.ones_like(out[1]), *out[1:], w)
        expected.append((out, grads))
    start = threading.Barrier(THREADS)
    failures: list[str] = []

    def work(i: int) -> None:
        x, w, b, h, c = inputs[i]
        start.wait()
        for round_ in range(ROUNDS):
            out = _C.forward(x, w, b, h, c)
            ones = (torch.ones_like(out[0]), torch.ones_like(out[1]))
            grads = _C.backward(*ones, *out[1:], w)
            op_out = torch.ops.lltm.forward(x, w, b, h, c)
            same = all(torch.equal(a, e) for a, e in zip(out, expected[i][0], strict=True))
            same &= all(torch.equal(a, e) for a, e in zip(grads, expected[i][1], strict=True))
            same &= torch.equal(op_out[0], expected[i][0][0])
            if not same:
                failures.append(f"thread {i}, round {round_}: differs from the one-thread result")
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in 120 s"
    assert failures == []
