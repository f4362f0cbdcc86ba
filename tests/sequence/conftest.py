"""The sequence tests' device: the CPU's choice, and each CUDA path forced."""

from __future__ import annotations

import pytest

from sequences import DEVICE_PATHS, set_device_path


@pytest.fixture(params=DEVICE_PATHS)
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The device to run on, with LLTM_SEQUENCE_PATH set for its path."""
    name, path = request.param
    set_device_path(monkeypatch, name, path)
    return name
