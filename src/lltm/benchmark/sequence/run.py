"""Running a sequence benchmark: the variants of one size in rounds, and sweeps of sizes."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import lltm

from .._common import dtype_name, first_line, in_rounds
from .._common import progress as _progress
from .precision import DTYPE_PRECISION, PRECISIONS, Precision, precision_switches
from .sizes import SWEEP_BATCHES, SWEEP_FS, SWEEP_STEPS, LayerOptions, lengths_fields
from .summary import row_setting
from .timing import GraphTime, gpu_measures, timed, warm_up
from .variants import (
    PACKED_VARIANTS,
    PATH_VARIABLE,
    SWEEP_VARIANTS,
    VARIANTS,
    Variant,
    build_variants,
    default_variants,
    forcing,
)

__all__ = ["SWEEP_OPTIONS", "path_label", "run_sequence", "run_sweep"]

# run_sequence's options in a sweep: a short budget per point, for its hundreds of points.
SWEEP_OPTIONS: dict[str, Any] = {
    "runs": None,
    "seconds": 0.5,
    "min_runs": 3,
    "max_runs": 200,
    "warmup": 2,
    "rounds": 3,
}


def _paths(v: Variant) -> lltm.PathsThatRan | None:
    """The path of each block of steps in one timed call of ``v``.

    Under ``torch.profiler``, so never inside the timed loop. None where ``v``
    calls no sequence op, or the profiler failed.
    """
    if not v.sequence_op:
        return None
    try:
        v.clear_grads()
        with forcing(v.path):
            return lltm.paths_that_ran(v.call)
    except Exception:  # noqa: BLE001 - the path is a note: none rather than a crash
        return None
    finally:
        v.clear_grads()


def _reason(exc: BaseException) -> str:
    """Why a variant cannot run: the line of ``exc`` that names the forced path, else its first."""
    named = [line for line in str(exc).splitlines() if PATH_VARIABLE in line]
    return named[0].strip() if named else first_line(exc)


def _not_forced(path: str | None, ran: lltm.PathsThatRan) -> str | None:
    """Why the blocks that ``ran`` are not the forced ``path``'s (None: they are, or none forced).

    The op may leave a block that the forced path cannot run to its usual
    choice: its time is then not the forced path's.
    """
    # A plan is named after its path: "cluster/simt/28x16" is the cluster's.
    others = sorted({p for p in ran["forward"] + ran["backward"] if p.split("/")[0] != path})
    if path is None or not others:
        return None
    return (
        f"{PATH_VARIABLE}={path}, but blocks ran {', '.join(others)}: the {path} path does not run "
        "these sizes and dtype here"
    )


def path_label(paths: lltm.PathsThatRan | None) -> str | None:
    """The paths of :func:`lltm.paths_that_ran`, compactly, as the tables show them.

    ``a / b``: every forward block ran plan ``a``, every backward one ``b``
    (spaced: a plan's own name has slashes, ``fused/mma/16x16/coop``);
    ``a``: both the same, or a forward alone (inference);
    where blocks ran different paths, their distinct names joined by ``+``
    (forward's first). None without paths; ``-`` where no block was marked.
    """
    if paths is None:
        return None
    forward = list(dict.fromkeys(paths["forward"]))
    backward = list(dict.fromkeys(paths["backward"]))
    if len(forward) > 1 or len(backward) > 1:
        return "+".join(dict.fromkeys(forward + backward))
    if forward and backward and forward != backward:
        return f"{forward[0]} / {backward[0]}"
    return (forward or backward or ["-"])[0]


def run_sequence(
    steps: int,
    batch: int,
    features: int,
    state: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    runs: int | None = 20,
    *,
    precision: str | None = None,
    seconds: float = 1.0,
    min_runs: int = 5,
    max_runs: int = 1000,
    warmup: int = 3,
    rounds: int = 5,
    variants: Sequence[str] | None = None,
    gpu_time: bool = True,
    launches: bool = False,
    progress: bool = True,
    bidirectional: bool = False,
    packed: bool = False,
    lengths_seed: int = 0,
    inference: bool = False,
) -> list[dict[str, Any]]:
    """Time forward + backward (or with ``inference``, the forward) of every variant over T steps.

    Args:
        steps: T, the sequence length.
        batch: B.
        features: F, the input features.
        state: S, the state size.
        dtype: of the inputs and parameters (when ``precision`` is not given).
        device: where to run.
        runs: timed iterations per variant, in ``rounds`` turns; None: as many
            as fit in ``seconds`` for all variants together (``min_runs`` to
            ``max_runs``).
        precision: a key of :data:`PRECISIONS` (dtype and TF32 switches);
            default: ``dtype``'s, with TF32 off.
        seconds: the time budget of the timed runs, when ``runs`` is None.
        min_runs: the fewest runs, when ``runs`` is None.
        max_runs: the most runs, when ``runs`` is None.
        warmup: untimed iterations per variant first (at least 1).
        rounds: how often the variants take turns.
        variants: a subset of :data:`VARIANTS` (default: all that run on
            ``device`` with these options, :func:`default_variants`; a forced
            path of another device is n/a, as is a variant that the options
            rule out).
        gpu_time: on CUDA, also time each variant as a CUDA graph replay.
        launches: on CUDA, count each variant's GPU operations (torch.profiler).
        progress: report each round on stderr.
        bidirectional: the layer and nn.LSTM run both directions.
        packed: the layer and nn.LSTM take a ``PackedSequence`` of lengths
            uniform in ``[ceil(T/4), T]``; ``layer-padded`` the same batch
            padded (see the module's docstring).
        lengths_seed: the seed of the packed batch's lengths.
        inference: time the forward alone under ``torch.inference_mode()``
            (GPU time, kernels and paths too) instead of forward + backward.

    Returns:
        One dict per variant: ``variant``, ``device``, ``dtype``,
        ``precision``, ``steps``, ``batch``, ``features``, ``state``,
        ``matmul_tf32``, ``cudnn_tf32``, ``runs``, ``median_ms``, ``min_ms``
        (wall), ``gpu_ms``, ``gpu_min_ms``, ``gpu_replays``,
        ``gpu_us_per_step`` (graph replay / T), ``host_ratio`` (wall median /
        GPU time), ``gpu_error`` (why there is no GPU time), ``launches``,
        ``vs_lstm`` (nn.LSTM's wall median / this one's: above 1 is faster
        than nn.LSTM), ``gpu_vs_lstm`` (the same on GPU times) and
        ``vs_loop_lltm`` (against the loop of ``lltm.LLTM``); nn.LSTM's row
        also has ``weights_flat`` (on CUDA: whether its weights share the one
        buffer that cuDNN needs, else it copies them per call). Every row
        records the options, ``bidirectional``, ``packed`` and
        ``lengths_seed`` (None unpacked); packed, also ``shortest`` and
        ``padded_steps`` (the longest length: ``layer-padded``'s T) and
        ``fill`` (the tokens / ``batch * padded_steps``), and the ``layer``
        row ``packed_vs_padded`` (its wall median / ``layer-padded``'s: below
        1 the packing saves time). Beside forced paths, the ``layer`` row
        has ``best_forced`` (the fastest forced variant) and
        ``default_vs_forced`` (its wall median / that one's: above 1, a
        forced path beat the default choice). A variant that cannot run here
        (a forced path that cannot run this size and dtype, with the op's
        error, or whose blocks ran another path; a path of another device or
        unknown to this build; ruled out by the options; out of memory) has
        ``error`` instead of times.
        Every row records ``inference``; a variant that calls the sequence op
        (``layer``, ``layer-padded``, the forced paths) also ``paths``, the
        path of each block of steps (:func:`lltm.paths_that_ran`), and
        ``path``, the same compactly (:func:`path_label`).
    """
    name = precision or DTYPE_PRECISION.get(dtype)
    if name not in PRECISIONS:
        msg = f"precision {name!r}: choose from {', '.join(PRECISIONS)}"
        raise ValueError(msg)
    device = torch.device(device)
    options = LayerOptions(bidirectional, packed, lengths_seed)
    # By default, what runs here; a CUDA-only variant asked for on the CPU is n/a.
    names = list(variants) if variants else default_variants(device, options)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        msg = f"unknown variants {unknown}; choose from {list(VARIANTS)}"
        raise ValueError(msg)
    with precision_switches(PRECISIONS[name]):
        rows = _run_point(
            (steps, batch, features, state),
            PRECISIONS[name],
            device,
            names,
            runs=runs,
            seconds=seconds,
            min_runs=min_runs,
            max_runs=max_runs,
            warmup=warmup,
            rounds=rounds,
            gpu_time=gpu_time,
            launches=launches,
            progress=progress,
            options=options,
            inference=inference,
        )
    if device.type == "cuda":
        # gc.collect() costs 0.2 s: only where an error's traceback may hold tensors.
        if any("error" in r for r in rows):
            gc.collect()
        # A sweep's sizes differ by 1000x: the pool would only grow.
        torch.cuda.empty_cache()
    return rows


def _warm_up_all(
    cases: dict[str, Variant],
    names: list[str],
    errors: dict[str, str],
    device: torch.device,
    warmup: int,
) -> dict[str, float]:
    """Warm each variant up; the seconds of its last call, or in ``errors`` why it cannot run."""
    probe: dict[str, float] = {}
    for name in names:
        try:
            probe[name] = warm_up(cases[name], device, warmup)
        except (RuntimeError, ValueError) as e:
            # A forced path that cannot run here or one unknown to the build, or out of memory.
            errors[name] = _reason(e)
            cases[name].clear_grads()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return probe


def _run_point(
    size: tuple[int, int, int, int],
    precision: Precision,
    device: torch.device,
    names: list[str],
    *,
    runs: int | None,
    seconds: float,
    min_runs: int,
    max_runs: int,
    warmup: int,
    rounds: int,
    gpu_time: bool,
    launches: bool,
    progress: bool,
    options: LayerOptions,
    inference: bool = False,
) -> list[dict[str, Any]]:
    steps, batch, features, state = size
    mode = "inference" if inference else ""
    setting = ", ".join(filter(None, (precision.name, options.label, mode)))
    label = f"T={steps} B={batch} F={features} S={state} {setting} {device}"
    cases, errors = build_variants(names, *size, precision.dtype, device, options)
    for case in cases.values():
        case.inference = inference
    probe = _warm_up_all(cases, [n for n in names if n not in errors], errors, device, warmup)
    live = [n for n in names if n not in errors]
    if runs is None:
        per_round = sum(probe[n] for n in live) or 1e-9
        runs = max(min_runs, min(max_runs, math.ceil(seconds / per_round)))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for n in in_rounds(runs, max(1, min(rounds, runs)), label, report=progress):
        for name in list(live):
            try:
                with forcing(cases[name].path):
                    samples[name] += [timed(cases[name], device) for _ in range(n)]
            except RuntimeError as e:  # out of memory, once both variants' caches fill it
                errors[name] = first_line(e)
                live.remove(name)
                cases[name].clear_grads()
    # After the timed loop: the profiler's own cost stays out of the times.
    paths = {n: ran for n in live if (ran := _paths(cases[n])) is not None}
    for name, ran in paths.items():
        if (why := _not_forced(cases[name].path, ran)) is not None:
            errors[name] = why
            live.remove(name)
    medians = {n: statistics.median(samples[n]) for n in live}
    graphs, counts = gpu_measures(
        cases, medians, device, seconds, gpu_time=gpu_time, launches=launches
    )
    forced = [n for n in live if cases[n].path is not None]
    rows = _rows(
        size, precision, device, names, errors, samples, runs, graphs, counts, options, forced
    )
    for row in rows:
        row["inference"] = inference
        if row["variant"] in cases:
            row.update(cases[row["variant"]].info)
        if row["variant"] in paths:
            row.update(paths=paths[row["variant"]], path=path_label(paths[row["variant"]]))
    return rows


def _rows(
    size: tuple[int, int, int, int],
    precision: Precision,
    device: torch.device,
    names: list[str],
    errors: dict[str, str],
    samples: dict[str, list[float]],
    runs: int,
    graphs: dict[str, GraphTime],
    counts: dict[str, int | None],
    options: LayerOptions | None = None,
    forced: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The result rows of one point, as :func:`run_sequence` documents them.

    ``forced``: the variants that ran a forced path, which the ``layer``'s
    default choice is held against.
    """
    options = options or LayerOptions()
    lengths = lengths_fields(size[0], size[1], options)
    steps, batch, features, state = size
    live = [n for n in names if n not in errors]
    medians = {n: statistics.median(samples[n]) for n in live}
    gpu = {n: g.median_ms for n, g in graphs.items() if g.median_ms is not None}
    results = []
    for name in names:
        row: dict[str, Any] = {
            "variant": name,
            "device": str(device),
            "dtype": dtype_name(precision.dtype),
            "precision": precision.name,
            "steps": steps,
            "batch": batch,
            "features": features,
            "state": state,
            "matmul_tf32": precision.matmul_tf32,
            "cudnn_tf32": precision.cudnn_tf32,
            "tf32": precision.matmul_tf32,
            **options.fields(),
            **lengths,
        }
        if name in errors:
            row["error"] = errors[name]
            results.append(row)
            continue
        g = graphs.get(
            name, GraphTime(error="not measured" if device.type == "cuda" else "CUDA only")
        )
        row.update(
            runs=runs,
            median_ms=medians[name] * 1e3,
            min_ms=min(samples[name]) * 1e3,
            gpu_ms=g.median_ms,
            gpu_min_ms=g.min_ms,
            gpu_replays=g.replays,
            gpu_us_per_step=g.median_ms * 1e3 / steps if g.median_ms is not None else None,
            host_ratio=medians[name] * 1e3 / g.median_ms if g.median_ms else None,
            gpu_error=g.error,
            launches=counts.get(name),
        )
        for key, base in (("vs_lstm", "nn.LSTM"), ("vs_loop_lltm", "loop-lltm")):
            row[key] = medians[base] / medians[name] if base in medians else None
        row["gpu_vs_lstm"] = (
            gpu["nn.LSTM"] / gpu[name] if name in gpu and "nn.LSTM" in gpu else None
        )
        if name == "layer" and options.packed:
            # The packed goal's ratio: below 1, the layer gains from the lengths.
            padded = medians.get("layer-padded")
            row["packed_vs_padded"] = medians[name] / padded if padded else None
        if name == "layer" and (tried := {n: medians[n] for n in forced if n in medians}):
            # The default choice's cost: above 1, a forced path beat it.
            best = min(tried, key=tried.__getitem__)
            row.update(best_forced=best, default_vs_forced=medians[name] / tried[best])
        results.append(row)
    return results


def run_sweep(
    steps: Sequence[int] = SWEEP_STEPS,
    batches: Sequence[int] = SWEEP_BATCHES,
    fs: Sequence[tuple[int, int]] = SWEEP_FS,
    precisions: Sequence[str] = ("float32", "float16"),
    device: str | torch.device = "cpu",
    *,
    variants: Sequence[str] | None = None,
    progress: bool = True,
    on_point: Callable[[list[dict[str, Any]]], None] | None = None,
    sizes: Sequence[tuple[int, int, int, int]] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Time the variants at every point of ``steps`` x ``batches`` x ``fs`` x ``precisions``.

    With ``sizes`` (T, B, F, S; :func:`draw_sizes`'s), at those sizes x
    ``precisions`` instead, in their order; their rows have ``off_grid``
    set, so that the tables list them rather than lay them on a grid.
    Each point is :func:`run_sequence` with ``options`` (its ``runs``,
    ``seconds``, ``min_runs``, ``max_runs``, ``warmup``, ``rounds``,
    ``gpu_time``, ``launches``, ``bidirectional``, ``packed``,
    ``lengths_seed`` and ``inference``), by default those of
    :data:`SWEEP_OPTIONS`: a budget of ``seconds`` for the timed runs of
    each point. ``variants`` defaults to :data:`SWEEP_VARIANTS`, packed to
    :data:`PACKED_VARIANTS`. Progress goes to stderr, one line per point, and
    ``on_point`` gets the rows so far after each point (to save them: a sweep
    cut short by a timeout keeps what it measured). Returns the rows of every
    point, as :func:`run_sequence` does.
    """
    options = {**SWEEP_OPTIONS, **options}
    if variants is None:
        variants = PACKED_VARIANTS if options.get("packed") else SWEEP_VARIANTS
    if sizes is None:
        points = [
            (p, f, s, t, b) for p in precisions for f, s in fs for t in steps for b in batches
        ]
    else:
        points = [(p, f, s, t, b) for p in precisions for t, b, f, s in sizes]
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    for i, (p, f, s, t, b) in enumerate(points):
        rows = run_sequence(
            t,
            b,
            f,
            s,
            device=device,
            precision=p,
            variants=variants,
            progress=False,
            **options,
        )
        if sizes is not None:
            for row in rows:
                row["off_grid"] = True
        results += rows
        if on_point is not None:
            on_point(results)
        if progress:
            elapsed = time.perf_counter() - start
            by = {r["variant"]: r for r in rows}
            parts = []
            for name in variants:
                r = by[name]
                if "error" in r:
                    parts.append(f"{name} n/a")
                    continue
                gpu = f", gpu {r['gpu_ms']:.3g}" if r.get("gpu_ms") is not None else ""
                path = f" [{r['path']}]" if r.get("path") else ""
                parts.append(f"{name} {r['median_ms']:.3g} ms{gpu}{path}")
            speedup = by.get("layer", {}).get("vs_lstm")
            padded = by.get("layer", {}).get("packed_vs_padded")
            regret = by.get("layer", {}).get("default_vs_forced")
            setting = row_setting(rows[0]) if rows else p
            _progress(
                f"[{i + 1}/{len(points)}] {setting} T={t} B={b} F={f} S={s}: {'; '.join(parts)}"
                f"{f' -> {speedup:.2f}x' if speedup else ''}"
                f"{f', packed/padded {padded:.2f}' if padded else ''}"
                f"{f', default/forced {regret:.2f}' if regret else ''} "
                f"({elapsed:.0f} s, ~{elapsed / (i + 1) * (len(points) - i - 1):.0f} s left)"
            )
    return results
