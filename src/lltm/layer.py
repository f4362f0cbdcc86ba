"""``lltm.LLTMLayer``: LLTM layers over whole sequences, with ``nn.LSTM``'s interface."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .module import LLTM
from .ops import lltm_sequence

__all__ = ["LLTMLayer"]


class LLTMLayer(nn.Module):
    """A stack of LLTM layers run over whole sequences, like ``nn.LSTM``.

    Each layer runs :func:`lltm.lltm_sequence`: one op call per layer, whose
    backward (backprop through time) runs in C++. Layer ``k > 0`` takes the
    outputs of layer ``k - 1`` as its input.

    Args:
        input_features: size of each input row.
        state_size: size of the hidden and cell state of every layer.
        num_layers: how many layers are stacked.
        batch_first: input and output are ``[batch, steps, ...]`` rather than
            ``[steps, batch, ...]`` (the states are not affected, as in
            ``nn.LSTM``).
        bias: whether the layers have a bias; without, it is zero.

    Attributes:
        weights_l{k}: ``[3 * state_size, state_size + in_k]``, layer ``k``'s
            weights in the cell's layout (``in_0 = input_features``, else
            ``state_size``): ``LLTM`` cell weights load as they are.
        bias_l{k}: ``[1, 3 * state_size]``, when ``bias``.

    Call ``layer(input, (h0, c0))`` or ``layer(input)`` (zero states):

    * input: ``[steps, batch, input_features]`` (``[batch, steps, ...]`` with
      ``batch_first``), or ``[steps, input_features]`` unbatched;
    * h0, c0: ``[num_layers, batch, state_size]`` (``[num_layers,
      state_size]`` unbatched).

    It returns ``(output, (h_n, c_n))``: the last layer's ``h_t`` of every
    step, shaped as the input with ``state_size`` features, and each layer's
    last state, shaped as ``h0``.

    Example:
        >>> layer = LLTMLayer(32, 128, num_layers=2)
        >>> output, (h_n, c_n) = layer(torch.randn(64, 16, 32))
        >>> output.shape, h_n.shape
        (torch.Size([64, 16, 128]), torch.Size([2, 16, 128]))
    """

    def __init__(
        self,
        input_features: int,
        state_size: int,
        num_layers: int = 1,
        batch_first: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if input_features < 0 or state_size < 0 or num_layers < 1:
            msg = (
                "LLTMLayer: expected input_features >= 0, state_size >= 0 and "
                f"num_layers >= 1, but got input_features={input_features}, "
                f"state_size={state_size}, num_layers={num_layers}"
            )
            raise ValueError(msg)
        self.input_features = input_features
        self.state_size = state_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.bias = bias
        for k in range(num_layers):
            features = input_features if k == 0 else state_size
            weights = torch.empty(3 * state_size, state_size + features)
            self.register_parameter(f"weights_l{k}", nn.Parameter(weights))
            if bias:
                self.register_parameter(f"bias_l{k}", nn.Parameter(torch.empty(1, 3 * state_size)))
            else:
                self.register_buffer(f"bias_l{k}", torch.zeros(1, 3 * state_size), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every parameter from U(-1/sqrt(state_size), 1/sqrt(state_size)), as ``LLTM``."""
        stdv = 1.0 / math.sqrt(self.state_size) if self.state_size > 0 else 0.0
        for weight in self.parameters():
            nn.init.uniform_(weight, -stdv, +stdv)

    @classmethod
    def from_cell(cls, cell: LLTM, *, batch_first: bool = False) -> LLTMLayer:
        """A one-layer ``LLTMLayer`` with a copy of ``cell``'s parameters.

        It computes what a Python loop of ``cell`` over the steps computes.
        """
        layer = cls(cell.input_features, cell.state_size, batch_first=batch_first)
        layer.to(device=cell.weights.device, dtype=cell.weights.dtype)
        with torch.no_grad():
            layer.weights_l0.copy_(cell.weights)
            layer.bias_l0.copy_(cell.bias)
        return layer

    def layer_parameters(self, k: int) -> tuple[Tensor, Tensor]:
        """Layer ``k``'s ``(weights, bias)``; the bias is a zero buffer without ``bias``."""
        return getattr(self, f"weights_l{k}"), getattr(self, f"bias_l{k}")

    def forward(
        self,
        input: Tensor,  # noqa: A002 - nn.LSTM's name
        hx: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Run every layer over the sequence: ``(output, (h_n, c_n))``."""
        if not isinstance(input, Tensor):
            msg = f"LLTMLayer: expected input to be a tensor, but got {type(input).__name__}"
            raise TypeError(msg)
        if input.dim() not in (2, 3):
            msg = (
                "LLTMLayer: expected input to be a 3-D tensor "
                f"[{'batch, steps' if self.batch_first else 'steps, batch'}, input_features] "
                f"or a 2-D (unbatched) tensor [steps, input_features], but got a "
                f"{input.dim()}-D tensor of shape {list(input.shape)}"
            )
            raise ValueError(msg)
        unbatched = input.dim() == 2
        x = (
            input.unsqueeze(1)
            if unbatched
            else (input.transpose(0, 1) if self.batch_first else input)
        )
        batch = x.shape[1]
        want = (
            [self.num_layers, self.state_size]
            if unbatched
            else [
                self.num_layers,
                batch,
                self.state_size,
            ]
        )
        if hx is None:
            # One zero state for every layer and both halves: a call's fixed
            # host cost is what short sequences pay (docs/performance.md).
            zeros = x.new_zeros(batch, self.state_size)
            states = [(zeros, zeros)] * self.num_layers
        else:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                msg = "LLTMLayer: expected the state to be a tuple (h0, c0)"
                raise TypeError(msg)
            for name, t in zip(("h0", "c0"), hx, strict=True):
                if not isinstance(t, Tensor):
                    msg = f"LLTMLayer: expected {name} to be a tensor, but got {type(t).__name__}"
                    raise TypeError(msg)
                if list(t.shape) != want:
                    layout = (
                        "[num_layers, state_size]"
                        if unbatched
                        else ("[num_layers, batch, state_size]")
                    )
                    msg = (
                        f"LLTMLayer: expected {name} to have shape {layout} = {want}, "
                        f"but got {list(t.shape)}"
                    )
                    raise ValueError(msg)
            h0, c0 = (t.unsqueeze(1) for t in hx) if unbatched else hx
            states = list(zip(h0.unbind(0), c0.unbind(0), strict=True))
        h_n, c_n = [], []
        for k, (h0_k, c0_k) in enumerate(states):
            weights, bias = self.layer_parameters(k)
            x, h, c = lltm_sequence(x, weights, bias, h0_k, c0_k)
            h_n.append(h)
            c_n.append(c)
        # One layer's state as a view, not a copy: stack launches a kernel.
        hidden = h_n[0].unsqueeze(0) if self.num_layers == 1 else torch.stack(h_n)
        cell = c_n[0].unsqueeze(0) if self.num_layers == 1 else torch.stack(c_n)
        if unbatched:
            return x.squeeze(1), (hidden.squeeze(1), cell.squeeze(1))
        output = x.transpose(0, 1) if self.batch_first else x
        return output, (hidden, cell)

    def extra_repr(self) -> str:
        """The sizes and options, shown by ``repr``."""
        return (
            f"input_features={self.input_features}, state_size={self.state_size}, "
            f"num_layers={self.num_layers}, batch_first={self.batch_first}, bias={self.bias}"
        )
