"""The sequence benchmark: an LLTM layer over T steps against Python loops and ``nn.LSTM``.

``python -m lltm.benchmark --sequence T`` runs it at one T, ``--sequence
--sizes TxBxFxS,...`` at sizes of their own T, and ``--sequence --sweep`` over a
grid of T x B x (F, S), or ``--sequence --sweep --random N`` over N sizes drawn
log-uniform (:func:`draw_sizes`). Each timed iteration runs the forward over
all T steps and the backward of ``output.sum()``; the input and every
parameter need grad. With ``inference``, it runs the forward alone under
``torch.inference_mode()`` instead. On CUDA the device is synchronized
before each clock read. Variants:

* ``loop-python``: :func:`lltm.reference.lltm_sequence_reference`, a Python
  loop of the eager cell, differentiated by autograd;
* ``loop-lltm``: the same loop of :func:`lltm.lltm`;
* ``layer``: :class:`lltm.LLTMLayer`, one op call per direction, on the
  path that the op chooses;
* ``layer-<path>``: the same layer with ``LLTM_SEQUENCE_PATH`` forcing
  each path of the device (:func:`forced_paths`; on CUDA they run by
  default, on the CPU on request). A forced path that cannot run a size and
  dtype is n/a with the op's error (or, where the op left its blocks to
  another path, with the paths that ran). Beside ``layer``, each point
  gives the default choice's wall time / the fastest forced path's
  (``default_vs_forced``, :func:`forced_summary`);
* ``layer-padded`` (``packed`` only): the same layer on the same batch
  padded to its longest sequence, the lengths ignored;
* ``nn.LSTM``: PyTorch's LSTM at the same sizes (cuDNN on the GPU, oneDNN
  on the CPU), which does the work of 4 gates to the LLTM's 3.

nn.LSTM's options (:class:`LayerOptions`), for the layer and ``nn.LSTM``
alike; the loops run one direction over every step, so they are n/a with
either:

* ``bidirectional``: both run both directions (output ``2S`` features);
* ``packed``: a batch of B sequences whose lengths are drawn uniform in
  ``[ceil(T/4), T]`` with ``lengths_seed`` (:func:`packed_lengths`: every
  variant and run sees the same lengths), zero past each end, packed once
  outside the timed call (``pack_padded_sequence(..., enforce_sorted=False)``).
  The variants take the ``PackedSequence``, whose ``.data`` is the leaf that
  needs grad, and the backward runs from ``output.data.sum()``.
  ``packed_vs_padded`` = the ``layer``'s wall time / ``layer-padded``'s: the
  packed goal is at most :data:`PACKED_GOAL`. ``fill`` = the tokens / the
  padded batch's cells, the ratio that a time proportional to the tokens
  would give (about 0.63 for these lengths). The packed layer refuses
  CUDA-graph capture, so its GPU time is n/a.

Each variant that runs the sequence op (``layer`` and its kin) also records
the path that each block of steps ran (:func:`lltm.paths_that_ran`, one call
outside the timed loop): ``paths`` in full, ``path`` compactly (:func:`path_label`).

Two times per variant:

* the **wall time**: the median of eager calls, host work included;
* on CUDA, the **GPU time**: the same call captured once as a
  CUDA graph and replayed, timed with CUDA events while the host is ahead of
  the GPU, so that no host cost is in it. ``host_ratio`` = wall / GPU time:
  1.0 means the host adds nothing.

All variants start from the same weights (``nn.LSTM`` from its own) and take
turns in rounds, so that a change in machine load affects them alike (on the
GPU the medians move 2x between runs, their ratios do not).

Precisions (see :data:`PRECISIONS`): ``float32`` turns TF32 off for both
cuBLAS and cuDNN, so all variants compute in fp32; ``float32-defaults`` keeps
torch's defaults, under which cuDNN (and so ``nn.LSTM``) uses TF32 while the
matmuls that lltm follows do not; ``float16``; ``bfloat16``, where PyTorch
does not flatten ``nn.LSTM``'s weights and cuDNN copies them at every call
(so the reduced-precision anchor is ``float16``).

The modules, one concern each: :mod:`.sizes` (grids, options, drawn sizes),
:mod:`.precision`, :mod:`.variants`, :mod:`.timing` (wall and GPU clocks),
:mod:`.run`, :mod:`.summary` (the goals), :mod:`.tables` and
:mod:`.sweep_tables`, and :mod:`.plot`.
"""

from __future__ import annotations

from .plot import plot_sweep
from .precision import PRECISIONS, Precision
from .run import SWEEP_OPTIONS, path_label, run_sequence, run_sweep
from .sizes import (
    CPU_MAX_GMACS,
    PACKED_BATCHES,
    PACKED_FS,
    PACKED_STEPS,
    RANDOM_RANGES,
    SWEEP_BATCHES,
    SWEEP_FS,
    SWEEP_STEPS,
    LayerOptions,
    RandomSizes,
    draw_sizes,
    forward_macs,
    packed_lengths,
)
from .summary import (
    HOST_RATIO_GOAL,
    PACKED_GOAL,
    SPEEDUP_GOAL_MEDIAN,
    SPEEDUP_GOAL_WORST,
    forced_summary,
    packed_summary,
    sweep_summary,
)
from .sweep_tables import format_sweep_tables
from .tables import (
    describe,
    format_sequence_markdown,
    format_sequence_summary,
    format_sequence_table,
)
from .timing import GraphTime, graph_time
from .variants import (
    CUDA_VARIANTS,
    PACKED_VARIANTS,
    SWEEP_VARIANTS,
    VARIANTS,
    default_variants,
    forced_paths,
    forced_variants,
    not_applicable,
)

__all__ = [
    "CPU_MAX_GMACS",
    "CUDA_VARIANTS",
    "HOST_RATIO_GOAL",
    "PACKED_BATCHES",
    "PACKED_FS",
    "PACKED_GOAL",
    "PACKED_STEPS",
    "PACKED_VARIANTS",
    "PRECISIONS",
    "RANDOM_RANGES",
    "SPEEDUP_GOAL_MEDIAN",
    "SPEEDUP_GOAL_WORST",
    "SWEEP_BATCHES",
    "SWEEP_FS",
    "SWEEP_OPTIONS",
    "SWEEP_STEPS",
    "SWEEP_VARIANTS",
    "VARIANTS",
    "GraphTime",
    "LayerOptions",
    "Precision",
    "RandomSizes",
    "default_variants",
    "describe",
    "draw_sizes",
    "forced_paths",
    "forced_summary",
    "forced_variants",
    "format_sequence_markdown",
    "format_sequence_summary",
    "format_sequence_table",
    "format_sweep_tables",
    "forward_macs",
    "graph_time",
    "not_applicable",
    "packed_lengths",
    "packed_summary",
    "path_label",
    "plot_sweep",
    "run_sequence",
    "run_sweep",
    "sweep_summary",
]
