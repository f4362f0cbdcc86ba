"""LLTMLayer's nn.LSTM options: bidirectional, dropout and PackedSequence, on every path.

The reference is :func:`lltm.reference.lltm_layer_reference`: each sequence
run alone over its own steps by a Python loop of the pure-PyTorch cell, in
float64. In float64 the layer matches it to 1e-10 in every output, state and
gradient. On CUDA each case runs on each path (LLTM_SEQUENCE_PATH); a packed
batch's segments run as on CUDA (several steps, padding rows) and as on the
CPU (one per change of the batch) with LLTM_SEGMENT_STEPS.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence

import lltm.layer
from lltm.ops import _sequence
from lltm.reference import lltm_layer_reference
from sequences import (
    assert_matches_the_reference,
    make_layer,
    outputs_and_grads,
    padded,
    states,
)

# (steps, batch, features, state) and each sequence's length: mixed lengths
# with ties, every length different, all equal, one step, one sequence.
PACKED = [
    pytest.param((7, 5, 3, 4), [7, 3, 7, 1, 5], id="mixed"),
    pytest.param((6, 6, 2, 5), [6, 5, 4, 3, 2, 1], id="all-different"),
    pytest.param((4, 3, 3, 4), [4, 4, 4], id="all-equal"),
    pytest.param((1, 2, 3, 4), [1, 1], id="one-step"),
    pytest.param((5, 1, 2, 3), [5], id="one-sequence"),
]

# LLTM_SEGMENT_STEPS: the backend's segments, and CUDA's kind on every device
# (segments of several steps over which ended sequences run on as padding).
SEGMENTS = [pytest.param(None, id="segments-auto"), pytest.param("3", id="segments-3")]

# LLTM_DIRECTIONS: unset (the layer's rule, here one call for both
# directions) and a call per direction (the reverse one on reversed steps).
DIRECTIONS = [pytest.param(None, id="one-call"), pytest.param("calls", id="call-each")]

# One direction, and two with each LLTM_DIRECTIONS above.
LAYOUTS = [
    pytest.param(False, None, id="uni"),
    pytest.param(True, None, id="bi"),
    pytest.param(True, "calls", id="bi-call-each"),
]


# --- float64: equal to the reference --------------------------------------------------


@pytest.mark.parametrize("layers", [1, 2], ids=lambda n: f"L{n}")
@pytest.mark.parametrize(("bidirectional", "directions"), LAYOUTS)
@pytest.mark.parametrize("hx", [False, True], ids=["zero-state", "given-state"])
def test_padded_matches_the_reference(
    device: str,
    monkeypatch: pytest.MonkeyPatch,
    layers: int,
    bidirectional: bool,
    directions: str | None,
    hx: bool,
) -> None:
    if directions is not None:
        monkeypatch.setenv("LLTM_DIRECTIONS", directions)
    layer = make_layer(3, 4, device=device, num_layers=layers, bidirectional=bidirectional)
    x = torch.randn(6, 5, 3, dtype=torch.float64).to(device).requires_grad_()
    assert_matches_the_reference(layer, x, states(layer, 5, device) if hx else None)


@pytest.mark.parametrize(("size", "lengths"), PACKED)
@pytest.mark.parametrize(("bidirectional", "directions"), LAYOUTS)
@pytest.mark.parametrize("segments", SEGMENTS)
def test_packed_matches_the_reference(
    device: str,
    monkeypatch: pytest.MonkeyPatch,
    size: tuple[int, int, int, int],
    lengths: list[int],
    bidirectional: bool,
    directions: str | None,
    segments: str | None,
) -> None:
    """Each sequence stops at its own length: output, h_n, c_n and the backward."""
    if segments is not None:
        monkeypatch.setenv("LLTM_SEGMENT_STEPS", segments)
    if directions is not None:
        # The reverse direction's call takes each sequence reversed in its length.
        monkeypatch.setenv("LLTM_DIRECTIONS", directions)
    steps, batch, features, state = size
    layer = make_layer(features, state, device=device, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(steps, batch, features, dtype=torch.float64).to(device).requires_grad_()
    packed = pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
    assert_matches_the_reference(layer, packed, states(layer, batch, device))


@pytest.mark.parametrize("enforce_sorted", [True, False], ids=["sorted", "unsorted"])
def test_packed_batch_first_and_pack_sequence(device: str, enforce_sorted: bool) -> None:
    """pack_padded_sequence from a batch-first tensor, and pack_sequence of a list."""
    layer = make_layer(3, 4, device=device, bidirectional=True, batch_first=True)
    lengths = [6, 4, 4, 1] if enforce_sorted else [4, 6, 1, 4]
    x = torch.randn(4, 6, 3, dtype=torch.float64, device=device)
    packed = pack_padded_sequence(
        x, torch.tensor(lengths), batch_first=True, enforce_sorted=enforce_sorted
    )
    assert_matches_the_reference(layer, packed, None)
    listed = pack_sequence([x[b, :n] for b, n in enumerate(lengths)], enforce_sorted=enforce_sorted)
    out_a, (h_a, c_a) = layer(packed)
    out_b, (h_b, c_b) = layer(listed)
    torch.testing.assert_close(out_a.data, out_b.data, rtol=0, atol=0)
    torch.testing.assert_close((h_a, c_a), (h_b, c_b), rtol=0, atol=0)


def test_packed_only_the_states_reach_the_loss(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loss of h_n and c_n alone: grad_output is None, each state's gradient joins
    its own sequence's last step (on CUDA's segments too)."""
    monkeypatch.setenv("LLTM_SEGMENT_STEPS", "4")
    layer = make_layer(2, 3, device=device, bidirectional=True)
    x = torch.randn(9, 4, 2, dtype=torch.float64, device=device, requires_grad=True)
    packed = pack_padded_sequence(x, torch.tensor([9, 8, 3, 2]))
    _, (h_n, c_n) = layer(packed)
    params = list(layer.parameters())
    # The packing's graph serves both calls.
    got = torch.autograd.grad((h_n * 2).sum() + (c_n * c_n).sum(), [*params, x], retain_graph=True)
    _, (rh, rc) = lltm_layer_reference(packed, layer.all_parameters(), bidirectional=True)
    want = torch.autograd.grad((rh * 2).sum() + (rc * rc).sum(), [*params, x])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_dropout_with_a_fixed_mask_matches_the_reference(device: str, packed: bool) -> None:
    """Between layers, in training only, from torch's generator: the same seed, the same masks."""
    layer = make_layer(3, 4, device=device, num_layers=3, bidirectional=True, dropout=0.4)
    x = torch.randn(5, 4, 3, dtype=torch.float64, device=device, requires_grad=True)
    input = pack_padded_sequence(x, torch.tensor([5, 4, 2, 2])) if packed else x  # noqa: A001
    assert_matches_the_reference(layer.train(), input, states(layer, 4, device))
    # Another seed draws other masks; evaluation mode draws none.
    torch.manual_seed(1)
    first = padded(layer(input)[0])
    torch.manual_seed(2)
    assert not torch.equal(first, padded(layer(input)[0]))
    layer.eval()
    plain = padded(layer(input)[0])
    want = padded(
        lltm_layer_reference(input, layer.all_parameters(), bidirectional=True, training=False)[0]
    )
    torch.testing.assert_close(plain.cpu(), want.cpu(), rtol=1e-10, atol=1e-10)


def test_dropout_draws_from_torch_generator() -> None:
    layer = make_layer(3, 4, num_layers=2, dropout=0.5).train()
    x = torch.randn(4, 3, 3, dtype=torch.float64)
    torch.manual_seed(7)
    a = layer(x)[0]
    torch.manual_seed(7)
    b = layer(x)[0]
    assert torch.equal(a, b)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("segments", SEGMENTS)
@pytest.mark.parametrize("directions", DIRECTIONS)
def test_inference_and_training_forwards_agree(
    device: str,
    monkeypatch: pytest.MonkeyPatch,
    packed: bool,
    segments: str | None,
    directions: str | None,
) -> None:
    """Without a graph the op saves nothing (lltm::sequence): the same numbers, bit for bit."""
    if segments is not None:
        monkeypatch.setenv("LLTM_SEGMENT_STEPS", segments)
    if directions is not None:
        monkeypatch.setenv("LLTM_DIRECTIONS", directions)
    layer = make_layer(4, 6, device=device, num_layers=2, bidirectional=True)
    x = torch.randn(8, 5, 4, dtype=torch.float64, device=device)
    input = pack_padded_sequence(x, torch.tensor([8, 7, 7, 3, 1])) if packed else x  # noqa: A001
    output, (h_n, c_n) = layer(input)
    assert (output.data if packed else output).requires_grad
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            plain, (h, c) = layer(input)
        assert torch.equal(plain.data, output.data)
        assert torch.equal(h, h_n)
        assert torch.equal(c, c_n)


# --- other dtypes, against the float64 reference ---------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_other_dtypes_match_the_float64_reference(
    device: str, dtype: torch.dtype, packed: bool
) -> None:
    layer = make_layer(16, 32, device=device, dtype=dtype, num_layers=2, bidirectional=True)
    x = torch.randn(8, 6, 16, dtype=torch.float64).to(device, dtype)
    input = (  # noqa: A001
        pack_padded_sequence(x, torch.tensor([8, 8, 7, 5, 2, 1])) if packed else x
    )
    assert_matches_the_reference(layer, input, states(layer, 6, device, dtype), atol=None)


def test_bitwise_repeatable(device: str) -> None:
    """The kernels add in a fixed order; the segments and gathers too."""
    layer = make_layer(5, 8, device=device, num_layers=2, bidirectional=True)
    x = torch.randn(7, 5, 5, dtype=torch.float64, device=device, requires_grad=True)
    lengths = torch.tensor([7, 6, 6, 3, 1])
    params = list(layer.parameters())
    runs = [
        outputs_and_grads(lambda: layer(pack_padded_sequence(x, lengths)), [*params, x])
        for _ in range(2)
    ]
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


# --- a call per direction ------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "steps", "calls"),
    [
        # Unset: a call each where stacking the weights copies 8 times what
        # flipping the steps does (2 x 192 x 80 against T B (16 + 192)).
        pytest.param(None, 1, [1, 1], id="short-call-each"),
        pytest.param(None, 80, [2], id="long-one-call"),
        pytest.param("calls", 80, [1, 1], id="calls"),
        pytest.param("together", 1, [2], id="together"),
        pytest.param("apart", 1, [2], id="apart"),
    ],
)
def test_the_layer_stacks_the_weights_where_they_are_the_smaller_copy(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, steps: int, calls: list[int]
) -> None:
    """On the CPU; the directions each call had, from the weights' first dimension."""
    if setting is None:
        monkeypatch.delenv("LLTM_DIRECTIONS", raising=False)
    else:
        monkeypatch.setenv("LLTM_DIRECTIONS", setting)
    seen: list[int] = []

    def counted(*args: object) -> object:
        seen.append(args[1].shape[0])  # type: ignore[attr-defined]
        return _sequence(*args)

    monkeypatch.setattr(lltm.layer, "_sequence", counted)
    torch.manual_seed(9)
    layer = lltm.LLTMLayer(16, 64, bidirectional=True)
    x = torch.randn(steps, 2, 16)
    layer(x)
    assert seen == calls
    # A packed batch of the same rows: the same calls.
    seen.clear()
    layer(pack_padded_sequence(x, torch.tensor([steps, steps])))
    assert seen == calls
