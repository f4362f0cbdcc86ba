"""The tutorial's contract: lltm._C.forward/backward, used by its own LLTMFunction."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from helpers import DEVICES, make_inputs
from lltm import _C as lltm_cpp
from lltm.reference import lltm_reference


# The tutorial's Python code, verbatim apart from formatting.
class LLTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input, weights, bias, old_h, old_cell):  # noqa: A002
        outputs = lltm_cpp.forward(input, weights, bias, old_h, old_cell)
        new_h, new_cell = outputs[:2]
        variables = outputs[1:] + [weights]
        ctx.save_for_backward(*variables)

        return new_h, new_cell

    @staticmethod
    def backward(ctx: Any, grad_h, grad_cell):
        outputs = lltm_cpp.backward(grad_h.contiguous(), grad_cell.contiguous(), *ctx.saved_tensors)
        d_old_h, d_input, d_weights, d_bias, d_old_cell = outputs
        return d_input, d_weights, d_bias, d_old_h, d_old_cell


class LLTM(torch.nn.Module):
    def __init__(self, input_features: int, state_size: int) -> None:
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size))
        self.bias = torch.nn.Parameter(torch.empty(1, 3 * state_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.state_size)
        for weight in self.parameters():
            weight.data.uniform_(-stdv, +stdv)

    def forward(self, input, state):  # noqa: A002
        return LLTMFunction.apply(input, self.weights, self.bias, *state)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_returns_the_tutorial_list(device: str) -> None:
    batch, features, state = 3, 17, 5
    args = make_inputs(batch, features, state, device=device, dtype=torch.float64)
    outputs = lltm_cpp.forward(*args)
    assert isinstance(outputs, list)
    assert len(outputs) == 7
    assert all(type(o) is torch.Tensor for o in outputs)
    new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights = outputs
    inp, weights, bias, old_h, old_cell = args
    torch.testing.assert_close(X, torch.cat([old_h, inp], dim=1))
    torch.testing.assert_close(gate_weights, torch.addmm(bias, X, weights.t()))
    z_i, z_o, z_c = gate_weights.chunk(3, dim=1)
    torch.testing.assert_close(input_gate, torch.sigmoid(z_i))
    torch.testing.assert_close(output_gate, torch.sigmoid(z_o))
    torch.testing.assert_close(candidate_cell, torch.nn.functional.elu(z_c))
    torch.testing.assert_close(new_cell, old_cell + candidate_cell * input_gate)
    torch.testing.assert_close(new_h, torch.tanh(new_cell) * output_gate)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_returns_the_tutorial_list(device: str) -> None:
    args = make_inputs(3, 17, 5, device=device, dtype=torch.float64, requires_grad=True)
    saved = lltm_cpp.forward(*[a.detach() for a in args])[1:]
    grad_h = torch.randn(3, 5, dtype=torch.float64, device=device)
    grad_cell = torch.randn(3, 5, dtype=torch.float64, device=device)
    outputs = lltm_cpp.backward(grad_h, grad_cell, *saved, args[1].detach())
    assert isinstance(outputs, list)
    assert len(outputs) == 5
    d_old_h, d_input, d_weights, d_bias, d_old_cell = outputs
    ref = lltm_reference(*args)
    expected = torch.autograd.grad(ref, args, (grad_h, grad_cell))
    d_input_ref, d_weights_ref, d_bias_ref, d_old_h_ref, d_old_cell_ref = expected
    torch.testing.assert_close(d_old_h, d_old_h_ref)
    torch.testing.assert_close(d_input, d_input_ref)
    torch.testing.assert_close(d_weights, d_weights_ref)
    torch.testing.assert_close(d_bias, d_bias_ref)
    assert d_bias.shape == (1, 15)
    torch.testing.assert_close(d_old_cell, d_old_cell_ref)


def test_keyword_arguments_use_the_tutorial_names() -> None:
    inp, weights, bias, old_h, old_cell = make_inputs(2, 3, 4)
    outputs = lltm_cpp.forward(
        input=inp, weights=weights, bias=bias, old_h=old_h, old_cell=old_cell
    )
    new_cell, input_gate, output_gate, candidate_cell, X, gate_weights = outputs[1:]
    grads = lltm_cpp.backward(
        grad_h=torch.ones(2, 4),
        grad_cell=torch.ones(2, 4),
        new_cell=new_cell,
        input_gate=input_gate,
        output_gate=output_gate,
        candidate_cell=candidate_cell,
        X=X,
        gate_weights=gate_weights,
        weights=weights,
    )
    assert [tuple(g.shape) for g in grads] == [(2, 4), (2, 3), (12, 7), (1, 12), (2, 4)]


@pytest.mark.parametrize("device", DEVICES)
def test_tutorial_function_trains_like_the_reference(device: str) -> None:
    """The tutorial's own LLTMFunction, unchanged, over lltm._C."""
    torch.manual_seed(42)
    cell = LLTM(32, 128).to(device).double()
    x = torch.randn(16, 32, device=device, dtype=torch.float64)
    h = torch.randn(16, 128, device=device, dtype=torch.float64)
    c = torch.randn(16, 128, device=device, dtype=torch.float64)
    new_h, new_cell = cell(x, (h, c))
    (new_h.sum() + new_cell.sum()).backward()
    ref_w = cell.weights.detach().clone().requires_grad_()
    ref_b = cell.bias.detach().clone().requires_grad_()
    ref_h, ref_c = lltm_reference(x, ref_w, ref_b, h, c)
    (ref_h.sum() + ref_c.sum()).backward()
    torch.testing.assert_close((new_h, new_cell), (ref_h, ref_c))
    torch.testing.assert_close(cell.weights.grad, ref_w.grad)
    torch.testing.assert_close(cell.bias.grad, ref_b.grad)
    assert torch.autograd.gradcheck(
        LLTMFunction.apply,
        make_inputs(3, 17, 5, device=device, dtype=torch.float64, requires_grad=True),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_aten_implementation_matches_the_kernels(device: str) -> None:
    """_C._forward_aten/_backward_aten, the benchmark's ATen baseline, on any device."""
    args = make_inputs(5, 7, 9, device=device, dtype=torch.float64)
    outputs = lltm_cpp.forward(*args)
    torch.testing.assert_close(lltm_cpp._forward_aten(*args), outputs)
    grads = [torch.randn_like(outputs[0]), torch.randn_like(outputs[0])]
    torch.testing.assert_close(
        lltm_cpp._backward_aten(*grads, *outputs[1:], args[1]),
        lltm_cpp.backward(*grads, *outputs[1:], args[1]),
    )
