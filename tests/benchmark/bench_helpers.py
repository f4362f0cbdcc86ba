"""What the benchmark's tests share: the command line, rows of known times, path names."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import torch

import lltm
from helpers import run_python
from lltm.benchmark.sequence import forced_paths, forced_variants

# The names of the sequence paths, on the CPU and on CUDA.
KNOWN_PATHS = {*forced_paths("cpu"), *forced_paths("cuda")}


def forced_in_float32(device: str) -> tuple[str, ...]:
    """The device's forced variants whose path plans a float32 block (dpbf16 takes bfloat16 alone)."""

    def plans(variant: str) -> bool:
        try:
            lltm.paths.plan(
                variant.removeprefix("layer-"),
                device=device,
                dtype=torch.float32,
                steps=4,
                batch=2,
                input_features=3,
                state_size=8,
            )
        except RuntimeError:
            return False
        return True

    return tuple(filter(plans, forced_variants(device)))


# --random's ranges for sizes that run in milliseconds.
TINY_RANGES = ["--random-range", "T=2:6,B=1:5,F=16:20,S=32:40"]


def run_benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m lltm.benchmark ARGS`` in a subprocess, its output captured."""
    return run_python("-m", "lltm.benchmark", *args)


def sequence_row(variant: str, t: int, b: int, wall: float, gpu: float | None = None) -> dict:
    """A row of run_sequence's shape, with the fields the reports read."""
    return {
        "variant": variant,
        "device": "cuda:0",
        "dtype": "float32",
        "precision": "float32",
        "steps": t,
        "batch": b,
        "features": 3,
        "state": 4,
        "median_ms": wall,
        "min_ms": wall,
        "gpu_ms": gpu,
        "gpu_us_per_step": gpu * 1e3 / t if gpu is not None else None,
        "host_ratio": wall / gpu if gpu is not None else None,
    }


def bench_tables() -> ModuleType:
    """scripts/bench_tables.py, imported as a module."""
    scripts = str(Path(__file__).resolve().parents[2] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    return importlib.import_module("bench_tables")
