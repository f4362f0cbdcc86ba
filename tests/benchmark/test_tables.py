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
