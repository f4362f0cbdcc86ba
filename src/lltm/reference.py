"""The tutorial's pure-PyTorch LLTM, shared by the tests and the benchmark.

This is the cell of PyTorch's "Custom C++ and CUDA Extensions" tutorial
written with ordinary tensor operations, so autograd derives its backward,
and the loops of it that :func:`lltm.lltm_sequence` and
:class:`lltm.LLTMLayer` compute. It is the ground truth the extension is
checked against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F  # noqa: N812

__all__ = ["lltm_layer_reference", "lltm_reference", "lltm_sequence_reference"]


def lltm_reference(
    input: torch.Tensor,  # noqa: A002 - the tutorial's name
    weights: torch.Tensor,
    bias: torch.Tensor,
    old_h: torch.Tensor,
    old_cell: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One LLTM step in plain PyTorch: the arguments and results of :func:`lltm.lltm`."""
    X = torch.cat([old_h, input], dim=1)  # noqa: N806 - the tutorial's name
    gate_weights = F.linear(X, weights, bias)
    gates = gate_weights.chunk(3, dim=1)
    input_gate = torch.sigmoid(gates[0])
    output_gate = torch.sigmoid(gates[1])
    candidate_cell = F.elu(gates[2])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    return new_h, new_cell


def lltm_sequence_reference(
    input: torch.Tensor,  # noqa: A002 - the tutorial's name
    weights: torch.Tensor,
    bias: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    *,
    cell: Callable[..., tuple[torch.Tensor, torch.Tensor]] = lltm_reference,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`lltm.lltm_sequence` as a Python loop of the cell: its arguments and results.

    ``cell`` is the step, called as :func:`lltm_reference` is (the benchmark
    loops :func:`lltm.lltm` with it). For zero steps, ``h_n`` and ``c_n`` are
    copies of ``h0`` and ``c0``.
    """
    h, c = h0, c0
    outputs = []
    for x in input:
        h, c = cell(x, weights, bias, h, c)
        outputs.append(h)
    if not outputs:
        return input.new_empty(0, *h0.shape), h0 * 1, c0 * 1
    return torch.stack(outputs), h, c


def lltm_layer_reference(
    input: torch.Tensor,  # noqa: A002 - nn.LSTM's name
    parameters: Sequence[tuple[torch.Tensor, torch.Tensor]],
    hx: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    batch_first: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """:class:`lltm.LLTMLayer` as loops of the cell over its layers and steps.

    Args:
        input: ``[steps, batch, input_features]``, or ``[batch, steps,
            input_features]`` with ``batch_first``.
        parameters: each layer's ``(weights, bias)``, as
            :meth:`lltm.LLTMLayer.layer_parameters` gives them.
        hx: ``(h0, c0)``, each ``[num_layers, batch, state_size]``; None:
            zeros.
        batch_first: whether ``input`` and the output are batch-major.

    Returns:
        ``(output, (h_n, c_n))`` as the layer returns them: the last layer's
        ``h`` of every step, and each layer's last state.
    """
    x = input.transpose(0, 1) if batch_first else input
    if hx is None:
        state = parameters[0][0].shape[0] // 3
        zeros = x.new_zeros(len(parameters), x.shape[1], state)
        hx = (zeros, zeros)
    h_n, c_n = [], []
    for k, (weights, bias) in enumerate(parameters):
        x, h, c = lltm_sequence_reference(x, weights, bias, hx[0][k], hx[1][k])
        h_n.append(h)
        c_n.append(c)
    output = x.transpose(0, 1) if batch_first else x
    return output, (torch.stack(h_n), torch.stack(c_n))
