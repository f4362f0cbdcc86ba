"""LLTMLayer's nn.LSTM options: bidirectional, dropout and PackedSequence, on every path.

The reference is :func:`lltm.reference.lltm_layer_reference`: each sequence
run alone over its own steps by a Python loop of the pure-PyTorch cell, in
float64. In float64 the layer matches it to 1e-10 in every output, state and
gradient. On CUDA each case runs on each path (LLTM_SEQUENCE_PATH); a packed
batch's segments run as on CUDA (several steps, padding rows) and as on the
CPU (one per change of the batch) with LLTM_SEGMENT_STEPS.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch.nn.utils.rnn import (
    PackedSequence,
    pack_padded_sequence,
    pack_sequence,
    pad_packed_sequence,
)

import lltm
from helpers import assert_a_graph_replays_the_layer, assert_close_to_reference
from lltm.reference import lltm_layer_reference

CUDA_PATHS = ("persistent", "cluster", "fused", "steps")

PATHS = [
    pytest.param(("cpu", "auto"), id="cpu"),
    *(pytest.param(("cuda", p), id=f"cuda-{p}", marks=pytest.mark.cuda) for p in CUDA_PATHS),
]


@pytest.fixture(params=PATHS)
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The device to run on, with LLTM_SEQUENCE_PATH set for its path."""
    name, path = request.param
    if name == "cuda" and path == "cluster" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the cluster path needs thread-block clusters (sm_90 on)")
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    return name


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


def make_layer(
    features: int,
    state: int,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float64,
    **options: object,
) -> lltm.LLTMLayer:
    """A layer whose weights are scaled so that a long sequence stays tame."""
    torch.manual_seed(0)
    layer = lltm.LLTMLayer(features, state, **options)  # type: ignore[arg-type]
    return layer.to(device=device, dtype=dtype)


def states(
    layer: lltm.LLTMLayer, batch: int, device: str, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (layer.num_layers * layer.directions, batch, layer.state_size)
    return (
        torch.randn(shape, dtype=torch.float64).to(device, dtype),
        torch.randn(shape, dtype=torch.float64).to(device, dtype),
    )


def padded(output: torch.Tensor | PackedSequence) -> torch.Tensor:
    return pad_packed_sequence(output)[0] if isinstance(output, PackedSequence) else output


def outputs_and_grads(
    run: Callable[[], tuple[object, tuple[torch.Tensor, torch.Tensor]]],
    leaves: list[torch.Tensor],
    seed: int = 1,
) -> list[torch.Tensor]:
    """``(output, h_n, c_n, *grads)`` under a loss that reaches all three differently.

    ``run`` is called after ``torch.manual_seed(seed)``: dropout draws the
    same masks in the layer and the reference.
    """
    torch.manual_seed(seed)
    output, (h_n, c_n) = run()
    out = padded(output)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(seed)
    scale = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out)
    loss = (out * scale).sum() + 2 * h_n.sum() + (c_n * c_n).sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
    return [out, h_n, c_n, *grads]


def assert_matches_the_reference(
    layer: lltm.LLTMLayer,
    input: torch.Tensor | PackedSequence,  # noqa: A002
    hx: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    atol: float | None = 1e-10,
) -> None:
    """The layer against the reference: every output, state and gradient.

    ``atol`` None compares at the tolerance of the layer's dtype.
    """
    leaves = list(layer.parameters())
    data = input.data if isinstance(input, PackedSequence) else input
    if data.requires_grad:
        leaves.append(data)
    got = outputs_and_grads(lambda: layer(input, hx), leaves)

    def reference() -> tuple[object, tuple[torch.Tensor, torch.Tensor]]:
        return lltm_layer_reference(
            input,
            layer.all_parameters(),
            hx,
            batch_first=layer.batch_first,
            bidirectional=layer.bidirectional,
            dropout=layer.dropout,
            training=layer.training,
        )

    if layer.weights_l0.dtype == torch.float64:
        # On the layer's device: dropout draws its masks from that device's generator.
        want = outputs_and_grads(reference, leaves)
    else:  # the reference in float64 on the CPU, from the same numbers
        ref = make_reference_copy(layer)
        ref_input = to64(input)
        ref_hx = None if hx is None else (hx[0].double().cpu(), hx[1].double().cpu())
        ref_data = ref_input.data if isinstance(ref_input, PackedSequence) else ref_input
        ref_leaves = list(ref.parameters()) + ([ref_data] if data.requires_grad else [])
        if data.requires_grad:
            ref_data.requires_grad_()
        want = outputs_and_grads(
            lambda: lltm_layer_reference(
                ref_input,
                ref.all_parameters(),
                ref_hx,
                batch_first=layer.batch_first,
                bidirectional=layer.bidirectional,
            ),
            ref_leaves,
        )
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        if atol is None:
            assert_close_to_reference(g.cpu(), w.detach().cpu())
        else:
            torch.testing.assert_close(g.cpu(), w.detach().cpu(), rtol=1e-10, atol=atol)


def make_reference_copy(layer: lltm.LLTMLayer) -> lltm.LLTMLayer:
    ref = lltm.LLTMLayer(
        layer.input_features,
        layer.state_size,
        layer.num_layers,
        layer.batch_first,
        layer.bias,
        bidirectional=layer.bidirectional,
        dtype=torch.float64,
    )
    with torch.no_grad():
        for a, b in zip(ref.parameters(), layer.parameters(), strict=True):
            a.copy_(b.double().cpu())
    return ref


def to64(input: torch.Tensor | PackedSequence) -> torch.Tensor | PackedSequence:  # noqa: A002
    if isinstance(input, PackedSequence):
        return PackedSequence(
            input.data.detach().double().cpu(),
            input.batch_sizes,
            *(
                None if t is None else t.cpu()
                for t in (input.sorted_indices, input.unsorted_indices)
            ),
        )
    return input.detach().double().cpu()


# --- float64: equal to the reference --------------------------------------------------


@pytest.mark.parametrize("layers", [1, 2], ids=lambda n: f"L{n}")
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("hx", [False, True], ids=["zero-state", "given-state"])
def test_padded_matches_the_reference(
    device: str, layers: int, bidirectional: bool, hx: bool
) -> None:
    layer = make_layer(3, 4, device=device, num_layers=layers, bidirectional=bidirectional)
    x = torch.randn(6, 5, 3, dtype=torch.float64).to(device).requires_grad_()
    assert_matches_the_reference(layer, x, states(layer, 5, device) if hx else None)


@pytest.mark.parametrize(("size", "lengths"), PACKED)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("segments", SEGMENTS)
def test_packed_matches_the_reference(
    device: str,
    monkeypatch: pytest.MonkeyPatch,
    size: tuple[int, int, int, int],
    lengths: list[int],
    bidirectional: bool,
    segments: str | None,
) -> None:
    """Each sequence stops at its own length: output, h_n, c_n and the backward."""
    if segments is not None:
        monkeypatch.setenv("LLTM_SEGMENT_STEPS", segments)
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
def test_inference_and_training_forwards_agree(
    device: str, monkeypatch: pytest.MonkeyPatch, packed: bool, segments: str | None
) -> None:
    """Without a graph the op saves nothing (lltm::sequence): the same numbers, bit for bit."""
    if segments is not None:
        monkeypatch.setenv("LLTM_SEGMENT_STEPS", segments)
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


# --- the ops ---------------------------------------------------------------------------


def _op_args(
    device: str, *, directions: int | None, packed: bool, requires_grad: bool = True
) -> list[torch.Tensor | None]:
    """[input, weights, bias, h0, c0, batch_sizes] of a small two-direction or packed call."""
    steps, batch, features, state = 4, 3, 3, 2
    gen = torch.Generator().manual_seed(5)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        t = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
        return t.to(device).requires_grad_(requires_grad)

    d = () if directions is None else (directions,)
    lengths = torch.tensor([4, 3, 1])
    x = torch.randn(steps, batch, features, generator=gen, dtype=torch.float64)
    batch_sizes = None
    if packed:
        p = pack_padded_sequence(x, lengths)
        x, batch_sizes = p.data, p.batch_sizes
    return [
        x.to(device).requires_grad_(requires_grad),
        rand(*d, 3 * state, state + features, scale=0.5),
        rand(*d, 1, 3 * state, scale=0.5),
        rand(*d, batch, state),
        rand(*d, batch, state),
        batch_sizes,
    ]


OP_CASES = [
    pytest.param(2, False, id="bidirectional"),
    pytest.param(1, False, id="one-direction-stacked"),
    pytest.param(None, True, id="packed"),
    pytest.param(2, True, id="bidirectional-packed"),
]


@pytest.mark.parametrize(("directions", "packed"), OP_CASES)
def test_gradcheck(device: str, directions: int | None, packed: bool) -> None:
    args = _op_args(device, directions=directions, packed=packed)
    tensors, batch_sizes = args[:5], args[5]
    assert torch.autograd.gradcheck(
        lambda *a: lltm.lltm_sequence(*a, batch_sizes=batch_sizes),
        tensors,  # type: ignore[arg-type]
    )


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize(("directions", "packed"), OP_CASES)
def test_opcheck(device: str, directions: int | None, packed: bool) -> None:
    for requires_grad in (False, True):
        args = _op_args(device, directions=directions, packed=packed, requires_grad=requires_grad)
        torch.library.opcheck(torch.ops.lltm.sequence.default, args)
        torch.library.opcheck(torch.ops.lltm.sequence_forward.default, args)
    args = _op_args(device, directions=directions, packed=packed, requires_grad=False)
    output, _, _, cells, gates = torch.ops.lltm.sequence_forward.default(*args)
    grad_h = torch.randn_like(args[3])  # type: ignore[arg-type]
    torch.library.opcheck(
        torch.ops.lltm.sequence_backward.default,
        (
            torch.randn_like(output),
            grad_h,
            grad_h * 2,
            args[0],
            args[1],
            args[3],
            output,
            cells,
            gates,
            args[5],
            [True] * 5,
        ),
    )


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_torch_compile_fullgraph(device: str, packed: bool) -> None:
    """No graph break, with dropout in training mode, and a PackedSequence as input.

    (pack_padded_sequence itself is not traced by Dynamo: packing happens
    outside, as a data loader does it.)
    """
    layer = make_layer(3, 4, device=device, num_layers=2, bidirectional=True, dropout=0.3)
    x = torch.randn(5, 3, 3, dtype=torch.float64, device=device)
    lengths = torch.tensor([3, 5, 2])
    input = pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x  # noqa: A001

    def loss(input: torch.Tensor | PackedSequence) -> torch.Tensor:  # noqa: A002
        output, (h_n, c_n) = layer(input)
        data = output.data if isinstance(output, PackedSequence) else output
        return data.sum() + (h_n * c_n).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=False)
    for mode in (layer.eval, layer.train):
        mode()
        # Compiled code draws its own random numbers unless told to fall back
        # to eager's: the same seed then gives the same dropout masks.
        with torch._inductor.config.patch(fallback_random=True):
            torch.manual_seed(3)
            want = loss(input)
            want_grads = torch.autograd.grad(want, list(layer.parameters()))
            torch.manual_seed(3)
            got = compiled(input)
            got_grads = torch.autograd.grad(got, list(layer.parameters()))
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_grads, want_grads)


@pytest.mark.parametrize("shape", [(0, 3, 2, 4), (3, 0, 2, 4)], ids=["no-steps", "no-batch"])
def test_empty_bidirectional(device: str, shape: tuple[int, int, int, int]) -> None:
    steps, batch, features, state = shape
    layer = make_layer(features, state, device=device, bidirectional=True)
    x = torch.randn(steps, batch, features, dtype=torch.float64, device=device)
    hx = states(layer, batch, device)
    output, (h_n, c_n) = layer(x, hx)
    assert output.shape == (steps, batch, 2 * state)
    torch.testing.assert_close((h_n, c_n), hx if steps == 0 else (h_n, c_n))


# --- nn.LSTM's interface ---------------------------------------------------------------


def test_parameters_are_named_as_nn_lstm_names_them() -> None:
    layer = lltm.LLTMLayer(3, 4, num_layers=2, bidirectional=True)
    assert [n for n, _ in layer.named_parameters()] == [
        "weights_l0",
        "bias_l0",
        "weights_l0_reverse",
        "bias_l0_reverse",
        "weights_l1",
        "bias_l1",
        "weights_l1_reverse",
        "bias_l1_reverse",
    ]
    # Layer 1 takes both directions' outputs.
    assert layer.weights_l1.shape == (12, 4 + 8)
    lstm = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    suffixes = {n.rsplit("_", 1)[-1] for n, _ in lstm.named_parameters()}
    assert suffixes == {"l0", "l1", "reverse"}
    x = torch.randn(5, 2, 3)
    (out, (h, c)), (want_out, (want_h, want_c)) = layer(x), lstm(x)
    assert out.shape == want_out.shape == (5, 2, 8)
    assert h.shape == want_h.shape == c.shape == want_c.shape == (4, 2, 4)
    # Unbatched, as nn.LSTM takes it.
    out_1, (h_1, _) = layer(x[:, 0])
    assert out_1.shape == lstm(x[:, 0])[0].shape == (5, 8)
    assert h_1.shape == (4, 4)
    assert "bidirectional=True" in repr(layer)


def test_state_order_is_nn_lstm_s() -> None:
    """h_n: layer 0 forward, layer 0 reverse, layer 1 forward, ...; the reverse
    direction's state is after each sequence's first step."""
    layer = make_layer(3, 4, num_layers=2, bidirectional=True)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    output, (h_n, _) = layer(x)
    state = layer.state_size
    torch.testing.assert_close(h_n[2], output[-1, :, :state])  # layer 1 forward: the last step
    torch.testing.assert_close(h_n[3], output[0, :, state:])  # layer 1 reverse: the first


def test_packed_output_keeps_the_input_order() -> None:
    layer = make_layer(3, 4, bidirectional=True)
    x = torch.randn(5, 3, 3, dtype=torch.float64)
    lengths = torch.tensor([2, 5, 3])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    output, (h_n, _) = layer(packed)
    assert torch.equal(output.batch_sizes, packed.batch_sizes)
    assert torch.equal(output.sorted_indices, packed.sorted_indices)
    # Sequence 1 alone gives what it gives in the batch.
    alone, (h_alone, _) = layer(x[:5, 1:2])
    out, got_lengths = pad_packed_sequence(output)
    assert got_lengths.tolist() == [2, 5, 3]
    torch.testing.assert_close(out[:, 1:2], alone)
    torch.testing.assert_close(h_n[:, 1:2], h_alone)
    assert torch.count_nonzero(out[2:, 0]) == 0  # past sequence 0's end: zeros


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize("dropout", [-0.1, 1.5, True, "0.5"], ids=str)
def test_dropout_outside_0_1_is_refused(dropout: object) -> None:
    with pytest.raises(ValueError, match=r"LLTMLayer: expected dropout to be a number in \[0, 1\]"):
        lltm.LLTMLayer(3, 4, num_layers=2, dropout=dropout)  # type: ignore[arg-type]


def test_dropout_with_one_layer_warns() -> None:
    with pytest.warns(UserWarning, match="dropout applies between layers"):
        lltm.LLTMLayer(3, 4, dropout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lltm.LLTMLayer(3, 4, num_layers=2, dropout=0.5)


def test_bad_packed_sequences_name_the_argument() -> None:
    layer = lltm.LLTMLayer(3, 4)
    data = torch.randn(6, 3)
    with pytest.raises(
        ValueError, match=r"expected batch_sizes to be at least 1 and non-increasing"
    ):
        layer(PackedSequence(data, torch.tensor([2, 3, 1])))
    with pytest.raises(ValueError, match=r"batch_sizes\[2\] = 0 after 2"):
        layer(PackedSequence(data, torch.tensor([4, 2, 0])))
    with pytest.raises(
        ValueError, match=r"expected input to have shape \[sum\(batch_sizes\), input_f"
    ):
        layer(PackedSequence(data, torch.tensor([3, 2])))
    with pytest.raises(
        ValueError, match=r"LLTMLayer: expected input.size\(-1\) to be input_features"
    ):
        layer(pack_sequence([torch.randn(3, 5)]))
    with pytest.raises(ValueError, match=r"LLTMLayer: expected h0 to have shape \[num_layers \* "):
        layer(pack_sequence([torch.randn(3, 3)] * 2), (torch.zeros(1, 3, 4), torch.zeros(1, 3, 4)))
    # torch's own checks, before the layer: a zero length, unsorted lengths.
    x = torch.randn(4, 2, 3)
    with pytest.raises(RuntimeError, match="Length of all samples has to be greater than 0"):
        pack_padded_sequence(x, torch.tensor([4, 0]))
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order"):
        pack_padded_sequence(x, torch.tensor([2, 4]), enforce_sorted=True)
    # batch_first is for tensors: a PackedSequence is the same either way, as in nn.LSTM.
    first = lltm.LLTMLayer(3, 4, batch_first=True)
    first.load_state_dict(layer.state_dict())
    packed = pack_padded_sequence(x, torch.tensor([4, 2]))
    torch.testing.assert_close(first(packed)[0].data, layer(packed)[0].data)


def test_bidirectional_states_must_count_both_directions() -> None:
    layer = lltm.LLTMLayer(3, 4, num_layers=2, bidirectional=True)
    with pytest.raises(
        ValueError,
        match=r"LLTMLayer: expected h0 to have shape \[num_layers \* directions, batch, "
        r"state_size\] = \[4, 2, 4\], but got \[2, 2, 4\]",
    ):
        layer(torch.randn(5, 2, 3), (torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)))


def test_the_input_is_blamed_not_the_weights() -> None:
    """nn.LSTM's kind of message: what the user passed is wrong, not the layer."""
    with pytest.raises(
        ValueError,
        match=r"LLTMLayer: expected input.size\(-1\) to be input_features = 4, but got 5",
    ):
        lltm.LLTMLayer(4, 8)(torch.randn(3, 2, 5))
    with pytest.raises(
        TypeError,
        match=r"LLTMLayer: expected input to have the dtype of the layer's weights \(float32\), "
        r"but got float64",
    ):
        lltm.LLTMLayer(4, 8)(torch.randn(3, 2, 4, dtype=torch.float64))
    h = torch.zeros(2, 8)
    with pytest.raises(
        ValueError, match=r"LLTM: expected input.size\(-1\) to be input_features = 4, but got 5"
    ):
        lltm.LLTM(4, 8)(torch.randn(2, 5), (h, h))
    with pytest.raises(TypeError, match=r"LLTM: expected input to have the dtype of the cell's"):
        lltm.LLTM(4, 8)(torch.randn(2, 4, dtype=torch.float64), (h, h))
    # Under autocast the op casts: no complaint about the dtype.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = lltm.LLTMLayer(4, 8)(torch.randn(3, 2, 4, dtype=torch.float64).float())
    assert out.dtype == torch.bfloat16


def test_op_errors_for_directions() -> None:
    args = _op_args("cpu", directions=2, packed=False, requires_grad=False)
    x, w, b, h0, c0, _ = args
    with pytest.raises(ValueError, match=r"expected weights to hold 1 or 2 directions"):
        lltm.lltm_sequence(x, torch.cat([w, w, w]), b, h0, c0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"expected h0 to be a 3-D tensor \[directions, batch, st"):
        lltm.lltm_sequence(x, w, b, h0[0], c0)  # type: ignore[index]
    with pytest.raises(ValueError, match=r"expected bias to have shape \[directions, 3 \* state_s"):
        lltm.lltm_sequence(x, w, b[:1], h0, c0)  # type: ignore[index]
    with pytest.raises(
        ValueError, match=r"expected batch_sizes to be a 1-D int64 tensor on the CPU"
    ):
        lltm.lltm_sequence(x[0], w, b, h0, c0, torch.tensor([2.0, 1.0]))  # type: ignore[index]
    packed = _op_args("cpu", directions=None, packed=True, requires_grad=False)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("LLTM_SEGMENT_STEPS", "0")
        with pytest.raises(ValueError, match=r"LLTM_SEGMENT_STEPS=0: expected a whole number >= 1"):
            lltm.lltm_sequence(*packed[:5], batch_sizes=packed[5])  # type: ignore[arg-type]


# --- CUDA only -------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("path", CUDA_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_cuda_graph_capture_of_a_bidirectional_layer(
    monkeypatch: pytest.MonkeyPatch, path: str, dtype: torch.dtype
) -> None:
    """Both directions' streams are the graph's branches."""
    if path == "cluster" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the cluster path needs thread-block clusters (sm_90 on)")
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    layer = lltm.LLTMLayer(32, 128, num_layers=2, bidirectional=True).to("cuda", dtype)
    assert_a_graph_replays_the_layer(layer, torch.randn(16, 16, 32, device="cuda", dtype=dtype))


@pytest.mark.cuda
def test_cuda_packed_batch_refuses_capture() -> None:
    layer = lltm.LLTMLayer(3, 4).cuda()
    packed = pack_padded_sequence(torch.randn(3, 2, 3, device="cuda"), torch.tensor([3, 1]))
    layer(packed)
    graph = torch.cuda.CUDAGraph()
    with (
        pytest.raises(RuntimeError, match=r"a packed batch .* cannot run inside a CUDA graph"),
        torch.cuda.graph(graph),
        torch.no_grad(),
    ):
        layer(packed)


@pytest.mark.cuda
def test_cuda_directions_run_on_the_current_stream() -> None:
    """Direction 1 runs on a stream forked from the caller's and joined back."""
    layer = make_layer(16, 32, device="cuda", dtype=torch.float32, bidirectional=True)
    base = torch.randn(8, 16, 16, device="cuda")
    want = layer(base)[0]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        x = base * 1  # written after the sleep
        got = layer(x)[0]
    side.synchronize()
    torch.testing.assert_close(got, want)


@pytest.mark.cuda
@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs: inputs on cuda:1, current device 0"
)
def test_cuda_on_a_second_device() -> None:
    layer = make_layer(3, 4, device="cuda:1", bidirectional=True)
    x = torch.randn(5, 3, 3, dtype=torch.float64, device="cuda:1")
    packed = pack_padded_sequence(x, torch.tensor([5, 2, 1]))
    assert_matches_the_reference(layer, packed, None)
