"""The CPU paths' packed W, in buffers that each thread keeps from call to call (layout_buffer).

A kept buffer is written again by every call that packs into it: another
layer's call in between, both directions on one thread, and a packed batch
whose blocks take turns on different paths all read their own W.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import lltm
from sequences import assert_trains_like_the_reference, cpu_path_dtype, train

PACKING_PATHS = ["fused", "fused_input", "dpbf16", "dpbf16_input"]


@pytest.mark.parametrize("path", PACKING_PATHS)
def test_layers_taking_turns_read_their_own_weights(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = cpu_path_dtype(path)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    torch.manual_seed(0)
    layers = [lltm.LLTMLayer(7, s, dtype=dtype) for s in (33, 17, 33)]
    x = torch.randn(5, 4, 7, dtype=dtype)
    alone = [train(layer, x) for layer in layers]
    for _ in range(2):
        for layer, want in zip(layers, alone, strict=True):
            for got, w in zip(train(layer, x), want, strict=True):
                assert torch.equal(got, w)


@pytest.mark.parametrize("path", ["fused", "fused_input"])
def test_both_directions_on_one_thread(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_path_dtype(path)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(1)
        layer = lltm.LLTMLayer(6, 40, bidirectional=True)
        assert_trains_like_the_reference(layer, torch.randn(9, 5, 6))
    finally:
        torch.set_num_threads(before)


def test_a_packed_batch_whose_blocks_take_turns_on_paths() -> None:
    """Kept choices put the segments of one call on fused and fused_input in turns."""
    torch.manual_seed(2)
    layer = lltm.LLTMLayer(5, 24)
    seqs = [torch.randn(n, 5) for n in (40, 33, 9, 2)]
    want = layer(pack_sequence(seqs))[0].data
    threads = torch.get_num_threads()
    # Its segments, (steps, batch bucket): 2 of 4, 7 of 3 (bucket 4), 24 of 2, 7 of 1.
    choices = [
        (f"cpu|Float|inference|threads={threads}|T={t}|B={b}|F=5|S=24", path)
        for t, b, path in (
            (2, 4, "fused"),
            (7, 4, "fused_input"),
            (24, 2, "fused"),
            (7, 1, "fused_input"),
        )
    ]
    lltm.clear_path_choices()
    try:
        lltm._C._load_path_choices(choices)
        with torch.no_grad():
            ran = lltm.paths_that_ran(lambda: layer(pack_sequence(seqs)))
            got = layer(pack_sequence(seqs))[0].data
    finally:
        lltm.clear_path_choices()
    assert ran["forward"] == ["fused", "fused_input", "fused", "fused_input"], ran
    torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-5)
