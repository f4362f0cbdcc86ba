"""How a sequence path is chosen (lltm.tuning), and what forcing one means.

The choice of the CPU: measured at a kind of block's first run, or by the
model (LLTM_TUNING=0), kept per kind of block, kept on disk. On CUDA, the
rules of the paths' windows, reported the same way. LLTM_SEQUENCE_PATH forces
a path of the block's device, and raises where it cannot run.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import lltm
from helpers import run_python
from sequences import (
    CPU_PATHS,
    layer_and_input,
    make_sequence,
    path_dtype,
    plan_or_reason,
    train,
    with_grads,
)

ONEDNN = torch.backends.mkldnn.is_available()


def block_choices() -> list[lltm.PathChoice]:
    """The choices of paths for blocks of steps, without the GEMMs' around them."""
    return [c for c in lltm.path_choices() if "|gemm|" not in c["key"]]


@pytest.fixture
def _fresh_choices() -> Iterator[None]:
    lltm.clear_path_choices()
    yield
    lltm.clear_path_choices()


def test_forcing_a_path_of_another_device_raises_naming_this_devices_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "persistent")
    layer, x = layer_and_input((4, 2, 3, 8))
    with pytest.raises(
        ValueError,
        match="LLTM_SEQUENCE_PATH=persistent: expected auto or a sequence path of the CPU: "
        + ", ".join(CPU_PATHS),
    ):
        layer(x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_forcing_a_path_that_cannot_run_raises_with_its_reason(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU's fused kernel is float32's alone: forcing it elsewhere is an error, not steps."""
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    layer = lltm.LLTMLayer(3, 8, dtype=dtype)
    x = torch.randn(4, 2, 3, dtype=dtype)
    with pytest.raises(
        RuntimeError,
        match=r"lltm::sequence_forward: LLTM_SEQUENCE_PATH=fused, but the fused path cannot run "
        r"a forward of steps = 4, batch = 2, input_features = 3, state_size = 8 in "
        + str(dtype).removeprefix("torch.")
        + r" here: float32 only",
    ):
        layer(x)[0].sum().backward()


def test_empty_blocks_run_no_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing to compute: no path runs, so forcing one that could not run is no error."""
    monkeypatch.setenv("LLTM_SEQUENCE_PATH", "fused")
    args = make_sequence(3, 0, 2, 4)
    ran = lltm.paths_that_ran(lambda: with_grads(lltm.lltm_sequence, args))
    assert ran["forward"] == ran["backward"] == []


@pytest.mark.parametrize(
    ("variable", "value", "match"),
    [
        (
            "LLTM_SEQUENCE_PATH",
            "fast",
            "LLTM_SEQUENCE_PATH=fast: expected auto or a sequence path of the CPU: "
            + ", ".join(CPU_PATHS),
        ),
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
    choices = {c["key"]: c for c in block_choices()}
    assert set(choices) == {
        f"cpu|Float|forward|threads={torch.get_num_threads()}|T=64|B=4|F=5|S=24",
        f"cpu|Float|backward|threads={torch.get_num_threads()}|T=64|B=4|F=5|S=24",
    }
    for key, c in choices.items():
        assert c["source"] == "measured"
        names = [name for name, _ in c["times_us"]]
        candidates = [
            p for p in CPU_PATHS if (p != "onednn" or ONEDNN) and not p.startswith("dpbf16")
        ]
        if "|backward|" in key:
            # fused_input's backward is fused's: one candidate.
            candidates.remove("fused_input")
        assert names == candidates
        assert all(t > 0 for _, t in c["times_us"])
        fastest = min(c["times_us"], key=lambda nt: nt[1])[0]
        assert c["path"] == fastest
    # The measured runs left the call's own buffers alone.
    for g, want in zip(first, train(layer, x), strict=True):
        assert torch.equal(g, want)
    forward = next(c for k, c in choices.items() if "forward" in k)
    backward = next(c for k, c in choices.items() if "backward" in k)
    assert ran["forward"] == [forward["plan"]]
    assert ran["backward"] == [backward["plan"]]
    # The same kind of block (another T and B in the same buckets) keeps it.
    layer(torch.randn(50, 4, 5))
    assert len(block_choices()) == 2


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
    (choice,) = block_choices()
    assert choice["source"] == "model"
    assert "|inference|" in choice["key"]
    assert ran["forward"] == [choice["path"]]
    assert choice["path"] == min(choice["times_us"], key=lambda nt: nt[1])[0]


# Sizes whose model estimates rank each CPU path first (LLTM_TUNING=0).
RANKED_SIZES = [(30, 2, 5, 24), (20, 1, 8, 512), (1, 1, 16, 512), (1, 1, 5, 64)]


def auto_inference(
    size: tuple[int, int, int, int], dtype: torch.dtype = torch.float32
) -> tuple[lltm.PathChoice, list[str]]:
    """The one choice that `auto` made for an inference block of `size`, and the path that ran."""
    lltm.clear_path_choices()
    layer, x = layer_and_input(size, dtype=dtype)
    with torch.no_grad():
        ran = lltm.paths_that_ran(lambda: layer(x.to(dtype)))
    choices = block_choices()
    assert len(choices) == 1, f"auto chose nothing at {size}: {choices}"
    return choices[0], ran["forward"]


@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.usefixtures("_fresh_choices")
def test_auto_runs_each_path_where_the_model_ranks_it_first(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`auto` is no alias of one path: the model's first at each size is what runs."""
    if path == "onednn" and not ONEDNN:
        pytest.skip("this build of torch has no oneDNN")
    # A path that refuses float32 (dpbf16) is ranked in the dtype it takes.
    dtype = path_dtype(path, "cpu")
    plan, why = plan_or_reason(path, "cpu", dtype, RANKED_SIZES[0])
    if plan is None:
        pytest.skip(why)
    monkeypatch.setenv("LLTM_TUNING", "0")
    for size in RANKED_SIZES:
        choice, ran = auto_inference(size, dtype)
        first = min(choice["times_us"], key=lambda nt: nt[1])[0]
        assert choice["path"] == first
        assert ran == [first]
        if first == path:
            return
    pytest.fail(f"the model ranks {path} first at none of {RANKED_SIZES}")


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
    assert len(block_choices()) == 1
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
        {
            "key": measured["key"],
            "path": measured["path"],
            "plan": measured["plan"],
            "source": "cache",
            "times_us": [],
        }
    ]
    assert second["ran"]["forward"] == [measured["path"]]
    # An empty LLTM_CACHE_DIR keeps nothing.
    third = child({**env, "LLTM_CACHE_DIR": ""})
    assert third["file"] == "None"
    assert third["choices"][0]["source"] == "measured"


def test_paths_that_ran_names_the_tables_paths() -> None:
    layer, x = layer_and_input((3, 2, 3, 8), bidirectional=True)
    ran = lltm.paths_that_ran(lambda: train(layer, x))
    assert len(ran["forward"]) == 2
    assert len(ran["backward"]) == 2
    assert set(ran["forward"]) | set(ran["backward"]) <= set(CPU_PATHS)
    assert ran["cell"] == ran["cell_backward"] == []


@pytest.mark.usefixtures("_fresh_choices")
def test_a_stale_cached_path_is_measured_anew_and_replaced() -> None:
    """A line of the disk's cache naming no path of the table (another version's) gives way, once."""
    key = f"cpu|Float|inference|threads={torch.get_num_threads()}|T=30|B=4|F=5|S=24"
    lltm._C._load_path_choices([(key, "retired")])
    layer, x = layer_and_input((30, 3, 5, 24))
    with torch.no_grad():
        layer(x)
    (choice,) = block_choices()
    assert (choice["key"], choice["source"]) == (key, "measured")
    assert choice["path"] in CPU_PATHS
    with torch.no_grad():
        layer(x)
    assert block_choices() == [choice]
