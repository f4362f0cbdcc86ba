"""python -m lltm.benchmark --sequence end to end: its JSON, tables and progress."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from bench_helpers import KNOWN_PATHS, TINY_RANGES, bench_tables, forced_in_float32, run_benchmark

from lltm import benchmark
from lltm.benchmark import sequence as seq


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
    tables = bench_tables()
    merged = tmp_path / "merged.json"
    tables.main([str(json_path), "--json", str(merged)])
    again = capsys.readouterr().out
    assert "| float32, F=3, S=4 | B=1 | B=2 |" in again
    assert json.loads(merged.read_text())["summary"]["overall"]["points"] == 4


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
    tables = bench_tables()
    merged = tmp_path / "merged.json"
    tables.main([str(path), "--json", str(merged)])
    assert f"| {setting}, F=3, S=4, packed / padded | B=2 | B=3 |" in capsys.readouterr().out
    assert json.loads(merged.read_text())["packed_summary"]["overall"]["points"] == 2
    # Without --steps/--batches/--fs, a packed sweep is the packed goal's eight sizes.
    args = benchmark.parse_args(["--sequence", "--sweep", "--packed", "--device", "cpu"])
    assert (args.steps, args.batches, args.fs) == ([128, 512], [16, 256], [(32, 128), (256, 512)])
    assert args.lengths_seed == 0


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
    tables = bench_tables()
    tables.main([str(path)])
    assert "| 4,2,16,36 | float32 | <0.001 |" in capsys.readouterr().out


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
    assert " / " not in rows["layer"]["path"]
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


def test_each_cpu_path_forced_beside_the_default_and_nn_lstm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What compare_cpu_paths.py did: each path, the default and nn.LSTM, in turns."""
    path = tmp_path / "forced.json"
    names = ["layer", *forced_in_float32("cpu"), "nn.LSTM"]
    benchmark.main(
        [
            *("--sequence", "--sizes", "4x2x3x8,3x2x3x8", "--variants", ",".join(names)),
            *("--device", "cpu", "--runs", "1", "--warmup", "1", "--json", str(path)),
        ]
    )
    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    rows = report["results"]
    assert [(r["steps"], r["variant"]) for r in rows] == [(t, v) for t in (4, 3) for v in names]
    assert all("error" not in r for r in rows)
    forced = report["forced_summary"]["cpu"]["precisions"]["float32"]
    assert (forced["points"], forced["missing"]) == (2, 0)
    # The default against the best forced path, and nn.LSTM against the default.
    for r in rows:
        if r["variant"] == "layer":
            assert r["best_forced"] in names
            assert r["default_vs_forced"] > 0
            assert r["vs_lstm"] > 0
    header = next(line for line in out.splitlines() if line.startswith("T,B,F,S"))
    assert header.rstrip().endswith("/forced")
    assert "4,2,3,8, float32: default / best forced path " in out
    assert "cpu, float32, 2 sizes: default / best forced path: worst " in out


def test_one_forced_cpu_path_alone(capsys: pytest.CaptureFixture[str]) -> None:
    benchmark.main(
        [
            *("--sequence", "--sizes", "4x2x3x8", "--variants", "layer-onednn"),
            *("--device", "cpu", "--runs", "1", "--warmup", "1", "--json", "-"),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    (row,) = report["results"]
    assert (row["variant"], row["path"]) == ("layer-onednn", "onednn")
    assert row["median_ms"] > 0
    # No layer to hold against it.
    assert "forced_summary" not in report
