"""``lltm.LLTM``, the tutorial's ``nn.Module``."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .ops import _cell

__all__ = ["LLTM"]


def check_input(owner: str, whose: str, x: Tensor, input_features: int, weights: Tensor) -> None:
    """Blame the input for what does not fit the module, as ``nn.LSTM`` does.

    The op would name the weights, which are the module's and fine: a
    5-feature input into ``LLTM(4, 8)`` is the input's mistake.
    """
    if x.shape[-1] != input_features:
        msg = (
            f"{owner}: expected input.size(-1) to be input_features = {input_features}, "
            f"but got {x.shape[-1]}"
        )
        raise ValueError(msg)
    if x.dtype != weights.dtype and not torch.is_autocast_enabled(x.device.type):
        want, got = (str(t).removeprefix("torch.") for t in (weights.dtype, x.dtype))
        msg = (
            f"{owner}: expected input to have the dtype of {whose} weights ({want}), "
            f"but got {got}: convert the input with input.to(torch.{want}), or the "
            f"module with .to(torch.{got})"
        )
        raise TypeError(msg)
    if x.device != weights.device:
        msg = (
            f"{owner}: expected input to be on the device of {whose} weights "
            f"({weights.device}), but got {x.device}"
        )
        raise RuntimeError(msg)


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
        if isinstance(input, Tensor) and not input.is_nested and input.dim() == 2:
            check_input("LLTM", "the cell's", input, self.input_features, self.weights)
        return _cell(input, self.weights, self.bias, old_h, old_cell)

    def extra_repr(self) -> str:
        """The sizes, shown by ``repr``."""
        return f"input_features={self.input_features}, state_size={self.state_size}"
