"""The tables of a sequence run: fixed-width and Markdown, the summary lines, the header."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._common import platform
from .precision import PRECISIONS
from .sizes import LayerOptions, RandomSizes
from .summary import PACKED_GOAL, forced_summary, packed_summary, row_setting, sweep_summary

__all__ = [
    "at_point",
    "describe",
    "format_sequence_markdown",
    "format_sequence_summary",
    "format_sequence_table",
    "num_text",
    "ratio_text",
    "timed_call",
    "variant_label",
]


def ratio_text(value: float | None) -> str:
    """``1.23x``, or ``-`` for none."""
    return f"{value:.2f}x" if value is not None else "-"


def num_text(value: float | None, spec: str = ".3f") -> str:
    """``value`` in ``spec``, or ``-`` for none."""
    return format(value, spec) if value is not None else "-"


def _cells(r: dict[str, Any]) -> tuple[str, str, str, str]:
    """A row's size, setting, host ratio and kernel count, as both tables print them."""
    size = f"{r['steps']},{r['batch']},{r['features']},{r['state']}"
    host = f"{r['host_ratio']:.2f}" if r.get("host_ratio") is not None else "-"
    kernels = str(r["launches"]) if r.get("launches") is not None else "-"
    return size, row_setting(r), host, kernels


def _lengths_notes(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per packed point: its lengths, the padded batch's T and the fill."""
    notes = {}
    for r in results:
        if r.get("packed") and r.get("padded_steps") is not None:
            size, *_ = _cells(r)
            notes[size] = (
                f"{size}: lengths in [{r['shortest']}, {r['padded_steps']}] of T={r['steps']} "
                f"(seed {r['lengths_seed']}); layer-padded runs {r['padded_steps']} steps; "
                f"fill {r['fill']:.2f}"
            )
    return list(notes.values())


def _forced_notes(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per point that ran forced paths: the default / the best of them, and both paths."""
    return [
        f"{_cells(r)[0]}, {row_setting(r)}: default / best forced path "
        f"{r['default_vs_forced']:.2f} (layer ran {r.get('path') or '-'}; the best forced "
        f"path was {r['best_forced']})"
        for r in results
        if r.get("default_vs_forced") is not None
    ]


def format_sequence_table(results: Sequence[dict[str, Any]]) -> str:
    """Render :func:`run_sequence`'s results as a fixed-width table.

    Packed, the ``layer`` row's ``/padded`` column is its wall time / the
    padded layer's, and a line per point gives the lengths. Beside forced
    paths, its ``/forced`` column is its wall time / the fastest forced
    variant's, and a line per point names both paths. ``path``, beside the
    variant, is the sequence path of those that call the op
    (:func:`path_label`).
    """
    with_launches = any(r.get("launches") is not None for r in results)
    with_padded = any(r.get("packed") for r in results)
    with_forced = any(r.get("default_vs_forced") is not None for r in results)
    with_paths = any(r.get("path") for r in results)
    width = max([18, *(len(row_setting(r)) + 2 for r in results)])
    variant_width = max([18, *(len(r["variant"]) + 2 for r in results)])
    # Left out where no row names a path (a run of the loops and nn.LSTM alone).
    paths = max([6, *(len(r.get("path") or "") + 2 for r in results)]) if with_paths else 0
    header = (
        f"{'T,B,F,S':<18}{'precision':<{width}}{'variant':<{variant_width}}"
        f"{'path' if paths else '':<{paths}}"
        f"{'wall ms':>10}{'min ms':>10}"
        f"{'gpu ms':>10}{'host x':>8}{'vs LSTM':>9}{'gpu vs':>8}{'vs loop':>9}{'runs':>6}"
    )
    if with_padded:
        header += f"{'/padded':>9}"
    if with_forced:
        header += f"{'/forced':>9}"
    if with_launches:
        header += f"{'kernels':>9}"
    lines = [header, "-" * len(header)]
    for r in results:
        size, setting, host, kernels = _cells(r)
        prefix = f"{size:<18}{setting:<{width}}{r['variant']:<{variant_width}}"
        if "error" in r:
            lines.append(f"{prefix}  n/a: {r['error']}")
            continue
        path = (r.get("path") or "-") if paths else ""
        line = (
            f"{prefix}{path:<{paths}}"
            f"{r['median_ms']:>10.3f}{r['min_ms']:>10.3f}{num_text(r.get('gpu_ms')):>10}"
            f"{host:>8}{ratio_text(r.get('vs_lstm')):>9}{ratio_text(r.get('gpu_vs_lstm')):>8}"
            f"{ratio_text(r.get('vs_loop_lltm')):>9}{r.get('runs', '-'):>6}"
        )
        if with_padded:
            line += f"{num_text(r.get('packed_vs_padded'), '.2f'):>9}"
        if with_forced:
            line += f"{num_text(r.get('default_vs_forced'), '.2f'):>9}"
        if with_launches:
            line += f"{kernels:>9}"
        lines.append(line)
    errors = sorted(
        {
            r["gpu_error"]
            for r in results
            if r.get("gpu_error") and r["gpu_error"] not in ("CUDA only", "not measured")
        }
    )
    lines += [f"no GPU time: {e}" for e in errors]
    unflat = sorted(
        {r.get("precision", r["dtype"]) for r in results if r.get("weights_flat") is False}
    )
    if unflat:
        lines.append(
            f"nn.LSTM's weights are not flat in {', '.join(unflat)}: cuDNN copies them at "
            "every call"
        )
    if with_padded:
        lines.append(
            f"/padded: the packed layer's wall time / layer-padded's (the goal: at most "
            f"{PACKED_GOAL}); fill: the tokens / the padded batch's cells"
        )
        lines += _lengths_notes(results)
    if with_forced:
        lines.append(
            "/forced: the layer's wall time / the fastest forced path's (above 1: a forced "
            "path beat the default choice)"
        )
        lines += _forced_notes(results)
    return "\n".join(lines)


def format_sequence_markdown(results: Sequence[dict[str, Any]]) -> str:
    """:func:`run_sequence`'s results as one Markdown table (times in ms)."""
    with_padded = any(r.get("packed") for r in results)
    with_forced = any(r.get("default_vs_forced") is not None for r in results)
    with_paths = any(r.get("path") for r in results)
    extra = (
        (" packed / padded |" if with_padded else "")
        + (" default / best forced |" if with_forced else "")
        + (" path |" if with_paths else "")
    )
    lines = [
        "| T,B,F,S | precision | variant | wall ms | GPU ms | host ratio | vs nn.LSTM | "
        + "GPU vs nn.LSTM | kernels |"
        + extra,
        "|---|---|---|---:|---:|---:|---:|---:|---:|"
        + ("---:|" if with_padded else "")
        + ("---:|" if with_forced else "")
        + ("---|" if with_paths else ""),
    ]
    for r in results:
        size, setting, host, kernels = _cells(r)
        head = f"| {size} | {setting} | {r['variant']} |"
        if "error" in r:
            lines.append(
                f"{head} n/a | | | | | |" + " |" * (with_padded + with_forced + with_paths)
            )
            continue
        line = (
            f"{head} {r['median_ms']:.3f} | {num_text(r.get('gpu_ms'))} | {host} | "
            f"{ratio_text(r.get('vs_lstm'))} | {ratio_text(r.get('gpu_vs_lstm'))} | {kernels} |"
        )
        if with_padded:
            line += f" {num_text(r.get('packed_vs_padded'), '.2f')} |"
        if with_forced:
            line += f" {num_text(r.get('default_vs_forced'), '.2f')} |"
        if with_paths:
            line += f" {r.get('path') or '-'} |"
        lines.append(line)
    notes = [f"- {n}" for n in [*_lengths_notes(results), *_forced_notes(results)]]
    return "\n".join(lines + (["", *notes] if notes else []))


def format_sequence_summary(results: Sequence[dict[str, Any]]) -> str:
    """The worst and median over the points of each device, where it ran several ('' if none).

    The speedup of the layer over nn.LSTM; packed, the packed / padded ratio;
    beside forced paths, the default / the best forced path.
    """
    lines = []
    for device in dict.fromkeys(r["device"] for r in results):
        rows = [r for r in results if r["device"] == device]
        speedups = sweep_summary(rows)["precisions"]
        padded = packed_summary(rows)["precisions"]
        forced = forced_summary(rows)["precisions"]
        for setting, s in speedups.items():
            if s["points"] + s["missing"] < 2:
                continue
            median = f"{s['median']:.2f}x" if s["median"] is not None else "n/a"
            missing = f", {s['missing']} n/a" if s["missing"] else ""
            lines.append(
                f"{device}, {setting}, {s['points']} sizes: LLTMLayer over nn.LSTM: worst "
                f"{at_point(s['worst'])}, median {median}, {s['below_1']} below 1.0{missing}"
            )
            if (p := padded.get(setting)) and p["points"]:
                lines.append(
                    f"{device}, {setting}, {p['points']} sizes: packed / padded: worst "
                    f"{at_point(p['worst'], '')}, median {p['median']:.2f}, {p['above_goal']} "
                    f"above {PACKED_GOAL} (median fill {p['fill_median']:.2f})"
                )
            if (f := forced.get(setting)) and f["points"] >= 2:
                lines.append(
                    f"{device}, {setting}, {f['points']} sizes: default / best forced path: "
                    f"worst {at_point(f['worst'], '')}, median {f['median']:.2f}"
                )
    return "\n".join(lines)


def variant_label(variant: str, results: Sequence[dict[str, Any]]) -> str:
    """A variant's name in a title: cuDNN's nn.LSTM when every row is on CUDA."""
    if variant == "layer":
        return "LLTMLayer"
    on_cuda = bool(results) and all(r["device"].startswith("cuda") for r in results)
    return "cuDNN nn.LSTM" if variant == "nn.LSTM" and on_cuda else variant


def at_point(w: dict[str, Any] | None, unit: str = "x") -> str:
    """A summary's worst or best: ``0.95x at T=.., B=.., F=.., S=.. (precision)``."""
    if w is None:
        return "n/a"
    return (
        f"{w['value']:.2f}{unit} at T={w['steps']}, B={w['batch']}, F={w['features']}, "
        f"S={w['state']} ({w['precision']})"
    )


def timed_call(results: Sequence[dict[str, Any]], *, short: bool = False) -> str:
    """What the rows timed, for a title: forward + backward, the forward alone, or both."""
    modes = {bool(r.get("inference")) for r in results}
    training = "forward + backward"
    if not short:
        training += " (the input and every parameter need grad)"
    inference = "forward alone" if short else "the forward alone, under torch.inference_mode()"
    if modes == {True}:
        return inference
    if modes == {True, False}:
        return f"{training}, or where the setting says inference, {inference}"
    return training


def describe(
    precisions: Sequence[str],
    device: str | torch.device,
    options: LayerOptions | None = None,
    *,
    inference: bool = False,
    drawn: RandomSizes | None = None,
) -> str:
    """The header of a report: torch, the GPU, what the columns, precisions and options mean.

    ``inference``: the forward alone was timed; ``drawn``: the sizes of a
    random sweep, and how they were drawn.
    """
    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    options = options or LayerOptions()
    if inference:
        timed = "inference: the forward alone under torch.inference_mode() (no backward)"
    else:
        timed = "forward + backward of output.sum() (input and parameters need grad)"
    lines = [
        f"LLTM layer over T steps, {timed}; {platform(gpu)}",
        (
            "wall = eager median; gpu = the same call replayed as a CUDA graph; host x = "
            "wall / gpu; vs LSTM = nn.LSTM's wall / the variant's (above 1: faster); gpu vs = "
            "the same on GPU times; vs loop = against the lltm.LLTM loop"
        ),
        (
            "path = the sequence path that the layer ran (lltm.paths_that_ran, one call "
            "outside the timed loop): forward/backward, one name where both ran the same or "
            "the forward ran alone, a+b where blocks of steps ran different paths"
        ),
    ]
    for p in precisions:
        prec = PRECISIONS[p]
        tf32 = (
            f"matmul TF32 {'on' if prec.matmul_tf32 else 'off'}, "
            f"cuDNN TF32 {'on' if prec.cudnn_tf32 else 'off'}"
        )
        lines.append(f"{p}: {tf32}{'; ' + prec.note if prec.note else ''}")
    if options.bidirectional:
        lines.append(
            "bidirectional: the layer and nn.LSTM run both directions in one call "
            "(output 2 x state features)"
        )
    if options.packed:
        lines.append(
            f"packed: B sequences of lengths uniform in [ceil(T/4), T] (seed "
            f"{options.lengths_seed}), packed once outside the timed call; the layer and "
            "nn.LSTM take the PackedSequence, backward from output.data.sum(); layer-padded = "
            "the layer on the same batch padded to its longest sequence; /padded = the "
            "layer's wall / layer-padded's"
        )
    if drawn is not None:
        lines += drawn.describe()
    return "\n".join(lines) + "\n"
