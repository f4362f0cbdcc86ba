"""The fast cell: lltm::cell, its C++ autograd, the masked backward, the kernels' paths."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest
import torch

import lltm
from helpers import (
    DEVICES,
    assert_close_to_reference,
    check_activations_over_their_range,
    make_inputs,
    reference_step,
    run_python,
)

NAMES = ("input", "weights", "bias", "old_h", "old_cell")


def saved_storages(fn, *args):
    """The storages (data_ptr -> bytes) autograd saves while fn(*args) runs."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, saved


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "needs_grad",
    [m for m in itertools.product([False, True], repeat=5) if any(m)],
    ids=lambda m: "+".join(n for n, g in zip(NAMES, m, strict=True) if g),
)
def test_masked_backward_matches_reference(device: str, needs_grad: tuple[bool, ...]) -> None:
    """Only the inputs that need a gradient get one, and each is right."""
    args = make_inputs(5, 7, 6, device=device, dtype=torch.float64)
    for a, wanted in zip(args, needs_grad, strict=True):
        a.requires_grad_(wanted)
    new_h, new_cell = lltm.lltm(*args)
    (new_h.sum() + 2 * new_cell.sum()).backward()
    want = reference_step(args)
    torch.testing.assert_close(new_h, want[0])
    torch.testing.assert_close(new_cell, want[1])
    for a, wanted, grad in zip(args, needs_grad, want[2:], strict=True):
        if wanted:
            torch.testing.assert_close(a.grad, grad)
        else:
            assert a.grad is None


@pytest.mark.parametrize("device", DEVICES)
def test_cell_backward_computes_only_the_mask(device: str) -> None:
    args = make_inputs(4, 3, 5, device=device, dtype=torch.float64)
    new_h, new_cell, gates, X = torch.ops.lltm.cell_forward(*args, True)
    grad = torch.randn_like(new_h)
    for mask in ([True, False, False, False, False], [False, True, True, False, True]):
        outs = torch.ops.lltm.cell_backward(grad, grad, new_cell, gates, X, args[1], mask)
        assert [o is not None for o in outs] == mask
    # No X: fine unless the weights need their gradient.
    outs = torch.ops.lltm.cell_backward(
        grad, None, new_cell, gates, None, args[1], [True] + [False] * 4
    )
    assert outs[0] is not None
    with pytest.raises(ValueError, match=r"lltm::cell_backward: expected X = \[old_h \| input\]"):
        torch.ops.lltm.cell_backward(
            grad, grad, new_cell, gates, None, args[1], [False, True] + [False] * 3
        )


@pytest.mark.parametrize("device", DEVICES)
def test_cell_forward_returns_what_backward_needs(device: str) -> None:
    args = make_inputs(3, 4, 5, device=device, dtype=torch.float64)
    new_h, new_cell, gates, X = torch.ops.lltm.cell_forward(*args, True)
    want_h, want_cell = lltm.reference.lltm_reference(*args)
    torch.testing.assert_close(new_h, want_h)
    torch.testing.assert_close(new_cell, want_cell)
    torch.testing.assert_close(X, torch.cat([args[3], args[0]], dim=1))
    z = X @ args[1].t() + args[2]
    activations = torch.cat(
        [z[:, :5].sigmoid(), z[:, 5:10].sigmoid(), torch.nn.functional.elu(z[:, 10:])], dim=1
    )
    torch.testing.assert_close(gates, activations)
    assert torch.ops.lltm.cell_forward(*args, False)[3] is None


@pytest.mark.parametrize("device", DEVICES)
def test_saves_activations_and_x_only_when_needed(device: str) -> None:
    """Saved: new_cell and the activations, [batch, 3 * state]; X only for the weights."""
    batch, features, state = 8, 6, 16
    args = make_inputs(batch, features, state, device=device, requires_grad=True)
    params = {a.untyped_storage().data_ptr() for a in args}
    _, saved = saved_storages(lltm.lltm, *args)
    extra = sorted(b for p, b in saved.items() if p not in params)
    e = 4  # float32
    assert extra == sorted(
        [batch * state * e, 3 * batch * state * e, batch * (state + features) * e]
    )
    args[1].requires_grad_(False)
    _, saved = saved_storages(lltm.lltm, *args)
    extra = sorted(b for p, b in saved.items() if p not in params)
    assert extra == sorted([batch * state * e, 3 * batch * state * e])


@pytest.mark.parametrize("device", DEVICES)
def test_cell_forward_needs_x_for_the_weights_gradient(device: str) -> None:
    args = make_inputs(2, 3, 4, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="the gradient of weights needs X"):
        torch.ops.lltm.cell_forward(*args, False)


@pytest.mark.parametrize("device", DEVICES)
def test_no_graph_without_grad(device: str) -> None:
    args = make_inputs(2, 3, 4, device=device, requires_grad=True)
    with torch.no_grad():
        new_h, new_cell = lltm.lltm(*args)
    assert new_h.grad_fn is None
    assert not new_cell.requires_grad
    torch.testing.assert_close(new_h, lltm.reference.lltm_reference(*args)[0].detach())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_opcheck_cell_ops(device: str) -> None:
    for shape, requires_grad in [((3, 17, 5), True), ((3, 17, 5), False), ((0, 2, 3), True)]:
        args = make_inputs(*shape, device=device, dtype=torch.float64, requires_grad=requires_grad)
        torch.library.opcheck(torch.ops.lltm.cell.default, args)
        torch.library.opcheck(torch.ops.lltm.cell_forward.default, [*args, True])
    args = make_inputs(3, 17, 5, device=device, dtype=torch.float64)
    new_h, new_cell, gates, X = torch.ops.lltm.cell_forward(*args, True)
    grad = torch.randn_like(new_h)
    for mask in ([True] * 5, [False, True, True, False, False], [True, False, False, True, True]):
        torch.library.opcheck(
            torch.ops.lltm.cell_backward.default, [grad, None, new_cell, gates, X, args[1], mask]
        )


@pytest.mark.parametrize("device", DEVICES)
def test_strided_upstream_gradients(device: str) -> None:
    """Gradients that are slices or transposes are read through their strides."""
    args = make_inputs(6, 5, 7, device=device, dtype=torch.float64, requires_grad=True)
    new_h, new_cell = lltm.lltm(*args)
    grad_h = torch.randn(6, 20, device=device, dtype=torch.float64)[:, 3:10]
    grad_cell = torch.randn(7, 6, device=device, dtype=torch.float64).t()
    grads = torch.autograd.grad((new_h, new_cell), args, (grad_h, grad_cell))
    ref = lltm.reference.lltm_reference(*args)
    torch.testing.assert_close(grads, torch.autograd.grad(ref, args, (grad_h, grad_cell)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1000, 3, 64), (300, 9, 130)], ids=str)
def test_batches_split_over_blocks(
    device: str, dtype: torch.dtype, shape: tuple[int, int, int]
) -> None:
    """Batches the kernels cut into several chunks, whose bias sums are added up."""
    args = make_inputs(*shape, device=device, dtype=dtype, requires_grad=True)
    new_h, new_cell = lltm.lltm(*args)
    grads = torch.autograd.grad(new_h.sum() + 2 * new_cell.sum(), args)
    for got, want in zip((new_h, new_cell, *grads), reference_step(args), strict=True):
        assert_close_to_reference(got, want)


def test_bias_gradient_does_not_depend_on_the_thread_count() -> None:
    args = make_inputs(2000, 4, 32, requires_grad=True)
    threads = torch.get_num_threads()
    d_bias = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            new_h, new_cell = lltm.lltm(*args)
            d_bias.append(torch.autograd.grad(new_h.sum() + new_cell.sum(), args[2])[0])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(d_bias[0], d) for d in d_bias[1:])


CAPABILITY_CHECK = textwrap.dedent(
    """
    import torch, lltm
    from helpers import (
        assert_close_to_reference, check_activations_over_their_range, make_inputs, reference_step,
    )
    torch.manual_seed(0)
    check_activations_over_their_range("cpu", torch.float32)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for shape in ((16, 32, 128), (7, 13, 33), (40, 3, 5)):
            args = make_inputs(*shape, dtype=dtype, requires_grad=True)
            new_h, new_cell = lltm.lltm(*args)
            grads = torch.autograd.grad(new_h.sum() + 2 * new_cell.sum(), args)
            for got, want in zip((new_h, new_cell, *grads), reference_step(args), strict=True):
                assert_close_to_reference(got, want)
    print(torch.backends.cpu.get_cpu_capability())
    """
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_activations_over_their_range(device: str, dtype: torch.dtype) -> None:
    """sigmoid, ELU and tanh stay within a few ulp, at saturation and near zero."""
    check_activations_over_their_range(device, dtype)


@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_every_cpu_capability(capability: str) -> None:
    """Each instruction set's kernels, chosen as ATen chooses (ATEN_CPU_CAPABILITY)."""
    if capability != "default" and not torch.backends.cpu.get_cpu_capability().startswith("AVX"):
        pytest.skip("an x86-64 instruction set this processor lacks")
    if capability == "avx512" and torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("this processor lacks AVX-512")
    result = run_python(
        "-c",
        CAPABILITY_CHECK,
        env={"ATEN_CPU_CAPABILITY": capability},
        cwd=Path(__file__).resolve().parents[1],  # tests/, where helpers.py is
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == capability.upper()


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_with_masked_gradients(device: str) -> None:
    args = make_inputs(8, 6, 16, device=device, dtype=torch.float64)
    args[0].requires_grad_()
    args[4].requires_grad_()

    def step(*a: torch.Tensor) -> torch.Tensor:
        new_h, new_cell = lltm.lltm(*a)
        return (new_h * new_cell).sum()

    compiled = torch.compile(step, fullgraph=True)
    eager = torch.autograd.grad(step(*args), [args[0], args[4]])
    got = torch.autograd.grad(compiled(*args), [args[0], args[4]])
    torch.testing.assert_close(got, eager)


@pytest.mark.cuda
@pytest.mark.parametrize("grad", ["params", "all"])
@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events at the end of each cycle")
def test_cuda_launches_per_step(grad: str) -> None:
    """At most 3 GPU operations forward and 4 backward (docs/performance.md)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    cell = lltm.LLTM(32, 128).cuda()
    x, h, c = (
        torch.randn(16, n, device="cuda", requires_grad=grad == "all") for n in (32, 128, 128)
    )
    gh, gc = torch.randn(16, 128, device="cuda"), torch.randn(16, 128, device="cuda")
    wrt = [*cell.parameters()] + ([x, h, c] if grad == "all" else [])
    torch.autograd.grad(cell(x, (h, c)), wrt, (gh, gc))  # warm up cuBLAS
    torch.cuda.synchronize()

    def gpu_ops(fn):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return out, names

    out, forward = gpu_ops(lambda: cell(x, (h, c)))
    _, backward = gpu_ops(lambda: torch.autograd.grad(out, wrt, (gh, gc)))
    assert len(forward) <= 3, forward
    assert len(backward) <= (2 if grad == "params" else 4), backward


# (batch, features, state) at the edges of the tiled forward's tiles (16 or
# 64 rows, 8 or 32 state columns, chunks of k): one row, odd sizes, a row and
# a column past a tile, k past a chunk, and sizes where auto takes the path.
TILED_SIZES = [(1, 1, 1), (1, 3, 20), (17, 5, 33), (65, 100, 30), (300, 32, 128), (1030, 7, 70)]


@pytest.mark.cuda
@pytest.mark.parametrize("path", ["small", "tiled", "cublas"])
@pytest.mark.parametrize(("batch", "features", "state"), TILED_SIZES, ids=str)
def test_cell_paths_match_the_reference(
    monkeypatch: pytest.MonkeyPatch, path: str, batch: int, features: int, state: int
) -> None:
    """Each path of the cell's GEMMs, forced with LLTM_CELL_PATH, gives the reference's step."""
    monkeypatch.setenv("LLTM_CELL_PATH", path)
    args = make_inputs(batch, features, state, device="cuda", requires_grad=True)
    ran = lltm.paths_that_ran(lambda: lltm.lltm(*args)[0].sum().backward())
    assert ran["cell"] == [path]
    assert ran["cell_backward"] == ["small" if path == "small" else "cublas"]
    new_h, new_cell = lltm.lltm(*args)
    grads = torch.autograd.grad(new_h.sum() + 2 * new_cell.sum(), args)
    for got, want in zip((new_h, new_cell, *grads), reference_step(args), strict=True):
        assert_close_to_reference(got, want)
    with torch.no_grad():  # lltm::cell, which saves nothing
        no_grad = lltm.lltm(*args)
    # The same bits where lltm's kernels run the GEMM; cuBLAS's two GEMMs
    # without X (old_h W_h^T + input W_x^T) round differently from X W^T.
    exact = {"rtol": 0, "atol": 0} if path != "cublas" else {}
    torch.testing.assert_close(no_grad, (new_h, new_cell), **exact)


@pytest.mark.cuda
@pytest.mark.parametrize(("batch", "features", "state"), TILED_SIZES[2:], ids=str)
def test_tiled_forward_gives_the_tutorial_outputs(
    monkeypatch: pytest.MonkeyPatch, batch: int, features: int, state: int
) -> None:
    """The tutorial's seven outputs on the tiled path, against cuBLAS's; X copied bit for bit."""
    args = [a.detach() for a in make_inputs(batch, features, state, device="cuda")]
    input_, weights, bias, old_h, old_cell = args
    # Strided operands: old_h a transposed view, the input a column slice.
    old_h = old_h.t().contiguous().t()
    input_ = torch.randn(batch, features + 3, device="cuda")[:, 1 : features + 1]
    operands = (input_, weights, bias, old_h, old_cell)
    monkeypatch.setenv("LLTM_CELL_PATH", "cublas")
    want = lltm._C.forward(*(t.double() for t in operands))
    monkeypatch.setenv("LLTM_CELL_PATH", "tiled")
    got = lltm._C.forward(*operands)
    assert torch.equal(got[5], torch.cat([old_h, input_], dim=1))  # X, copied
    for g, w in zip(got, want, strict=True):
        assert_close_to_reference(g, w)
    again = lltm._C.forward(*operands)
    assert all(torch.equal(a, g) for a, g in zip(again, got, strict=True))  # bitwise repeatable


@pytest.mark.cuda
@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events at the end of each cycle")
def test_tiled_forward_is_one_launch() -> None:
    """From batch 128 on, float32 at 32 features and state 128: the forward is one kernel."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    cell = lltm.LLTM(32, 128).cuda()
    x, h, c = (torch.randn(1024, n, device="cuda") for n in (32, 128, 128))
    cell(x, (h, c))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        cell(x, (h, c))
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(names) == 1, names
    assert "tiled_cell_kernel" in names[0], names


@pytest.mark.cuda
def test_cell_path_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    args = make_inputs(4, 3, 5, device="cuda", dtype=torch.float64)
    monkeypatch.setenv("LLTM_CELL_PATH", "fast")
    with pytest.raises(
        ValueError, match="LLTM_CELL_PATH=fast: expected auto, small, tiled or cublas"
    ):
        lltm.lltm(*args)
    monkeypatch.setenv("LLTM_CELL_PATH", "tiled")
    with pytest.raises(
        ValueError, match="LLTM_CELL_PATH=tiled: the tiled kernels take float32, not Double"
    ):
        lltm.lltm(*args)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("batch", [1, 64, 65, 128])
def test_small_and_cublas_paths_agree(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, batch: int
) -> None:
    """The GEMMs in lltm's own kernels (small problems) and in cuBLAS give the same step."""
    for features, state in ((32, 128), (100, 30)):
        args = make_inputs(batch, features, state, device="cuda", dtype=dtype, requires_grad=True)
        steps = {}
        for path in ("small", "cublas"):
            monkeypatch.setenv("LLTM_CELL_PATH", path)
            ran = lltm.paths_that_ran(lambda a=args: lltm.lltm(*a))
            assert ran["cell"] == [path]
            new_h, new_cell = lltm.lltm(*args)
            grads = torch.autograd.grad(new_h.sum() + 2 * new_cell.sum(), args)
            steps[path] = (new_h, new_cell, *grads)
            for got, want in zip(steps[path], reference_step(args), strict=True):
                assert_close_to_reference(got, want)
        # Each sums in its own order: they agree at the dtype's tolerance.
        for small, cublas in zip(steps["small"], steps["cublas"], strict=True):
            assert_close_to_reference(small, cublas.double())
