"""lltm.lltm, lltm.LLTM and torch.ops.lltm against the pure-PyTorch reference."""

from __future__ import annotations

import math

import pytest
import torch

import lltm
from helpers import DEVICES, assert_close_to_reference, lltm_step, make_inputs, reference_step
from lltm.reference import lltm_reference

# (batch, input_features, state_size): the tutorial's size, odd sizes, batch 1.
SHAPES = [(16, 32, 128), (3, 17, 5), (1, 1, 1), (1, 100, 3), (7, 13, 33), (5, 3, 64)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-F{}-S{}".format(*s))
def test_matches_reference(device: str, dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    args = make_inputs(*shape, device=device, dtype=dtype, requires_grad=True)
    for got, want in zip(lltm_step(args), reference_step(args), strict=True):
        assert got.dtype == dtype
        assert got.device.type == device
        assert_close_to_reference(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_matches_reference(device: str, dtype: torch.dtype) -> None:
    args = make_inputs(16, 32, 128, device=device, dtype=dtype, requires_grad=True)
    for got, want in zip(lltm_step(args), reference_step(args), strict=True):
        assert got.dtype == dtype
        assert_close_to_reference(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_bias_1d_and_2d_agree(device: str) -> None:
    args = make_inputs(4, 6, 8, device=device, bias_1d=True, requires_grad=True)
    bias_2d = args[2].detach().reshape(1, -1).requires_grad_()
    out_1d = lltm.lltm(*args)
    out_2d = lltm.lltm(args[0], args[1], bias_2d, *args[3:])
    torch.testing.assert_close(out_1d, out_2d)
    (d_bias_1d,) = torch.autograd.grad(out_1d[0].sum(), [args[2]])
    (d_bias_2d,) = torch.autograd.grad(out_2d[0].sum(), [bias_2d])
    assert d_bias_1d.shape == (24,)
    assert d_bias_2d.shape == (1, 24)
    torch.testing.assert_close(d_bias_1d, d_bias_2d.reshape(-1))


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device: str) -> None:
    batch, features, state = 5, 7, 6
    # Transposed storage: same values, strides (1, rows).
    args = [
        torch.randn(shape[::-1], device=device, dtype=torch.float64).t()
        for shape in [
            (batch, features),
            (3 * state, state + features),
            (1, 3 * state),
            (batch, state),
            (batch, state),
        ]
    ]
    # And a strided slice of a larger tensor.
    args[0] = torch.randn(batch, 2 * features, device=device, dtype=torch.float64)[:, ::2]
    assert not any(a.is_contiguous() for a in (args[0], args[1], args[3], args[4]))
    args = [a.requires_grad_() for a in args]
    for got, want in zip(lltm_step(args), reference_step(args), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_expanded_upstream_gradients(device: str) -> None:
    """Gradients from .sum() reach the backward as zero-stride tensors."""
    args = make_inputs(4, 3, 5, device=device, dtype=torch.float64, requires_grad=True)
    new_h, new_cell = lltm.lltm(*args)
    grad_h = torch.ones(1, 1, device=device, dtype=torch.float64).expand(4, 5)
    grads = torch.autograd.grad((new_h, new_cell), args, (grad_h, grad_h))
    ref = lltm_reference(*args)
    ref_grads = torch.autograd.grad(ref, args, (grad_h, grad_h))
    torch.testing.assert_close(grads, ref_grads)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device: str) -> None:
    args = make_inputs(0, 4, 3, device=device, dtype=torch.float64, requires_grad=True)
    new_h, new_cell = lltm.lltm(*args)
    assert new_h.shape == new_cell.shape == (0, 3)
    grads = torch.autograd.grad(new_h.sum() + new_cell.sum(), args)
    for grad, arg in zip(grads, args, strict=True):
        assert grad.shape == arg.shape
    # No batch rows: the parameter gradients are exactly zero.
    assert torch.count_nonzero(grads[1]) == 0
    assert torch.count_nonzero(grads[2]) == 0
    outputs = torch.ops.lltm.forward.default(*[a.detach() for a in args])
    assert [tuple(o.shape) for o in outputs] == [(0, 3)] * 5 + [(0, 7), (0, 9)]


@pytest.mark.parametrize("device", DEVICES)
def test_only_one_output_reaches_the_loss(device: str) -> None:
    """Autograd passes None for the unused output; it must count as zero."""
    args = make_inputs(3, 4, 5, device=device, dtype=torch.float64, requires_grad=True)
    for index in (0, 1):
        out = lltm.lltm(*args)[index]
        grads = torch.autograd.grad(out.sum(), args)
        ref_grads = torch.autograd.grad(lltm_reference(*args)[index].sum(), args)
        torch.testing.assert_close(grads, ref_grads)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device: str) -> None:
    args = make_inputs(3, 17, 5, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lltm.lltm, args, check_undefined_grad=True)


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_raises(device: str) -> None:
    args = make_inputs(2, 3, 4, device=device, dtype=torch.float64, requires_grad=True)
    new_h, _ = lltm.lltm(*args)
    (d_input,) = torch.autograd.grad(new_h.sum(), args[0], create_graph=True)
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        d_input.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_saved_activations_are_not_differentiable(device: str) -> None:
    args = make_inputs(2, 3, 4, device=device, dtype=torch.float64, requires_grad=True)
    outputs = torch.ops.lltm.forward.default(*args)
    assert [o.requires_grad for o in outputs] == [True, True] + [False] * 5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [True, False])
@pytest.mark.parametrize("bias_1d", [True, False])
# torch 2.14's test_aot_dispatch_dynamic reads .grad of its own non-leaf
# copies of the inputs; the warning is about opcheck, not about lltm.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_opcheck_forward(device: str, requires_grad: bool, bias_1d: bool) -> None:
    for shape in [(3, 17, 5), (0, 2, 3)]:
        args = make_inputs(
            *shape, device=device, dtype=torch.float64, bias_1d=bias_1d, requires_grad=requires_grad
        )
        torch.library.opcheck(torch.ops.lltm.forward.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward(device: str) -> None:
    for shape in [(3, 17, 5), (0, 2, 3)]:
        args = make_inputs(*shape, device=device, dtype=torch.float64)
        saved = torch.ops.lltm.forward.default(*args)[1:]
        grads = [torch.randn_like(saved[0]), torch.randn_like(saved[0])]
        torch.library.opcheck(torch.ops.lltm.backward.default, [*grads, *saved, args[1]])


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_matches_eager(device: str) -> None:
    cell = lltm.LLTM(32, 128).to(device)

    def step(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        new_h, new_cell = cell(x, (h, c))
        return (new_h * 2).sum() + new_cell.relu().sum()

    compiled = torch.compile(step, fullgraph=True)
    x, h, c = (torch.randn(16, n, device=device) for n in (32, 128, 128))
    eager_loss = step(x, h, c)
    eager_grads = torch.autograd.grad(eager_loss, list(cell.parameters()))
    compiled_loss = compiled(x, h, c)
    compiled_grads = torch.autograd.grad(compiled_loss, list(cell.parameters()))
    torch.testing.assert_close(compiled_loss, eager_loss)
    torch.testing.assert_close(compiled_grads, eager_grads)


def test_module_parameters_and_init() -> None:
    cell = lltm.LLTM(32, 128)
    assert cell.weights.shape == (3 * 128, 32 + 128)
    assert cell.bias.shape == (1, 3 * 128)
    bound = 1 / math.sqrt(128)
    for p in cell.parameters():
        assert p.abs().max() <= bound
        # Uniform on [-b, b] has standard deviation b / sqrt(3).
        assert abs(p.std().item() - bound / math.sqrt(3)) < 0.1 * bound
    assert "input_features=32, state_size=128" in repr(cell)


def test_module_forward_matches_reference() -> None:
    cell = lltm.LLTM(8, 6).double()
    x, h, c = (torch.randn(4, n, dtype=torch.float64) for n in (8, 6, 6))
    torch.testing.assert_close(cell(x, (h, c)), lltm_reference(x, cell.weights, cell.bias, h, c))


def test_module_rejects_negative_sizes() -> None:
    with pytest.raises(ValueError, match="expected input_features and state_size to be >= 0"):
        lltm.LLTM(-1, 4)
