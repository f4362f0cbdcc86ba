"""Shipping a model with lltm inside: torch.export, save/load, AOTInductor, torch.compile.

The model is what a user ships: a bidirectional ``LLTMLayer`` of two layers, an ``LLTM``
cell on its last step and a ``Linear`` head, exported once with dynamic steps
T and batch B. Every route must give the eager model's outputs at other T and
B than the traced ones. The saved program and the AOTInductor package are
loaded in a fresh process that has only ``import lltm`` (not this file's
model class), as a serving process would; without that import the package
cannot find the ops it calls.

One AOTInductor compile for the CPU, shared by the module (about half a
minute on two cores). On CUDA every AOTInductor step runs in a subprocess: on
torch 2.11 it crashes even for a model without lltm, so a control model of
two ``nn.Linear`` layers goes first, and the test is skipped, naming it, when
the control crashes.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import lltm
from helpers import run_python

pytestmark = [
    # Inductor's own deepcopy of the graph (torch/_dynamo/repro/after_aot.py)
    # trips torch's deprecation of LeafSpec; a model without lltm does too.
    pytest.mark.filterwarnings(
        "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"
    ),
]

FEATURES, STATE, CLASSES = 8, 16, 4
TRACED = (5, 3)  # (T, B) of the example input the model is exported with
# Other (T, B), one step and one sample among them.
SHAPES = [(1, 1), (2, 7), (12, 5)]

# What a serving process runs: load the artifact, run it on saved inputs,
# save the outputs. IMPORT_LLTM registers torch.ops.lltm, which the artifact
# calls by name; nothing else of lltm, or of this file, is imported.
IMPORT_LLTM = "import lltm\n"
SERVE = """\
import sys

import torch
{import_lltm}
kind, artifact, inputs, outputs = sys.argv[1:]
if kind == "aoti":
    run = torch._inductor.aoti_load_package(artifact)
else:
    run = torch.export.load(artifact).module()
with torch.no_grad():
    torch.save([run(x) for x in torch.load(inputs)], outputs)
print("served", kind)
"""

# Compiles a saved exported program into an AOTInductor package, in a
# subprocess of its own: on CUDA a crash there must not take pytest with it.
COMPILE = """\
import sys

import torch
import lltm

program, package = sys.argv[1:]
torch._inductor.aoti_compile_and_package(torch.export.load(program), package_path=package)
print("compiled")
"""

# The control: two nn.Linear layers, no lltm, through AOTInductor on CUDA and
# run in the same process.
CONTROL = """\
import sys

import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)).cuda().eval()
x = torch.randn(3, 8, device="cuda")
program = torch.export.export(model, (x,))
package = torch._inductor.aoti_compile_and_package(program, package_path=sys.argv[1])
with torch.no_grad():
    torch.testing.assert_close(torch._inductor.aoti_load_package(package)(x), model(x))
print("control ok")
"""


class SequenceClassifier(nn.Module):
    """Two bidirectional ``LLTMLayer`` layers, one more ``LLTM`` step on the last output
    (both directions'), from the last layer's forward state, and a ``Linear`` head."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = lltm.LLTMLayer(FEATURES, STATE, num_layers=2, bidirectional=True)
        self.cell = lltm.LLTM(2 * STATE, STATE)
        self.head = nn.Linear(STATE, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, CLASSES]`` of sequences ``[T, B, FEATURES]``."""
        output, (h_n, c_n) = self.rnn(x)
        h, _ = self.cell(output[-1], (h_n[-2], c_n[-2]))
        return self.head(h)


def make_model(device: str = "cpu") -> SequenceClassifier:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return SequenceClassifier().to(device).eval()


def export(model: nn.Module, device: str = "cpu") -> torch.export.ExportedProgram:
    """The model exported with dynamic T and B, from an example input of shape TRACED."""
    steps, batch = torch.export.Dim("T", min=1), torch.export.Dim("B", min=1)
    x = torch.randn(*TRACED, FEATURES, device=device)
    return torch.export.export(model, (x,), dynamic_shapes=({0: steps, 1: batch},))


def make_inputs(device: str = "cpu") -> list[Tensor]:
    return [torch.randn(t, b, FEATURES, device=device) for t, b in SHAPES]


def eager(model: nn.Module, inputs: list[Tensor]) -> list[Tensor]:
    with torch.no_grad():
        return [model(x) for x in inputs]


def serve(
    tmp_path: Path, kind: str, artifact: Path, inputs: list[Tensor], *, import_lltm: bool = True
) -> tuple[list[Tensor] | None, str]:
    """Run ``artifact`` on ``inputs`` in a fresh process: its outputs (None if it failed), its log."""
    script = tmp_path / "serve.py"
    script.write_text(SERVE.format(import_lltm=IMPORT_LLTM if import_lltm else ""))
    torch.save(inputs, tmp_path / "inputs.pt")
    result = run_python(
        script, kind, artifact, tmp_path / "inputs.pt", tmp_path / "outputs.pt", cwd=tmp_path
    )
    log = result.stdout + result.stderr
    if result.returncode != 0:
        return None, log
    assert f"served {kind}" in result.stdout
    return torch.load(tmp_path / "outputs.pt"), log


def exit_status(returncode: int) -> str:
    """``returncode`` in words: the signal's name when a signal ended the process."""
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


@pytest.fixture(scope="module")
def model() -> SequenceClassifier:
    return make_model()


@pytest.fixture(scope="module")
def program(model: SequenceClassifier) -> torch.export.ExportedProgram:
    return export(model)


@pytest.fixture(scope="module")
def package(
    program: torch.export.ExportedProgram, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The CPU AOTInductor package, compiled once for the module."""
    path = tmp_path_factory.mktemp("aoti") / "model.pt2"
    torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    return path


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_export_with_dynamic_steps_and_batch(device: str) -> None:
    model = make_model(device)
    program = export(model, device)
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert {"lltm.sequence.default", "lltm.cell.default"} <= ops
    inputs = make_inputs(device)
    for got, want in zip(eager(program.module(), inputs), eager(model, inputs), strict=True):
        torch.testing.assert_close(got, want)


def test_saved_program_loads_in_a_fresh_process(
    tmp_path: Path, model: SequenceClassifier, program: torch.export.ExportedProgram
) -> None:
    path = tmp_path / "program.pt2"
    torch.export.save(program, path)
    inputs = make_inputs()
    got, log = serve(tmp_path, "export", path, inputs)
    assert got is not None, log
    torch.testing.assert_close(got, eager(model, inputs))


def test_aoti_package_runs_in_a_fresh_process(
    tmp_path: Path, model: SequenceClassifier, package: Path
) -> None:
    inputs = make_inputs()
    got, log = serve(tmp_path, "aoti", package, inputs)
    assert got is not None, log
    torch.testing.assert_close(got, eager(model, inputs))


def test_aoti_package_needs_import_lltm(tmp_path: Path, package: Path) -> None:
    """The package calls torch.ops.lltm by name: without ``import lltm`` it does not load."""
    got, log = serve(tmp_path, "aoti", package, make_inputs(), import_lltm=False)
    assert got is None
    assert "Could not find schema for lltm::" in log


def test_torch_compile_fullgraph_dynamic(model: SequenceClassifier) -> None:
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    inputs = make_inputs()
    torch.testing.assert_close(eager(compiled, inputs), eager(model, inputs))


@pytest.mark.cuda
def test_aoti_package_runs_in_a_fresh_process_on_cuda(tmp_path: Path) -> None:
    control = tmp_path / "control.py"
    control.write_text(CONTROL)
    result = run_python(control, tmp_path / "control.pt2", cwd=tmp_path, timeout=300)
    if result.returncode != 0:
        pytest.skip(
            "AOTInductor on CUDA fails without lltm: the control (two nn.Linear layers "
            f"compiled and run in one process) ended with {exit_status(result.returncode)}: "
            f"{(result.stdout + result.stderr)[-500:]}"
        )
    model = make_model("cuda")
    torch.export.save(export(model, "cuda"), tmp_path / "program.pt2")
    compile_script = tmp_path / "compile.py"
    compile_script.write_text(COMPILE)
    result = run_python(
        compile_script,
        tmp_path / "program.pt2",
        tmp_path / "model.pt2",
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, f"{exit_status(result.returncode)}\n{result.stderr}"
    inputs = make_inputs("cuda")
    got, log = serve(tmp_path, "aoti", tmp_path / "model.pt2", inputs)
    assert got is not None, log
    torch.testing.assert_close(got, eager(model, inputs))
