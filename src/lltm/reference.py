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
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

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
    input: torch.Tensor | PackedSequence,  # noqa: A002 - nn.LSTM's name
    parameters: Sequence[tuple[torch.Tensor, torch.Tensor]],
    hx: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    batch_first: bool = False,
    bidirectional: bool = False,
    dropout: float = 0.0,
    training: bool = False,
) -> tuple[torch.Tensor | PackedSequence, tuple[torch.Tensor, torch.Tensor]]:
    """:class:`lltm.LLTMLayer` as loops of the cell over its layers, directions, sequences and steps.

    Each sequence runs alone, over its own steps: the reverse direction from
    its own last step to its first.

    Args:
        input: ``[steps, batch, input_features]``, or ``[batch, steps,
            input_features]`` with ``batch_first``; or a ``PackedSequence``.
        parameters: each layer's ``(weights, bias)``, as
            :meth:`lltm.LLTMLayer.layer_parameters` gives them, in
            ``nn.LSTM``'s order: with ``bidirectional``, each layer's reverse
            direction after it.
        hx: ``(h0, c0)``, each ``[num_layers * directions, batch,
            state_size]``; None: zeros.
        batch_first: whether a tensor ``input`` and the output are batch-major.
        bidirectional: whether each layer has a reverse direction.
        dropout: the probability of zeroing an element of each layer's output
            but the last's, in ``training``. The masks are drawn as the layer
            draws them (on its outputs, packed where the input is), so that
            with the same seed both draw the same ones.
        training: whether dropout applies.

    Returns:
        ``(output, (h_n, c_n))`` as the layer returns them.
    """
    directions = 2 if bidirectional else 1
    layers = len(parameters) // directions
    packed = isinstance(input, PackedSequence)
    if packed:
        x, lengths = pad_packed_sequence(input)
        lengths_list = [int(n) for n in lengths]
    else:
        x = input.transpose(0, 1) if batch_first else input
        lengths_list = [x.shape[0]] * x.shape[1]
    steps, batch = x.shape[0], x.shape[1]
    state = parameters[0][0].shape[0] // 3
    if hx is None:
        zeros = x.new_zeros(layers * directions, batch, state)
        hx = (zeros, zeros)
    h_n, c_n = [], []
    for k in range(layers):
        outputs = []
        for d in range(directions):
            weights, bias = parameters[k * directions + d]
            h0, c0 = hx[0][k * directions + d], hx[1][k * directions + d]
            # An empty batch runs nothing: its state is h0's empty rows.
            rows, hs, cs = [x.new_zeros(steps, 0, state)], [h0[:0]], [c0[:0]]
            for b, length in enumerate(lengths_list):
                seq = x[:length, b : b + 1]
                seq = seq.flip(0) if d == 1 else seq
                out, h, c = lltm_sequence_reference(
                    seq, weights, bias, h0[b : b + 1], c0[b : b + 1]
                )
                rows.append(out.flip(0) if d == 1 else out)
                hs.append(h)
                cs.append(c)
            output = torch.cat([F.pad(r, (0, 0, 0, 0, 0, steps - r.shape[0])) for r in rows], 1)
            outputs.append(output)
            h_n.append(torch.cat(hs))
            c_n.append(torch.cat(cs))
        x = torch.cat(outputs, dim=-1)
        if dropout > 0 and training and k < layers - 1:
            if packed:
                data = pack_padded_sequence(x, lengths, enforce_sorted=False)
                dropped = data._replace(data=F.dropout(data.data, dropout, training=True))
                x, _ = pad_packed_sequence(dropped, total_length=steps)
            else:
                x = F.dropout(x, dropout, training=True)
    hidden = (torch.stack(h_n), torch.stack(c_n))
    if packed:
        return pack_padded_sequence(x, lengths, enforce_sorted=False), hidden
    return (x.transpose(0, 1) if batch_first else x), hidden
