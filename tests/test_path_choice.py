"""The sequence paths of the CPU and how a path is chosen (lltm.tuning).

Each CPU path (``steps``: ATen's BLAS and the pointwise kernel per step;
``onednn``: oneDNN's matmul per step; ``fused``: each step's GEMM and cell in
one kernel, forward and backward) is forced with LLTM_SEQUENCE_PATH, proven to have run through
the profiler's ranges (:func:`lltm.paths_that_ran`), and checked against the
float64 reference at float32's tolerance, at each kernel's edges. Then the
choice itself: measured, modelled, kept per kind of block, kept on disk.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import lltm
from helpers import TOLERANCES, run_python
from lltm.reference import lltm_layer_reference

CPU_PATHS = ("steps", "onednn", "fused")
KNOWN = {"steps", "onednn", "fused", "persistent", "cluster"}
ONEDNN = torch.backends.mkldnn.is_available()

# (steps, batch, features, state): one step, batch 1, state 1, states and
# batches that are no multiple of the fused kernel's vector and row block,
# and a state of several panels.
SHAPES = [(1, 3, 4, 16), (5, 1, 3, 33), (4, 9, 5, 1), (3, 17, 6, 17), (6, 8, 7, 130)]


@pytest.fixture
def _fresh_choices() -> Iterator[None]:
    lltm.clear_path_choices()
    yield
    lltm.clear_path_choices()


def layer_and_input(
    size: tuple[int, int, int, int], **options: object
) -> tuple[lltm.LLTMLayer, torch.Tensor]:
    steps, batch, features, state = size
    torch.manual_seed(sum(size))
    layer = lltm.LLTMLayer(features, state, **options)  # type: ignore[arg-type]
    return layer, torch.randn(steps, batch, features)


def train(layer: lltm.LLTMLayer, x: torch.Tensor) -> list[torch.Tensor]:
    """Output, h_n, c_n and the gradients of the input and every parameter."""
    x = x.detach().requires_grad_()
    layer.zero_grad()
    output, (h_n, c_n) = layer(x)
    scale = torch.linspace(-1, 1, output.numel()).view_as(output)
    ((output * scale).sum() + 2 * h_n.sum() + 3 * c_n.sum()).backward()
    return [output, h_n, c_n, x.grad, *(p.grad for p in layer.parameters())]


def train_reference(layer: lltm.LLTMLayer, x: torch.Tensor) -> list[torch.Tensor]:
    params = [p.detach().double().requires_grad_() for p in layer.parameters()]
    x64 = x.detach().double().requires_grad_()
    per_layer = [params[2 * k : 2 * k + 2] for k in range(len(params) // 2)]
    output, (h_n, c_n) = lltm_layer_reference(
        x64, per_layer, None, bidirectional=layer.bidirectional
    )
    scale = torch.linspace(-1, 1, output.numel(), dtype=torch.float64).view_as(output)
    ((output * scale).sum() + 2 * h_n.sum() + 3 * c_n.sum()).backward()
    return [output, h_n, c_n, x64.grad, *(p.grad for p in params)]


@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.parametrize("size", SHAPES, ids=str)
def test_each_cpu_path_runs_and_matches_the_reference(
    path: str, size: tuple[int, int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "onednn" and not ONEDNN:
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    layer, x = layer_and_input(size)
    ran = lltm.paths_that_ran(lambda: train(layer, x))
    assert ran == {"forward": [path], "backward": [path]}
    got = train(layer, x)
    for g, want in zip(got, train_reference(layer, x), strict=True):
        torch.testing.assert_close(g.double(), want, **TOLERANCES[torch.float32])
    # Bit for bit again, and the inference forward equals the training one.
    for g, again in zip(got, train(layer, x), strict=True):
        assert torch.equal(g, again)
    with torch.inference_mode():
        output, (h_n, c_n) = layer(x)
    assert lltm.paths_that_ran(lambda: layer(x.detach()))["forward"] == [path]
    assert torch.equal(output, got[0])
    assert torch.equal(h_n, got[1])
    assert torch.equal(c_n, got[2])


@pytest.mark.parametrize("path", CPU_PATHS)
def test_each_cpu_path_runs_both_directions_and_packed_batches(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "onednn" and not ONEDNN:
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", path)
    torch.manual_seed(3)
    layer = lltm.LLTMLayer(5, 20, num_layers=2, bidirectional=True)
    sequences = [torch.randn(n, 5) for n in (7, 3, 7, 1, 5)]
    packed = pack_sequence(sequences, enforce_sorted=False)
    ran = lltm.paths_that_ran(lambda: layer(packed))
    assert set(ran["forward"]) == {path}
    out, (h_n, c_n) = layer(packed)
    params = [[layer.layer_parameters(k, reverse=r) for r in (False, True)] for k in range(2)]
    flat = [[p.detach().double() for p in pair] for layers in params for pair in layers]
    want, (want_h, want_c) = lltm_layer_reference(
        pack_sequence([s.double() for s in sequences], enforce_sorted=False),
        flat,
        None,
        bidirectional=True,
    )
    tol = TOLERANCES[torch.float32]
    torch.testing.assert_close(out.data.double(), want.data, **tol)
    torch.testing.assert_close(h_n.double(), want_h, **tol)
    torch.testing.assert_close(c_n.double(), want_c, **tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_path_without_the_dtype_leaves_the_choice_to_auto(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    layer = lltm.LLTMLayer(3, 8, dtype=dtype)
    x = torch.randn(4, 2, 3, dtype=dtype)
    assert lltm.paths_that_ran(lambda: layer(x)[0].sum().backward()) == {
        "forward": ["steps"],
        "backward": ["steps"],
    }


def test_a_cuda_path_on_the_cpu_is_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "persistent")
    layer, x = layer_and_input((4, 2, 3, 8))
    ran = lltm.paths_that_ran(lambda: layer(x))
    assert len(ran["forward"]) == 1
    assert ran["forward"][0] in CPU_PATHS


@pytest.mark.parametrize(
    ("variable", "value", "match"),
    [
        ("LLTM_SEQUENCE_PATH", "fast", r"LLTM_SEQUENCE_PATH=fast: expected auto, steps, onednn"),
        ("LLTM_TUNING", "yes", r"LLTM_TUNING=yes: expected 1 .* or 0"),
    ],
)
@pytest.mark.usefixtures("_fresh_choices")
def test_bad_settings_are_named(
    variable: str, value: str, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    layer, x = layer_and_input((4, 2, 3, 8))
    with pytest.raises(ValueError, match=match):
        layer(x)


@pytest.mark.usefixtures("_fresh_choices")
def test_the_first_block_of_a_kind_measures_every_candidate() -> None:
    layer, x = layer_and_input((40, 3, 5, 24))
    rng = torch.get_rng_state()
    first: list[torch.Tensor] = []
    ran = lltm.paths_that_ran(lambda: first.extend(train(layer, x)))
    # Measuring draws nothing from torch's generator.
    assert torch.equal(torch.get_rng_state(), rng)
    choices = {c["key"]: c for c in lltm.path_choices()}
    assert set(choices) == {
        f"cpu|Float|forward|threads={torch.get_num_threads()}|T=64|B=4|F=5|S=24",
        f"cpu|Float|backward|threads={torch.get_num_threads()}|T=64|B=4|F=5|S=24",
    }
    for c in choices.values():
        assert c["source"] == "measured"
        names = [name for name, _ in c["times_us"]]
        assert names == (["steps", "onednn", "fused"] if ONEDNN else ["steps", "fused"])
        assert all(t > 0 for _, t in c["times_us"])
        fastest = min(c["times_us"], key=lambda nt: nt[1])[0]
        assert c["path"] == fastest
    # The measured runs left the call's own buffers alone.
    for g, want in zip(first, train(layer, x), strict=True):
        assert torch.equal(g, want)
    forward = next(c for k, c in choices.items() if "forward" in k)
    backward = next(c for k, c in choices.items() if "backward" in k)
    assert ran == {"forward": [forward["path"]], "backward": [backward["path"]]}
    # The same kind of block (another T and B in the same buckets) keeps it.
    layer(torch.randn(50, 4, 5))
    assert len(lltm.path_choices()) == 2


@pytest.mark.usefixtures("_fresh_choices")
def test_without_tuning_the_model_chooses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLTM_TUNING", "0")
    layer, x = layer_and_input((30, 2, 5, 24))
    with torch.no_grad():
        first: list[torch.Tensor] = []
        ran = lltm.paths_that_ran(lambda: first.append(layer(x)[0]))
        assert torch.equal(first[0], layer(x)[0])
    (choice,) = lltm.path_choices()
    assert choice["source"] == "model"
    assert "|inference|" in choice["key"]
    assert ran["forward"] == [choice["path"]]
    assert choice["path"] == min(choice["times_us"], key=lambda nt: nt[1])[0]


@pytest.mark.usefixtures("_fresh_choices")
def test_threads_share_one_choice() -> None:
    layer, x = layer_and_input((20, 5, 6, 40))
    outputs: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with torch.no_grad():
                outputs.append(layer(x)[0])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(lltm.path_choices()) == 1
    # Each Python thread has its own number of threads for ATen (and so its
    # own kind of block): close, not bit for bit.
    with torch.no_grad():
        want = layer(x)[0]
    for o in outputs:
        torch.testing.assert_close(o, want)


CHILD = """
import json, torch, lltm
layer = lltm.LLTMLayer(5, 24)
with torch.no_grad():
    ran = lltm.paths_that_ran(lambda: layer(torch.randn(30, 3, 5)))
print(json.dumps({"ran": ran, "choices": lltm.path_choices(),
                  "file": str(lltm.tuning.cache_file())}))
"""


def child(env: dict[str, str | None]) -> dict[str, object]:
    done = run_python("-c", CHILD, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_choices_are_kept_on_disk_for_the_next_process(tmp_path: Path) -> None:
    env: dict[str, str | None] = {
        "LLTM_CACHE_DIR": str(tmp_path),
        "LLTM_SEQUENCE_PATH": None,
        "LLTM_TUNING": None,
    }
    first = child(env)
    (measured,) = first["choices"]
    assert measured["source"] == "measured"
    kept = json.loads(Path(str(first["file"])).read_text())
    assert kept["choices"] == {measured["key"]: measured["path"]}
    second = child(env)
    assert second["choices"] == [
        {"key": measured["key"], "path": measured["path"], "source": "cache", "times_us": []}
    ]
    assert second["ran"]["forward"] == [measured["path"]]
    # An empty LLTM_CACHE_DIR keeps nothing.
    third = child({**env, "LLTM_CACHE_DIR": ""})
    assert third["file"] == "None"
    assert third["choices"][0]["source"] == "measured"


def test_paths_that_ran_names_known_paths() -> None:
    layer, x = layer_and_input((3, 2, 3, 8), bidirectional=True)
    ran = lltm.paths_that_ran(lambda: train(layer, x))
    assert len(ran["forward"]) == 2
    assert len(ran["backward"]) == 2
    assert set(ran["forward"]) | set(ran["backward"]) <= KNOWN
