"""python -m lltm.benchmark: what it measures and reports, on tiny sizes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

import lltm
from lltm import benchmark


def run_benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lltm.benchmark", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=os.environ.copy(),
    )


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


def test_parse_args() -> None:
    args = benchmark.parse_args(["--sizes", "16x32x128,4096X32X128"])
    assert args.sizes == [(16, 32, 128), (4096, 32, 128)]
    assert benchmark.parse_args(["-b", "7"]).sizes == [(7, 32, 128)]
    assert benchmark.parse_args([]).variants == list(benchmark.VARIANTS)
    for bad in (["--sizes", "16x32"], ["--sizes", "0x1x1"], ["--variants", "python,nope"]):
        with pytest.raises(SystemExit):
            benchmark.parse_args(bad)


def test_parse_errors_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--sizes", "16x32"])
    assert "expected BATCHxFEATURESxSTATE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--variants", "python,nope"])
    assert "unknown nope" in capsys.readouterr().err


def test_saved_bytes_per_variant() -> None:
    """The saved-bytes figure counts what autograd keeps beyond inputs and parameters."""
    p = benchmark.Problem(8, 6, 16, torch.float32, torch.device("cpu"), "all")
    lltm_case = benchmark._Case("lltm", p)
    # new_cell, the activations and X.
    assert lltm_case.saved_bytes() == 4 * (8 * 16 + 3 * 8 * 16 + 8 * (16 + 6))
    assert benchmark._Case("loss", p).saved_bytes() is None


def test_plot(tmp_path: os.PathLike[str]) -> None:
    pytest.importorskip("matplotlib")
    results = [
        benchmark.Result(
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
    benchmark.plot(results, path)
    with open(path, "rb") as f:  # noqa: PTH123
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_rejects_unavailable_device() -> None:
    if "cuda" in lltm.available_backends():
        pytest.skip("CUDA is available here")
    result = run_benchmark("--device", "cuda", "--runs", "1")
    assert result.returncode != 0
    assert "--device cuda: lltm cannot run on cuda here (available: cpu" in result.stderr


def test_namespace_defaults() -> None:
    args = benchmark.parse_args([])
    assert isinstance(args, argparse.Namespace)
    assert args.grad == "params"
    assert args.runs is None
    assert args.seconds == 2.0


def test_sequence_mode() -> None:
    result = run_benchmark(
        *("--sequence", "3", "-b", "2", "-f", "3", "-s", "4", "--device", "cpu"),
        *("--runs", "2", "--warmup", "1", "--json", "-"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows = {r["variant"]: r for r in report["results"]}
    assert set(rows) == {"loop-python", "loop-lltm", "layer", "nn.LSTM"}
    assert all(r["steps"] == 3 and r["median_ms"] > 0 for r in rows.values())
    assert rows["nn.LSTM"]["vs_lstm"] == 1.0
