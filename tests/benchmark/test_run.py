"""Running a sequence benchmark: forced paths, the rows of what cannot run, the path label."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from bench_helpers import forced_in_float32, run_benchmark

import lltm
from lltm.benchmark import sequence as seq
from lltm.benchmark.sequence import run as seq_run
from lltm.benchmark.sequence import variants
from lltm.benchmark.sequence.precision import precision_switches
from lltm.paths import profiler_logs_hidden


def test_a_path_that_does_not_fit_or_is_unknown_is_n_a(monkeypatch: pytest.MonkeyPatch) -> None:
    """RuntimeError (does not fit) and ValueError (unknown path, as 'fused' before it exists)."""

    def failing(exc: Exception) -> variants.Variant:
        def forward() -> torch.Tensor:
            raise exc

        return variants.Variant(forward, "fused", [])

    leaf = torch.ones(3, requires_grad=True)
    cases = {
        "layer-fused": failing(ValueError("LLTM_SEQUENCE_PATH=fused: expected auto, persistent")),
        "layer-onednn": failing(RuntimeError("the onednn path cannot run this block\nmore")),
        "nn.LSTM": variants.Variant(lambda: leaf * 2, None, [leaf]),
    }
    monkeypatch.setattr(seq_run, "build_variants", lambda *_: (dict(cases), {}))
    rows = seq.run_sequence(2, 1, 3, 4, runs=2, warmup=1, variants=list(cases), progress=False)
    by = {r["variant"]: r for r in rows}
    assert by["layer-fused"]["error"] == "LLTM_SEQUENCE_PATH=fused: expected auto, persistent"
    assert by["layer-onednn"]["error"] == "the onednn path cannot run this block"
    assert by["nn.LSTM"]["vs_lstm"] == 1.0
    assert "n/a: LLTM_SEQUENCE_PATH=fused" in seq.format_sequence_table(rows)


def test_cuda_variants_on_the_cpu_and_precisions() -> None:
    # A path of CUDA alone, where this build has one.
    for path in set(lltm.sequence_paths("cuda")) - set(lltm.sequence_paths("cpu")):
        rows = seq.run_sequence(
            2, 2, 3, 4, runs=1, warmup=1, variants=["layer", f"layer-{path}"], progress=False
        )
        error = f"no {path} path on cpu (its paths: {', '.join(lltm.sequence_paths('cpu'))})"
        assert rows[1] == {**rows[1], "variant": f"layer-{path}", "error": error}
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


def test_path_label() -> None:
    def label(forward: list[str], backward: list[str]) -> str | None:
        return seq.path_label({"forward": forward, "backward": backward})

    assert label(["fused", "fused"], ["onednn", "onednn"]) == "fused / onednn"
    assert label(["fused/mma/16x16/coop"], ["cluster/simt/1x16"]) == (
        "fused/mma/16x16/coop / cluster/simt/1x16"
    )
    assert label(["steps"], ["steps"]) == "steps"
    assert label(["fused", "fused"], []) == "fused"  # inference: no backward
    assert label(["fused", "steps"], ["steps", "steps"]) == "fused+steps"
    assert label(["persistent"], ["cluster", "steps"]) == "persistent+cluster+steps"
    assert label([], []) == "-"
    assert seq.path_label(None) is None


def test_each_cpu_path_forced_beside_the_default() -> None:
    """Every forced variant runs its own path; the layer's row holds the default against them."""
    forced = forced_in_float32("cpu")
    rows = seq.run_sequence(
        4, 2, 3, 8, runs=2, warmup=1, variants=["layer", *forced, "nn.LSTM"], progress=False
    )
    by = {r["variant"]: r for r in rows}
    for name in forced:
        path = variants.forced_path(name, "cpu")
        assert by[name]["median_ms"] > 0, by[name].get("error")
        assert set(by[name]["paths"]["forward"] + by[name]["paths"]["backward"]) == {path}
        assert by[name]["path"] == path
        assert "default_vs_forced" not in by[name]
    layer = by["layer"]
    best = min(forced, key=lambda n: by[n]["median_ms"])
    assert layer["best_forced"] == best
    assert layer["default_vs_forced"] == pytest.approx(layer["median_ms"] / by[best]["median_ms"])
    assert "default_vs_forced" not in by["nn.LSTM"]


def test_a_forced_path_that_cannot_run_is_n_a_with_why() -> None:
    """The CPU's onednn and fused take float32 alone: forced in float64, each is n/a."""
    names = ["layer", "layer-onednn", "layer-fused", "layer-steps"]
    rows = seq.run_sequence(
        4, 2, 3, 8, torch.float64, runs=2, warmup=1, variants=names, progress=False
    )
    by = {r["variant"]: r for r in rows}
    for path in ("onednn", "fused"):
        row = by[f"layer-{path}"]
        assert "median_ms" not in row
        # The op's error, or where it ran another path instead, the paths that ran.
        assert f"LLTM_SEQUENCE_PATH={path}" in row["error"]
    assert by["layer-steps"]["median_ms"] > 0
    # Held against the forced paths that ran.
    assert by["layer"]["best_forced"] == "layer-steps"
    assert (
        "n/a: lltm::sequence_forward: LLTM_SEQUENCE_PATH=onednn, but the onednn path cannot run"
        in seq.format_sequence_table(rows)
    )


def test_the_reason_is_the_op_s_line_that_names_the_forced_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = (
        "lltm_sequence_forward failed\n"
        "LLTM_SEQUENCE_PATH=onednn, but the onednn path cannot run a forward in double\n"
        "Exception raised from plan_block"
    )

    def forward() -> torch.Tensor:
        raise RuntimeError(message)

    leaf = torch.ones(3, requires_grad=True)
    cases = {
        "layer-onednn": variants.Variant(forward, "onednn", []),
        "nn.LSTM": variants.Variant(lambda: leaf * 2, None, [leaf]),
    }
    monkeypatch.setattr(seq_run, "build_variants", lambda *_: (dict(cases), {}))
    rows = seq.run_sequence(2, 1, 3, 4, runs=1, warmup=1, variants=list(cases), progress=False)
    assert rows[0]["error"] == (
        "LLTM_SEQUENCE_PATH=onednn, but the onednn path cannot run a forward in double"
    )
    assert rows[1]["median_ms"] > 0


def test_blocks_of_another_path_make_a_forced_variant_n_a() -> None:
    ran: lltm.PathsThatRan = {"forward": ["steps", "onednn"], "backward": ["onednn"]}
    assert seq_run._not_forced(None, ran) is None
    assert seq_run._not_forced("onednn", {"forward": ["onednn"], "backward": []}) is None
    assert seq_run._not_forced("onednn", {"forward": [], "backward": []}) is None
    # Plans of the forced path (CUDA's variants) are that path's.
    plans: lltm.PathsThatRan = {"forward": ["cluster/simt/28x16"], "backward": ["cluster/mma"]}
    assert seq_run._not_forced("cluster", plans) is None
    assert seq_run._not_forced("fused", plans) == (
        "LLTM_SEQUENCE_PATH=fused, but blocks ran cluster/mma, cluster/simt/28x16: the fused path "
        "does not run these sizes and dtype here"
    )
    assert seq_run._not_forced("onednn", ran) == (
        "LLTM_SEQUENCE_PATH=onednn, but blocks ran steps: the onednn path does not run these "
        "sizes and dtype here"
    )


def test_no_profiler_lines_in_the_output() -> None:
    """torch.profiler's kineto logs USDT lines at each start and stop: none get out."""
    result = run_benchmark(
        *("--sequence", "--sizes", "4x2x3x8,3x2x3x8", "--variants", "layer,nn.LSTM"),
        *("--device", "cpu", "--runs", "1", "--warmup", "1"),
    )
    assert result.returncode == 0, result.stderr
    assert "\n4,2,3,8 " in result.stdout
    for text in (result.stdout, result.stderr):
        assert "USDT" not in text
        assert "profiler_start" not in text


@pytest.mark.parametrize(
    "message",
    [
        # torch 2.11's words, then later releases'.
        "Warning: Profiler clears events at the end of each cycle.Only events from the current cycle",
        "Profiler clears events at the end of each cycle.",
    ],
)
def test_profiler_logs_hidden_drops_the_cleared_events_warning(message: str) -> None:
    """torch warns once per process, wherever the profiler first runs: never a test's error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with profiler_logs_hidden():
            warnings.warn(message, UserWarning, stacklevel=1)
        with pytest.raises(UserWarning, match="an op's own"):
            warnings.warn("an op's own", UserWarning, stacklevel=1)


def test_profiler_logs_hidden_keeps_every_other_line(capfd: pytest.CaptureFixture[str]) -> None:
    layer, x = lltm.LLTMLayer(3, 4), torch.randn(5, 2, 3)
    lltm.paths_that_ran(lambda: layer(x))  # kineto is set up, whatever ran before
    capfd.readouterr()
    with profiler_logs_hidden():
        lltm.paths_that_ran(lambda: layer(x))
        os.write(2, b"USDT:2026-01-01 10:00:00 1:1 Handler.cpp:52] profiler_start\n")
        os.write(2, b"WARNING:2026-01-01 10:00:00 1:1 Handler.cpp:60] kept\n")
        os.write(2, b"a line of the op's\n")
    out, err = capfd.readouterr()
    assert "USDT" not in err
    assert "profiler_" not in err
    assert "WARNING:2026-01-01 10:00:00 1:1 Handler.cpp:60] kept\n" in err
    assert "a line of the op's\n" in err
    assert out == ""
