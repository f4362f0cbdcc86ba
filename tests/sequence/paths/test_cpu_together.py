"""A bidirectional layer's two directions with their steps together (LLTM_DIRECTIONS).

The fused paths run both directions' steps in one loop, each step's tasks of
the two in one parallel region, where the CPU has more threads than
directions (or LLTM_DIRECTIONS=together asks). Each task computes what it
computes apart, so the results are the same bits either way; other paths, and
packed batches, run their directions apart.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import lltm
from sequences import assert_trains_like_the_reference, cpu_path_dtype, train

TOGETHER_PATHS = ["fused", "fused_input", "dpbf16", "dpbf16_input"]


def bidirectional(features: int, state: int, dtype: torch.dtype, seed: int) -> lltm.LLTMLayer:
    torch.manual_seed(seed)
    return lltm.LLTMLayer(features, state, num_layers=2, bidirectional=True, dtype=dtype)


@pytest.mark.parametrize("path", TOGETHER_PATHS)
@pytest.mark.parametrize("size", [(7, 5, 9, 40), (1, 1, 3, 5), (12, 17, 33, 64)])
def test_together_is_apart_bit_for_bit(
    path: str, size: tuple[int, int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = cpu_path_dtype(path)
    steps, batch, features, state = size
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    layer = bidirectional(features, state, dtype, sum(size))
    x = torch.randn(steps, batch, features, dtype=dtype)
    got = {}
    for mode in ("apart", "together"):
        monkeypatch.setenv("LLTM_DIRECTIONS", mode)
        with torch.no_grad():
            inference = layer(x)
        got[mode] = [inference[0], *inference[1], *train(layer, x)]
    for a, b in zip(got["apart"], got["together"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("path", ["fused", "fused_input"])
def test_together_trains_like_the_reference(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_path_dtype(path)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    monkeypatch.setenv("LLTM_DIRECTIONS", "together")
    layer = bidirectional(6, 40, torch.float32, 3)
    x = torch.randn(9, 5, 6)
    ran = lltm.paths_that_ran(lambda: train(layer, x))
    # One block a layer for both directions, both ways.
    assert ran["forward"] == [f"{path}/together"] * 2
    assert ran["backward"] == [f"{path}/together"] * 2
    # Twice: the second call reuses the first's kept buffers.
    for _ in range(2):
        assert_trains_like_the_reference(layer, x)


def test_paths_without_a_loop_for_both_run_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "steps")
    monkeypatch.setenv("LLTM_DIRECTIONS", "together")
    layer = bidirectional(4, 8, torch.float32, 4)
    ran = lltm.paths_that_ran(lambda: train(layer, torch.randn(3, 2, 4)))
    assert ran["forward"] == ran["backward"] == ["steps"] * 4


def test_a_packed_batch_runs_its_directions_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    monkeypatch.setenv("LLTM_DIRECTIONS", "together")
    torch.manual_seed(5)
    layer = lltm.LLTMLayer(4, 8, bidirectional=True)
    batch = pack_sequence([torch.randn(n, 4) for n in (5, 3)])
    with torch.no_grad():
        ran = lltm.paths_that_ran(lambda: layer(batch))
    assert ran["forward"]
    assert all(not p.endswith("/together") for p in ran["forward"])


def test_the_engine_runs_them_together_only_past_the_directions_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unset: together where threads > 2 and a step is large enough to share."""
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    monkeypatch.delenv("LLTM_DIRECTIONS", raising=False)
    layer = bidirectional(8, 256, torch.float32, 6)
    # A batch large enough that the layer makes one call for both directions.
    x = torch.randn(4, 300, 8)
    before = torch.get_num_threads()
    try:
        for threads, together in ((2, False), (3, True)):
            torch.set_num_threads(threads)
            with torch.no_grad():
                ran = lltm.paths_that_ran(lambda: layer(x))
            assert (ran["forward"] == ["fused/together"] * 2) == together, (threads, ran)
        # A step too small to share: a thread each.
        small = bidirectional(8, 16, torch.float32, 7)
        with torch.no_grad():
            ran = lltm.paths_that_ran(lambda: small(x))
        assert ran["forward"] == ["fused"] * 4
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("directions", [1, 2])
@pytest.mark.parametrize("packed", [False, True])
def test_a_bad_directions_setting_names_it_at_every_call(
    directions: int, packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLTM_DIRECTIONS", "both")
    torch.manual_seed(8)
    layer = lltm.LLTMLayer(4, 8, bidirectional=directions == 2)
    x = torch.randn(3, 2, 4)
    with pytest.raises(
        ValueError, match=r"LLTM_DIRECTIONS=both: expected together, apart or calls"
    ):
        layer(pack_sequence([x[:, 0], x[:2, 1]]) if packed else x)
