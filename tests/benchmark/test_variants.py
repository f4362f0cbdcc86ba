"""The variants of a sequence run: what each one runs, and which apply where."""

from __future__ import annotations

import os

import torch

import lltm
from lltm.benchmark import sequence as seq
from lltm.benchmark.sequence import variants


def test_the_options_variants_and_their_inputs() -> None:
    """What each variant runs: both directions, the packed batch, and the same batch padded."""
    cpu = torch.device("cpu")
    options = seq.LayerOptions(bidirectional=True)
    cases, errors = variants.build_variants(
        ["layer", "nn.LSTM"], 5, 3, 2, 4, torch.float32, cpu, options
    )
    assert errors == {}
    assert cases["layer"].forward().shape == (5, 3, 8)  # both directions' h_t
    assert cases["nn.LSTM"].forward().shape == (5, 3, 8)
    names = ["loop-lltm", "layer", "layer-padded", "nn.LSTM"]
    options = seq.LayerOptions(packed=True, lengths_seed=4)
    cases, errors = variants.build_variants(names, 8, 6, 2, 4, torch.float32, cpu, options)
    assert set(errors) == {"loop-lltm"}
    lengths = seq.packed_lengths(8, 6, seed=4)
    tokens, longest = int(lengths.sum()), int(lengths.max())
    # The packed variants: their forward is the PackedSequence's data, a row per token,
    # and the leaf that needs grad is that batch's data.
    assert cases["layer"].forward().shape == (tokens, 4)
    assert cases["nn.LSTM"].forward().shape == (tokens, 4)
    data = cases["layer"].leaves[-1]
    assert data.shape == (tokens, 2)
    assert data.requires_grad
    assert cases["nn.LSTM"].leaves[-1] is data
    # layer-padded: the same layer on the same batch, padded to its longest sequence.
    padded = cases["layer-padded"].leaves[-1]
    assert padded.shape == (longest, 6, 2)
    assert cases["layer-padded"].forward().shape == (longest, 6, 4)
    assert cases["layer-padded"].leaves[:-1] == cases["layer"].leaves[:-1]
    repacked = torch.nn.utils.rnn.pack_padded_sequence(padded, lengths, enforce_sorted=False)
    assert torch.equal(repacked.data, data)
    past_the_end = torch.arange(longest)[:, None] >= lengths[None, :]
    assert padded[past_the_end].abs().sum() == 0
    # The step's backward reaches the packed leaf.
    cases["layer"].step()
    assert data.grad is not None
    assert data.grad.shape == data.shape


def test_variants_the_options_rule_out() -> None:
    both = seq.LayerOptions(bidirectional=True, packed=True)
    assert seq.default_variants("cpu") == ["loop-python", "loop-lltm", "layer", "nn.LSTM"]
    assert seq.default_variants("cpu", seq.LayerOptions(bidirectional=True)) == [
        "layer",
        "nn.LSTM",
    ]
    assert seq.default_variants("cpu", both) == ["layer", "layer-padded", "nn.LSTM"]
    assert seq.default_variants("cuda", both) == [
        "layer",
        "layer-padded",
        *seq.CUDA_VARIANTS,
        "nn.LSTM",
    ]
    rows = seq.run_sequence(
        3, 2, 3, 4, runs=1, warmup=1, progress=False, variants=["layer-padded", "layer"]
    )
    assert rows[0]["error"] == "only with packed (the layer on the packed batch, padded)"
    rows = seq.run_sequence(
        3, 2, 3, 4, runs=1, warmup=1, progress=False, variants=["loop-python"], packed=True
    )
    assert rows[0]["error"].startswith("the loops run one direction over every step")


def test_inference_times_the_forward_alone() -> None:
    """The timed call of an inference variant: the forward under inference_mode, no grads."""
    cpu = torch.device("cpu")
    cases, _ = variants.build_variants(["layer", "nn.LSTM"], 4, 2, 3, 5, torch.float32, cpu)
    seen = []
    for case in cases.values():
        forward = case.forward

        def spy(forward: variants.Step = forward) -> torch.Tensor:
            seen.append(torch.is_inference_mode_enabled())
            return forward()

        case.forward = spy
        case.inference = True
        case.clear_grads()  # the input is every variant's leaf
        case.call()
        assert all(leaf.grad is None for leaf in case.leaves)
        case.inference = False
        case.call()
        assert all(leaf.grad is not None for leaf in case.leaves)
    assert seen == [True, False, True, False]


def test_the_forced_variants_of_both_devices_come_from_forced_paths() -> None:
    assert variants.forced_paths("cpu") == tuple(lltm.sequence_paths("cpu"))
    cuda = tuple(lltm.sequence_paths("cuda"))
    assert variants.forced_paths(torch.device("cuda", 1)) == cuda
    for device in ("cpu", "cuda"):
        paths = variants.forced_paths(device)
        forced = seq.forced_variants(device)
        assert forced == tuple(f"layer-{p}" for p in paths)
        assert [variants.forced_path(v, device) for v in forced] == list(paths)
        assert set(forced) <= set(seq.VARIANTS)
    assert seq.forced_variants("cuda") == seq.CUDA_VARIANTS
    assert variants.forced_path("layer", "cpu") is None
    assert variants.forced_path("layer-padded", "cpu") is None
    # Every variant once: the loops, the layer's, nn.LSTM, and each device's forced ones.
    assert len(seq.VARIANTS) == len(set(seq.VARIANTS))
    assert set(seq.VARIANTS) == {
        *("loop-python", "loop-lltm", "layer", "layer-padded", "nn.LSTM"),
        *seq.forced_variants("cpu"),
        *seq.forced_variants("cuda"),
    }


def test_a_path_of_another_device_is_n_a_and_says_which_paths_there_are() -> None:
    options = seq.LayerOptions()
    cuda = ", ".join(lltm.sequence_paths("cuda")) or "none"
    assert seq.not_applicable("layer-onednn", options, "cuda") == (
        f"no onednn path on cuda (its paths: {cuda})"
    )
    if "persistent" in lltm.sequence_paths("cuda"):
        assert seq.not_applicable("layer-persistent", options, torch.device("cpu")) == (
            f"no persistent path on cpu (its paths: {', '.join(lltm.sequence_paths('cpu'))})"
        )
    assert seq.not_applicable("layer-onednn", options, "cpu") is None
    if "fused" in lltm.sequence_paths("cuda"):
        assert seq.not_applicable("layer-fused", options, "cuda") is None
    # Without a device, only what the options rule out.
    assert seq.not_applicable("layer-onednn", options) is None


def test_the_forced_variants_on_the_cpu_are_the_layer_with_a_path_set() -> None:
    cpu = torch.device("cpu")
    cuda_only = [
        f"layer-{p}" for p in lltm.sequence_paths("cuda") if p not in lltm.sequence_paths("cpu")
    ]
    names = ["layer", *seq.forced_variants(cpu), *cuda_only]
    cases, errors = variants.build_variants(names, 3, 2, 3, 4, torch.float32, cpu)
    assert list(errors) == cuda_only
    assert [cases[n].path for n in names[: len(names) - len(cuda_only)]] == [
        None,
        *variants.forced_paths(cpu),
    ]
    for case in cases.values():
        assert case.sequence_op
        assert case.leaves == cases["layer"].leaves
    # The CPU's default run leaves them out; CUDA's has them.
    assert not set(seq.default_variants(cpu)) & set(seq.forced_variants(cpu))
    assert set(seq.forced_variants("cuda")) <= set(seq.default_variants("cuda"))


def test_forcing_sets_the_variable_for_the_calls_inside() -> None:
    before = os.environ.get(variants.PATH_VARIABLE)
    with variants.forcing("steps"):
        assert os.environ[variants.PATH_VARIABLE] == "steps"
        with variants.forcing(None):
            assert os.environ[variants.PATH_VARIABLE] == "steps"
    assert os.environ.get(variants.PATH_VARIABLE) == before
