"""``lltm.LLTMLayer``: LLTM layers over whole sequences, with ``nn.LSTM``'s interface."""

from __future__ import annotations

import functools
import math
import numbers
import os
import warnings
from typing import overload

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from .module import LLTM, check_input
from .ops import _sequence

__all__ = ["LLTMLayer"]


# A call per direction where the stack copies this many times what the flips do.
_STACK_OVER_FLIPS = 8


def _wants_a_call_per_direction(x: Tensor, weights: Tensor) -> bool:
    """Whether a bidirectional layer on the CPU runs as two one-direction calls.

    The op takes both directions' weights as one ``[2, 3S, S + F]`` tensor,
    which the layer stacks at every call; in a call each, the reverse
    direction's input and output are reversed instead (``x`` ``[T, B, F]``,
    or a packed batch's ``[N, F]`` with each sequence reversed within its own
    length). A call each where the stack is by far the larger copy: a short
    sequence under large weights, where it took half the call
    (docs/performance.md, "A call per direction"). ``LLTM_DIRECTIONS=calls``
    asks for it, ``together`` and ``apart`` (the op's) for one call.
    """
    if torch.compiler.is_compiling():
        return False  # a traced graph keeps one op per layer
    setting = os.environ.get("LLTM_DIRECTIONS", "")
    if setting:
        # The op checks the setting at every call, so a bad one raises there.
        return setting == "calls"
    if x.device.type != "cpu":
        # CUDA copies the weights at memory speed and runs the directions on
        # two streams.
        return False
    rows, features = math.prod(x.shape[:-1]), x.shape[-1]
    state = weights.shape[0] // 3
    # The stack copies 2 x 3 S (S + F), a call each rows x (F + 3 S) (the
    # reversals, the output's cat) and runs the directions one after the
    # other: measured, a call each won from 34 times the reversals' copy and
    # lost up to 35% below 3 (docs/performance.md). One rule for training and
    # inference, so that both compute the same bits.
    return 2 * weights.numel() > _STACK_OVER_FLIPS * rows * (features + 3 * state)


def _reversed_rows(batch_sizes: Tensor) -> Tensor:
    """For each row of a packed batch (step t of sequence r), the row of step length_r - 1 - t.

    Each sequence reversed within its own length keeps every length, so the
    reversed batch has the same ``batch_sizes``; the map is its own inverse.
    """
    offsets = torch.cumsum(batch_sizes, 0) - batch_sizes
    step = torch.repeat_interleave(torch.arange(batch_sizes.numel()), batch_sizes)
    sequence = torch.arange(step.numel()) - offsets[step]
    lengths = (batch_sizes.unsqueeze(0) > torch.arange(int(batch_sizes[0])).unsqueeze(1)).sum(1)
    return offsets[lengths[sequence] - 1 - step] + sequence


def _call_per_direction(
    x: Tensor,
    forward: tuple[Tensor, Tensor],
    backward: tuple[Tensor, Tensor],
    h: Tensor,
    c: Tensor,
    batch_sizes: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """A bidirectional layer as two one-direction calls, ``backward``'s on ``x`` reversed."""
    if batch_sizes is None:
        reverse = functools.partial(torch.flip, dims=(0,))
    else:
        rows = _reversed_rows(batch_sizes).to(x.device)
        reverse = functools.partial(torch.index_select, dim=0, index=rows)
    (weights, bias), (weights_r, bias_r) = forward, backward
    out, h_f, c_f = _sequence(x, weights[None], bias[None], h[:1], c[:1], batch_sizes)
    out_r, h_r, c_r = _sequence(
        reverse(x), weights_r[None], bias_r[None], h[1:], c[1:], batch_sizes
    )
    return torch.cat((out, reverse(out_r)), -1), torch.cat((h_f, h_r)), torch.cat((c_f, c_r))


class LLTMLayer(nn.Module):
    """A stack of LLTM layers run over whole sequences, like ``nn.LSTM``.

    Each layer is one call of :func:`lltm.lltm_sequence`, both directions of
    a bidirectional layer included, whose backward (backprop through time)
    runs in C++. Layer ``k > 0`` takes the outputs of layer ``k - 1`` as its
    input.

    Args:
        input_features: size of each input row.
        state_size: size of the hidden and cell state of every layer.
        num_layers: how many layers are stacked.
        batch_first: a tensor input and output are ``[batch, steps, ...]``
            rather than ``[steps, batch, ...]`` (not the states, nor a
            ``PackedSequence``, as in ``nn.LSTM``).
        bias: whether the layers have a bias; without, it is zero.
        dropout: the probability of zeroing each element of every layer's
            output but the last's, in training mode (``nn.LSTM``'s dropout).
        bidirectional: each layer also runs from the last step to the first,
            and its output is both directions' ``h_t`` side by side.
        device, dtype: where and how the parameters are made.

    Attributes:
        weights_l{k}: ``[3 * state_size, state_size + in_k]``, layer ``k``'s
            weights in the cell's layout (``in_0 = input_features``, else
            ``state_size * directions``): ``LLTM`` cell weights load as they
            are.
        bias_l{k}: ``[1, 3 * state_size]``, when ``bias``.
        weights_l{k}_reverse, bias_l{k}_reverse: the reverse direction's,
            with ``bidirectional``.

    Call ``layer(input, (h0, c0))`` or ``layer(input)`` (zero states):

    * input: ``[steps, batch, input_features]`` (``[batch, steps, ...]`` with
      ``batch_first``), ``[steps, input_features]`` unbatched, or a
      ``PackedSequence`` (``torch.nn.utils.rnn.pack_padded_sequence``) of
      sequences of different lengths, each of which stops at its own;
    * h0, c0: ``[num_layers * directions, batch, state_size]`` (``[num_layers
      * directions, state_size]`` unbatched), in ``nn.LSTM``'s order: layer 0,
      its reverse direction, layer 1, ...

    It returns ``(output, (h_n, c_n))``: the last layer's ``h_t`` of every
    step (both directions', ``directions * state_size`` features), shaped as
    the input (a ``PackedSequence`` for one), and each layer's and
    direction's state after its last step, shaped as ``h0``.

    Example:
        >>> layer = LLTMLayer(32, 128, num_layers=2, bidirectional=True)
        >>> output, (h_n, c_n) = layer(torch.randn(64, 16, 32))
        >>> output.shape, h_n.shape
        (torch.Size([64, 16, 256]), torch.Size([4, 16, 128]))
    """

    def __init__(
        self,
        input_features: int,
        state_size: int,
        num_layers: int = 1,
        batch_first: bool = False,
        bias: bool = True,
        *,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if input_features < 0 or state_size < 0 or num_layers < 1:
            msg = (
                "LLTMLayer: expected input_features >= 0, state_size >= 0 and "
                f"num_layers >= 1, but got input_features={input_features}, "
                f"state_size={state_size}, num_layers={num_layers}"
            )
            raise ValueError(msg)
        if (
            not isinstance(dropout, numbers.Real)
            or isinstance(dropout, bool)
            or not 0 <= dropout <= 1
        ):
            msg = (
                "LLTMLayer: expected dropout to be a number in [0, 1], the probability "
                f"of zeroing an element, but got {dropout!r}"
            )
            raise ValueError(msg)
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "LLTMLayer: dropout applies between layers, after all but the last, so "
                f"dropout={dropout} with num_layers=1 drops nothing",
                stacklevel=2,
            )
        self.input_features = input_features
        self.state_size = state_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.bias = bias
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        directions = 2 if bidirectional else 1
        factory = {"device": device, "dtype": dtype}
        for k in range(num_layers):
            features = input_features if k == 0 else state_size * directions
            for suffix in ("", "_reverse")[:directions]:
                weights = torch.empty(3 * state_size, state_size + features, **factory)
                self.register_parameter(f"weights_l{k}{suffix}", nn.Parameter(weights))
                b = torch.empty(1, 3 * state_size, **factory)
                if bias:
                    self.register_parameter(f"bias_l{k}{suffix}", nn.Parameter(b))
                else:
                    self.register_buffer(f"bias_l{k}{suffix}", b.zero_(), persistent=False)
        self.reset_parameters()

    @property
    def directions(self) -> int:
        """2 for a bidirectional layer, else 1."""
        return 2 if self.bidirectional else 1

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

    def layer_parameters(self, k: int, *, reverse: bool = False) -> tuple[Tensor, Tensor]:
        """Layer ``k``'s ``(weights, bias)`` (its reverse direction's with ``reverse``).

        The bias is a zero buffer without ``bias``.
        """
        suffix = "_reverse" if reverse else ""
        return getattr(self, f"weights_l{k}{suffix}"), getattr(self, f"bias_l{k}{suffix}")

    def all_parameters(self) -> list[tuple[Tensor, Tensor]]:
        """Every layer's and direction's ``(weights, bias)``, in ``nn.LSTM``'s order.

        Layer 0, its reverse direction (when bidirectional), layer 1, ...: what
        :func:`lltm.reference.lltm_layer_reference` takes.
        """
        return [
            self.layer_parameters(k, reverse=d == 1)
            for k in range(self.num_layers)
            for d in range(self.directions)
        ]

    def _check_states(self, hx: object, want: list[int], layout: str) -> tuple[Tensor, Tensor]:
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            msg = "LLTMLayer: expected the state to be a tuple (h0, c0)"
            raise TypeError(msg)
        for name, t in zip(("h0", "c0"), hx, strict=True):
            if not isinstance(t, Tensor):
                msg = f"LLTMLayer: expected {name} to be a tensor, but got {type(t).__name__}"
                raise TypeError(msg)
            if t.layout != torch.strided or t.is_nested:
                # Each layer takes a slice of the states, which sparse tensors cannot give.
                got = "a nested tensor" if t.is_nested else f"a tensor of layout {t.layout}"
                msg = f"LLTMLayer: expected {name} to be a strided tensor, but got {got}"
                raise TypeError(msg)
            if list(t.shape) != want:
                msg = (
                    f"LLTMLayer: expected {name} to have shape {layout} = {want}, "
                    f"but got {list(t.shape)}"
                )
                raise ValueError(msg)
        return hx[0], hx[1]

    @overload
    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]: ...

    @overload
    def forward(
        self, input: PackedSequence, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[PackedSequence, tuple[Tensor, Tensor]]: ...

    def forward(
        self,
        input: Tensor | PackedSequence,  # noqa: A002 - nn.LSTM's name
        hx: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor | PackedSequence, tuple[Tensor, Tensor]]:
        """Run every layer over the sequences: ``(output, (h_n, c_n))``."""
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
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
        check_input("LLTMLayer", "the layer's", input, self.input_features, self.weights_l0)
        unbatched = input.dim() == 2
        x = (
            input.unsqueeze(1)
            if unbatched
            else (input.transpose(0, 1) if self.batch_first else input)
        )
        batch = x.shape[1]
        stacked = self.num_layers * self.directions
        if hx is None:
            h0 = c0 = None
        elif unbatched:
            h0, c0 = self._check_states(
                hx, [stacked, self.state_size], "[num_layers * directions, state_size]"
            )
            h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
        else:
            h0, c0 = self._check_states(
                hx,
                [stacked, batch, self.state_size],
                "[num_layers * directions, batch, state_size]",
            )
        x, hidden, cell = self._run(x, batch, h0, c0, None)
        if unbatched:
            return x.squeeze(1), (hidden.squeeze(1), cell.squeeze(1))
        output = x.transpose(0, 1) if self.batch_first else x
        return output, (hidden, cell)

    def _forward_packed(
        self, sequences: PackedSequence, hx: tuple[Tensor, Tensor] | None
    ) -> tuple[PackedSequence, tuple[Tensor, Tensor]]:
        """A packed batch: the op takes its data and batch_sizes; sorted by length inside."""
        data, batch_sizes, sorted_indices, unsorted_indices = sequences
        if data.dim() != 2:
            msg = (
                "LLTMLayer: expected a PackedSequence's data to be a 2-D tensor "
                f"[sum(batch_sizes), input_features], but got a {data.dim()}-D tensor "
                f"of shape {list(data.shape)}"
            )
            raise ValueError(msg)
        check_input("LLTMLayer", "the layer's", data, self.input_features, self.weights_l0)
        # The batch, from the indices' size where there are some (no data read).
        batch = sorted_indices.numel() if sorted_indices is not None else int(batch_sizes[0])
        if hx is None:
            h0 = c0 = None
        else:
            h0, c0 = self._check_states(
                hx,
                [self.num_layers * self.directions, batch, self.state_size],
                "[num_layers * directions, batch, state_size]",
            )
            if sorted_indices is not None:
                # The states follow the sequences, which the op takes sorted by length.
                h0, c0 = h0.index_select(1, sorted_indices), c0.index_select(1, sorted_indices)
        x, hidden, cell = self._run(data, batch, h0, c0, batch_sizes)
        if unsorted_indices is not None:
            hidden = hidden.index_select(1, unsorted_indices)
            cell = cell.index_select(1, unsorted_indices)
        return PackedSequence(x, batch_sizes, sorted_indices, unsorted_indices), (hidden, cell)

    def _run(
        self,
        x: Tensor,
        batch: int,
        h0: Tensor | None,
        c0: Tensor | None,
        batch_sizes: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Every layer, one op call each: the last output, and h_n and c_n of them all."""
        directions = self.directions
        if h0 is None or c0 is None:
            # One zero state for every layer and both halves: a call's fixed
            # host cost is what short sequences pay (docs/performance.md).
            zeros = x.new_zeros(directions, batch, self.state_size)
        h_n, c_n = [], []
        for k in range(self.num_layers):
            # The op's form with a direction dimension: each layer's states
            # come out [directions, batch, state], h_n's own rows, not views.
            layers = slice(directions * k, directions * (k + 1))
            h, c = (zeros, zeros) if h0 is None or c0 is None else (h0[layers], c0[layers])
            if k > 0 and self.dropout > 0 and self.training:
                x = F.dropout(x, self.dropout, training=True)
            forward = self.layer_parameters(k)
            backward = self.layer_parameters(k, reverse=True) if directions == 2 else None
            if backward is None:
                weights, bias = (t.unsqueeze(0) for t in forward)
                x, h, c = _sequence(x, weights, bias, h, c, batch_sizes)
            elif _wants_a_call_per_direction(x, forward[0]):
                x, h, c = _call_per_direction(x, forward, backward, h, c, batch_sizes)
            else:
                weights = torch.stack((forward[0], backward[0]))
                bias = torch.stack((forward[1], backward[1]))
                x, h, c = _sequence(x, weights, bias, h, c, batch_sizes)
            h_n.append(h)
            c_n.append(c)
        hidden = h_n[0] if self.num_layers == 1 else torch.cat(h_n)
        cell = c_n[0] if self.num_layers == 1 else torch.cat(c_n)
        return x, hidden, cell

    def extra_repr(self) -> str:
        """The sizes and options, shown by ``repr``."""
        text = (
            f"input_features={self.input_features}, state_size={self.state_size}, "
            f"num_layers={self.num_layers}, batch_first={self.batch_first}, bias={self.bias}"
        )
        if self.dropout:
            text += f", dropout={self.dropout}"
        if self.bidirectional:
            text += ", bidirectional=True"
        return text
