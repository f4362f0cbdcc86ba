"""The GEMMs around the CPU's blocks (cpp/sequence/cpu/gemm.cpp).

The input's projection and d_input each run through at::mm or oneDNN's
matmul, whichever measured faster for the GEMM's shape at its first call; the
choice is kept like a block's path, under a ``|gemm|`` key of
``lltm.path_choices()``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import lltm
from lltm import _C
from sequences import assert_trains_like_the_reference, layer_and_input, plan_or_reason, train

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this build of torch has no oneDNN"
)

# M = T * B = 1024 rows, K = 64 features, N = 3 * 96 gate columns: work enough to be measured.
SIZE = (64, 16, 64, 96)
THREADS = torch.get_num_threads()
PROJECTION = f"cpu|Float|gemm|threads={THREADS}|M=1024|K=64|N=288"
D_INPUT = f"cpu|Float|gemm|threads={THREADS}|M=1024|K=288|N=64"


@pytest.fixture(autouse=True)
def _fresh_choices(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # A path whose blocks read the projection (fused_input's run it in their steps).
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "steps")
    lltm.clear_path_choices()
    yield
    lltm.clear_path_choices()


def gemm_choices() -> dict[str, lltm.PathChoice]:
    return {c["key"]: c for c in lltm.path_choices() if "|gemm|" in c["key"]}


def test_the_projection_and_d_input_each_measure_both_libraries_once() -> None:
    layer, x = layer_and_input(SIZE)
    first = train(layer, x)
    choices = gemm_choices()
    assert {PROJECTION, D_INPUT} <= set(choices)
    for c in choices.values():
        assert c["source"] == "measured"
        assert [name for name, _ in c["times_us"]] == ["aten", "onednn"]
        assert all(t > 0 for _, t in c["times_us"])
        assert c["path"] == min(c["times_us"], key=lambda nt: nt[1])[0]
    # The next call keeps every choice (bit for bit the same results), and
    # another T and B of the same bucket share them.
    again = train(layer, x)
    for g, want in zip(again, first, strict=True):
        assert torch.equal(g, want)
    train(layer, torch.randn(16, 60, 64))
    assert gemm_choices() == choices


@pytest.mark.parametrize("library", ["aten", "onednn"])
def test_either_library_trains_like_the_reference(library: str) -> None:
    layer, x = layer_and_input(SIZE)
    # A kept choice (as from the disk's cache) is what runs.
    _C._load_path_choices([(PROJECTION, library), (D_INPUT, library)])
    assert_trains_like_the_reference(layer, x)
    chosen = gemm_choices()
    assert chosen[PROJECTION]["path"] == chosen[D_INPUT]["path"] == library
    assert chosen[PROJECTION]["source"] == "cache"


def test_without_tuning_onednn_runs_unmeasured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLTM_TUNING", "0")
    layer, x = layer_and_input(SIZE)
    with torch.no_grad():
        layer(x)
    (projection,) = gemm_choices().values()
    assert projection["key"] == PROJECTION
    assert (projection["path"], projection["source"], projection["times_us"]) == (
        "onednn",
        "rules",
        [],
    )


@pytest.mark.parametrize(
    ("size", "dtype"),
    [((8, 4, 16, 32), torch.float32), (SIZE, torch.float64)],
    ids=["small", "float64"],
)
def test_small_or_other_dtype_gemms_take_aten_without_a_choice(
    size: tuple[int, int, int, int], dtype: torch.dtype
) -> None:
    layer, x = layer_and_input(size, dtype=dtype)
    with torch.no_grad():
        layer(x.to(dtype))
    assert gemm_choices() == {}


def test_dpbf16_projects_bfloat16_in_float32_through_the_measured_gemm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its plan asks for the projection in float32 (its largest error, rounded): a float32 GEMM."""
    plan, why = plan_or_reason("dpbf16", "cpu", torch.bfloat16, SIZE)
    if plan is None:
        pytest.skip(why)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "dpbf16")
    layer, x = layer_and_input(SIZE, dtype=torch.bfloat16)
    with torch.no_grad():
        layer(x.to(torch.bfloat16))
    assert set(gemm_choices()) == {PROJECTION}


def test_a_stale_cached_library_is_measured_anew_and_replaced() -> None:
    """A line of the disk's cache naming no library (another version's) gives way, once."""
    _C._load_path_choices([(PROJECTION, "blas")])
    layer, x = layer_and_input(SIZE)
    with torch.no_grad():
        layer(x)
    projection = gemm_choices()[PROJECTION]
    assert projection["source"] == "measured"
    assert projection["path"] in ("aten", "onednn")
    with torch.no_grad():
        layer(x)
    assert gemm_choices()[PROJECTION] == projection
