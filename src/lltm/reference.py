"""The tutorial's pure-PyTorch LLTM, shared by the tests and the benchmark.

This is the cell of PyTorch's "Custom C++ and CUDA Extensions" tutorial
written with ordinary tensor operations, so autograd derives its backward.
It is the ground truth the extension is checked against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

__all__ = ["lltm_reference"]


def lltm_reference(
    input: torch.Tensor,  # noqa: A002 - the tutorial's name
    weights: torch.Tensor,
    bias: torch.Tensor,
    old_h: torch.Tensor,
    old_cell: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One LLTM step in plain PyTorch.

    Args:
        input: ``[batch, input_features]``.
        weights: ``[3 * state_size, state_size + input_features]``.
        bias: ``[3 * state_size]`` or ``[1, 3 * state_size]``.
        old_h: ``[batch, state_size]``.
        old_cell: ``[batch, state_size]``.

    Returns:
        ``(new_h, new_cell)``, each ``[batch, state_size]``.
    """
    X = torch.cat([old_h, input], dim=1)  # noqa: N806 - the tutorial's name
    gate_weights = F.linear(X, weights, bias)
    gates = gate_weights.chunk(3, dim=1)
    input_gate = torch.sigmoid(gates[0])
    output_gate = torch.sigmoid(gates[1])
    candidate_cell = F.elu(gates[2])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    return new_h, new_cell
