"""The cell benchmark: its JSON report, its tables and its plot, on tiny sizes."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from bench_helpers import bench_tables, run_benchmark

from lltm.benchmark import cell


def test_json_report_of_a_sweep() -> None:
    result = run_benchmark(
        *("--sizes", "2x3x4,5x3x4", "--variants", "python,floor,loss,kernels,lltm"),
        *("--runs", "4", "--warmup", "1", "--rounds", "2", "--device", "cpu", "--json", "-"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["config"]["sizes"] == [[2, 3, 4], [5, 3, 4]]
    assert report["config"]["grad"] == "params"
    rows = report["results"]
    assert [(r["batch"], r["variant"]) for r in rows] == [
        (b, v) for b in (2, 5) for v in ("python", "floor", "loss", "kernels", "lltm")
    ]
    for r in rows:
        assert r["device"] == "cpu"
        assert r["runs"] == 4
        assert 0 < r["step_us"]["min"] <= r["step_us"]["median"]
        # The step is the forward and the backward of each iteration.
        assert r["step_us"]["min"] >= r["forward_us"]["min"]
    by_variant = {r["variant"]: r for r in rows if r["batch"] == 5}
    assert by_variant["python"]["speedup"] == 1.0
    assert by_variant["floor"]["vs_floor"] == 1.0
    assert by_variant["floor"]["saved_bytes"] is None
    # lltm saves the activations, new_cell and X; eager saves more.
    s, f, b = 4, 3, 5
    assert by_variant["lltm"]["saved_bytes"] == 4 * (3 * b * s + b * s + b * (s + f))
    assert by_variant["python"]["saved_bytes"] > by_variant["lltm"]["saved_bytes"]
    assert "round 2/2" in result.stderr


def test_grad_all_and_the_table() -> None:
    result = run_benchmark(
        *("-b", "3", "-f", "2", "-s", "5", "--grad", "all", "--variants", "python,lltm"),
        *("--runs", "3", "--warmup", "1", "--rounds", "1", "--device", "cpu"),
    )
    assert result.returncode == 0, result.stderr
    assert "cpu: batch 3, features 2, state 5, float32, grad=all, 3 runs" in result.stdout
    assert "fwd+bwd" in result.stdout
    assert result.stdout.count("\nlltm ") == 1


def test_saved_bytes_per_variant() -> None:
    """The saved-bytes figure counts what autograd keeps beyond inputs and parameters."""
    p = cell.Problem(8, 6, 16, torch.float32, torch.device("cpu"), "all")
    lltm_case = cell._Case("lltm", p)
    # new_cell, the activations and X.
    assert lltm_case.saved_bytes() == 4 * (8 * 16 + 3 * 8 * 16 + 8 * (16 + 6))
    assert cell._Case("loss", p).saved_bytes() is None


def test_plot(tmp_path: os.PathLike[str]) -> None:
    pytest.importorskip("matplotlib")
    results = [
        cell.Result(
            variant=v,
            batch=b,
            features=3,
            state=4,
            dtype="float32",
            device="cpu",
            grad="params",
            forward_us={"median": 1.0},
            backward_us={"median": 1.0},
            step_us={"median": float(b)},
            runs=1,
        )
        for v in ("python", "lltm")
        for b in (1, 10)
    ]
    path = f"{tmp_path}/plot.png"
    cell.plot(results, path)
    with open(path, "rb") as f:  # noqa: PTH123
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_markdown_of_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cell.format_markdown, and bench_tables.py, which renders a report's file with it."""
    result = cell.Result(
        variant="lltm",
        batch=2,
        features=3,
        state=4,
        dtype="float32",
        device="cpu",
        grad="params",
        forward_us={"median": 1234.0},
        backward_us={"median": 2.0},
        step_us={"median": 1236.4},
        runs=5,
        saved_bytes=2048,
        speedup=1.5,
    )
    report = {"config": {"torch": "2.x", "threads": 2, "gpu": None}, "results": [asdict(result)]}
    text = cell.format_markdown(report)
    assert "**cpu, batch 2, features 3, state 4, float32, grad=params** (5 runs; torch 2.x, " in (
        text
    )
    assert "| variant | fwd | bwd | fwd+bwd | speedup | x floor | saved KB |\n" in text
    assert "| lltm | 1,234 | 2 | 1,236 | 1.50x | - | 2 |" in text
    assert "launches" not in text
    with_launches = asdict(result) | {"launches": {"forward": 3, "backward": 5}}
    launched = cell.format_markdown(report | {"results": [with_launches]})
    assert "| 1.50x | - | 2 | 3+5 |" in launched
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(report))
    bench_tables().main([str(path)])
    assert capsys.readouterr().out.strip() == text.strip()
