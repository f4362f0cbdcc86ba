"""Running a sequence benchmark: forced paths, the rows of what cannot run, the path label."""

from __future__ import annotations

import pytest
import torch

from lltm.benchmark import sequence as seq
from lltm.benchmark.sequence import run as seq_run
from lltm.benchmark.sequence import variants
from lltm.benchmark.sequence.precision import precision_switches


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
