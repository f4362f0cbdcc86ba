"""Opt-in (LLTM_TEST_LARGE=1, a CUDA GPU with ~60 GB free): batch * 3 * state > 2**31 elements.

The cell and the per-step path of the sequence (LLTM_SEQUENCE_PATH=steps),
forward and backward, in bfloat16. Every row of the batch depends only on
its own inputs, so rows are checked against the float64 reference where the
flat index of the gates crosses 2**31, and at both ends.
"""

from __future__ import annotations

import os

import pytest
import torch

import lltm
from helpers import assert_close_to_reference
from lltm.reference import lltm_reference

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        os.environ.get("LLTM_TEST_LARGE") != "1",
        reason="set LLTM_TEST_LARGE=1 (needs a GPU with ~60 GB free)",
    ),
]

BATCH, FEATURES, STATE, STEPS = 1_400_000, 4, 512, 2
# The row whose gates hold flat index 2**31.
BOUNDARY = 2**31 // (3 * STATE)
ROWS = [slice(0, 2), slice(BOUNDARY - 2, BOUNDARY + 2), slice(BATCH - 2, BATCH)]


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_()


def test_cell_beyond_2_31_elements() -> None:
    assert 3 * BATCH * STATE > 2**31
    args = [
        _randn(BATCH, FEATURES),
        _randn(3 * STATE, STATE + FEATURES),
        _randn(3 * STATE),
        _randn(BATCH, STATE),
        _randn(BATCH, STATE),
    ]
    new_h, new_cell = lltm.lltm(*args)
    d_input, _, _, d_old_h, d_old_cell = torch.autograd.grad(new_h.sum() + 2 * new_cell.sum(), args)
    for rows in ROWS:
        part = [args[0][rows], args[1], args[2], args[3][rows], args[4][rows]]
        part = [p.detach().double().requires_grad_() for p in part]
        want_h, want_cell = lltm_reference(*part)
        grads = torch.autograd.grad(want_h.sum() + 2 * want_cell.sum(), [part[0], part[3], part[4]])
        assert_close_to_reference(new_h[rows], want_h)
        assert_close_to_reference(new_cell[rows], want_cell)
        for got, want in zip((d_input[rows], d_old_h[rows], d_old_cell[rows]), grads, strict=True):
            assert_close_to_reference(got, want)


def test_sequence_steps_path_beyond_2_31_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "steps")
    x = _randn(STEPS, BATCH, FEATURES)
    weights, bias = _randn(3 * STATE, STATE + FEATURES), _randn(1, 3 * STATE)
    h0, c0 = _randn(BATCH, STATE), _randn(BATCH, STATE)
    output, h_n, c_n = lltm.lltm_sequence(x, weights, bias, h0, c0)
    d_x, d_h0, d_c0 = torch.autograd.grad(output.sum() + 2 * h_n.sum() + 3 * c_n.sum(), [x, h0, c0])
    for rows in ROWS:
        xs, hs, cs = (t[..., rows, :].detach().double().requires_grad_() for t in (x, h0, c0))
        w, b = weights.detach().double(), bias.detach().double()
        h, c, outs = hs, cs, []
        for t in range(STEPS):
            h, c = lltm_reference(xs[t], w, b, h, c)
            outs.append(h)
        want_out = torch.stack(outs)
        grads = torch.autograd.grad(want_out.sum() + 2 * h.sum() + 3 * c.sum(), [xs, hs, cs])
        assert_close_to_reference(output[:, rows], want_out)
        assert_close_to_reference(h_n[rows], h)
        assert_close_to_reference(c_n[rows], c)
        for got, want in zip((d_x[:, rows], d_h0[rows], d_c0[rows]), grads, strict=True):
            assert_close_to_reference(got, want)
