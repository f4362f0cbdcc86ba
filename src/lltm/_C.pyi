"""Type stubs for lltm._C, the compiled pybind11 module (cpp/bindings.cpp)."""

import torch
from torch import Tensor

PYBIND11_VERSION: str
"""Version of the pybind11 headers the module was compiled with (torch's bundled copy)."""
TORCH_VERSION: str
"""Version of the torch headers the module was compiled with."""

def forward(
    input: Tensor, weights: Tensor, bias: Tensor, old_h: Tensor, old_cell: Tensor
) -> list[Tensor]:
    """LLTM forward.

    Returns [new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights].
    """

def backward(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    input_gate: Tensor,
    output_gate: Tensor,
    candidate_cell: Tensor,
    X: Tensor,  # noqa: N803
    gate_weights: Tensor,
    weights: Tensor,
) -> list[Tensor]:
    """LLTM backward. Returns [d_old_h, d_input, d_weights, d_bias, d_old_cell]."""

# forward() and backward() computed with ATen operations only, on any device:
# the same signatures.
_forward_aten = forward
_backward_aten = backward

def supported_dtypes() -> list[torch.dtype]:
    """The dtypes the kernels are built for."""

# The sequence paths (cpp/sequence/path.h) and their choices
# (cpp/sequence/choice.h), for lltm.paths and lltm.tuning.
def _sequence_paths(device: torch.device) -> list[str]:
    """The sequence paths of a device's type, by rank (none where lltm has no kernels for it)."""

def _sequence_plan(
    path: str,
    device: torch.device,
    dtype: torch.dtype,
    steps: int,
    batch: int,
    input_features: int,
    state_size: int,
    backward: bool,
    save: bool,
) -> tuple[str | None, str]:
    """The plan that runs a block of steps on `path` ("auto": the choice's): (its name, ""), or (None, why not)."""

def _path_choices() -> list[dict[str, object]]:
    """The sequence paths chosen so far: key, path, plan, source, times_us."""

def _load_path_choices(entries: list[tuple[str, str]]) -> None:
    """Keep these (key, path) choices, where a key has none yet."""

def _clear_path_choices() -> None:
    """Forget every sequence path's choice."""
