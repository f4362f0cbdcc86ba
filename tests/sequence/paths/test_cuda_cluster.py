"""CUDA's cluster path (sm_90 on): each kernel of its plans at its edges, proven by
the plan that ran: on CUDA cores ("cluster/simt/<rows>x<columns>") and on tensor
cores ("cluster/mma"), and where it cannot hold a block, the reason.
"""

from __future__ import annotations

import pytest
import torch

import lltm
from helpers import assert_close_to_reference
from lltm.reference import lltm_sequence_reference
from sequences import (
    assert_ran_the_named_plans,
    make_sequence,
    matches_the_reference_bit_for_bit,
    plan_or_reason,
    set_device_path,
    shape_id,
    with_grads,
)

pytestmark = pytest.mark.cuda


# The cluster's kernels on CUDA cores (sm_90 on: 16 blocks of 512 threads) at
# the edges of their regime, in float32: one step, one row, states that leave
# blocks without a column (5, 33), and the shared memory's edge at state
# 512 (W_h's slice of 32 columns, and the double-buffered tile: batch 2 in
# the backward, 8 in the forward). On CUDA cores (float32) clusters take the
# batch in tiles of rows (64 items a block where those clusters run at once):
# two tiles (batch 16 at state 128), a short last tile (20), eight tiles
# (64), tiles grown to run at once (264 rows).
CLUSTER_SHAPES = [
    (1, 1, 3, 5),
    (3, 7, 5, 33),
    (4, 16, 8, 128),
    (3, 20, 4, 128),
    (2, 33, 4, 128),
    (3, 64, 4, 128),
    (2, 264, 4, 128),
    (3, 16, 4, 256),
    (2, 1, 8, 512),
    (5, 2, 8, 512),
]


# The cluster's kernels on tensor cores (cuda/sequence/persistent/cluster_mma.cu: float16
# and bfloat16, sm_90 on) at the edges of their regime: one row, one step;
# one column a block (state 5: four blocks, three without a column), blocks
# without a column (33, 200); a second row tile; the most fragments
# (batch x state / 16) the tensor cores take where the CUDA cores' tiles are
# small (256: batch 32 at state 128, 16 at 256); at state 512, where they are
# not, the most rows whose backward fits on tensor cores (16).
CLUSTER_MMA_SHAPES = [
    (1, 1, 3, 5),
    (3, 7, 5, 33),
    (4, 16, 8, 128),
    (2, 17, 4, 128),
    (3, 16, 3, 200),
    (2, 32, 4, 128),
    (2, 16, 4, 256),
    (3, 16, 8, 512),
]

# Sizes that the tensor-core kernels could hold, past 256 fragments where
# the CUDA cores' tiles are small in both directions: the cluster runs on
# CUDA cores there.
CLUSTER_SIMT_16_BIT_SHAPES = [(3, 30, 3, 200), (2, 128, 4, 128), (2, 48, 4, 256)]


# (dtype, shape, the plans' kernel): float32's clusters are on CUDA cores;
# float16's and bfloat16's on tensor cores where those fit, but at batch 1 on
# CUDA cores where those fit (their exchange is the faster one there), and
# on CUDA cores where their tiles are small.
EDGES = [
    *(
        pytest.param(torch.float32, s, "cluster/simt/", id=f"simt-{shape_id(s)}")
        for s in CLUSTER_SHAPES
    ),
    *(
        pytest.param(torch.float16, s, "cluster/", id=f"float16-{shape_id(s)}")
        for s in CLUSTER_SHAPES
    ),
    *(
        pytest.param(
            dtype, s, "cluster/" if s[1] == 1 else "cluster/mma", id=f"mma-{dtype}-{shape_id(s)}"
        )
        for dtype in (torch.float16, torch.bfloat16)
        for s in CLUSTER_MMA_SHAPES
    ),
    *(
        pytest.param(dtype, s, "cluster/simt/", id=f"simt-{dtype}-{shape_id(s)}")
        for dtype in (torch.float16, torch.bfloat16)
        for s in CLUSTER_SIMT_16_BIT_SHAPES
    ),
]


@pytest.mark.parametrize(("dtype", "shape", "kernel"), EDGES)
def test_cuda_cluster_kernels_at_their_edges(
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype,
    shape: tuple[int, int, int, int],
    kernel: str,
) -> None:
    set_device_path(monkeypatch, "cuda", "cluster")
    ran = matches_the_reference_bit_for_bit(make_sequence(*shape, device="cuda", dtype=dtype))
    assert_ran_the_named_plans("cluster", ran, shape, dtype, (kernel,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cuda_cluster_forward_on_tensor_cores_alone(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """Batch 32 at state 512: the forward fits on tensor cores, the backward does
    not, so only the inference forward runs there, saving nothing.
    """
    set_device_path(monkeypatch, "cuda", "cluster")
    shape = (3, 32, 4, 512)
    args = make_sequence(*shape, device="cuda", dtype=dtype, requires_grad=False)
    ran = lltm.paths_that_ran(lambda: lltm.lltm_sequence(*args))
    assert ran["forward"] == ["cluster/mma"]
    backward, _ = plan_or_reason("cluster", "cuda", dtype, shape, backward=True)
    assert backward != "cluster/mma"
    got = lltm.lltm_sequence(*args)
    want = lltm_sequence_reference(*[a.double().cpu() for a in args])
    for g, w in zip(got, want, strict=True):
        assert_close_to_reference(g.cpu(), w)
    for g, again in zip(got, lltm.lltm_sequence(*args), strict=True):
        assert torch.equal(g, again)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((2, 600, 4, 128), torch.float32),  # tiles of more items than threads
        ((2, 40, 8, 512), torch.float32),  # the backward's tile too large
        ((2, 600, 4, 128), torch.float16),  # too many rows for tensor cores too
    ],
    ids=lambda v: "T{}-B{}-F{}-S{}".format(*v) if isinstance(v, tuple) else str(v),
)
def test_cuda_cluster_refuses_what_it_cannot_hold(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int, int], dtype: torch.dtype
) -> None:
    set_device_path(monkeypatch, "cuda", "cluster")
    args = make_sequence(*shape, device="cuda", dtype=dtype)
    steps, batch, features, state = shape
    with pytest.raises(
        RuntimeError,
        match=f"LLTM_SEQUENCE_PATH=cluster, but the cluster path cannot run a (forward|backward) "
        f"of steps = {steps}, batch = {batch}, input_features = {features}, "
        f"state_size = {state} in {str(dtype).removeprefix('torch.')} here: ",
    ):
        with_grads(lltm.lltm_sequence, args)
