"""examples/train_digits.py: it trains on the CPU, and DDP and FSDP2 follow the one-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn", reason="examples/train_digits.py needs scikit-learn")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"
TWO_PROCESSES = (
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node=2",
)


def train(
    tmp_path: Path, name: str, *launcher: str, epochs: int = 2, options: tuple[str, ...] = ()
) -> dict:
    log = tmp_path / f"{name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            *launcher,
            str(SCRIPT),
            "--device",
            "cpu",
            "--epochs",
            str(epochs),
            "--log-json",
            str(log),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"epoch   {epochs}/{epochs}  loss" in result.stdout
    return json.loads(log.read_text())


def test_trains_on_the_cpu(tmp_path: Path) -> None:
    log = train(tmp_path, "one", sys.executable, epochs=3)
    losses = [e["loss"] for e in log["epochs"]]
    assert losses[-1] < 0.6 * losses[0]
    assert log["test_accuracy"] > 0.8


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The two-epoch run on one process, which the two-process runs must follow."""
    return train(tmp_path_factory.mktemp("one"), "one", sys.executable)


def assert_same_steps(one: dict, two: dict) -> None:
    """Same seed and global batch: the same steps, up to the rounding of the split batch."""
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert len(one["step_losses"]) == len(two["step_losses"]) > 0
    difference = max(
        abs(a - b) for a, b in zip(one["step_losses"], two["step_losses"], strict=True)
    )
    assert difference < 1e-4


def test_ddp_follows_the_one_process_run(tmp_path: Path, one_process: dict) -> None:
    two = train(tmp_path, "two", *TWO_PROCESSES)
    assert two["parallel"] == "ddp"
    assert two["local_parameters"] == two["parameters"]  # every process holds the model
    assert_same_steps(one_process, two)


def test_fsdp2_follows_the_one_process_run(tmp_path: Path, one_process: dict) -> None:
    """fully_shard over gloo: each process holds about half of each parameter, same steps."""
    two = train(tmp_path, "fsdp", *TWO_PROCESSES, options=("--fsdp",))
    assert two["parallel"] == "fsdp"
    # Shard(0) of each parameter: rank 0 holds the first ceil(rows / 2) rows.
    assert two["local_parameters"] < 0.6 * two["parameters"]
    assert_same_steps(one_process, two)
