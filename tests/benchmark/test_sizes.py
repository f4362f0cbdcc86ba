"""The sizes of a sequence run: the packed batch's lengths and the random draws."""

from __future__ import annotations

import pytest
import torch

from lltm.benchmark import sequence as seq


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
