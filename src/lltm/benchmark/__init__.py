"""``python -m lltm.benchmark``: lltm's cell and layer, timed against what users would pick instead.

Without ``--sequence`` it times the training step of the cell
(:mod:`lltm.benchmark.cell` lists the variants). ``--grad params`` (the
default, the tutorial's case) differentiates the weights and bias only;
``--grad all`` also the input and both states, as in an unrolled sequence.
``--sizes`` sweeps several sizes and ``--plot`` draws time against batch size
(``pip install 'lltm[plot]'`` for matplotlib). ``--launches`` counts the GPU
operations of each variant's forward and backward with ``torch.profiler``.

``--sequence T`` times whole sequences instead: :class:`lltm.LLTMLayer` over
T steps against Python loops of the cell and ``nn.LSTM``, with the GPU time
of each (the call replayed as a CUDA graph) beside its wall time (see
:mod:`lltm.benchmark.sequence`). ``--sequence --sizes TxBxFxS,...`` gives each
size its own T; ``--sequence --sweep`` runs the layer and ``nn.LSTM`` over
``--steps`` x ``--batches`` x ``--fs`` (by default the grid of the speedup goals),
prints the speedup tables in Markdown and ``--plot`` draws them as a heat map.
``--precision float32,float32-defaults,float16,bfloat16`` picks the dtypes and
TF32 switches of a sequence run.

``--sequence --bidirectional`` and ``--sequence --packed``, at sizes or in a
sweep, give the layer and ``nn.LSTM`` those options of nn.LSTM's:
both directions, or a ``PackedSequence`` of lengths drawn uniform in
``[T/4, T]`` (``--lengths-seed``, default 0; recorded with the options in
every row and the JSON's config). ``--packed`` adds ``layer-padded``, the
layer on the same batch padded to its longest sequence, and reports the
packed / padded time ratio beside the speedup over ``nn.LSTM``, with their
worst and median over the sizes; ``--sweep --packed`` defaults to the packed
goal's eight sizes. The goals' commands are in ``--help``.

``--sequence --sweep --random N --seed S`` runs N sizes drawn instead of the
grid, each of T, B, F and S log-uniform over its range (``--random-range
T=1:1000,B=1:2048``; by default T 1..2000, B 1..4096, F 16..1024, S
32..2048) and rounded, so that odd sizes occur; the same seed draws the same
sizes on every machine. ``--max-gmacs X`` draws again a size whose forward
does more than X billion multiply-adds (on the CPU 2 by default, so that a
run ends). ``--inference`` times the forward alone under
``torch.inference_mode()``, with or without the sweep and the options. Every
report names the sequence path that the layer ran at each size
(:func:`lltm.paths_that_ran`). ``--variants layer-PATH`` forces a sequence
path of the device (:func:`lltm.benchmark.sequence.forced_paths`); beside
``layer``, the tables give the default choice's time / the best forced path's.

:mod:`lltm.benchmark.cli` holds the one command line of both.
"""

from __future__ import annotations

from .cell import VARIANTS, Problem, Result, run
from .cli import main, parse_args

__all__ = ["VARIANTS", "Problem", "Result", "main", "parse_args", "run"]
