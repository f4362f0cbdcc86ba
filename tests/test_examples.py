"""examples/train_digits.py: it trains on the CPU, and DDP follows the one-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn", reason="examples/train_digits.py needs scikit-learn")

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"


def train(tmp_path: Path, name: str, *launcher: str, epochs: int = 2) -> dict:
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


def test_ddp_follows_the_one_process_run(tmp_path: Path) -> None:
    """Same seed and global batch: the same steps, up to the rounding of the split batch."""
    one = train(tmp_path, "one", sys.executable)
    two = train(
        tmp_path,
        "two",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
    )
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert len(one["step_losses"]) == len(two["step_losses"]) > 0
    difference = max(
        abs(a - b) for a, b in zip(one["step_losses"], two["step_losses"], strict=True)
    )
    assert difference < 1e-4
