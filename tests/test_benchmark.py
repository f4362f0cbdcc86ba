"""python -m lltm.benchmark: what it measures and reports, on tiny sizes."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import lltm
from helpers import run_python
from lltm import benchmark
from lltm.benchmark import cell
from lltm.benchmark import sequence as seq
from lltm.benchmark.sequence import run as seq_run
from lltm.benchmark.sequence import timing, variants
from lltm.benchmark.sequence.precision import precision_switches

# scripts/bench_tables.py, imported as a module by the sweep test.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def run_benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    return run_python("-m", "lltm.benchmark", *args)


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


# --- the sequence benchmark: sweeps, GPU time, precisions, flags ---------------------


def sequence_row(variant: str, t: int, b: int, wall: float, gpu: float | None = None) -> dict:
    """A row of run_sequence's shape, with the fields the reports read."""
    return {
        "variant": variant,
        "device": "cuda:0",
        "dtype": "float32",
        "precision": "float32",
        "steps": t,
        "batch": b,
        "features": 3,
        "state": 4,
        "median_ms": wall,
        "min_ms": wall,
        "gpu_ms": gpu,
        "gpu_us_per_step": gpu * 1e3 / t if gpu is not None else None,
        "host_ratio": wall / gpu if gpu is not None else None,
    }


def test_sweep_on_cpu_json_tables_plot_and_bench_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tiny sweep end to end: JSON, Markdown tables, heat map, and bench_tables.py."""
    json_path, png = tmp_path / "sweep.json", tmp_path / "heat.png"
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    benchmark.main(
        [
            *("--sequence", "--sweep", "--steps", "2,3", "--batches", "1,2", "--fs", "3x4"),
            *("--device", "cpu", "--runs", "1", "--warmup", "1", "--json", str(json_path), *plot),
        ]
    )
    out, err = capsys.readouterr()
    report = json.loads(json_path.read_text())
    config = report["config"]
    assert config["mode"] == "sweep"
    assert (config["steps"], config["batches"], config["fs"]) == ([2, 3], [1, 2], [[3, 4]])
    assert config["variants"] == ["layer", "nn.LSTM"]
    rows = report["results"]
    assert [(r["steps"], r["batch"], r["variant"]) for r in rows] == [
        (t, b, v) for t in (2, 3) for b in (1, 2) for v in ("layer", "nn.LSTM")
    ]
    for r in rows:
        assert r["precision"] == "float32"
        assert (r["matmul_tf32"], r["cudnn_tf32"]) == (False, False)
        assert r["median_ms"] > 0
        assert r["runs"] == 1
        # No CUDA graph on the CPU: no GPU time, and said why.
        assert r["gpu_ms"] is None
        assert r["host_ratio"] is None
        assert r["gpu_error"] == "CUDA only"
    summary = report["summary"]["precisions"]["float32"]
    assert summary["points"] == 4
    assert summary["worst"]["value"] <= summary["median"]
    assert "[4/4] float32 T=3 B=2 F=3 S=4" in err
    assert "| float32, F=3, S=4 | B=1 | B=2 |\n|---|---:|---:|\n| T=2 | " in out
    assert "\n| T=3 | " in out
    assert "| precision | points | worst | median | below 1.0 | n/a |" in out
    # Neither GPU time nor host ratio on the CPU: those tables are left out.
    assert "µs/step" not in out
    if plot:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The helper for docs/performance.md: the same tables from the JSON.
    tables = importlib.import_module("bench_tables")
    merged = tmp_path / "merged.json"
    tables.main([str(json_path), "--json", str(merged)])
    again = capsys.readouterr().out
    assert "| float32, F=3, S=4 | B=1 | B=2 |" in again
    assert json.loads(merged.read_text())["summary"]["overall"]["points"] == 4


def test_sweep_tables_and_summary() -> None:
    """The speedup, per-step and host tables, and the worst and median, from known rows."""
    rows = []
    for t, b, layer, lstm in ((2, 1, 1.0, 2.0), (2, 8, 4.0, 2.0), (4, 1, 1.0, 1.5)):
        rows += [
            sequence_row("layer", t, b, layer, layer / 2),
            sequence_row("nn.LSTM", t, b, lstm, lstm),
        ]
    missing = sequence_row("layer", 4, 8, 1.0)
    rows.append({k: v for k, v in missing.items() if k != "median_ms"} | {"error": "out of memory"})
    rows.append(sequence_row("nn.LSTM", 4, 8, 1.0))
    text = seq.format_sweep_tables(rows)
    assert (
        "| float32, F=3, S=4 | B=1 | B=8 |\n|---|---:|---:|\n| T=2 | 2.00 | 0.50 |\n"
        "| T=4 | 1.50 | n/a |" in text
    )
    assert "cuDNN nn.LSTM" in text
    # GPU time per step in µs, layer / cuDNN: 0.5 ms over 2 steps is 250 µs.
    assert "| T=2 | 250 / 1000 | 1000 / 1000 |" in text
    # Host ratio, layer / cuDNN.
    assert "| T=2 | 2.00 / 1.00 | 2.00 / 1.00 |" in text
    s = seq.sweep_summary(rows)["precisions"]["float32"]
    assert (s["points"], s["missing"], s["below_1"]) == (3, 1, 1)
    assert s["worst"] == {
        "value": 0.5,
        "precision": "float32",
        "steps": 2,
        "batch": 8,
        "features": 3,
        "state": 4,
    }
    assert s["median"] == 1.5
    assert s["gpu_median"] == 3.0
    assert s["host_ratio_max"]["value"] == 2.0
    assert (s["gpu_below_1"], s["host_ratio_above_goal"]) == (0, 3)
    assert "| float32 | 3 | 0.50x at T=2, B=8, F=3, S=4 (float32) | 1.50x | 1 | 1 |" in text


def test_graph_time_replays_and_failures() -> None:
    """The CUDA-graph timing logic, with fake graphs and events on the CPU."""
    clock = [0.0]
    log: list[str] = []

    class Graph:
        def replay(self) -> None:
            clock[0] += 2.0
            log.append("replay")

    class Event:
        def record(self) -> None:
            self.t = clock[0]

        def synchronize(self) -> None:
            log.append("sync")

        def elapsed_time(self, end: Event) -> float:
            return end.t - self.t

    def stall_for(ms: float) -> Callable[[], None]:
        assert ms >= 1.0
        return lambda: log.append("stall")

    g = timing._graph_time_with(Graph, Event, lambda: None, stall_for, replays=None, seconds=0.01)
    assert g.error is None
    # 2 ms per replay, 10 ms of budget: 5 replays, the GPU stalled before them.
    assert (g.median_ms, g.min_ms, g.replays) == (2.0, 2.0, 5)
    assert log[-7:] == ["stall", *["replay"] * 5, "sync"]
    g = timing._graph_time_with(Graph, Event, lambda: None, stall_for, replays=3, seconds=9.0)
    assert g.replays == 3

    def refuse() -> Graph:
        msg = "operation not permitted when stream is capturing\nmore"
        raise RuntimeError(msg)

    g = timing._graph_time_with(refuse, Event, lambda: None, stall_for, replays=None, seconds=1.0)
    assert g.median_ms is None
    assert g.error == "RuntimeError: operation not permitted when stream is capturing"
    # Not on CUDA: no graph, and why.
    assert seq.graph_time(None, torch.device("cpu")).error == "CUDA only"  # type: ignore[arg-type]


def test_a_path_that_does_not_fit_or_is_unknown_is_n_a(monkeypatch: pytest.MonkeyPatch) -> None:
    """RuntimeError (does not fit) and ValueError (unknown path, as 'fused' before it exists)."""

    def failing(exc: Exception) -> variants.Variant:
        def forward() -> torch.Tensor:
            raise exc

        return variants.Variant(forward, "fused", [])

    leaf = torch.ones(3, requires_grad=True)
    cases = {
        "layer-fused": failing(ValueError("LLTM_SEQUENCE_PATH=fused: expected auto, persistent")),
        "layer-persistent": failing(RuntimeError("the persistent kernel cannot hold W_h\nmore")),
        "nn.LSTM": variants.Variant(lambda: leaf * 2, None, [leaf]),
    }
    monkeypatch.setattr(seq_run, "build_variants", lambda *_: (dict(cases), {}))
    rows = seq.run_sequence(2, 1, 3, 4, runs=2, warmup=1, variants=list(cases), progress=False)
    by = {r["variant"]: r for r in rows}
    assert by["layer-fused"]["error"] == "LLTM_SEQUENCE_PATH=fused: expected auto, persistent"
    assert by["layer-persistent"]["error"] == "the persistent kernel cannot hold W_h"
    assert by["nn.LSTM"]["vs_lstm"] == 1.0
    assert "n/a: LLTM_SEQUENCE_PATH=fused" in seq.format_sequence_table(rows)


def test_cuda_variants_on_the_cpu_and_precisions() -> None:
    rows = seq.run_sequence(
        2, 2, 3, 4, runs=1, warmup=1, variants=["layer", "layer-persistent"], progress=False
    )
    error = "no persistent path on cpu (its paths: steps, onednn, fused)"
    assert rows[1] == {**rows[1], "variant": "layer-persistent", "error": error}
    default = seq.run_sequence(2, 1, 2, 3, runs=1, warmup=1, progress=False)
    assert [r["variant"] for r in default] == ["loop-python", "loop-lltm", "layer", "nn.LSTM"]
    # float32-defaults: cuDNN's TF32 on for the run, and back afterwards.
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    seen = []
    with precision_switches(seq.PRECISIONS["float32-defaults"]):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
    with precision_switches(seq.PRECISIONS["float32"]):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
    assert seen == [(True, False), (False, False)]
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before
    assert "nn.LSTM computes in TF32 (cuDNN" in seq.describe(["float32-defaults"], "cpu")
    with pytest.raises(ValueError, match="precision 'float8'"):
        seq.run_sequence(1, 1, 1, 1, precision="float8")


def test_sequence_sizes_with_their_own_steps(capsys: pytest.CaptureFixture[str]) -> None:
    benchmark.main(
        [
            *("--sequence", "--sizes", "2x1x3x4,3x2x3x4", "--precision", "float32,float64"),
            *("--variants", "layer,nn.LSTM", "--device", "cpu", "--runs", "1", "--json", "-"),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["sizes"] == [[2, 1, 3, 4], [3, 2, 3, 4]]
    assert [(r["steps"], r["precision"], r["variant"]) for r in report["results"]] == [
        (t, p, v) for t in (2, 3) for p in ("float32", "float64") for v in ("layer", "nn.LSTM")
    ]
    assert "| 2,1,3,4 | float32 | layer |" in seq.format_sequence_markdown(report["results"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sequence"], r"--sequence without T: give --sweep, or --sizes STEPSx"),
        (["--sequence", "8", "--sweep"], r"--sequence T and --sweep: the sweep takes its T"),
        (["--sequence", "--sweep", "-b", "4"], r"--batch-size and --sweep: the sweep takes"),
        (["--sequence", "--sweep", "--sizes", "1x2x3"], r"--sizes and --sweep"),
        (["--sequence", "8", "--steps", "1,2"], r"--steps: only with --sweep"),
        (["--sequence", "8", "--plot", "x.png"], r"--plot with --sequence: only with --sweep"),
        (["--sequence", "8", "--grad", "all"], r"--grad: --sequence always differentiates"),
        (["--sequence", "8", "--dtype", "float16", "--precision", "float16"], r"give one"),
        (["--sequence", "8", "--precision", "float8"], r"--precision: unknown float8"),
        (["--sequence", "8", "--variants", "layer,lstm"], r"--variants: unknown lstm; with"),
        (["--sequence", "8", "--sizes", "2x1x3x4"], r"--sequence 8 and --sizes STEPSx"),
        (["--sequence", "8", "-s", "4", "--sizes", "2x3x4"], r"--state-size and --sizes: give"),
        (["--sequence", "8", "--warmup", "0"], r"--warmup 0 with --sequence: every variant's"),
        (["--sequence", "8", "--variants", "lltm"], r"--variants: unknown lltm; with --sequence"),
        (["--sequence", "--sweep", "--fs", "32"], r"expected FEATURESxSTATE"),
        (["--sequence", "--sweep", "--batches", "0"], r"expected positive integers"),
        (["--sequence", "--sweep", "--device", "cpu,cuda"], r"--sweep runs on one device"),
        (["--sweep"], r"--sweep: only with --sequence"),
        (["--precision", "float16"], r"--precision: only with --sequence"),
        (["--sizes", "2x1x3x4"], r"STEPSx\.\.\. only with --sequence"),
        (["--no-gpu-time"], r"--no-gpu-time: only with --sequence"),
        # The cell benchmark: -b/-f/-s and --sizes are one size or a list, not both.
        (["-b", "4", "-f", "2", "--sizes", "2x3x4"], r"--batch-size, --features and --sizes: give"),
    ],
)
def test_sequence_flags_that_cannot_apply_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        benchmark.parse_args(argv)
    assert re.search(message, capsys.readouterr().err)


def test_launches_without_a_gpu_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    for mode in ([], ["--sequence", "2", "--variants", "layer"]):
        benchmark.main(
            [
                *mode,
                *("-b", "2", "-f", "3", "-s", "4", "--device", "cpu", "--launches"),
                *("--runs", "1", "--warmup", "1", "--rounds", "1", "--json", "-"),
            ]
        )
        out, err = capsys.readouterr()
        assert "note: --launches counts GPU operations: none on cpu" in err
        assert all(r["launches"] is None for r in json.loads(out)["results"])


def test_sequence_defaults_per_mode() -> None:
    single = benchmark.parse_args(["--sequence", "8", "-b", "4"])
    assert single.sizes == [(8, 4, 32, 128)]
    assert (single.precision, single.warmup, single.rounds, single.seconds) == (
        ["float32"],
        3,
        5,
        2.0,
    )
    sweep = benchmark.parse_args(["--sequence", "--sweep", "--device", "cpu"])
    assert (sweep.steps, sweep.batches, sweep.fs) == (
        list(seq.SWEEP_STEPS),
        list(seq.SWEEP_BATCHES),
        list(seq.SWEEP_FS),
    )
    assert sweep.variants == ["layer", "nn.LSTM"]
    assert (sweep.warmup, sweep.rounds, sweep.seconds) == (2, 3, 0.5)
    # Given values are kept, not clamped.
    assert benchmark.parse_args(["--sequence", "8", "--warmup", "20"]).warmup == 20
    step = benchmark.parse_args(["--kernels"])
    assert (step.launches, step.dtype, step.warmup, step.rounds) == (True, "float32", 20, 10)


def test_graph_time_cuda_calls_with_a_fake_torch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """graph_time's CUDA path, against stand-ins for torch.cuda: the calls and their order."""
    log: list[str] = []
    clock = [0.0]

    class Stream:
        def __init__(self, index: int | None = None) -> None:
            self.index = index

        def wait_stream(self, *_: Stream) -> None:
            log.append("wait_stream")

    class Graph:
        def replay(self) -> None:
            clock[0] += 1.0
            log.append("replay")

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing

        def record(self) -> None:
            self.t = clock[0]

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: Event) -> float:
            return end.t - self.t

    @contextlib.contextmanager
    def capture(*_: Graph, stream: Stream | None = None) -> Iterator[None]:
        assert stream is not None
        assert stream.index == 0  # the warm-up's stream
        log.append("capture")
        yield

    current = Stream()
    fakes = {
        "current_device": lambda: 0,
        "Stream": Stream,
        "current_stream": lambda *_: current,
        "stream": lambda *_: contextlib.nullcontext(),
        "set_stream": lambda *_: log.append("set_stream"),
        "device": lambda *_: contextlib.nullcontext(),
        "synchronize": lambda *_: None,
        "CUDAGraph": Graph,
        "graph": capture,
        "Event": Event,
        "_sleep": lambda *_: log.append("sleep"),
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(torch.cuda, name, fake, raising=False)
    monkeypatch.setattr(timing, "_SIDE_STREAMS", {})
    monkeypatch.setattr(timing, "_CYCLES_PER_MS", {0: 1000.0})
    leaf = torch.ones(3, requires_grad=True)
    steps = []

    def forward() -> torch.Tensor:
        steps.append("step")
        return leaf * 2

    v = variants.Variant(forward, "steps", [leaf])
    g = seq.graph_time(v, torch.device("cuda"), warmup=2, estimate_ms=1.0, seconds=0.004)
    assert g.error is None
    assert (g.median_ms, g.replays) == (1.0, 4)
    # Two warm-up calls and the captured one; then the grads are cleared.
    assert len(steps) == 3
    assert leaf.grad is None
    assert log[0] == "wait_stream"
    assert log.index("capture") < log.index("sleep") < log.index("set_stream")

    def fail() -> torch.Tensor:
        msg = "CUDA error: operation not permitted when stream is capturing"
        raise RuntimeError(msg)

    # The spin kernel's calibration, once per GPU.
    timing._CYCLES_PER_MS.clear()
    assert timing._stall(torch.device("cuda"), 2.0) is not None
    assert 0 in timing._CYCLES_PER_MS
    g = seq.graph_time(variants.Variant(fail, None, [leaf]), torch.device("cuda"))
    assert g.error == "RuntimeError: CUDA error: operation not permitted when stream is capturing"


def test_sweep_heat_map_of_gpu_times(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [
        sequence_row(v, t, b, 1.0, gpu)
        for t in (2, 4)
        for b in (1, 8)
        for v, gpu in (("layer", 0.5 * t), ("nn.LSTM", 1.0))
    ]
    path = tmp_path / "gpu.png"
    seq.plot_sweep(rows, str(path), metric="gpu")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- nn.LSTM's options: bidirectional and packed batches ----------------------------


def test_packed_lengths_are_seeded_and_in_range() -> None:
    lengths = seq.packed_lengths(128, 256, seed=0)
    assert lengths.dtype == torch.int64
    assert lengths.shape == (256,)
    assert int(lengths.min()) >= 32
    assert int(lengths.max()) <= 128
    # Uniform over [32, 128]: both halves of the range are drawn.
    assert int(lengths.min()) < 50
    assert int(lengths.max()) > 110
    assert torch.equal(lengths, seq.packed_lengths(128, 256, seed=0))
    assert not torch.equal(lengths, seq.packed_lengths(128, 256, seed=1))
    # T/4 rounds up, and never below one step.
    assert int(seq.packed_lengths(10, 64).min()) >= 3
    assert set(seq.packed_lengths(2, 64).tolist()) <= {1, 2}


def test_the_options_variants_and_their_inputs() -> None:
    """What each variant runs: both directions, the packed batch, and the same batch padded."""
    cpu = torch.device("cpu")
    options = seq.LayerOptions(bidirectional=True)
    cases, errors = variants.build_variants(
        ["layer", "nn.LSTM"], 5, 3, 2, 4, torch.float32, cpu, options
    )
    assert errors == {}
    assert cases["layer"].forward().shape == (5, 3, 8)  # both directions' h_t
    assert cases["nn.LSTM"].forward().shape == (5, 3, 8)
    names = ["loop-lltm", "layer", "layer-padded", "nn.LSTM"]
    options = seq.LayerOptions(packed=True, lengths_seed=4)
    cases, errors = variants.build_variants(names, 8, 6, 2, 4, torch.float32, cpu, options)
    assert set(errors) == {"loop-lltm"}
    lengths = seq.packed_lengths(8, 6, seed=4)
    tokens, longest = int(lengths.sum()), int(lengths.max())
    # The packed variants: their forward is the PackedSequence's data, a row per token,
    # and the leaf that needs grad is that batch's data.
    assert cases["layer"].forward().shape == (tokens, 4)
    assert cases["nn.LSTM"].forward().shape == (tokens, 4)
    data = cases["layer"].leaves[-1]
    assert data.shape == (tokens, 2)
    assert data.requires_grad
    assert cases["nn.LSTM"].leaves[-1] is data
    # layer-padded: the same layer on the same batch, padded to its longest sequence.
    padded = cases["layer-padded"].leaves[-1]
    assert padded.shape == (longest, 6, 2)
    assert cases["layer-padded"].forward().shape == (longest, 6, 4)
    assert cases["layer-padded"].leaves[:-1] == cases["layer"].leaves[:-1]
    repacked = torch.nn.utils.rnn.pack_padded_sequence(padded, lengths, enforce_sorted=False)
    assert torch.equal(repacked.data, data)
    past_the_end = torch.arange(longest)[:, None] >= lengths[None, :]
    assert padded[past_the_end].abs().sum() == 0
    # The step's backward reaches the packed leaf.
    cases["layer"].step()
    assert data.grad is not None
    assert data.grad.shape == data.shape


def test_variants_the_options_rule_out() -> None:
    both = seq.LayerOptions(bidirectional=True, packed=True)
    assert seq.default_variants("cpu") == ["loop-python", "loop-lltm", "layer", "nn.LSTM"]
    assert seq.default_variants("cpu", seq.LayerOptions(bidirectional=True)) == [
        "layer",
        "nn.LSTM",
    ]
    assert seq.default_variants("cpu", both) == ["layer", "layer-padded", "nn.LSTM"]
    assert seq.default_variants("cuda", both) == [
        "layer",
        "layer-padded",
        *seq.CUDA_VARIANTS,
        "nn.LSTM",
    ]
    rows = seq.run_sequence(
        3, 2, 3, 4, runs=1, warmup=1, progress=False, variants=["layer-padded", "layer"]
    )
    assert rows[0]["error"] == "only with packed (the layer on the packed batch, padded)"
    rows = seq.run_sequence(
        3, 2, 3, 4, runs=1, warmup=1, progress=False, variants=["loop-python"], packed=True
    )
    assert rows[0]["error"].startswith("the loops run one direction over every step")


def test_bidirectional_sequence_json(capsys: pytest.CaptureFixture[str]) -> None:
    benchmark.main(
        [
            *("--sequence", "3", "-b", "2", "-f", "3", "-s", "4", "--bidirectional"),
            *("--device", "cpu", "--runs", "2", "--warmup", "1", "--json", "-"),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    config = report["config"]
    assert (config["bidirectional"], config["packed"], config["lengths_seed"]) == (
        True,
        False,
        None,
    )
    rows = {r["variant"]: r for r in report["results"]}
    assert list(rows) == ["layer", "nn.LSTM"]  # no loops: they run one direction
    for r in rows.values():
        assert (r["bidirectional"], r["packed"], r["lengths_seed"]) == (True, False, None)
        assert "packed_vs_padded" not in r
    layer, lstm = rows["layer"], rows["nn.LSTM"]
    assert layer["vs_lstm"] == pytest.approx(lstm["median_ms"] / layer["median_ms"])
    summary = report["summary"]["cpu"]["precisions"]["float32, bidirectional"]
    assert summary["points"] == 1
    assert summary["median"] == pytest.approx(layer["vs_lstm"])


def test_packed_sizes_table_json_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Packed at two sizes: the three variants, the ratio of their times, the lengths, the summary."""
    path = tmp_path / "packed.json"
    benchmark.main(
        [
            *("--sequence", "--sizes", "8x4x3x5,6x3x3x5", "--packed", "--lengths-seed", "3"),
            *("--device", "cpu", "--runs", "2", "--warmup", "1", "--json", str(path)),
        ]
    )
    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    config = report["config"]
    assert (config["bidirectional"], config["packed"], config["lengths_seed"]) == (
        False,
        True,
        3,
    )
    rows = report["results"]
    assert [(r["steps"], r["variant"]) for r in rows] == [
        (t, v) for t in (8, 6) for v in ("layer", "layer-padded", "nn.LSTM")
    ]
    ratios = []
    for t, b in ((8, 4), (6, 3)):
        lengths = seq.packed_lengths(t, b, seed=3)
        by = {r["variant"]: r for r in rows if r["steps"] == t}
        for r in by.values():
            assert (r["packed"], r["lengths_seed"], r["bidirectional"]) == (True, 3, False)
            assert r["padded_steps"] == int(lengths.max())
            assert r["shortest"] == int(lengths.min())
            assert r["fill"] == pytest.approx(int(lengths.sum()) / (b * int(lengths.max())))
        ratio = by["layer"]["median_ms"] / by["layer-padded"]["median_ms"]
        assert by["layer"]["packed_vs_padded"] == pytest.approx(ratio)
        assert "packed_vs_padded" not in by["nn.LSTM"]
        ratios.append(ratio)
    packed = report["packed_summary"]["cpu"]["precisions"]["float32, packed"]
    assert packed["points"] == 2
    assert packed["worst"]["value"] == pytest.approx(max(ratios))
    assert packed["median"] == pytest.approx(sum(ratios) / 2)
    assert packed["above_goal"] == sum(1 for v in ratios if v > seq.PACKED_GOAL)
    assert report["summary"]["cpu"]["precisions"]["float32, packed"]["points"] == 2
    # The printed table: the options in the header and the rows, the ratio's column,
    # the lengths of each size, and the worst and median over both sizes.
    assert "packed: B sequences of lengths uniform in [ceil(T/4), T] (seed 3)" in out
    header = next(line for line in out.splitlines() if line.startswith("T,B,F,S"))
    assert header.rstrip().endswith("/padded")
    layer_row = next(line for line in out.splitlines() if line.startswith("8,4,3,5"))
    assert "float32, packed" in layer_row
    assert layer_row.rstrip().endswith(f"{ratios[0]:.2f}")
    assert f"8,4,3,5: lengths in [{rows[0]['shortest']}, {rows[0]['padded_steps']}] of T=8" in out
    assert "cpu, float32, packed, 2 sizes: LLTMLayer over nn.LSTM: worst" in out
    assert f"packed / padded: worst {max(ratios):.2f} at" in out


def test_packed_bidirectional_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sweep.json"
    benchmark.main(
        [
            *("--sequence", "--sweep", "--packed", "--bidirectional", "--steps", "4"),
            *("--batches", "2,3", "--fs", "3x4", "--device", "cpu", "--runs", "1"),
            *("--warmup", "1", "--json", str(path)),
        ]
    )
    out, err = capsys.readouterr()
    report = json.loads(path.read_text())
    config = report["config"]
    assert config["variants"] == ["layer", "layer-padded", "nn.LSTM"]
    assert (config["bidirectional"], config["packed"], config["lengths_seed"]) == (True, True, 0)
    assert [(r["batch"], r["variant"]) for r in report["results"]] == [
        (b, v) for b in (2, 3) for v in ("layer", "layer-padded", "nn.LSTM")
    ]
    setting = "float32, bidirectional, packed"
    assert report["summary"]["precisions"][setting]["points"] == 2
    assert report["packed_summary"]["precisions"][setting]["points"] == 2
    assert f"[2/2] {setting} T=4 B=3 F=3 S=4" in err
    assert "packed/padded" in err
    assert f"| {setting}, F=3, S=4 | B=2 | B=3 |" in out
    assert f"| {setting}, F=3, S=4, packed / padded | B=2 | B=3 |" in out
    assert "| precision | points | worst | median | above 0.75 | n/a | fill |" in out
    assert "The goal bidirectional and packed: at least 1.0x everywhere" in out
    # bench_tables.py: the same tables, and the packed summary in its merged JSON.
    tables = importlib.import_module("bench_tables")
    merged = tmp_path / "merged.json"
    tables.main([str(path), "--json", str(merged)])
    assert f"| {setting}, F=3, S=4, packed / padded | B=2 | B=3 |" in capsys.readouterr().out
    assert json.loads(merged.read_text())["packed_summary"]["overall"]["points"] == 2
    # Without --steps/--batches/--fs, a packed sweep is the packed goal's eight sizes.
    args = benchmark.parse_args(["--sequence", "--sweep", "--packed", "--device", "cpu"])
    assert (args.steps, args.batches, args.fs) == ([128, 512], [16, 256], [(32, 128), (256, 512)])
    assert args.lengths_seed == 0


def test_packed_tables_from_known_rows() -> None:
    """The packed / padded ratio's table and summary, from rows of known times."""

    def packed(variant: str, t: int, b: int, wall: float) -> dict:
        row = sequence_row(variant, t, b, wall) | {"packed": True, "lengths_seed": 0}
        return row | {"fill": 0.625, "padded_steps": t, "shortest": t // 4}

    rows = []
    for t, b, layer, padded in ((8, 2, 1.2, 2.0), (8, 4, 1.8, 2.0), (16, 2, 1.0, 2.0)):
        rows += [
            packed("layer", t, b, layer) | {"packed_vs_padded": layer / padded},
            packed("layer-padded", t, b, padded),
            packed("nn.LSTM", t, b, 3.0),
        ]
    text = seq.format_sweep_tables(rows)
    assert (
        "| float32, packed, F=3, S=4, packed / padded | B=2 | B=4 |\n|---|---:|---:|\n"
        "| T=8 | 0.60 | 0.90 |\n| T=16 | 0.50 |  |" in text
    )
    s = seq.packed_summary(rows)["precisions"]["float32, packed"]
    assert (s["points"], s["missing"], s["above_goal"]) == (3, 0, 1)
    assert s["worst"]["value"] == pytest.approx(0.9)
    assert (s["worst"]["steps"], s["worst"]["batch"]) == (8, 4)
    assert s["median"] == pytest.approx(0.6)
    assert s["fill_median"] == 0.625
    assert "| float32, packed | 3 | 0.90 at T=8, B=4, F=3, S=4 (float32, packed) | 0.60 | 1 |" in (
        text
    )
    # Unpacked rows have no packed tables, and keep issue 12's goal.
    plain = seq.format_sweep_tables([sequence_row("layer", 2, 1, 1.0)])
    assert "packed / padded" not in plain
    assert "a median of at least 1.3x" in plain
    assert seq.packed_summary([sequence_row("layer", 2, 1, 1.0)])["precisions"] == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--packed"], r"--packed: only with --sequence"),
        (["--bidirectional", "-b", "4"], r"--bidirectional: only with --sequence"),
        (["--lengths-seed", "0"], r"--lengths-seed: only with --sequence"),
        (["--sequence", "8", "--lengths-seed", "0"], r"--lengths-seed: only with --packed"),
        (["--sequence", "8", "--packed", "--lengths-seed", "-1"], r"must be at least 0"),
        (["--sequence", "8", "--variants", "layer-padded"], r"layer-padded: only with --packed"),
        (
            ["--sequence", "8", "--bidirectional", "--variants", "layer,loop-lltm"],
            r"--variants loop-lltm with --bidirectional: the loops run one direction",
        ),
        (
            ["--sequence", "--sweep", "--packed", "--variants", "loop-python"],
            r"--variants loop-python with --packed",
        ),
    ],
)
def test_option_flags_that_cannot_apply_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        benchmark.parse_args(argv)
    assert re.search(message, capsys.readouterr().err)


# --- random off-grid sizes, inference, and the path that the layer ran ---------------

# The names of the sequence paths, on the CPU and on CUDA.
KNOWN_PATHS = {"steps", "onednn", "fused", "persistent", "cluster"}
TINY_RANGES = ["--random-range", "T=2:6,B=1:5,F=16:20,S=32:40"]


def test_draw_sizes_is_seeded_log_uniform_in_range_and_capped() -> None:
    tiny = {"T": (2, 6), "B": (1, 5), "F": (16, 20), "S": (32, 40)}
    drawn = seq.draw_sizes(3, 7, tiny)
    # Pinned: the same seed gives these sizes on every machine (decimal's ln
    # and exp, not the platform's libm).
    assert drawn.sizes == [(3, 1, 19, 33), (4, 2, 16, 36), (2, 2, 16, 33)]
    assert seq.draw_sizes(3, 7, tiny).sizes == drawn.sizes
    assert seq.draw_sizes(3, 8, tiny).sizes != drawn.sizes
    # A longer draw starts with the shorter one.
    assert seq.draw_sizes(5, 7, tiny).sizes[:3] == drawn.sizes
    # Unnamed keys keep their defaults; every size lies in its range.
    many = seq.draw_sizes(1000, 0, {"T": (3, 900)})
    assert many.ranges == {**seq.RANDOM_RANGES, "T": (3, 900)}
    for i, key in enumerate("TBFS"):
        lo, hi = many.ranges[key]
        values = sorted(size[i] for size in many.sizes)
        assert lo <= values[0]
        assert values[-1] <= hi
        # Log-uniform: the median near the geometric mean of the range (a
        # uniform draw's would be near the middle, 4 to 20 times as large).
        assert 0.7 < values[500] / (lo * hi) ** 0.5 < 1.4
    # Odd sizes occur.
    assert sum(1 for size in many.sizes if size[0] % 2 and size[2] % 2) > 100
    # The cap: every size under it, the same redraws for the same seed.
    capped = seq.draw_sizes(20, 3, {"T": (100, 2000), "B": (100, 4096)}, max_gmacs=2.0)
    assert capped.redraws > 0
    assert all(seq.forward_macs(*size) <= 2e9 for size in capped.sizes)
    again = seq.draw_sizes(20, 3, {"T": (100, 2000), "B": (100, 4096)}, max_gmacs=2.0)
    assert (again.sizes, again.redraws) == (capped.sizes, capped.redraws)
    assert seq.forward_macs(2, 3, 5, 7) == 2 * 3 * 3 * 7 * (7 + 5)
    with pytest.raises(ValueError, match="below the smallest size of the ranges"):
        seq.draw_sizes(1, 0, {"T": (1000, 2000), "B": (1000, 4096)}, max_gmacs=1.0)
    with pytest.raises(ValueError, match=r"T=5:2: expected 1 <= LO <= HI"):
        seq.draw_sizes(1, 0, {"T": (5, 2)})


def test_random_sweep_json_table_and_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--random: the drawn sizes run, in the header, the JSON and a table of a row each."""
    path = tmp_path / "random.json"
    benchmark.main(
        [
            *("--sequence", "--sweep", "--random", "3", "--seed", "7", *TINY_RANGES),
            *("--device", "cpu", "--runs", "1", "--warmup", "1", "--json", str(path)),
        ]
    )
    out, err = capsys.readouterr()
    report = json.loads(path.read_text())
    config = report["config"]
    sizes = [(3, 1, 19, 33), (4, 2, 16, 36), (2, 2, 16, 33)]
    assert config["mode"] == "sweep"
    assert config["sizes"] == [list(s) for s in sizes]
    assert config["random"]["seed"] == 7
    assert config["random"]["ranges"] == {"T": [2, 6], "B": [1, 5], "F": [16, 20], "S": [32, 40]}
    # The CPU's default cap, said so.
    assert config["random"]["max_gmacs"] == seq.CPU_MAX_GMACS
    assert config["random"]["max_gmacs_note"] == "the CPU's default"
    assert "steps" not in config
    assert config["inference"] is False
    rows = report["results"]
    assert [(r["steps"], r["batch"], r["features"], r["state"], r["variant"]) for r in rows] == [
        (*s, v) for s in sizes for v in ("layer", "nn.LSTM")
    ]
    assert all(r["off_grid"] and r["median_ms"] > 0 for r in rows)
    assert report["summary"]["precisions"]["float32"]["points"] == 3
    # Progress per size, and the sizes before the first.
    assert "random sizes: 3 drawn with seed 7" in err
    assert err.index("T,B,F,S drawn: 3,1,19,33 4,2,16,36 2,2,16,33") < err.index("[1/3]")
    assert "[3/3] float32 T=2 B=2 F=16 S=33: layer " in err
    # The header: the draw and the cap; then one row per size, not a grid per (F, S).
    assert "redrawn (the CPU's default; --max-gmacs sets it): 0 redrawn" in out
    assert "T,B,F,S drawn: 3,1,19,33 4,2,16,36 2,2,16,33" in out
    assert "| T,B,F,S | precision | GMAC | LLTMLayer ms | nn.LSTM ms | speedup | path |" in out
    assert "| float32, F=19, S=33 |" not in out
    for r in rows:
        if r["variant"] == "layer":
            size = f"{r['steps']},{r['batch']},{r['features']},{r['state']}"
            line = next(x for x in out.splitlines() if x.startswith(f"| {size} |"))
            assert line.endswith(f"| {r['path']} |")
            assert f"{r['vs_lstm']:.2f}" in line
    # bench_tables.py lists them the same way.
    tables = importlib.import_module("bench_tables")
    tables.main([str(path)])
    assert "| 4,2,16,36 | float32 | <0.001 |" in capsys.readouterr().out


def test_random_sizes_at_parse_time() -> None:
    """The same seed, the same sizes; the cap by device; the grid options keep their defaults."""

    def drawn(*argv: str) -> seq.RandomSizes:
        args = benchmark.parse_args(["--sequence", "--sweep", "--random", "4", *argv])
        assert (args.steps, args.batches, args.fs) == (None, None, None)
        return args.random_sizes

    cpu = drawn("--seed", "11", "--device", "cpu")
    assert cpu.sizes == drawn("--seed", "11", "--device", "cpu").sizes
    assert cpu.sizes != drawn("--seed", "12", "--device", "cpu").sizes
    assert cpu.sizes == seq.draw_sizes(4, 11, max_gmacs=seq.CPU_MAX_GMACS).sizes
    assert drawn("--device", "cpu").seed == 0
    # CUDA: no cap by default (parsing needs no GPU); inf lifts the CPU's.
    assert drawn("--device", "cuda").max_gmacs is None
    assert drawn("--device", "cpu", "--max-gmacs", "inf").max_gmacs is None
    given = drawn("--device", "cpu", "--max-gmacs", "0.5", "--random-range", "s=64:1024")
    assert (given.max_gmacs, given.cap_note) == (0.5, "")
    assert given.ranges["S"] == (64, 1024)
    assert all(seq.forward_macs(*s) <= 0.5e9 and 64 <= s[3] <= 1024 for s in given.sizes)
    assert benchmark.parse_args(["--sequence", "8"]).random_sizes is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--random-range", "T=9:3"], r"argument --random-range: 'T=9:3': LO must be at most HI"),
        (["--random-range", "X=1:3"], r"argument --random-range: expected KEY=LO:HI"),
        (["--random-range", "T=1-3"], r"argument --random-range: expected KEY=LO:HI"),
        (["--random-range", "B=0:3"], r"argument --random-range: sizes must be at least 1"),
        (["--random-range", "T=1:3,T=2:4"], r"argument --random-range: T given twice"),
        (["--max-gmacs", "0"], r"argument --max-gmacs: must be above 0"),
        (["--max-gmacs", "1e-9"], r"--max-gmacs 1e-09: the cap of 1e-09 GMAC is below"),
        (["--steps", "4"], r"--steps and --random: the sizes are drawn"),
        (["--plot", "x.png"], r"--plot with --random: the heat map needs the grid"),
    ],
)
def test_random_flags_that_cannot_apply_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        benchmark.parse_args(["--sequence", "--sweep", "--random", "3", "--device", "cpu", *argv])
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sequence", "--sweep", "--seed", "3"], r"--seed: only with --random"),
        (["--sequence", "8", "--random-range", "T=1:3"], r"--random-range: only with --random"),
        (["--sequence", "8", "--max-gmacs", "3"], r"--max-gmacs: only with --random"),
        (["--sequence", "8", "--random", "3"], r"--random: only with --sweep"),
        (["--random", "3"], r"--random: only with --sequence"),
        (["--inference"], r"--inference: only with --sequence"),
    ],
)
def test_random_and_inference_need_their_modes(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        benchmark.parse_args(argv)
    assert re.search(message, capsys.readouterr().err)


def test_inference_times_the_forward_alone() -> None:
    """The timed call of an inference variant: the forward under inference_mode, no grads."""
    cpu = torch.device("cpu")
    cases, _ = variants.build_variants(["layer", "nn.LSTM"], 4, 2, 3, 5, torch.float32, cpu)
    seen = []
    for case in cases.values():
        forward = case.forward

        def spy(forward: variants.Step = forward) -> torch.Tensor:
            seen.append(torch.is_inference_mode_enabled())
            return forward()

        case.forward = spy
        case.inference = True
        case.clear_grads()  # the input is every variant's leaf
        case.call()
        assert all(leaf.grad is None for leaf in case.leaves)
        case.inference = False
        case.call()
        assert all(leaf.grad is not None for leaf in case.leaves)
    assert seen == [True, False, True, False]


def test_inference_sequence_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    benchmark.main(
        [
            *("--sequence", "3", "-b", "2", "-f", "3", "-s", "4", "--inference"),
            *("--device", "cpu", "--runs", "2", "--warmup", "1", "--json", "-"),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["inference"] is True
    assert report["config"]["timed"] == "the forward alone under torch.inference_mode()"
    rows = {r["variant"]: r for r in report["results"]}
    assert set(rows) == {"loop-python", "loop-lltm", "layer", "nn.LSTM"}
    assert all(r["inference"] and r["median_ms"] > 0 for r in rows.values())
    assert rows["nn.LSTM"]["vs_lstm"] == 1.0
    # No backward ran: the forward's blocks alone, one name in the table.
    paths = rows["layer"]["paths"]
    assert paths["backward"] == []
    assert paths["forward"]
    assert set(paths["forward"]) <= KNOWN_PATHS
    assert "/" not in rows["layer"]["path"]
    assert "float32, inference" in report["summary"]["cpu"]["precisions"]
    # The table and its header say which mode ran.
    benchmark.main(
        [
            *("--sequence", "3", "-b", "2", "-f", "3", "-s", "4", "--inference"),
            *("--variants", "layer,nn.LSTM", "--device", "cpu", "--runs", "1", "--warmup", "1"),
        ]
    )
    out = capsys.readouterr().out
    assert "the forward alone under torch.inference_mode() (no backward)" in out
    layer_row = next(line for line in out.splitlines() if line.startswith("3,2,3,4"))
    assert "float32, inference" in layer_row


def test_inference_random_sweep_with_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    benchmark.main(
        [
            *("--sequence", "--sweep", "--random", "2", "--seed", "1", *TINY_RANGES),
            *("--inference", "--bidirectional", "--packed", "--device", "cpu"),
            *("--runs", "1", "--warmup", "1", "--json", "-"),
        ]
    )
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["config"]["inference"] is True
    setting = "float32, bidirectional, packed, inference"
    assert list(report["summary"]["precisions"]) == [setting]
    assert report["packed_summary"]["precisions"][setting]["points"] == 2
    assert f"[2/2] {setting} T=" in err
    for r in report["results"]:
        assert (r["inference"], r["bidirectional"], r["packed"]) == (True, True, True)
        if r["variant"] in ("layer", "layer-padded"):
            # Both directions' blocks (and the packed batch's segments), forward only.
            assert len(r["paths"]["forward"]) >= 2
            assert r["paths"]["backward"] == []
            assert set(r["paths"]["forward"]) <= KNOWN_PATHS
        else:
            assert "paths" not in r


def test_the_path_that_the_layer_ran(capsys: pytest.CaptureFixture[str]) -> None:
    """Training: forward and backward blocks in the JSON, a path column in the table."""
    benchmark.main(
        [
            *("--sequence", "--sizes", "3x2x3x4", "--bidirectional", "--device", "cpu"),
            *("--runs", "1", "--warmup", "1", "--json", "-"),
        ]
    )
    rows = {r["variant"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    paths = rows["layer"]["paths"]
    # One block per direction, both ways.
    assert len(paths["forward"]) == len(paths["backward"]) == 2
    assert set(paths["forward"]) | set(paths["backward"]) <= KNOWN_PATHS
    assert rows["layer"]["path"] == seq.path_label(paths)
    assert "paths" not in rows["nn.LSTM"]
    benchmark.main(
        [
            *("--sequence", "--sizes", "3x2x3x4", "--variants", "layer,nn.LSTM,loop-lltm"),
            *("--device", "cpu", "--runs", "1", "--warmup", "1"),
        ]
    )
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("T,B,F,S"))
    assert header.split()[:5] == ["T,B,F,S", "precision", "variant", "path", "wall"]
    cells = {
        line.split()[2]: line.split()[3] for line in out.splitlines() if line.startswith("3,2,3,4")
    }
    assert cells["nn.LSTM"] == cells["loop-lltm"] == "-"
    assert set(re.split(r"[/+]", cells["layer"])) <= KNOWN_PATHS


def test_path_label() -> None:
    def label(forward: list[str], backward: list[str]) -> str | None:
        return seq.path_label({"forward": forward, "backward": backward})

    assert label(["fused", "fused"], ["onednn", "onednn"]) == "fused/onednn"
    assert label(["steps"], ["steps"]) == "steps"
    assert label(["fused", "fused"], []) == "fused"  # inference: no backward
    assert label(["fused", "steps"], ["steps", "steps"]) == "fused+steps"
    assert label(["persistent"], ["cluster", "steps"]) == "persistent+cluster+steps"
    assert label([], []) == "-"
    assert seq.path_label(None) is None


def test_sweep_tables_of_paths_off_grid_rows_and_inference() -> None:
    """From known rows: the grid's path tables, the off-grid list, titles and goals by mode."""
    rows = []
    for t, b, path in ((2, 1, "steps"), (2, 8, "fused/onednn"), (4, 1, "onednn")):
        rows += [
            sequence_row("layer", t, b, 1.0, 0.5) | {"path": path},
            sequence_row("nn.LSTM", t, b, 2.0, 1.0),
        ]
    text = seq.format_sweep_tables(rows)
    assert (
        "| float32, F=3, S=4, path | B=1 | B=8 |\n|---|---:|---:|\n"
        "| T=2 | steps | fused/onednn |\n| T=4 | onednn |  |" in text
    )
    assert "forward + backward (the input and every parameter need grad)" in text
    # Off grid, in inference: a row per point with the figures as columns; no goal.
    drawn = [
        r | {"off_grid": True, "inference": True, "features": 16, "state": 32} for r in rows[:2]
    ]
    text = seq.format_sweep_tables(drawn)
    assert "the forward alone, under torch.inference_mode()" in text
    assert (
        "| T,B,F,S | precision | GMAC | LLTMLayer ms | cuDNN nn.LSTM ms | speedup | "
        "µs/step LLTMLayer / cuDNN nn.LSTM | host ratio LLTMLayer / cuDNN nn.LSTM | path |"
    ) in text
    # 2 x 1 x 96 x 48 multiply-adds: under a millionth of a GMAC.
    assert (
        "| 2,1,16,32 | float32, inference | <0.001 | 1.000 | 2.000 | 2.00 | 250 / 500 | "
        "2.00 / 2.00 | steps |" in text
    )
    assert "| float32, inference, F=16, S=32 |" not in text
    assert "The goal" not in text
    assert "| float32, inference | 1 | 2.00x at T=2, B=1, F=16, S=32" in text
