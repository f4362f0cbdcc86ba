"""``lltm.LLTM``, the tutorial's ``nn.Module``."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .ops import _cell

__all__ = ["LLTM"]


class LLTM(nn.Module):
    """An LLTM cell with the tutorial's parameters and initialization.

    Args:
        input_features: size of each input row.
        state_size: size of the hidden and cell state.

    Attributes:
        weights: ``[3 * state_size, input_features + state_size]``; its columns
            multiply ``[old_h | input]``.
        bias: ``[1, 3 * state_size]``.

    Example:
        >>> cell = LLTM(32, 128)
        >>> h, c = torch.zeros(16, 128), torch.zeros(16, 128)
        >>> h, c = cell(torch.randn(16, 32), (h, c))
    """

    def __init__(self, input_features: int, state_size: int) -> None:
        super().__init__()
        if input_features < 0 or state_size < 0:
            msg = (
                "LLTM: expected input_features and state_size to be >= 0, "
                f"but got input_features={input_features}, state_size={state_size}"
            )
            raise ValueError(msg)
        self.input_features = input_features
        self.state_size = state_size
        self.weights = nn.Parameter(torch.empty(3 * state_size, input_features + state_size))
        self.bias = nn.Parameter(torch.empty(1, 3 * state_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every parameter from U(-1/sqrt(state_size), 1/sqrt(state_size))."""
        stdv = 1.0 / math.sqrt(self.state_size) if self.state_size > 0 else 0.0
        for weight in self.parameters():
            nn.init.uniform_(weight, -stdv, +stdv)

    def forward(self, input: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:  # noqa: A002
        """Advance the cell one step: returns ``(new_h, new_cell)``."""
        old_h, old_cell = state
        return _cell(input, self.weights, self.bias, old_h, old_cell)

    def extra_repr(self) -> str:
        """The sizes, shown by ``repr``."""
        return f"input_features={self.input_features}, state_size={self.state_size}"
