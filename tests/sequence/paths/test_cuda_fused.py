"""CUDA's fused path: each kernel of its plans at its edges, proven by the plan that ran.

The plans (cuda/sequence/fused/plan.cu): float32's steps on CUDA cores, W_h
read in chunks or held in shared memory; float16's and bfloat16's on tensor
cores where the GPU has them for the type; every step in one cooperative
launch where the grid fits at once, else a launch per step. The tiles named
below are those an H200 (132 multiprocessors) takes; on any GPU, what runs
is the plan lltm.paths.plan names, of the kernel the test is named after.
"""

from __future__ import annotations

import pytest
import torch

from sequences import (
    assert_ran_the_named_plans,
    make_sequence,
    matches_the_reference_bit_for_bit,
    shape_id,
)

pytestmark = pytest.mark.cuda

# The capability from which a type's steps run on tensor cores.
TENSOR_CORES = {torch.float16: (7, 0), torch.bfloat16: (8, 0)}


# Each of the fused kernel's tiles, by the sizes that select it on a GPU of
# 132 multiprocessors (an H200), at its edges: rows and columns past a
# tile's end, one step, one row. A grid of at most two blocks per
# multiprocessor (264) runs every step in one cooperative launch, a larger
# one a launch per step.
FUSED_SHAPES = [
    (1, 1, 3, 20),  # the smallest tiles, one row, one step
    (2, 17, 5, 33),  # a row and a column past the smallest tiles: cooperative
    (5, 64, 8, 128),  # the smallest tiles, 64 and 32 blocks: cooperative, 5 steps
    (4, 16, 8, 512),  # cooperative, several rounds of chunks over k
    (3, 33, 5, 97),  # cooperative, odd sizes
    (2, 300, 8, 256),  # forward 16x32, 152 blocks: cooperative; backward 304: per step
    (9, 300, 8, 256),  # the same forward's 19 row tiles and their barriers, over 9 steps
    (2, 600, 4, 256),  # forward 16x32, 304 blocks: per step; backward 16x64: cooperative
    (1, 1023, 8, 512),  # forward 64x32, backward 16x64, a short last tile
    (2, 1200, 8, 510),  # forward 64x64, backward 64x64: cooperative
    (2, 2200, 4, 512),  # forward 64x64, 280 blocks: per step; backward 64x128: cooperative
    # float32's cooperative smallest tiles hold W_h in shared memory where the
    # state is a multiple of 4: one row past a tile, columns past the end, k
    # split unevenly over the groups (36); their largest grids at state 128
    # (forward 256 blocks, backward 128); forward 272 blocks: per step, the
    # backward held; state 512, whose backward takes 200 KB a block; 6 row
    # tiles, each with its own barrier, over 40 steps, the last tile short.
    (2, 17, 5, 36),
    (3, 256, 8, 128),
    (2, 264, 4, 128),
    (3, 16, 4, 512),
    (40, 90, 8, 128),
]


@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=shape_id)
def test_cuda_fused_tiles(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int, int]
) -> None:
    """float32's steps on CUDA cores: W_h in chunks, or held; the plan lltm.paths names."""
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    ran = matches_the_reference_bit_for_bit(
        make_sequence(*shape, device="cuda", dtype=torch.float32)
    )
    assert_ran_the_named_plans("fused", ran, shape, torch.float32, ("fused/chunked/", "fused/held"))


def test_cuda_fused_steps_with_unaligned_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """h0 and c0 four bytes into their storage: a plan of 16-byte copies of h_{t-1}
    (W_h held) takes an aligned copy of h0."""
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    args = make_sequence(3, 64, 8, 128, device="cuda", dtype=torch.float32)
    for k in (3, 4):
        state = args[k].detach()
        storage = torch.empty(state.numel() + 1, device="cuda", dtype=state.dtype)
        unaligned = storage[1:].view_as(state)
        unaligned.copy_(state)
        args[k] = unaligned.requires_grad_()
    assert args[3].data_ptr() % 16 != 0
    ran = matches_the_reference_bit_for_bit(args)
    assert_ran_the_named_plans(
        "fused", ran, (3, 64, 8, 128), torch.float32, ("fused/chunked/", "fused/held")
    )


# The tensor-core kernels of the fused steps (cuda/sequence/fused/mma.cu), which
# run float16 and bfloat16: each tile on a GPU of 132 multiprocessors, with
# 16-byte loads (state_size and state_size + input_features multiples of 8)
# and element by element, at the edges: one row, a row and a column past a
# tile, a short last tile, one step. A grid that fits on the GPU at once (up
# to 264 blocks of 256 threads on an H200) runs every step in one cooperative
# launch, a barrier per row tile between steps; a larger one a launch per step.
MMA_SHAPES = [
    (1, 1, 3, 20),  # the 16x16 tiles, one row, by element, one step
    (2, 17, 5, 33),  # a row and a column past them
    (3, 16, 8, 128),  # the 16x16 tiles, packed
    (2, 600, 8, 256),  # 32x32, packed, 152 blocks: cooperative
    (2, 600, 4, 250),  # 32x32, by element
    (2, 1100, 8, 512),  # 64x32, packed, 288 blocks: a launch per step
    (1, 1023, 7, 512),  # 64x32, by element (W_h's rows of 519), a short last tile
    (5, 256, 8, 256),  # the 16x16 tiles, 256 blocks: cooperative, 5 steps
    (2, 960, 8, 128),  # the 16x16 tiles, 480 blocks: a launch per step
    (3, 961, 8, 128),  # 32x32 on 124 of the 132 (the 16x16 would be 488): cooperative
    (12, 90, 8, 128),  # cooperative: 6 row tiles, each with its own barrier, over 12 steps
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", MMA_SHAPES, ids=shape_id)
def test_cuda_fused_tensor_core_tiles(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    if torch.cuda.get_device_capability() < TENSOR_CORES[dtype]:
        pytest.skip(
            f"{dtype}'s steps run on tensor cores from sm_{''.join(map(str, TENSOR_CORES[dtype]))}"
        )
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    ran = matches_the_reference_bit_for_bit(make_sequence(*shape, device="cuda", dtype=dtype))
    assert_ran_the_named_plans("fused", ran, shape, dtype, ("fused/mma/",))
