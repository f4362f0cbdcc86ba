"""lltm.lltm_sequence, lltm.LLTMLayer and the torch.ops.lltm.sequence* ops, on every device.

The reference is a Python loop of the pure-PyTorch cell in float64. On CUDA
every case runs on each path of the table, forced with LLTM_SEQUENCE_PATH;
tests/sequence/paths holds each path's own cases.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import lltm
from helpers import assert_close_to_reference
from lltm.reference import lltm_layer_reference, lltm_sequence_reference
from sequences import (
    make_sequence,
    reference_with_grads,
    shape_id,
    with_grads,
)

# (steps, batch, input_features, state_size): the tutorial's cell, odd sizes,
# one step, batch 1.
SHAPES = [(6, 16, 32, 128), (5, 3, 7, 5), (1, 2, 3, 4), (7, 1, 1, 33), (4, 5, 3, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_matches_a_loop_of_the_cell(
    device: str, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    args = make_sequence(*shape, device=device, dtype=dtype)
    got = with_grads(lltm.lltm_sequence, args)
    want = reference_with_grads(args)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        assert g.device.type == device
        assert_close_to_reference(g.cpu(), w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_matches_the_float64_reference(device: str, dtype: torch.dtype) -> None:
    args = make_sequence(8, 16, 32, 128, device=device, dtype=dtype)
    for g, w in zip(with_grads(lltm.lltm_sequence, args), reference_with_grads(args), strict=True):
        assert g.dtype == dtype
        assert_close_to_reference(g.cpu(), w)


def test_gradcheck(device: str) -> None:
    args = make_sequence(3, 2, 3, 4, device=device)
    assert torch.autograd.gradcheck(lltm.lltm_sequence, args)
    # Through h_n alone: output and c_n reach the backward as None.
    assert torch.autograd.gradcheck(lambda *a: lltm.lltm_sequence(*a)[1], args)


def test_expanded_upstream_gradients(device: str) -> None:
    """.sum() hands the backward zero-stride gradients."""
    args = make_sequence(4, 3, 2, 5, device=device)
    output, h_n, c_n = lltm.lltm_sequence(*args)
    got = torch.autograd.grad(output.sum() + h_n.sum() + c_n.sum(), args)
    ref_args = [a.detach().cpu().requires_grad_() for a in args]
    output, h_n, c_n = lltm_sequence_reference(*ref_args)
    want = torch.autograd.grad(output.sum() + h_n.sum() + c_n.sum(), ref_args)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w)


def test_only_the_inputs_that_need_a_gradient_get_one(device: str) -> None:
    args = make_sequence(3, 2, 3, 4, device=device, requires_grad=False)
    args[1].requires_grad_()
    output, _, _ = lltm.lltm_sequence(*args)
    (d_weights,) = torch.autograd.grad(output.sum(), [args[1]])
    ref_args = [a.detach().cpu() for a in args]
    ref_args[1].requires_grad_()
    (want,) = torch.autograd.grad(lltm_sequence_reference(*ref_args)[0].sum(), [ref_args[1]])
    torch.testing.assert_close(d_weights.cpu(), want)


def test_no_grad_and_graph_agree(device: str) -> None:
    args = make_sequence(5, 4, 3, 6, device=device)
    with torch.no_grad():
        plain = lltm.lltm_sequence(*args)
    recorded = lltm.lltm_sequence(*args)
    for a, b in zip(plain, recorded, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(0, 3, 2, 4), (4, 0, 2, 4), (3, 2, 2, 0), (0, 0, 2, 4)], ids=str)
def test_empty_sequences(device: str, shape: tuple[int, int, int, int]) -> None:
    """Zero steps return the initial state; an empty batch or state returns empty tensors."""
    steps, batch, _, state = shape
    args = make_sequence(*shape, device=device)
    got = with_grads(lltm.lltm_sequence, args)
    want = reference_with_grads(args)
    assert got[0].shape == (steps, batch, state)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w)
    if device == "cuda":
        torch.cuda.synchronize()


def test_bias_1d_and_2d_agree(device: str) -> None:
    args = make_sequence(3, 2, 3, 4, device=device)
    bias_1d = args[2].detach().reshape(-1).requires_grad_()
    out_2d = lltm.lltm_sequence(*args)
    out_1d = lltm.lltm_sequence(args[0], args[1], bias_1d, *args[3:])
    torch.testing.assert_close(out_1d, out_2d)
    (d_1d,) = torch.autograd.grad(out_1d[0].sum(), [bias_1d])
    (d_2d,) = torch.autograd.grad(out_2d[0].sum(), [args[2]])
    assert d_1d.shape == (12,)
    assert d_2d.shape == (1, 12)
    torch.testing.assert_close(d_1d, d_2d.reshape(-1))


def test_non_contiguous_inputs(device: str) -> None:
    steps, batch, features, state = 4, 3, 5, 6
    dense = make_sequence(steps, batch, features, state, device=device, requires_grad=False)
    strided = [
        # batch-major storage, as batch_first gives
        dense[0].transpose(0, 1).contiguous().transpose(0, 1),
        dense[1].t().contiguous().t(),
        dense[2],
        dense[3].t().contiguous().t(),
        dense[4].t().contiguous().t(),
    ]
    assert not strided[0].is_contiguous()
    strided = [a.requires_grad_() for a in strided]
    for g, w in zip(
        with_grads(lltm.lltm_sequence, strided), reference_with_grads(dense), strict=True
    ):
        torch.testing.assert_close(g.cpu(), w)


def test_double_backward_raises(device: str) -> None:
    args = make_sequence(2, 2, 2, 3, device=device)
    output, _, _ = lltm.lltm_sequence(*args)
    (d_input,) = torch.autograd.grad(output.sum(), [args[0]], create_graph=True)
    with pytest.raises(RuntimeError, match="lltm supports first-order gradients only"):
        d_input.sum().backward()


def _opcheck_samples(device: str) -> Iterator[list[torch.Tensor]]:
    for requires_grad in (False, True):
        yield make_sequence(3, 2, 3, 4, device=device, requires_grad=requires_grad)
    yield make_sequence(0, 2, 3, 4, device=device)


# opcheck's test_aot_dispatch_dynamic (torch 2.14) reads .grad of its own
# copies of the inputs; the warning is about opcheck, not about lltm.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_opcheck(device: str) -> None:
    for args in _opcheck_samples(device):
        torch.library.opcheck(torch.ops.lltm.sequence.default, args)
        torch.library.opcheck(torch.ops.lltm.sequence_forward.default, args)
    saved = torch.ops.lltm.sequence_forward.default(
        *make_sequence(3, 2, 3, 4, device=device, requires_grad=False)
    )
    args = make_sequence(3, 2, 3, 4, device=device, requires_grad=False)
    grad = torch.randn_like(saved[0])
    torch.library.opcheck(
        torch.ops.lltm.sequence_backward.default,
        (
            grad,
            None,
            None,
            args[0],
            args[1],
            args[3],
            saved[0],
            saved[3],
            saved[4],
            None,
            [True, True, True, True, True],
        ),
    )


def test_torch_compile_fullgraph(device: str) -> None:
    layer = lltm.LLTMLayer(3, 4, num_layers=2).to(device=device, dtype=torch.float64)
    x = torch.randn(5, 2, 3, device=device, dtype=torch.float64)

    def loss(x: torch.Tensor) -> torch.Tensor:
        output, (h_n, c_n) = layer(x)
        return output.sum() + (h_n * c_n).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=False)
    want = loss(x)
    want_grads = torch.autograd.grad(want, list(layer.parameters()))
    got = compiled(x)
    got_grads = torch.autograd.grad(got, list(layer.parameters()))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grads, want_grads)


# --- LLTMLayer ----------------------------------------------------------------------------


def _cell_loop(cell: lltm.LLTM, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple:
    outputs = []
    for x_t in x:
        h, c = cell(x_t, (h, c))
        outputs.append(h)
    return torch.stack(outputs), h, c


def test_layer_with_a_cells_weights_equals_a_loop_of_that_cell(device: str) -> None:
    cell = lltm.LLTM(7, 9).to(device=device, dtype=torch.float64)
    layer = lltm.LLTMLayer.from_cell(cell)
    loaded = lltm.LLTMLayer(7, 9).to(device=device, dtype=torch.float64)
    loaded.load_state_dict({"weights_l0": cell.weights, "bias_l0": cell.bias})
    x = torch.randn(6, 4, 7, device=device, dtype=torch.float64)
    h0 = torch.randn(1, 4, 9, device=device, dtype=torch.float64)
    c0 = torch.randn(1, 4, 9, device=device, dtype=torch.float64)
    want_output, want_h, want_c = _cell_loop(cell, x, h0[0], c0[0])
    want_grads = torch.autograd.grad(want_output.sum() + want_c.sum(), list(cell.parameters()))
    for model in (layer, loaded):
        output, (h_n, c_n) = model(x, (h0, c0))
        torch.testing.assert_close(output, want_output)
        torch.testing.assert_close(h_n, want_h.unsqueeze(0))
        torch.testing.assert_close(c_n, want_c.unsqueeze(0))
        grads = torch.autograd.grad(output.sum() + c_n.sum(), list(model.parameters()))
        torch.testing.assert_close(grads, want_grads)


def test_layer_stacks_layers_and_follows_lstm_conventions(device: str) -> None:
    torch.manual_seed(0)
    layer = lltm.LLTMLayer(3, 5, num_layers=3).to(device=device, dtype=torch.float64)
    x = torch.randn(4, 2, 3, device=device, dtype=torch.float64)
    output, (h_n, c_n) = layer(x)
    assert output.shape == (4, 2, 5)
    assert h_n.shape == c_n.shape == (3, 2, 5)
    # Each layer's outputs feed the next, from zero states.
    parameters = [layer.layer_parameters(k) for k in range(3)]
    want, (want_h, want_c) = lltm_layer_reference(x, parameters)
    torch.testing.assert_close(output, want)
    torch.testing.assert_close(h_n, want_h)
    torch.testing.assert_close(c_n, want_c)
    # batch_first: the same numbers, batch-major.
    first = lltm.LLTMLayer(3, 5, num_layers=3, batch_first=True).to(device, torch.float64)
    first.load_state_dict(layer.state_dict())
    out_bf, (h_bf, _) = first(x.transpose(0, 1))
    torch.testing.assert_close(out_bf, output.transpose(0, 1))
    torch.testing.assert_close(h_bf, h_n)
    # Unbatched: [steps, features] with [num_layers, state] states.
    out_1, (h_1, _) = layer(x[:, 0], (h_n[:, 0], c_n[:, 0]))
    out_2, (h_2, _) = layer(x[:, :1], (h_n[:, :1], c_n[:, :1]))
    torch.testing.assert_close(out_1, out_2[:, 0])
    torch.testing.assert_close(h_1, h_2[:, 0])


def test_layer_without_bias(device: str) -> None:
    layer = lltm.LLTMLayer(3, 4, bias=False).to(device=device, dtype=torch.float64)
    assert [name for name, _ in layer.named_parameters()] == ["weights_l0"]
    x = torch.randn(3, 2, 3, device=device, dtype=torch.float64)
    output, _ = layer(x)
    zeros = torch.zeros(2, 4, device=device, dtype=torch.float64)
    want, _, _ = lltm_sequence_reference(x, layer.weights_l0, torch.zeros(12).to(x), zeros, zeros)
    torch.testing.assert_close(output, want)
    output.sum().backward()
    assert layer.weights_l0.grad is not None


# --- errors -------------------------------------------------------------------------------


def _args(**changes: torch.Tensor) -> list[torch.Tensor]:
    names = ["input", "weights", "bias", "h0", "c0"]
    args = dict(zip(names, make_sequence(3, 2, 4, 5, requires_grad=False), strict=True))
    args.update(changes)
    return [args[n] for n in names]


ERROR_CASES = [
    (
        {"input": torch.randn(2, 4, dtype=torch.float64)},
        ValueError,
        (
            r"expected input to be a 3-D tensor \[steps, batch, input_features\], but got a 2-D "
            r"tensor of shape \[2, 4\]"
        ),
    ),
    (
        {"h0": torch.randn(3, 5, dtype=torch.float64)},
        ValueError,
        r"expected h0 to have shape \[batch, state_size\] = \[2, 5\], but got \[3, 5\]",
    ),
    (
        {"c0": torch.randn(2, 6, dtype=torch.float64)},
        ValueError,
        r"expected c0 to have shape \[batch, state_size\] = \[2, 5\], but got \[2, 6\]",
    ),
    (
        {"weights": torch.randn(15, 8, dtype=torch.float64)},
        ValueError,
        (
            r"expected weights to have shape \[3 \* state_size, state_size \+ input_features\] = "
            r"\[15, 9\], but got \[15, 8\]"
        ),
    ),
    (
        {"bias": torch.randn(14, dtype=torch.float64)},
        ValueError,
        r"expected bias to have shape \[3 \* state_size\] = \[15\]",
    ),
    (
        {"c0": torch.randn(2, 5, dtype=torch.float32)},
        TypeError,
        r"expected c0 to have the same dtype as input \(float64\), but got float32",
    ),
    (
        {"input": torch.ones(3, 2, 4, dtype=torch.long)},
        TypeError,
        r"expected input to have a floating-point dtype",
    ),
]


@pytest.mark.parametrize(("changes", "error", "match"), ERROR_CASES)
@pytest.mark.parametrize("op", ["sequence", "sequence_forward"])
def test_bad_arguments_are_named(
    op: str, changes: dict[str, torch.Tensor], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=f"lltm::{op}: {match}"):
        getattr(torch.ops.lltm, op).default(*_args(**changes))


def test_bad_backward_arguments_are_named() -> None:
    args = make_sequence(3, 2, 4, 5, requires_grad=False)
    output, _, _, cells, gates = torch.ops.lltm.sequence_forward.default(*args)
    backward = torch.ops.lltm.sequence_backward.default
    mask = [True] * 5
    with pytest.raises(
        ValueError,
        match=r"lltm::sequence_backward: expected gates to have shape "
        r"\[steps, batch, 3 \* state_size\] = \[3, 2, 15\], but got \[3, 2, 14\]",
    ):
        backward(
            None, None, None, args[0], args[1], args[3], output, cells, gates[..., :14], None, mask
        )
    with pytest.raises(
        ValueError,
        match=r"lltm::sequence_backward: expected grad_h_n to have shape "
        r"\[batch, state_size\] = \[2, 5\], but got \[2, 4\]",
    ):
        backward(
            None,
            output[0, :, :4],
            None,
            args[0],
            args[1],
            args[3],
            output,
            cells,
            gates,
            None,
            mask,
        )


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda layer: layer(torch.randn(2, 3, 4, 5)),
            ValueError,
            r"LLTMLayer: expected input to be a 3-D tensor \[steps, batch, input_features\]",
        ),
        (
            lambda layer: layer(torch.randn(2, 3, 4), (torch.zeros(1, 3, 6), torch.zeros(2, 3, 6))),
            ValueError,
            (
                r"LLTMLayer: expected h0 to have shape \[num_layers \* directions, batch, "
                r"state_size\] = \[2, 3, 6\], but got \[1, 3, 6\]"
            ),
        ),
        (
            lambda layer: layer(torch.randn(2, 3, 5)),
            ValueError,
            r"LLTMLayer: expected input.size\(-1\) to be input_features = 4, but got 5",
        ),
        (
            lambda layer: layer(torch.randn(2, 3, 4), torch.zeros(2, 3, 6)),
            TypeError,
            r"LLTMLayer: expected the state to be a tuple \(h0, c0\)",
        ),
    ],
)
def test_layer_errors_name_the_argument(call: object, error: type[Exception], match: str) -> None:
    layer = lltm.LLTMLayer(4, 6, num_layers=2)
    with pytest.raises(error, match=match):
        call(layer)  # type: ignore[operator]


def test_layer_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match=r"LLTMLayer: expected .* num_layers >= 1"):
        lltm.LLTMLayer(4, 6, num_layers=0)
