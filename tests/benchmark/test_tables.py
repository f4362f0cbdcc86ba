"""The tables, summaries and heat map of a sequence run, from rows of known times."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import sequence_row

from lltm.benchmark import sequence as seq


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


def test_sweep_tables_of_paths_off_grid_rows_and_inference() -> None:
    """From known rows: the grid's path tables, the off-grid list, titles and goals by mode."""
    rows = []
    for t, b, path in ((2, 1, "steps"), (2, 8, "fused / onednn"), (4, 1, "onednn")):
        rows += [
            sequence_row("layer", t, b, 1.0, 0.5) | {"path": path},
            sequence_row("nn.LSTM", t, b, 2.0, 1.0),
        ]
    text = seq.format_sweep_tables(rows)
    assert (
        "| float32, F=3, S=4, path | B=1 | B=8 |\n|---|---:|---:|\n"
        "| T=2 | steps | fused / onednn |\n| T=4 | onednn |  |" in text
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


def test_the_default_against_the_best_forced_path_from_known_rows() -> None:
    """The /forced column, its notes, its summary line and its sweep tables."""
    a, b = seq.forced_variants("cpu")[:2]
    rows = []
    for t, layer, times in ((2, 1.2, (1.0, 1.5)), (4, 2.0, (2.5, 2.0)), (8, 1.0, (None, None))):
        tried = {n: ms for n, ms in zip((a, b), times, strict=True) if ms is not None}
        best = min(tried, key=tried.__getitem__) if tried else None
        forced = {"best_forced": best, "default_vs_forced": layer / tried[best]} if tried else {}
        rows.append(
            sequence_row("layer", t, 1, layer) | {"device": "cpu", "path": "fused"} | forced
        )
        for name, ms in zip((a, b), times, strict=True):
            row = sequence_row(name, t, 1, ms or 1.0) | {"device": "cpu"}
            rows.append(
                row | {"path": name.removeprefix("layer-")} if ms else row | {"error": "no"}
            )
    s = seq.forced_summary(rows)["precisions"]["float32"]
    assert (s["points"], s["missing"]) == (2, 1)
    assert s["worst"]["value"] == pytest.approx(1.2)
    assert (s["worst"]["steps"], s["best"]["steps"]) == (2, 4)
    assert s["median"] == pytest.approx(1.1)
    table = seq.format_sequence_table(rows)
    header = next(line for line in table.splitlines() if line.startswith("T,B,F,S"))
    assert header.rstrip().endswith("/forced")
    layer_row = next(line for line in table.splitlines() if line.startswith("2,1,3,4 "))
    assert layer_row.rstrip().endswith("1.20")
    assert "/forced: the layer's wall time / the fastest forced path's" in table
    assert "2,1,3,4, float32: default / best forced path 1.20 (layer ran fused; the best " in (
        table
    )
    assert f"forced path was {a})" in table
    markdown = seq.format_sequence_markdown(rows)
    assert "| kernels | default / best forced | path |" in markdown
    assert "| 4,1,3,4 | float32 | layer | 2.000 |" in markdown
    assert "| - | 1.00 | fused |" in markdown
    assert "- 4,1,3,4, float32: default / best forced path 1.00" in markdown
    summary = seq.format_sequence_summary(rows)
    assert (
        "cpu, float32, 2 sizes: default / best forced path: worst 1.20 at T=2, B=1, F=3, "
        "S=4 (float32), median 1.10" in summary
    )
    sweep = seq.format_sweep_tables(rows)
    assert (
        "| float32, F=3, S=4, default / best forced | B=1 |\n|---|---:|\n| T=2 | 1.20 |\n"
        "| T=4 | 1.00 |\n| T=8 | n/a |" in sweep
    )
    assert "| float32 | 2 | 1.20 at T=2, B=1, F=3, S=4 (float32) | 1.10 | 1 |" in sweep
    # Without forced variants: no column, no notes, no tables.
    plain = [r for r in rows if r["variant"] == "layer" and "best_forced" not in r]
    assert seq.forced_summary(plain)["precisions"] == {}
    assert "forced" not in seq.format_sequence_table(plain)
    assert "forced" not in seq.format_sweep_tables(plain)
