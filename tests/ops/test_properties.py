"""Property-based tests (hypothesis) of the cell and of LLTMLayer against lltm.reference.

Random shapes (sizes 0 and 1 included), strides (transposed, sliced,
expanded), dtypes, both bias shapes; for the layer also the number of
layers, batch_first, given or omitted states and bias. Forward values and
every input gradient are compared with the float64 reference.

LLTM_HYPOTHESIS_PROFILE picks the number of examples: ``ci`` (the default:
300 for the cell and 200 for the layer per device, 500 on CPU), ``gpu``
(ten times as many, for the H200) or ``dev`` (a quick 30).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis", reason="pip install hypothesis (the test extra)")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lltm
from helpers import DEVICES, TOLERANCES, assert_close_to_reference, input_shapes
from lltm.reference import lltm_layer_reference, lltm_reference

SCALE = {"ci": 1, "gpu": 10, "dev": 0.1}[os.environ.get("LLTM_HYPOTHESIS_PROFILE", "ci")]
CELL_EXAMPLES = max(1, int(300 * SCALE))
LAYER_EXAMPLES = max(1, int(200 * SCALE))
COMMON = {
    "deadline": None,  # no timing: the first example of a dtype compiles nothing, but loads
    "derandomize": True,  # the same examples in every run: a failure is reproducible
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    "database": None,
}


def on_each_device(examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A property test (under ``@given``) run on each device with ``examples`` examples."""

    def wrap(test: Callable[..., None]) -> Callable[..., None]:
        with_settings = settings(max_examples=examples, **COMMON)(test)
        return pytest.mark.parametrize("device", DEVICES)(with_settings)

    return wrap


DTYPES = st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16])
LAYOUTS = st.sampled_from(["contiguous", "transposed", "sliced", "expanded"])


def _make(
    shape: tuple[int, ...], layout: str, dtype: torch.dtype, device: str, seed: int
) -> torch.Tensor:
    """A tensor of ``shape`` with the given memory layout, values from N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)

    if layout == "transposed" and len(shape) >= 2:
        return randn(*reversed(shape)).permute(*reversed(range(len(shape))))
    if layout == "sliced":
        return randn(*shape[:-1], 2 * shape[-1] + 1)[..., 1::2]
    if layout == "expanded" and len(shape) >= 1:
        # Stride 0 along the first dim: every row is the same row.
        return randn(1, *shape[1:]).expand(*shape)
    return randn(*shape)


def _tolerance_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in TOLERANCES else torch.float32


@on_each_device(CELL_EXAMPLES)
@given(
    batch=st.integers(0, 7),
    features=st.integers(0, 6),
    state=st.integers(0, 6),
    dtype=DTYPES,
    bias_1d=st.booleans(),
    layouts=st.lists(LAYOUTS, min_size=5, max_size=5),
    seed=st.integers(0, 2**31 - 1),
)
def test_cell_matches_the_reference(
    device: str,
    batch: int,
    features: int,
    state: int,
    dtype: torch.dtype,
    bias_1d: bool,
    layouts: list[str],
    seed: int,
) -> None:
    shapes = input_shapes(batch, features, state, bias_1d=bias_1d)
    args = [
        _make(shape, layout, dtype, device, seed + i).requires_grad_()
        for i, (shape, layout) in enumerate(zip(shapes, layouts, strict=True))
    ]
    new_h, new_cell = lltm.lltm(*args)
    assert new_h.dtype == dtype
    assert new_h.shape == new_cell.shape == (batch, state)
    args64 = [a.detach().double().requires_grad_() for a in args]
    want_h, want_cell = lltm_reference(*args64)
    assert_close_to_reference(new_h, want_h)
    assert_close_to_reference(new_cell, want_cell)
    got = torch.autograd.grad(new_h.sum() + 2 * new_cell.sum(), args, allow_unused=True)
    want = torch.autograd.grad(want_h.sum() + 2 * want_cell.sum(), args64, allow_unused=True)
    for g, w, a in zip(got, want, args64, strict=True):
        g = torch.zeros_like(a) if g is None else g  # noqa: PLW2901 - no path to the loss
        w = torch.zeros_like(a) if w is None else w  # noqa: PLW2901
        assert g.shape == a.shape
        assert_close_to_reference(g.to(_tolerance_dtype(dtype)), w)


@on_each_device(LAYER_EXAMPLES)
@given(
    steps=st.integers(0, 4),
    batch=st.integers(0, 4),
    features=st.integers(0, 5),
    state=st.integers(1, 5),
    num_layers=st.integers(1, 3),
    batch_first=st.booleans(),
    with_states=st.booleans(),
    bias=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    layout=LAYOUTS,
    seed=st.integers(0, 2**31 - 1),
)
def test_layer_matches_a_loop_of_the_reference(
    device: str,
    steps: int,
    batch: int,
    features: int,
    state: int,
    num_layers: int,
    batch_first: bool,
    with_states: bool,
    bias: bool,
    dtype: torch.dtype,
    layout: str,
    seed: int,
) -> None:
    torch.manual_seed(seed)
    layer = lltm.LLTMLayer(features, state, num_layers, batch_first=batch_first, bias=bias)
    layer.to(device=device, dtype=dtype)
    shape = (batch, steps, features) if batch_first else (steps, batch, features)
    x = _make(shape, layout, dtype, device, seed).requires_grad_()
    states = [
        _make((num_layers, batch, state), layout, dtype, device, seed + i).requires_grad_()
        for i in (1, 2)
    ]
    output, (h_n, c_n) = layer(x, tuple(states)) if with_states else layer(x)
    assert output.shape == (*shape[:2], state)
    assert h_n.shape == c_n.shape == (num_layers, batch, state)

    x64 = x.detach().double().requires_grad_()
    s64 = [s.detach().double().requires_grad_() for s in states]
    h0, c0 = (
        s64 if with_states else [torch.zeros(num_layers, batch, state, dtype=torch.float64)] * 2
    )
    parameters = [
        (w.detach().double(), b.detach().double())
        for w, b in map(layer.layer_parameters, range(num_layers))
    ]
    want_out, (want_h, want_c) = lltm_layer_reference(
        x64, parameters, (h0.to(device), c0.to(device)), batch_first=batch_first
    )
    for got, want in ((output, want_out), (h_n, want_h), (c_n, want_c)):
        assert_close_to_reference(got, want)

    inputs = [x, *states] if with_states else [x]
    inputs64 = [x64, *s64] if with_states else [x64]
    loss = output.sum() + 2 * h_n.sum() + 3 * c_n.sum()
    want_loss = want_out.sum() + 2 * want_h.sum() + 3 * want_c.sum()
    if not want_loss.requires_grad:
        return  # zero steps from zero states: nothing depends on the input
    got = torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True)
    want = torch.autograd.grad(want_loss, inputs64, allow_unused=True, materialize_grads=True)
    for g, w in zip(got, want, strict=True):
        assert_close_to_reference(g, w)
