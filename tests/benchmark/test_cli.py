"""The command line: its parse, its defaults per mode, and the flags a mode refuses."""

from __future__ import annotations

import argparse
import re

import pytest
from bench_helpers import run_benchmark

import lltm
from lltm import benchmark
from lltm.benchmark import sequence as seq


def test_parse_args() -> None:
    args = benchmark.parse_args(["--sizes", "16x32x128,4096X32X128"])
    assert args.sizes == [(16, 32, 128), (4096, 32, 128)]
    assert benchmark.parse_args(["-b", "7"]).sizes == [(7, 32, 128)]
    assert benchmark.parse_args([]).variants == list(benchmark.VARIANTS)
    for bad in (["--sizes", "16x32"], ["--sizes", "0x1x1"], ["--variants", "python,nope"]):
        with pytest.raises(SystemExit):
            benchmark.parse_args(bad)


def test_parse_errors_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--sizes", "16x32"])
    assert "expected BATCHxFEATURESxSTATE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--variants", "python,nope"])
    assert "unknown nope" in capsys.readouterr().err


def test_rejects_unavailable_device() -> None:
    if "cuda" in lltm.available_backends():
        pytest.skip("CUDA is available here")
    result = run_benchmark("--device", "cuda", "--runs", "1")
    assert result.returncode != 0
    assert "--device cuda: lltm cannot run on cuda here (available: cpu" in result.stderr


def test_namespace_defaults() -> None:
    args = benchmark.parse_args([])
    assert isinstance(args, argparse.Namespace)
    assert args.grad == "params"
    assert args.runs is None
    assert args.seconds == 2.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sequence"], r"--sequence without T: give --sweep, or --sizes STEPSx"),
        (["--sequence", "8", "--sweep"], r"--sequence T and --sweep: the sweep takes its T"),
        (["--sequence", "--sweep", "-b", "4"], r"--batch-size and --sweep: the sweep takes"),
        (["--sequence", "--sweep", "--sizes", "1x2x3"], r"--sizes and --sweep"),
        (["--sequence", "8", "--steps", "1,2"], r"--steps: only with --sweep"),
        (["--sequence", "8", "--plot", "x.png"], r"--plot with --sequence: only with --sweep"),
        (["--sequence", "8", "--grad", "all"], r"--grad: --sequence always differentiates"),
        (["--sequence", "8", "--dtype", "float16", "--precision", "float16"], r"give one"),
        (["--sequence", "8", "--precision", "float8"], r"--precision: unknown float8"),
        (["--sequence", "8", "--variants", "layer,lstm"], r"--variants: unknown lstm; with"),
        (["--sequence", "8", "--sizes", "2x1x3x4"], r"--sequence 8 and --sizes STEPSx"),
        (["--sequence", "8", "-s", "4", "--sizes", "2x3x4"], r"--state-size and --sizes: give"),
        (["--sequence", "8", "--warmup", "0"], r"--warmup 0 with --sequence: every variant's"),
        (["--sequence", "8", "--variants", "lltm"], r"--variants: unknown lltm; with --sequence"),
        (["--sequence", "--sweep", "--fs", "32"], r"expected FEATURESxSTATE"),
        (["--sequence", "--sweep", "--batches", "0"], r"expected positive integers"),
        (["--sequence", "--sweep", "--device", "cpu,cuda"], r"--sweep runs on one device"),
        (["--sweep"], r"--sweep: only with --sequence"),
        (["--precision", "float16"], r"--precision: only with --sequence"),
        (["--sizes", "2x1x3x4"], r"STEPSx\.\.\. only with --sequence"),
        (["--no-gpu-time"], r"--no-gpu-time: only with --sequence"),
        # The cell benchmark: -b/-f/-s and --sizes are one size or a list, not both.
        (["-b", "4", "-f", "2", "--sizes", "2x3x4"], r"--batch-size, --features and --sizes: give"),
    ],
)
def test_sequence_flags_that_cannot_apply_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        benchmark.parse_args(argv)
    assert re.search(message, capsys.readouterr().err)


def test_sequence_defaults_per_mode() -> None:
    single = benchmark.parse_args(["--sequence", "8", "-b", "4"])
    assert single.sizes == [(8, 4, 32, 128)]
    assert (single.precision, single.warmup, single.rounds, single.seconds) == (
        ["float32"],
        3,
        5,
        2.0,
    )
    sweep = benchmark.parse_args(["--sequence", "--sweep", "--device", "cpu"])
    assert (sweep.steps, sweep.batches, sweep.fs) == (
        list(seq.SWEEP_STEPS),
        list(seq.SWEEP_BATCHES),
        list(seq.SWEEP_FS),
    )
    assert sweep.variants == ["layer", "nn.LSTM"]
    assert (sweep.warmup, sweep.rounds, sweep.seconds) == (2, 3, 0.5)
    # Given values are kept, not clamped.
    assert benchmark.parse_args(["--sequence", "8", "--warmup", "20"]).warmup == 20
    step = benchmark.parse_args(["--kernels"])
    assert (step.launches, step.dtype, step.warmup, step.rounds) == (True, "float32", 20, 10)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--packed"], r"--packed: only with --sequence"),
        (["--bidirectional", "-b", "4"], r"--bidirectional: only with --sequence"),
        (["--lengths-seed", "0"], r"--lengths-seed: only with --sequence"),
        (["--sequence", "8", "--lengths-seed", "0"], r"--lengths-seed: only with --packed"),
        (["--sequence", "8", "--packed", "--lengths-seed", "-1"], r"must be at least 0"),
        (["--sequence", "8", "--variants", "layer-padded"], r"layer-padded: only with --packed"),
        (
            ["--sequence", "8", "--bidirectional", "--variants", "layer,loop-lltm"],
            r"--variants loop-lltm with --bidirectional: the loops run one direction",
        ),
        (
            ["--sequence", "--sweep", "--packed", "--variants", "loop-python"],
            r"--variants loop-python with --packed",
        ),
    ],
)
def test_option_flags_that_cannot_apply_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        benchmark.parse_args(argv)
    assert re.search(message, capsys.readouterr().err)


def test_random_sizes_at_parse_time() -> None:
    """The same seed, the same sizes; the cap by device; the grid options keep their defaults."""

    def drawn(*argv: str) -> seq.RandomSizes:
        args = benchmark.parse_args(["--sequence", "--sweep", "--random", "4", *argv])
        assert (args.steps, args.batches, args.fs) == (None, None, None)
        return args.random_sizes

    cpu = drawn("--seed", "11", "--device", "cpu")
    assert cpu.sizes == drawn("--seed", "11", "--device", "cpu").sizes
    assert cpu.sizes != drawn("--seed", "12", "--device", "cpu").sizes
    assert cpu.sizes == seq.draw_sizes(4, 11, max_gmacs=seq.CPU_MAX_GMACS).sizes
    assert drawn("--device", "cpu").seed == 0
    # CUDA: no cap by default (parsing needs no GPU); inf lifts the CPU's.
    assert drawn("--device", "cuda").max_gmacs is None
    assert drawn("--device", "cpu", "--max-gmacs", "inf").max_gmacs is None
    given = drawn("--device", "cpu", "--max-gmacs", "0.5", "--random-range", "s=64:1024")
    assert (given.max_gmacs, given.cap_note) == (0.5, "")
    assert given.ranges["S"] == (64, 1024)
    assert all(seq.forward_macs(*s) <= 0.5e9 and 64 <= s[3] <= 1024 for s in given.sizes)
    assert benchmark.parse_args(["--sequence", "8"]).random_sizes is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--random-range", "T=9:3"], r"argument --random-range: 'T=9:3': LO must be at most HI"),
        (["--random-range", "X=1:3"], r"argument --random-range: expected KEY=LO:HI"),
        (["--random-range", "T=1-3"], r"argument --random-range: expected KEY=LO:HI"),
        (["--random-range", "B=0:3"], r"argument --random-range: sizes must be at least 1"),
        (["--random-range", "T=1:3,T=2:4"], r"argument --random-range: T given twice"),
        (["--max-gmacs", "0"], r"argument --max-gmacs: must be above 0"),
        (["--max-gmacs", "1e-9"], r"--max-gmacs 1e-09: the cap of 1e-09 GMAC is below"),
        (["--steps", "4"], r"--steps and --random: the sizes are drawn"),
        (["--plot", "x.png"], r"--plot with --random: the heat map needs the grid"),
    ],
)
def test_random_flags_that_cannot_apply_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        benchmark.parse_args(["--sequence", "--sweep", "--random", "3", "--device", "cpu", *argv])
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sequence", "--sweep", "--seed", "3"], r"--seed: only with --random"),
        (["--sequence", "8", "--random-range", "T=1:3"], r"--random-range: only with --random"),
        (["--sequence", "8", "--max-gmacs", "3"], r"--max-gmacs: only with --random"),
        (["--sequence", "8", "--random", "3"], r"--random: only with --sweep"),
        (["--random", "3"], r"--random: only with --sequence"),
        (["--inference"], r"--inference: only with --sequence"),
    ],
)
def test_random_and_inference_need_their_modes(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        benchmark.parse_args(argv)
    assert re.search(message, capsys.readouterr().err)
