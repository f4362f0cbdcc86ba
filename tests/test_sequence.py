"""lltm.lltm_sequence, lltm.LLTMLayer and the torch.ops.lltm.sequence* ops.

The reference is a Python loop of the pure-PyTorch cell in float64. On CUDA
every case runs on each path, forced with LLTM_SEQUENCE_PATH: the persistent
kernel in a cooperative grid and in one thread-block cluster (sm_90 on), the
fused steps (a GEMM with the cell in its epilogue per step) and the per-step
loop of cuBLAS and the pointwise kernel.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

import lltm
from helpers import assert_a_graph_replays_the_layer, assert_close_to_reference, input_shapes
from lltm.reference import lltm_layer_reference, lltm_sequence_reference

CUDA_PATHS = ("persistent", "cluster", "fused", "steps")


def skip_without_clusters(path: str = "cluster") -> None:
    """The cluster path runs from sm_90 on; elsewhere forcing it is an error."""
    if path == "cluster" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the cluster path needs thread-block clusters (sm_90 on)")


# (device, LLTM_SEQUENCE_PATH): the CPU has one path, CUDA three.
PATHS = [
    pytest.param(("cpu", "auto"), id="cpu"),
    *(pytest.param(("cuda", p), id=f"cuda-{p}", marks=pytest.mark.cuda) for p in CUDA_PATHS),
]

# (steps, batch, input_features, state_size): the tutorial's cell, odd sizes,
# one step, batch 1.
SHAPES = [(6, 16, 32, 128), (5, 3, 7, 5), (1, 2, 3, 4), (7, 1, 1, 33), (4, 5, 3, 64)]


@pytest.fixture(params=CUDA_PATHS)
def cuda_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """LLTM_SEQUENCE_PATH for a CUDA-only test, set to each path in turn."""
    skip_without_clusters(request.param)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", request.param)
    return str(request.param)


@pytest.fixture(params=PATHS)
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The device to run on, with LLTM_SEQUENCE_PATH set for its path."""
    name, path = request.param
    if name == "cuda":
        skip_without_clusters(path)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    return name


def make_sequence(
    *size: int, device: str = "cpu", dtype: torch.dtype = torch.float64, requires_grad: bool = True
) -> list[torch.Tensor]:
    """``[input, weights, bias, h0, c0]`` of ``size`` = ``(steps, batch, features, state)``.

    The weights are scaled so that a long sequence stays tame.
    """
    steps, batch, features, state = size
    gen = torch.Generator().manual_seed(steps * 1000 + batch * 100 + features * 10 + state)
    shapes = input_shapes(batch, features, state, steps=steps)
    scales = [1.0, 1.0 / max(1, state + features) ** 0.5, 0.5, 1.0, 1.0]
    return [
        (torch.randn(shape, generator=gen, dtype=torch.float64) * scale)
        .to(device=device, dtype=dtype)
        .requires_grad_(requires_grad)
        for shape, scale in zip(shapes, scales, strict=True)
    ]


def loss_of(outputs: tuple[torch.Tensor, ...], seed: int = 1) -> torch.Tensor:
    """A loss that reaches output, h_n and c_n with different upstream gradients."""
    output, h_n, c_n = outputs
    gen = torch.Generator().manual_seed(seed)
    scale = torch.randn(output.shape, generator=gen, dtype=torch.float64).to(output)
    return (output * scale).sum() + 2 * h_n.sum() + 3 * c_n.sum()


def with_grads(fn: object, args: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``(output, h_n, c_n, *grads of the inputs)`` of ``fn`` under :func:`loss_of`."""
    outputs = fn(*args)  # type: ignore[operator]
    # Zero steps leave the input out of the reference's graph: zeros.
    grads = torch.autograd.grad(loss_of(outputs), args, allow_unused=True, materialize_grads=True)
    return (*outputs, *grads)


def reference_with_grads(args: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    args64 = [a.detach().double().cpu().requires_grad_() for a in args]
    return with_grads(lltm_sequence_reference, args64)


def ran_the_forced_path(args: list[torch.Tensor]) -> None:
    """On CUDA with a path forced, every block of steps ran that path.

    So that a test named after a path proves the path ran (the profiler's
    ranges, lltm.paths_that_ran); empty problems run no kernel.
    """
    path = os.environ.get("LLTM_SEQUENCE_PATH", "")
    if not args[0].is_cuda or path in ("", "auto") or 0 in args[0].shape[:2] or 0 in args[3].shape:
        return
    ran = lltm.paths_that_ran(lambda: with_grads(lltm.lltm_sequence, args))
    assert set(ran["forward"]) | set(ran["backward"]) == {path}, ran


def matches_the_reference_bit_for_bit(args: list[torch.Tensor]) -> None:
    """Close to the float64 reference, and bit for bit the same when run again.

    The kernels add their partial sums in a fixed order, so a second call
    repeats the first exactly.
    """
    ran_the_forced_path(args)
    got = with_grads(lltm.lltm_sequence, args)
    for g, w in zip(got, reference_with_grads(args), strict=True):
        assert_close_to_reference(g.cpu(), w)
    for g, again in zip(got, with_grads(lltm.lltm_sequence, args), strict=True):
        assert torch.equal(g, again)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}-B{}-F{}-S{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_matches_a_loop_of_the_cell(
    device: str, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    args = make_sequence(*shape, device=device, dtype=dtype)
    got = with_grads(lltm.lltm_sequence, args)
    want = reference_with_grads(args)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        assert g.device.type == device
        assert_close_to_reference(g.cpu(), w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_matches_the_float64_reference(device: str, dtype: torch.dtype) -> None:
    args = make_sequence(8, 16, 32, 128, device=device, dtype=dtype)
    for g, w in zip(with_grads(lltm.lltm_sequence, args), reference_with_grads(args), strict=True):
        assert g.dtype == dtype
        assert_close_to_reference(g.cpu(), w)


def test_gradcheck(device: str) -> None:
    args = make_sequence(3, 2, 3, 4, device=device)
    assert torch.autograd.gradcheck(lltm.lltm_sequence, args)
    # Through h_n alone: output and c_n reach the backward as None.
    assert torch.autograd.gradcheck(lambda *a: lltm.lltm_sequence(*a)[1], args)


def test_expanded_upstream_gradients(device: str) -> None:
    """.sum() hands the backward zero-stride gradients."""
    args = make_sequence(4, 3, 2, 5, device=device)
    output, h_n, c_n = lltm.lltm_sequence(*args)
    got = torch.autograd.grad(output.sum() + h_n.sum() + c_n.sum(), args)
    ref_args = [a.detach().cpu().requires_grad_() for a in args]
    output, h_n, c_n = lltm_sequence_reference(*ref_args)
    want = torch.autograd.grad(output.sum() + h_n.sum() + c_n.sum(), ref_args)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w)


def test_only_the_inputs_that_need_a_gradient_get_one(device: str) -> None:
    args = make_sequence(3, 2, 3, 4, device=device, requires_grad=False)
    args[1].requires_grad_()
    output, _, _ = lltm.lltm_sequence(*args)
    (d_weights,) = torch.autograd.grad(output.sum(), [args[1]])
    ref_args = [a.detach().cpu() for a in args]
    ref_args[1].requires_grad_()
    (want,) = torch.autograd.grad(lltm_sequence_reference(*ref_args)[0].sum(), [ref_args[1]])
    torch.testing.assert_close(d_weights.cpu(), want)


def test_no_grad_and_graph_agree(device: str) -> None:
    args = make_sequence(5, 4, 3, 6, device=device)
    with torch.no_grad():
        plain = lltm.lltm_sequence(*args)
    recorded = lltm.lltm_sequence(*args)
    for a, b in zip(plain, recorded, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(0, 3, 2, 4), (4, 0, 2, 4), (3, 2, 2, 0), (0, 0, 2, 4)], ids=str)
def test_empty_sequences(device: str, shape: tuple[int, int, int, int]) -> None:
    """Zero steps return the initial state; an empty batch or state returns empty tensors."""
    steps, batch, _, state = shape
    args = make_sequence(*shape, device=device)
    got = with_grads(lltm.lltm_sequence, args)
    want = reference_with_grads(args)
    assert got[0].shape == (steps, batch, state)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w)
    if device == "cuda":
        torch.cuda.synchronize()


def test_bias_1d_and_2d_agree(device: str) -> None:
    args = make_sequence(3, 2, 3, 4, device=device)
    bias_1d = args[2].detach().reshape(-1).requires_grad_()
    out_2d = lltm.lltm_sequence(*args)
    out_1d = lltm.lltm_sequence(args[0], args[1], bias_1d, *args[3:])
    torch.testing.assert_close(out_1d, out_2d)
    (d_1d,) = torch.autograd.grad(out_1d[0].sum(), [bias_1d])
    (d_2d,) = torch.autograd.grad(out_2d[0].sum(), [args[2]])
    assert d_1d.shape == (12,)
    assert d_2d.shape == (1, 12)
    torch.testing.assert_close(d_1d, d_2d.reshape(-1))


def test_non_contiguous_inputs(device: str) -> None:
    steps, batch, features, state = 4, 3, 5, 6
    dense = make_sequence(steps, batch, features, state, device=device, requires_grad=False)
    strided = [
        # batch-major storage, as batch_first gives
        dense[0].transpose(0, 1).contiguous().transpose(0, 1),
        dense[1].t().contiguous().t(),
        dense[2],
        dense[3].t().contiguous().t(),
        dense[4].t().contiguous().t(),
    ]
    assert not strided[0].is_contiguous()
    strided = [a.requires_grad_() for a in strided]
    for g, w in zip(
        with_grads(lltm.lltm_sequence, strided), reference_with_grads(dense), strict=True
    ):
        torch.testing.assert_close(g.cpu(), w)


def test_double_backward_raises(device: str) -> None:
    args = make_sequence(2, 2, 2, 3, device=device)
    output, _, _ = lltm.lltm_sequence(*args)
    (d_input,) = torch.autograd.grad(output.sum(), [args[0]], create_graph=True)
    with pytest.raises(RuntimeError, match="lltm supports first-order gradients only"):
        d_input.sum().backward()


def _opcheck_samples(device: str) -> Iterator[list[torch.Tensor]]:
    for requires_grad in (False, True):
        yield make_sequence(3, 2, 3, 4, device=device, requires_grad=requires_grad)
    yield make_sequence(0, 2, 3, 4, device=device)


# opcheck's test_aot_dispatch_dynamic (torch 2.14) reads .grad of its own
# copies of the inputs; the warning is about opcheck, not about lltm.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_opcheck(device: str) -> None:
    for args in _opcheck_samples(device):
        torch.library.opcheck(torch.ops.lltm.sequence.default, args)
        torch.library.opcheck(torch.ops.lltm.sequence_forward.default, args)
    saved = torch.ops.lltm.sequence_forward.default(
        *make_sequence(3, 2, 3, 4, device=device, requires_grad=False)
    )
    args = make_sequence(3, 2, 3, 4, device=device, requires_grad=False)
    grad = torch.randn_like(saved[0])
    torch.library.opcheck(
        torch.ops.lltm.sequence_backward.default,
        (
            grad,
            None,
            None,
            args[0],
            args[1],
            args[3],
            saved[0],
            saved[3],
            saved[4],
            None,
            [True, True, True, True, True],
        ),
    )


def test_torch_compile_fullgraph(device: str) -> None:
    layer = lltm.LLTMLayer(3, 4, num_layers=2).to(device=device, dtype=torch.float64)
    x = torch.randn(5, 2, 3, device=device, dtype=torch.float64)

    def loss(x: torch.Tensor) -> torch.Tensor:
        output, (h_n, c_n) = layer(x)
        return output.sum() + (h_n * c_n).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=False)
    want = loss(x)
    want_grads = torch.autograd.grad(want, list(layer.parameters()))
    got = compiled(x)
    got_grads = torch.autograd.grad(got, list(layer.parameters()))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grads, want_grads)


# --- LLTMLayer ----------------------------------------------------------------------------


def _cell_loop(cell: lltm.LLTM, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple:
    outputs = []
    for x_t in x:
        h, c = cell(x_t, (h, c))
        outputs.append(h)
    return torch.stack(outputs), h, c


def test_layer_with_a_cells_weights_equals_a_loop_of_that_cell(device: str) -> None:
    cell = lltm.LLTM(7, 9).to(device=device, dtype=torch.float64)
    layer = lltm.LLTMLayer.from_cell(cell)
    loaded = lltm.LLTMLayer(7, 9).to(device=device, dtype=torch.float64)
    loaded.load_state_dict({"weights_l0": cell.weights, "bias_l0": cell.bias})
    x = torch.randn(6, 4, 7, device=device, dtype=torch.float64)
    h0 = torch.randn(1, 4, 9, device=device, dtype=torch.float64)
    c0 = torch.randn(1, 4, 9, device=device, dtype=torch.float64)
    want_output, want_h, want_c = _cell_loop(cell, x, h0[0], c0[0])
    want_grads = torch.autograd.grad(want_output.sum() + want_c.sum(), list(cell.parameters()))
    for model in (layer, loaded):
        output, (h_n, c_n) = model(x, (h0, c0))
        torch.testing.assert_close(output, want_output)
        torch.testing.assert_close(h_n, want_h.unsqueeze(0))
        torch.testing.assert_close(c_n, want_c.unsqueeze(0))
        grads = torch.autograd.grad(output.sum() + c_n.sum(), list(model.parameters()))
        torch.testing.assert_close(grads, want_grads)


def test_layer_stacks_layers_and_follows_lstm_conventions(device: str) -> None:
    torch.manual_seed(0)
    layer = lltm.LLTMLayer(3, 5, num_layers=3).to(device=device, dtype=torch.float64)
    x = torch.randn(4, 2, 3, device=device, dtype=torch.float64)
    output, (h_n, c_n) = layer(x)
    assert output.shape == (4, 2, 5)
    assert h_n.shape == c_n.shape == (3, 2, 5)
    # Each layer's outputs feed the next, from zero states.
    parameters = [layer.layer_parameters(k) for k in range(3)]
    want, (want_h, want_c) = lltm_layer_reference(x, parameters)
    torch.testing.assert_close(output, want)
    torch.testing.assert_close(h_n, want_h)
    torch.testing.assert_close(c_n, want_c)
    # batch_first: the same numbers, batch-major.
    first = lltm.LLTMLayer(3, 5, num_layers=3, batch_first=True).to(device, torch.float64)
    first.load_state_dict(layer.state_dict())
    out_bf, (h_bf, _) = first(x.transpose(0, 1))
    torch.testing.assert_close(out_bf, output.transpose(0, 1))
    torch.testing.assert_close(h_bf, h_n)
    # Unbatched: [steps, features] with [num_layers, state] states.
    out_1, (h_1, _) = layer(x[:, 0], (h_n[:, 0], c_n[:, 0]))
    out_2, (h_2, _) = layer(x[:, :1], (h_n[:, :1], c_n[:, :1]))
    torch.testing.assert_close(out_1, out_2[:, 0])
    torch.testing.assert_close(h_1, h_2[:, 0])


def test_layer_without_bias(device: str) -> None:
    layer = lltm.LLTMLayer(3, 4, bias=False).to(device=device, dtype=torch.float64)
    assert [name for name, _ in layer.named_parameters()] == ["weights_l0"]
    x = torch.randn(3, 2, 3, device=device, dtype=torch.float64)
    output, _ = layer(x)
    zeros = torch.zeros(2, 4, device=device, dtype=torch.float64)
    want, _, _ = lltm_sequence_reference(x, layer.weights_l0, torch.zeros(12).to(x), zeros, zeros)
    torch.testing.assert_close(output, want)
    output.sum().backward()
    assert layer.weights_l0.grad is not None


# --- errors -------------------------------------------------------------------------------


def _args(**changes: torch.Tensor) -> list[torch.Tensor]:
    names = ["input", "weights", "bias", "h0", "c0"]
    args = dict(zip(names, make_sequence(3, 2, 4, 5, requires_grad=False), strict=True))
    args.update(changes)
    return [args[n] for n in names]


ERROR_CASES = [
    (
        {"input": torch.randn(2, 4, dtype=torch.float64)},
        ValueError,
        (
            r"expected input to be a 3-D tensor \[steps, batch, input_features\], but got a 2-D "
            r"tensor of shape \[2, 4\]"
        ),
    ),
    (
        {"h0": torch.randn(3, 5, dtype=torch.float64)},
        ValueError,
        r"expected h0 to have shape \[batch, state_size\] = \[2, 5\], but got \[3, 5\]",
    ),
    (
        {"c0": torch.randn(2, 6, dtype=torch.float64)},
        ValueError,
        r"expected c0 to have shape \[batch, state_size\] = \[2, 5\], but got \[2, 6\]",
    ),
    (
        {"weights": torch.randn(15, 8, dtype=torch.float64)},
        ValueError,
        (
            r"expected weights to have shape \[3 \* state_size, state_size \+ input_features\] = "
            r"\[15, 9\], but got \[15, 8\]"
        ),
    ),
    (
        {"bias": torch.randn(14, dtype=torch.float64)},
        ValueError,
        r"expected bias to have shape \[3 \* state_size\] = \[15\]",
    ),
    (
        {"c0": torch.randn(2, 5, dtype=torch.float32)},
        TypeError,
        r"expected c0 to have the same dtype as input \(float64\), but got float32",
    ),
    (
        {"input": torch.ones(3, 2, 4, dtype=torch.long)},
        TypeError,
        r"expected input to have a floating-point dtype",
    ),
]


@pytest.mark.parametrize(("changes", "error", "match"), ERROR_CASES)
@pytest.mark.parametrize("op", ["sequence", "sequence_forward"])
def test_bad_arguments_are_named(
    op: str, changes: dict[str, torch.Tensor], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=f"lltm::{op}: {match}"):
        getattr(torch.ops.lltm, op).default(*_args(**changes))


def test_bad_backward_arguments_are_named() -> None:
    args = make_sequence(3, 2, 4, 5, requires_grad=False)
    output, _, _, cells, gates = torch.ops.lltm.sequence_forward.default(*args)
    backward = torch.ops.lltm.sequence_backward.default
    mask = [True] * 5
    with pytest.raises(
        ValueError,
        match=r"lltm::sequence_backward: expected gates to have shape "
        r"\[steps, batch, 3 \* state_size\] = \[3, 2, 15\], but got \[3, 2, 14\]",
    ):
        backward(
            None, None, None, args[0], args[1], args[3], output, cells, gates[..., :14], None, mask
        )
    with pytest.raises(
        ValueError,
        match=r"lltm::sequence_backward: expected grad_h_n to have shape "
        r"\[batch, state_size\] = \[2, 5\], but got \[2, 4\]",
    ):
        backward(
            None,
            output[0, :, :4],
            None,
            args[0],
            args[1],
            args[3],
            output,
            cells,
            gates,
            None,
            mask,
        )


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda layer: layer(torch.randn(2, 3, 4, 5)),
            ValueError,
            r"LLTMLayer: expected input to be a 3-D tensor \[steps, batch, input_features\]",
        ),
        (
            lambda layer: layer(torch.randn(2, 3, 4), (torch.zeros(1, 3, 6), torch.zeros(2, 3, 6))),
            ValueError,
            (
                r"LLTMLayer: expected h0 to have shape \[num_layers \* directions, batch, "
                r"state_size\] = \[2, 3, 6\], but got \[1, 3, 6\]"
            ),
        ),
        (
            lambda layer: layer(torch.randn(2, 3, 5)),
            ValueError,
            r"LLTMLayer: expected input.size\(-1\) to be input_features = 4, but got 5",
        ),
        (
            lambda layer: layer(torch.randn(2, 3, 4), torch.zeros(2, 3, 6)),
            TypeError,
            r"LLTMLayer: expected the state to be a tuple \(h0, c0\)",
        ),
    ],
)
def test_layer_errors_name_the_argument(call: object, error: type[Exception], match: str) -> None:
    layer = lltm.LLTMLayer(4, 6, num_layers=2)
    with pytest.raises(error, match=match):
        call(layer)  # type: ignore[operator]


def test_layer_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match=r"LLTMLayer: expected .* num_layers >= 1"):
        lltm.LLTMLayer(4, 6, num_layers=0)


# --- CUDA only ----------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "shape",
    [(16, 16, 32, 128), (5, 96, 16, 100), (3, 300, 8, 256)],
    ids=lambda s: "T{}-B{}-F{}-S{}".format(*s),
)
def test_cuda_paths_agree(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    """Every CUDA path: the same numbers, to rounding."""
    args = make_sequence(*shape, device="cuda", dtype=dtype)
    want = reference_with_grads(args)
    clusters = torch.cuda.get_device_capability() >= (9, 0)
    for path in (p for p in CUDA_PATHS if p != "cluster" or clusters):
        monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
        try:
            got = with_grads(lltm.lltm_sequence, args)
        except RuntimeError as e:
            # The cluster holds the whole problem in one cluster's shared
            # memory: where it cannot, it says so, and the size is for the others.
            if path != "cluster" or "the cluster kernel cannot run" not in str(e):
                raise
            continue
        for g, w in zip(got, want, strict=True):
            assert_close_to_reference(g.cpu(), w)


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


@pytest.mark.cuda
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=lambda s: "T{}-B{}-F{}-S{}".format(*s))
def test_cuda_fused_tiles(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int, int]
) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    matches_the_reference_bit_for_bit(make_sequence(*shape, device="cuda", dtype=torch.float32))


@pytest.mark.cuda
def test_cuda_fused_steps_with_unaligned_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """h0 and c0 four bytes into their storage: the steps that copy h_{t-1} in
    16-byte pieces cannot take h0, and the chunked ones run instead."""
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    args = make_sequence(3, 64, 8, 128, device="cuda", dtype=torch.float32)
    for k in (3, 4):
        state = args[k].detach()
        storage = torch.empty(state.numel() + 1, device="cuda", dtype=state.dtype)
        unaligned = storage[1:].view_as(state)
        unaligned.copy_(state)
        args[k] = unaligned.requires_grad_()
    assert args[3].data_ptr() % 16 != 0
    matches_the_reference_bit_for_bit(args)


# The tensor-core kernels of the fused steps (cuda/lltm_step_mma.cu), which
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


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", MMA_SHAPES, ids=lambda s: "T{}-B{}-F{}-S{}".format(*s))
def test_cuda_fused_tensor_core_tiles(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    matches_the_reference_bit_for_bit(make_sequence(*shape, device="cuda", dtype=dtype))


# The cluster's kernels (sm_90 on: 16 blocks of 512 threads on an H200) at
# the edges of their regime: one step, one row, states that leave blocks
# without a column (5, 33), and in float32 the shared memory's edge at state
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


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", CLUSTER_SHAPES, ids=lambda s: "T{}-B{}-F{}-S{}".format(*s))
def test_cuda_cluster_at_its_edges(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    skip_without_clusters()
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "cluster")
    matches_the_reference_bit_for_bit(make_sequence(*shape, device="cuda", dtype=dtype))


# The cluster's kernels on tensor cores (cuda/lltm_cluster_mma.cu: float16
# and bfloat16, sm_90 on) at the edges of their regime: one row, one step;
# one column a block (state 5: four blocks, three without a column), blocks
# without a column (33, 200); a second row tile; the most rows whose
# backward tiles fit in shared memory at each state (128 at 128, 48 at 256,
# 16 at 512), with up to two epilogue items a thread (batch * columns a
# block <= 1024).
CLUSTER_MMA_SHAPES = [
    (1, 1, 3, 5),
    (3, 7, 5, 33),
    (4, 16, 8, 128),
    (2, 17, 4, 128),
    (3, 30, 3, 200),
    (2, 128, 4, 128),
    (2, 48, 4, 256),
    (3, 16, 8, 512),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", CLUSTER_MMA_SHAPES, ids=lambda s: "T{}-B{}-F{}-S{}".format(*s))
def test_cuda_cluster_on_tensor_cores_at_its_edges(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    skip_without_clusters()
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "cluster")
    matches_the_reference_bit_for_bit(make_sequence(*shape, device="cuda", dtype=dtype))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cuda_cluster_forward_on_tensor_cores_alone(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """Batch 64 at state 256: the forward fits (8 tiles a block, two warps each), the
    backward's tiles do not, so the forward runs without a graph, saving nothing.
    """
    skip_without_clusters()
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "cluster")
    args = make_sequence(3, 64, 4, 256, device="cuda", dtype=dtype, requires_grad=False)
    got = lltm.lltm_sequence(*args)
    want = lltm_sequence_reference(*[a.double().cpu() for a in args])
    for g, w in zip(got, want, strict=True):
        assert_close_to_reference(g.cpu(), w)
    for g, again in zip(got, lltm.lltm_sequence(*args), strict=True):
        assert torch.equal(g, again)


@pytest.mark.cuda
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
    skip_without_clusters()
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "cluster")
    args = make_sequence(*shape, device="cuda", dtype=dtype)
    _, batch, _, state = shape
    with pytest.raises(
        RuntimeError,
        match=f"LLTM_SEQUENCE_PATH=cluster, but the cluster kernel cannot run batch = {batch}, "
        f"state_size = {state} in {str(dtype).removeprefix('torch.')}",
    ):
        with_grads(lltm.lltm_sequence, args)


# auto's thresholds (cpp/sequence_cuda.cpp), a size on each side: on sm_90
# the cluster up to 224 items a block of its tiles of rows in float32 (256 in
# float64; batch 196 and 197 at state 128 on an H200, which runs 7 clusters
# at once); in 16-bit types on tensor cores up to 256 fragments of batch *
# state / 16 (batch 32 and 33 at state 128), then on CUDA cores up to 160
# items a block (batch 140 and 141 at state 128), on tensor cores again up to
# 512 fragments; the
# persistent kernel in one block up to 256 elements of batch * state, up to
# batch 16 and 4096 elements (in float64, up to either); the fused steps up to
# 2**26 multiply-adds per recurrent product (2**24 in 16-bit types); cuBLAS
# beyond. Where the fused steps run on tensor cores (bfloat16 from sm_80),
# never the persistent kernel, and the fused steps up to 2**29 multiply-adds.
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


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", AUTO_EDGES, ids=lambda s: "T{}-B{}-F{}-S{}".format(*s))
def test_cuda_auto_at_its_thresholds(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "auto")
    args = make_sequence(*shape, device="cuda", dtype=dtype)
    for got, w in zip(
        with_grads(lltm.lltm_sequence, args), reference_with_grads(args), strict=True
    ):
        assert_close_to_reference(got.cpu(), w)


@pytest.mark.cuda
def test_cuda_bad_path_and_a_state_too_large_for_the_persistent_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = make_sequence(2, 2, 3, 4, device="cuda", dtype=torch.float32, requires_grad=False)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fast")
    with pytest.raises(ValueError, match="LLTM_SEQUENCE_PATH=fast: expected auto, steps, onednn"):
        lltm.lltm_sequence(*args)
    # W_h of state 2048 in float32 is 50 MB: more than the GPU's shared memory.
    big = make_sequence(1, 1, 1, 2048, device="cuda", dtype=torch.float32, requires_grad=False)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "persistent")
    with pytest.raises(RuntimeError, match="LLTM_SEQUENCE_PATH=persistent, but the persistent"):
        lltm.lltm_sequence(*big)
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "auto")  # falls back to the steps
    torch.testing.assert_close(
        lltm.lltm_sequence(*big)[0].double().cpu(),
        lltm_sequence_reference(*[a.double().cpu() for a in big])[0],
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.cuda
@pytest.mark.usefixtures("cuda_path")
def test_cuda_runs_on_the_current_stream() -> None:
    base = make_sequence(8, 16, 32, 128, device="cuda", dtype=torch.float32, requires_grad=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        args = [(a * 1).requires_grad_() for a in base]  # written after the sleep
        got = with_grads(lltm.lltm_sequence, args)
    side.synchronize()
    for g, w in zip(got, reference_with_grads(base), strict=True):
        assert_close_to_reference(g.cpu(), w)


@pytest.mark.cuda
@pytest.mark.usefixtures("cuda_path")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_cuda_graph_capture_and_replay(dtype: torch.dtype) -> None:
    """The fused steps' cooperative launch (one per direction) is a graph node too."""
    layer = lltm.LLTMLayer(32, 128).to("cuda", dtype)
    assert_a_graph_replays_the_layer(layer, torch.randn(16, 16, 32, device="cuda", dtype=dtype))


@pytest.mark.cuda
@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs: inputs on cuda:1, current device 0"
)
@pytest.mark.usefixtures("cuda_path")
def test_cuda_on_a_second_device() -> None:
    args = make_sequence(4, 8, 5, 16, device="cuda:1", dtype=torch.float32)
    for g, w in zip(with_grads(lltm.lltm_sequence, args), reference_with_grads(args), strict=True):
        assert g.device == torch.device("cuda:1")
        assert_close_to_reference(g.cpu(), w)
