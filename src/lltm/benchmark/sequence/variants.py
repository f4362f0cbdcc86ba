"""The variants of a sequence run: the loops, the layer (default and forced paths), nn.LSTM."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import lltm
from lltm.reference import lltm_reference, lltm_sequence_reference

from .sizes import LayerOptions, packed_lengths

__all__ = [
    "CUDA_VARIANTS",
    "PACKED_VARIANTS",
    "PATH_VARIABLE",
    "SWEEP_VARIANTS",
    "VARIANTS",
    "Step",
    "Variant",
    "build_variants",
    "default_variants",
    "forced_path",
    "forced_paths",
    "forced_variants",
    "forcing",
    "not_applicable",
]

# The variable that forces a path, read by the op at each call; its errors name it.
PATH_VARIABLE = "LLTM_SEQUENCE_PATH"
# The device types whose forced paths VARIANTS lists, CUDA's first.
_DEVICE_TYPES = ("cuda", "cpu")
# A forced variant is this prefix and the path's name.
_FORCED_PREFIX = "layer-"


def forced_paths(device: str | torch.device) -> tuple[str, ...]:
    """The sequence paths of ``device``'s type that ``LLTM_SEQUENCE_PATH`` can force.

    lltm's own table (:func:`lltm.sequence_paths`; none for a device this
    build has no kernels for): the forced variants, ``layer-<path>``, are
    made from it.
    """
    return tuple(lltm.sequence_paths(device))


def forced_variants(device: str | torch.device) -> tuple[str, ...]:
    """``layer-<path>`` for each of :func:`forced_paths`: the layer with that path forced."""
    return tuple(_FORCED_PREFIX + path for path in forced_paths(device))


def forced_path(name: str, device: str | torch.device) -> str | None:
    """The path that variant ``name`` forces on ``device`` (None: it forces none there)."""
    return name.removeprefix(_FORCED_PREFIX) if name in forced_variants(device) else None


# Every device's forced variants, once each.
_FORCED = tuple(dict.fromkeys(v for d in _DEVICE_TYPES for v in forced_variants(d)))
VARIANTS = ("loop-python", "loop-lltm", "layer", "layer-padded", *_FORCED, "nn.LSTM")
CUDA_VARIANTS = forced_variants("cuda")
# The speedup goals' variants: the layer against nn.LSTM.
SWEEP_VARIANTS = ("layer", "nn.LSTM")
# The packed goal's variants.
PACKED_VARIANTS = ("layer", "layer-padded", "nn.LSTM")
# What a variant times: one forward, returning the tensor whose sum the backward starts from.
Step = Callable[[], Tensor]


@contextlib.contextmanager
def forcing(path: str | None) -> Iterator[None]:
    """Set LLTM_SEQUENCE_PATH for the calls inside (read by the op at each call)."""
    if path is None:
        yield
        return
    old = os.environ.get(PATH_VARIABLE)
    os.environ[PATH_VARIABLE] = path
    try:
        yield
    finally:
        if old is None:
            del os.environ[PATH_VARIABLE]
        else:
            os.environ[PATH_VARIABLE] = old


def not_applicable(
    name: str, options: LayerOptions, device: str | torch.device | None = None
) -> str | None:
    """Why variant ``name`` cannot run with ``options`` (and on ``device``, if given), or None."""
    if name.startswith("loop-") and (options.bidirectional or options.packed):
        return f"the loops run one direction over every step: not with {options.label}"
    if name == "layer-padded" and not options.packed:
        return "only with packed (the layer on the packed batch, padded)"
    if device is not None and name in _FORCED and forced_path(name, device) is None:
        paths = ", ".join(forced_paths(device)) or "none"
        path = name.removeprefix(_FORCED_PREFIX)
        return f"no {path} path on {torch.device(device).type} (its paths: {paths})"
    return None


def default_variants(device: str | torch.device, options: LayerOptions | None = None) -> list[str]:
    """The variants that :func:`run_sequence` runs when given none: all that apply here.

    The CPU's forced variants only on request: its default run stays short.
    """
    device = torch.device(device)
    options = options or LayerOptions()
    return [
        n
        for n in VARIANTS
        if not_applicable(n, options, device) is None
        and (device.type == "cuda" or n not in _FORCED)
    ]


@dataclass
class Variant:
    """One variant's forward, its forced path and the leaves whose grads it clears."""

    forward: Step
    path: str | None
    leaves: list[Tensor]
    # Facts for the variant's row (nn.LSTM: whether its weights are flat).
    info: dict[str, Any] = field(default_factory=dict)
    # Whether it calls the sequence op, whose paths its row then names.
    sequence_op: bool = False
    # Time the forward alone, under torch.inference_mode(), instead of step().
    inference: bool = False

    def clear_grads(self) -> None:
        """Drop the leaves' grads, so that the next backward writes fresh ones."""
        for t in self.leaves:
            t.grad = None

    def step(self) -> None:
        """One forward + backward; the grads land in the leaves' ``.grad``."""
        self.forward().sum().backward()

    def call(self) -> None:
        """What is timed: :meth:`step`, or with ``inference`` the forward alone, no graph."""
        if self.inference:
            with torch.inference_mode():
                self.forward()
        else:
            self.step()


def _inputs(
    x: Tensor, options: LayerOptions
) -> tuple[Tensor | PackedSequence, Tensor, Tensor | None]:
    """What the layer and nn.LSTM take, the leaf of it that needs grad, and the padded batch.

    Unpacked, ``x`` itself (made a leaf), and no padded batch. Packed, the
    batch zeroed past each sequence's end and packed once, here, so that the
    timed calls hold no packing; and a copy of it cut at the longest
    sequence (what ``pad_packed_sequence`` would give) for ``layer-padded``.
    """
    if not options.packed:
        return x.requires_grad_(), x, None
    steps, batch = x.shape[:2]
    lengths = packed_lengths(steps, batch, options.lengths_seed)
    inside = torch.arange(steps)[:, None] < lengths[None, :]
    x = x * inside.to(device=x.device, dtype=x.dtype).unsqueeze(-1)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    data = packed.data.detach().requires_grad_()
    sequences = PackedSequence(
        data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices
    )
    padded = x[: int(lengths.max())].detach().clone().requires_grad_()
    return sequences, data, padded


def build_variants(
    names: Sequence[str],
    steps: int,
    batch: int,
    features: int,
    state: int,
    dtype: torch.dtype,
    device: torch.device,
    options: LayerOptions | None = None,
) -> tuple[dict[str, Variant], dict[str, str]]:
    """The variants in ``names`` that can run here, and why the others cannot.

    Only what the named variants need is allocated: a sweep of the layer and
    nn.LSTM builds no cell.
    """
    options = options or LayerOptions()
    # Drawn on the device: the sweep's largest inputs would take seconds each on the CPU.
    gen = torch.Generator(device=device).manual_seed(42)
    x = torch.randn(steps, batch, features, generator=gen, device=device).to(dtype)
    source, leaf, padded = _inputs(x, options)

    def output_of(module: nn.Module) -> Step:
        # A packed output's data is all its steps (no padding to sum over).
        if isinstance(source, PackedSequence):
            return lambda: module(source)[0].data
        return lambda: module(source)[0]

    cases: dict[str, Variant] = {}
    errors = {n: why for n in names if (why := not_applicable(n, options, device)) is not None}
    names = [n for n in names if n not in errors]
    forced = {n: path for n in names if (path := forced_path(n, device)) is not None}
    layer: lltm.LLTMLayer | None = None
    if any(n in ("layer", "layer-padded") or n in forced for n in names):
        layer = lltm.LLTMLayer(features, state, bidirectional=options.bidirectional)
        layer.to(device=device, dtype=dtype)
    if any(n.startswith("loop-") for n in names):
        cell = lltm.LLTM(features, state).to(device=device, dtype=dtype)
        if layer is not None:
            with torch.no_grad():
                cell.weights.copy_(layer.weights_l0)
                cell.bias.copy_(layer.bias_l0)
        zeros = torch.zeros(batch, state, device=device, dtype=dtype)

        def loop(step: Callable[..., tuple[Tensor, Tensor]]) -> Step:
            return lambda: lltm_sequence_reference(
                x, cell.weights, cell.bias, zeros, zeros, cell=step
            )[0]

        leaves = [*cell.parameters(), x]
        loops = {"loop-python": lltm_reference, "loop-lltm": lltm.lltm}
        for name, fn in loops.items():
            if name in names:
                cases[name] = Variant(loop(fn), None, leaves)
    if layer is not None:
        leaves = [*layer.parameters(), leaf]
        for name in ("layer", *forced):
            if name in names:
                cases[name] = Variant(output_of(layer), forced.get(name), leaves, sequence_op=True)
        if "layer-padded" in names and padded is not None:
            cases["layer-padded"] = Variant(
                lambda: layer(padded)[0], None, [*layer.parameters(), padded], sequence_op=True
            )
    if "nn.LSTM" in names:
        lstm = nn.LSTM(features, state, bidirectional=options.bidirectional)
        lstm.to(device=device, dtype=dtype)
        # .to() may split the weights, which cuDNN then copies per call (bf16 stays split).
        lstm.flatten_parameters()
        # cuDNN copies no weights when they share one storage (the CPU has no such need: None).
        weights = getattr(lstm, "_flat_weights", None) or list(lstm.parameters())
        storages = {w.untyped_storage().data_ptr() for w in weights}
        flat = len(storages) == 1 if device.type == "cuda" else None
        cases["nn.LSTM"] = Variant(
            output_of(lstm), None, [*lstm.parameters(), leaf], {"weights_flat": flat}
        )
    return cases, errors
