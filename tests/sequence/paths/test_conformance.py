"""Every registered sequence path, on its device: the conformance suite.

The paths come from lltm's own table (:func:`lltm.sequence_paths`), so a new
path is tested here without a line of this file changing. Each is forced with
LLTM_SEQUENCE_PATH, proven to have run through the profiler's ranges
(:func:`lltm.paths_that_ran`), and checked against the float64 reference at
its dtype's tolerance (float32, or the dtype the path takes where it refuses
float32): at each kernel's edges (one step, batch 1, state 1,
sizes past a vector or a tile), in both directions and on packed batches,
bit for bit when run again, and with the inference forward equal to the
training one. Where a path's plan refuses a dtype, forcing it raises with the
plan's own reason.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import lltm
from helpers import TOLERANCES, assert_close_to_reference
from lltm.reference import lltm_layer_reference
from sequences import (
    CPU_PATHS,
    CUDA_PATHS,
    assert_trains_like_the_reference,
    layer_and_input,
    make_sequence,
    path_dtype,
    plan_or_reason,
    plans_that_ran,
    reference_with_grads,
    set_device_path,
    shape_id,
    skip_unless_it_runs,
    train,
    with_grads,
)

DEVICE_PATH = [
    *(pytest.param(("cpu", p), id=f"cpu-{p}") for p in CPU_PATHS),
    *(pytest.param(("cuda", p), id=f"cuda-{p}", marks=pytest.mark.cuda) for p in CUDA_PATHS),
]

# (steps, batch, features, state): one step, batch 1, state 1, states and
# batches that are no multiple of a vector, a row block or a tile, and a
# state of several panels.
SHAPES = [(1, 3, 4, 16), (5, 1, 3, 33), (4, 9, 5, 1), (3, 17, 6, 17), (6, 8, 7, 130)]

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.fixture(params=DEVICE_PATH)
def device_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(device, path), with LLTM_SEQUENCE_PATH set to the path."""
    device, path = request.param
    set_device_path(monkeypatch, device, path)
    return device, path


def path_of(plans: list[str]) -> set[str]:
    return {p.split("/")[0] for p in plans}


@pytest.mark.parametrize("size", SHAPES, ids=str)
def test_runs_and_matches_the_reference(
    device_path: tuple[str, str], size: tuple[int, int, int, int]
) -> None:
    device, path = device_path
    dtype = path_dtype(path, device)
    skip_unless_it_runs(path, device, dtype, size)
    layer, x = layer_and_input(size, device=device, dtype=dtype)
    x = x.to(dtype)
    ran = lltm.paths_that_ran(lambda: train(layer, x))
    assert path_of(ran["forward"]) == path_of(ran["backward"]) == {path}, ran
    got = assert_trains_like_the_reference(layer, x)
    # Bit for bit again, and the inference forward equals the training one.
    for g, again in zip(got, train(layer, x), strict=True):
        assert torch.equal(g, again)
    with torch.inference_mode():
        output, (h_n, c_n) = layer(x)
    with torch.inference_mode():
        inference = lltm.paths_that_ran(lambda: layer(x))
    assert path_of(inference["forward"]) == {path}
    assert torch.equal(output, got[0])
    assert torch.equal(h_n, got[1])
    assert torch.equal(c_n, got[2])


def test_runs_both_directions_and_packed_batches(device_path: tuple[str, str]) -> None:
    device, path = device_path
    dtype = path_dtype(path, device)
    skip_unless_it_runs(path, device, dtype, (7, 5, 20, 20))
    torch.manual_seed(3)
    layer = lltm.LLTMLayer(5, 20, num_layers=2, bidirectional=True, device=device, dtype=dtype)
    sequences = [torch.randn(n, 5, device=device, dtype=dtype) for n in (7, 3, 7, 1, 5)]
    packed = pack_sequence(sequences, enforce_sorted=False)
    ran = lltm.paths_that_ran(lambda: layer(packed))
    assert path_of(ran["forward"]) == {path}
    out, (h_n, c_n) = layer(packed)
    params = [[layer.layer_parameters(k, reverse=r) for r in (False, True)] for k in range(2)]
    flat = [[p.detach().double().cpu() for p in pair] for layers in params for pair in layers]
    want, (want_h, want_c) = lltm_layer_reference(
        pack_sequence([s.double().cpu() for s in sequences], enforce_sorted=False),
        flat,
        None,
        bidirectional=True,
    )
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(out.data.double().cpu(), want.data, **tol)
    torch.testing.assert_close(h_n.double().cpu(), want_h, **tol)
    torch.testing.assert_close(c_n.double().cpu(), want_c, **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_dtype_runs_or_is_refused_with_the_plans_reason(
    device_path: tuple[str, str], dtype: torch.dtype
) -> None:
    device, path = device_path
    size = (4, 3, 5, 8)
    plan, why = plan_or_reason(path, device, dtype, size)
    if plan is None:
        layer, x = layer_and_input(size, device=device, dtype=dtype)
        with pytest.raises(
            RuntimeError,
            match=re.escape(f"LLTM_SEQUENCE_PATH={path}, but the {path} path cannot run")
            + ".*"
            + re.escape(why),
        ):
            layer(x.to(dtype))
        return
    layer, x = layer_and_input(size, device=device, dtype=dtype)
    ran = lltm.paths_that_ran(lambda: train(layer, x.to(dtype)))
    assert path_of(ran["forward"] + ran["backward"]) == {path}
    assert_trains_like_the_reference(layer, x.to(dtype))


def test_the_plan_that_runs_is_the_plan_lltm_paths_names(device_path: tuple[str, str]) -> None:
    """lltm.paths.plan() and the run agree: what a benchmark or a test asks is what runs."""
    device, path = device_path
    size = (6, 8, 7, 32)
    dtype = path_dtype(path, device)
    skip_unless_it_runs(path, device, dtype, size)
    layer, x = layer_and_input(size, device=device, dtype=dtype)
    ran = lltm.paths_that_ran(lambda: train(layer, x.to(dtype)))
    for backward, plans in ((False, ran["forward"]), (True, ran["backward"])):
        assert plans == [plan_or_reason(path, device, dtype, size, backward=backward)[0]]


DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "shape", [(16, 16, 32, 128), (5, 96, 16, 100), (3, 300, 8, 256)], ids=shape_id
)
def test_every_path_of_a_device_agrees(
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    dtype: torch.dtype,
    shape: tuple[int, int, int, int],
) -> None:
    """Each path gives the same numbers, to rounding; one that cannot run says why."""
    args = make_sequence(*shape, device=device, dtype=dtype)
    want = reference_with_grads(args)
    for path in lltm.sequence_paths(device):
        monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
        refusals = [plan_or_reason(path, device, dtype, shape, backward=b)[1] for b in (0, 1)]
        if any(refusals):
            with pytest.raises(RuntimeError, match=re.escape(next(r for r in refusals if r))):
                with_grads(lltm.lltm_sequence, args)
            continue
        forward, backward_plans = plans_that_ran(args)
        assert path_of(forward + backward_plans) == {path}
        for g, w in zip(with_grads(lltm.lltm_sequence, args), want, strict=True):
            assert_close_to_reference(g.cpu(), w)
