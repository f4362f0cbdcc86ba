"""What the sequence tests share: the paths of each device, read from lltm's table,
inputs, the float64 reference with gradients, and the checks that a path ran.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

import lltm
from helpers import assert_close_to_reference, input_shapes
from lltm.reference import lltm_layer_reference, lltm_sequence_reference

CPU_PATHS = tuple(lltm.sequence_paths("cpu"))
# Empty in a build without CUDA kernels: no CUDA case is collected there.
CUDA_PATHS = tuple(lltm.sequence_paths("cuda"))

# (device, LLTM_SEQUENCE_PATH): the CPU's choice, and each CUDA path forced.
DEVICE_PATHS = [
    pytest.param(("cpu", "auto"), id="cpu"),
    *(pytest.param(("cuda", p), id=f"cuda-{p}", marks=pytest.mark.cuda) for p in CUDA_PATHS),
]


def shape_id(shape: tuple[int, ...]) -> str:
    return "T{}-B{}-F{}-S{}".format(*shape)


def plan_or_reason(
    path: str,
    device: str,
    dtype: torch.dtype,
    shape: tuple[int, int, int, int],
    *,
    backward: bool = False,
) -> tuple[str | None, str]:
    """(the plan lltm.paths names for such a block, ""), or (None, why the path cannot run it)."""
    steps, batch, features, state = shape
    try:
        return lltm.paths.plan(
            path,
            device=device,
            dtype=dtype,
            steps=steps,
            batch=batch,
            input_features=features,
            state_size=state,
            backward=backward,
        ), ""
    except RuntimeError as refused:
        return None, str(refused).split(": ", 1)[1]


def path_dtype(path: str, device: str) -> torch.dtype:
    """float32, or where the path refuses it the first dtype its plan runs (float32 if none)."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        if plan_or_reason(path, device, dtype, (4, 3, 5, 8))[0] is not None:
            return dtype
    return torch.float32


def cpu_path_dtype(path: str) -> torch.dtype:
    """The CPU path's dtype (path_dtype); skips with the plan's reason where it cannot run here."""
    dtype = path_dtype(path, "cpu")
    plan, why = plan_or_reason(path, "cpu", dtype, (4, 3, 5, 8))
    if plan is None:
        pytest.skip(why)
    return dtype


def skip_unless_it_runs(
    path: str, device: str, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    """Skip where the path's plan says it cannot run such a block here, with its reason."""
    for backward in (False, True):
        plan, why = plan_or_reason(path, device, dtype, shape, backward=backward)
        if plan is None:
            pytest.skip(f"the {path} path cannot run {shape} in {dtype}: {why}")


def assert_ran_the_named_plans(
    path: str,
    ran: tuple[list[str], list[str]],
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    kernels: tuple[str, ...],
) -> None:
    """Each direction ran the plan lltm.paths names for it, of one of `kernels`."""
    for backward, plans in zip((False, True), ran, strict=True):
        want, why = plan_or_reason(path, "cuda", dtype, shape, backward=backward)
        assert want is not None, why
        assert plans == [want]
        assert want.startswith(kernels), want


def set_device_path(monkeypatch: pytest.MonkeyPatch, device: str, path: str) -> None:
    """LLTM_SEQUENCE_PATH for `path`; the cluster skips where the GPU has no clusters."""
    if device == "cuda" and path == "cluster" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the cluster path needs thread-block clusters (sm_90 on)")
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)


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


def plans_that_ran(args: list[torch.Tensor]) -> tuple[list[str], list[str]]:
    """The plans of lltm_sequence's forward and backward blocks on ``args``."""
    ran = lltm.paths_that_ran(lambda: with_grads(lltm.lltm_sequence, args))
    return ran["forward"], ran["backward"]


def ran_the_forced_path(args: list[torch.Tensor]) -> tuple[list[str], list[str]]:
    """With a path forced, every block of steps ran a plan of that path.

    So that a test named after a path proves the path ran (the profiler's
    ranges, lltm.paths_that_ran); empty problems run no path.
    """
    path = os.environ.get("LLTM_SEQUENCE_PATH", "")
    forward, backward = plans_that_ran(args)
    if path not in ("", "auto") and 0 not in (*args[0].shape[:2], args[3].shape[-1]):
        assert {p.split("/")[0] for p in forward + backward} == {path}, (forward, backward)
    return forward, backward


def matches_the_reference_bit_for_bit(args: list[torch.Tensor]) -> tuple[list[str], list[str]]:
    """Close to the float64 reference, and bit for bit the same when run again.

    The kernels add their partial sums in a fixed order, so a second call
    repeats the first exactly. Returns the plans that ran, forward and backward.
    """
    ran = ran_the_forced_path(args)
    got = with_grads(lltm.lltm_sequence, args)
    for g, w in zip(got, reference_with_grads(args), strict=True):
        assert_close_to_reference(g.cpu(), w)
    for g, again in zip(got, with_grads(lltm.lltm_sequence, args), strict=True):
        assert torch.equal(g, again)
    return ran


def layer_and_input(
    size: tuple[int, int, int, int], device: str = "cpu", **options: object
) -> tuple[lltm.LLTMLayer, torch.Tensor]:
    steps, batch, features, state = size
    torch.manual_seed(sum(size))
    layer = lltm.LLTMLayer(features, state, device=device, **options)  # type: ignore[arg-type]
    return layer, torch.randn(steps, batch, features, device=device)


def train(layer: lltm.LLTMLayer, x: torch.Tensor) -> list[torch.Tensor]:
    """Output, h_n, c_n and the gradients of the input and every parameter."""
    x = x.detach().requires_grad_()
    layer.zero_grad()
    output, (h_n, c_n) = layer(x)
    scale = torch.linspace(-1, 1, output.numel(), device=x.device).view_as(output)
    ((output * scale).sum() + 2 * h_n.sum() + 3 * c_n.sum()).backward()
    return [output, h_n, c_n, x.grad, *(p.grad for p in layer.parameters())]


def train_reference(layer: lltm.LLTMLayer, x: torch.Tensor) -> list[torch.Tensor]:
    params = [p.detach().double().cpu().requires_grad_() for p in layer.parameters()]
    x64 = x.detach().double().cpu().requires_grad_()
    per_layer = [params[2 * k : 2 * k + 2] for k in range(len(params) // 2)]
    output, (h_n, c_n) = lltm_layer_reference(
        x64, per_layer, None, bidirectional=layer.bidirectional
    )
    scale = torch.linspace(-1, 1, output.numel(), dtype=torch.float64).view_as(output)
    ((output * scale).sum() + 2 * h_n.sum() + 3 * c_n.sum()).backward()
    return [output, h_n, c_n, x64.grad, *(p.grad for p in params)]


def assert_trains_like_the_reference(layer: lltm.LLTMLayer, x: torch.Tensor) -> list[torch.Tensor]:
    """train() against train_reference(), at the tolerance of the layer's dtype."""
    got = train(layer, x)
    for g, want in zip(got, train_reference(layer, x), strict=True):
        assert_close_to_reference(g.cpu(), want)
    return got


# --- LLTMLayer's options -----------------------------------------------------------------


def make_layer(
    features: int,
    state: int,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float64,
    **options: object,
) -> lltm.LLTMLayer:
    """A layer whose weights are scaled so that a long sequence stays tame."""
    torch.manual_seed(0)
    layer = lltm.LLTMLayer(features, state, **options)  # type: ignore[arg-type]
    return layer.to(device=device, dtype=dtype)


def states(
    layer: lltm.LLTMLayer, batch: int, device: str, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (layer.num_layers * layer.directions, batch, layer.state_size)
    return (
        torch.randn(shape, dtype=torch.float64).to(device, dtype),
        torch.randn(shape, dtype=torch.float64).to(device, dtype),
    )


def padded(output: torch.Tensor | PackedSequence) -> torch.Tensor:
    return pad_packed_sequence(output)[0] if isinstance(output, PackedSequence) else output


def outputs_and_grads(
    run: Callable[[], tuple[object, tuple[torch.Tensor, torch.Tensor]]],
    leaves: list[torch.Tensor],
    seed: int = 1,
) -> list[torch.Tensor]:
    """``(output, h_n, c_n, *grads)`` under a loss that reaches all three differently.

    ``run`` is called after ``torch.manual_seed(seed)``: dropout draws the
    same masks in the layer and the reference.
    """
    torch.manual_seed(seed)
    output, (h_n, c_n) = run()
    out = padded(output)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(seed)
    scale = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out)
    loss = (out * scale).sum() + 2 * h_n.sum() + (c_n * c_n).sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
    return [out, h_n, c_n, *grads]


def assert_matches_the_reference(
    layer: lltm.LLTMLayer,
    input: torch.Tensor | PackedSequence,  # noqa: A002
    hx: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    atol: float | None = 1e-10,
) -> None:
    """The layer against the reference: every output, state and gradient.

    ``atol`` None compares at the tolerance of the layer's dtype.
    """
    leaves = list(layer.parameters())
    data = input.data if isinstance(input, PackedSequence) else input
    if data.requires_grad:
        leaves.append(data)
    got = outputs_and_grads(lambda: layer(input, hx), leaves)

    def reference() -> tuple[object, tuple[torch.Tensor, torch.Tensor]]:
        return lltm_layer_reference(
            input,
            layer.all_parameters(),
            hx,
            batch_first=layer.batch_first,
            bidirectional=layer.bidirectional,
            dropout=layer.dropout,
            training=layer.training,
        )

    if layer.weights_l0.dtype == torch.float64:
        # On the layer's device: dropout draws its masks from that device's generator.
        want = outputs_and_grads(reference, leaves)
    else:  # the reference in float64 on the CPU, from the same numbers
        ref = make_reference_copy(layer)
        ref_input = to64(input)
        ref_hx = None if hx is None else (hx[0].double().cpu(), hx[1].double().cpu())
        ref_data = ref_input.data if isinstance(ref_input, PackedSequence) else ref_input
        ref_leaves = list(ref.parameters()) + ([ref_data] if data.requires_grad else [])
        if data.requires_grad:
            ref_data.requires_grad_()
        want = outputs_and_grads(
            lambda: lltm_layer_reference(
                ref_input,
                ref.all_parameters(),
                ref_hx,
                batch_first=layer.batch_first,
                bidirectional=layer.bidirectional,
            ),
            ref_leaves,
        )
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        if atol is None:
            assert_close_to_reference(g.cpu(), w.detach().cpu())
        else:
            torch.testing.assert_close(g.cpu(), w.detach().cpu(), rtol=1e-10, atol=atol)


def make_reference_copy(layer: lltm.LLTMLayer) -> lltm.LLTMLayer:
    ref = lltm.LLTMLayer(
        layer.input_features,
        layer.state_size,
        layer.num_layers,
        layer.batch_first,
        layer.bias,
        bidirectional=layer.bidirectional,
        dtype=torch.float64,
    )
    with torch.no_grad():
        for a, b in zip(ref.parameters(), layer.parameters(), strict=True):
            a.copy_(b.double().cpu())
    return ref


def to64(input: torch.Tensor | PackedSequence) -> torch.Tensor | PackedSequence:  # noqa: A002
    if isinstance(input, PackedSequence):
        return PackedSequence(
            input.data.detach().double().cpu(),
            input.batch_sizes,
            *(
                None if t is None else t.cpu()
                for t in (input.sorted_indices, input.unsorted_indices)
            ),
        )
    return input.detach().double().cpu()
