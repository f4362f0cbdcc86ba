"""CUDA's rules: the paths' windows, a size on each side of each threshold.

Where CUDA does not measure (LLTM_TUNING=0, and inside a graph's capture
without a kept choice), auto takes the first path of its table (cluster,
persistent, fused, steps) whose window holds and whose plan runs the block.
The windows are restated here with their constants (cpp/sequence/cuda/): a
constant moved by a size fails this test. What the GPU decides (whether a
plan runs, a cluster's tile) comes from lltm.paths.plan.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import lltm
from helpers import assert_close_to_reference
from sequences import (
    make_sequence,
    plan_or_reason,
    plans_that_ran,
    reference_with_grads,
    shape_id,
    with_grads,
)

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("_rules")]


@pytest.fixture
def _rules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No measuring, and no measured choice kept from another test."""
    monkeypatch.setenv("LLTM_TUNING", "0")
    lltm.clear_path_choices()
    yield
    lltm.clear_path_choices()


# cluster.cpp
CLUSTER_MMA_MOST_FRAGMENTS = 512
CLUSTER_FLOAT_MOST_ITEMS = 224
CLUSTER_MOST_ITEMS = 256
# cuda/sequence/sequence.h: where the CUDA-core cluster's tiles are small
CLUSTER_SMALL_TILE = 160
# persistent.cpp
GRID_FLOAT_MOST_ELEMENTS = 1024
GRID_MOST_ELEMENTS = 4096
GRID_MOST_BATCH = 16
# fused.cpp
FUSED_TENSOR_CORE_MOST_MACS = 2**29
FUSED_16BIT_MOST_MACS = 2**24
FUSED_MOST_MACS = 2**26

Shape = tuple[int, int, int, int]


def on_tensor_cores(dtype: torch.dtype) -> bool:
    """Whether the fused steps of the type run on this GPU's tensor cores."""
    first = {torch.float16: (7, 0), torch.bfloat16: (8, 0)}.get(dtype)
    return first is not None and torch.cuda.get_device_capability() >= first


def plan(path: str, shape: Shape, dtype: torch.dtype, backward: bool) -> str | None:
    return plan_or_reason(path, "cuda", dtype, shape, backward=backward)[0]


def simt_items(plan_name: str | None) -> int | None:
    """A CUDA-core cluster's items a block ("cluster/simt/<rows>x<columns>"), else None."""
    if plan_name is None or not plan_name.startswith("cluster/simt/"):
        return None
    rows, columns = plan_name.rsplit("/", 1)[1].split("x")
    return int(rows) * int(columns)


def cluster_window(shape: Shape, dtype: torch.dtype, backward: bool) -> bool:
    _, batch, _, state = shape
    if on_tensor_cores(dtype):
        if batch * -(-state // 16) <= CLUSTER_MMA_MOST_FRAGMENTS:
            return True
        # Beyond, where the CUDA cores' tiles are small in both directions.
        items = [simt_items(plan("cluster", shape, dtype, b)) for b in (False, True)]
        return all(i is not None and i <= CLUSTER_SMALL_TILE for i in items)
    items = simt_items(plan("cluster", shape, dtype, backward))
    most = CLUSTER_FLOAT_MOST_ITEMS if dtype == torch.float32 else CLUSTER_MOST_ITEMS
    return items is not None and items <= most


def persistent_window(shape: Shape, dtype: torch.dtype) -> bool:
    _, batch, _, state = shape
    if on_tensor_cores(dtype):
        return False
    elements = batch * state
    if dtype == torch.float64:
        return elements <= GRID_MOST_ELEMENTS or batch <= GRID_MOST_BATCH
    if dtype == torch.float32:
        return elements <= GRID_FLOAT_MOST_ELEMENTS
    return batch <= GRID_MOST_BATCH and elements <= GRID_MOST_ELEMENTS


def fused_window(shape: Shape, dtype: torch.dtype) -> bool:
    _, batch, _, state = shape
    if on_tensor_cores(dtype):
        most = FUSED_TENSOR_CORE_MOST_MACS
    else:
        most = FUSED_16BIT_MOST_MACS if dtype.itemsize == 2 else FUSED_MOST_MACS
    return batch * 3 * state * state <= most


def expected_path(shape: Shape, dtype: torch.dtype, backward: bool) -> str:
    windows = {
        "cluster": lambda: cluster_window(shape, dtype, backward),
        "persistent": lambda: persistent_window(shape, dtype),
        "fused": lambda: fused_window(shape, dtype),
        "steps": lambda: True,
    }
    assert list(windows) == lltm.sequence_paths("cuda")
    for path, window in windows.items():
        if window() and plan(path, shape, dtype, backward) is not None:
            return path
    msg = "steps runs every block"
    raise AssertionError(msg)


# A size on each side of each threshold on an H200 (132 multiprocessors, 7
# CUDA-core clusters at once at state 128): the grid in one block up to 256
# elements of batch * state; the cluster's items (batch 196 and 197 at state
# 128) and fragments (batch 32 and 33, 64 and 65 at state 128); the grid's
# batch and elements; the fused steps' multiply-adds; cuBLAS beyond.
AUTO_EDGES = [
    (3, 2, 4, 128),
    (3, 3, 4, 128),
    (3, 8, 4, 128),
    (3, 9, 4, 128),
    (3, 16, 4, 256),
    (2, 8, 4, 256),  # float32: two tiles of 4 rows
    (2, 9, 4, 256),
    (3, 8, 4, 512),
    (3, 9, 4, 512),
    (3, 16, 4, 512),
    (3, 17, 4, 256),
    (2, 16, 4, 128),
    (2, 17, 4, 128),
    (2, 32, 4, 128),
    (2, 33, 4, 128),
    (2, 64, 4, 128),
    (2, 65, 4, 128),
    (2, 140, 4, 128),
    (2, 141, 4, 128),
    (2, 196, 4, 128),
    (2, 197, 4, 128),
    (3, 17, 4, 512),
    (2, 341, 4, 256),
    (2, 342, 4, 256),
    (2, 341, 4, 128),
    (2, 342, 4, 128),
    (2, 682, 4, 512),
    (2, 683, 4, 512),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", AUTO_EDGES, ids=shape_id)
def test_auto_takes_the_path_its_rules_give(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: Shape
) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "auto")
    args = make_sequence(*shape, device="cuda", dtype=dtype)
    # The path the rules give, and the variant that path plans for the block.
    for is_backward, plans in zip((False, True), plans_that_ran(args), strict=True):
        path = expected_path(shape, dtype, is_backward)
        want, why = plan_or_reason(path, "cuda", dtype, shape, backward=is_backward)
        assert plans == [want], why
    for got, want in zip(
        with_grads(lltm.lltm_sequence, args), reference_with_grads(args), strict=True
    ):
        assert_close_to_reference(got.cpu(), want)


def test_auto_reports_its_rules_in_path_choices() -> None:
    args = make_sequence(3, 8, 4, 128, device="cuda", dtype=torch.float32)
    forward, _ = plans_that_ran(args)
    choices = [c for c in lltm.path_choices() if c["key"].startswith("cuda|")]
    assert {c["source"] for c in choices} == {"rules"}
    forward_choice = next(c for c in choices if "|forward|" in c["key"])
    gpu = torch.cuda.get_device_name()
    assert forward_choice["key"] == f"cuda|Float|forward|gpu={gpu}|T=3|B=8|F=4|S=128"
    assert [forward_choice["plan"]] == forward
