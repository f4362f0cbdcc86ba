"""LLTMLayer's options through the ops (gradcheck, opcheck, torch.compile), its interface and its errors.

The layout of test_options.py: every case on the CPU and on each CUDA path.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.utils.rnn import (
    PackedSequence,
    pack_padded_sequence,
    pack_sequence,
    pad_packed_sequence,
)

import lltm
from helpers import assert_a_graph_replays_the_layer
from sequences import (
    CUDA_PATHS,
    assert_matches_the_reference,
    make_layer,
    set_device_path,
    states,
)

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
    set_device_path(monkeypatch, "cuda", path)
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
