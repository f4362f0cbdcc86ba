"""Shared fixtures: devices, dtypes and LLTM inputs."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator

# The sequence paths' choices of the tests' processes are kept apart from
# the user's (lltm.tuning), before lltm's import reads them.
os.environ.setdefault("LLTM_CACHE_DIR", tempfile.mkdtemp(prefix="lltm-cache-"))

import pytest
import torch

import lltm

CUDA_SKIP_REASON = "needs a CUDA device and a CUDA build of lltm"


def cuda_available() -> bool:
    return "cuda" in lltm.available_backends()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    if cuda_available():
        return
    skip = pytest.mark.skip(reason=CUDA_SKIP_REASON)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded_rng() -> Iterator[None]:
    """Seed every test and leave the global RNG state as it was."""
    cpu_state = torch.get_rng_state()
    py_state = random.getstate()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    torch.manual_seed(0)
    yield
    torch.set_rng_state(cpu_state)
    random.setstate(py_state)
    if cuda_states is not None:
        torch.cuda.set_rng_state_all(cuda_states)
