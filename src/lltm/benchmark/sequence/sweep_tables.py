"""The Markdown tables of a sweep: the speedup per (precision, F, S), rows T, columns B."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .precision import PRECISIONS
from .sizes import forward_macs
from .summary import (
    HOST_RATIO_GOAL,
    PACKED_GOAL,
    SPEEDUP_GOAL_MEDIAN,
    SPEEDUP_GOAL_WORST,
    Grid,
    forced_summary,
    grid_of,
    packed_summary,
    row_setting,
    speedup_at,
    sweep_summary,
)
from .tables import at_point, num_text, timed_call, variant_label

__all__ = ["format_sweep_tables"]


def _us(value: float | None) -> str:
    """Microseconds with three significant digits, never in exponent notation."""
    if value is None:
        return "n/a"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _gmac(macs: int) -> str:
    """Multiply-adds in billions, three significant digits, never in exponent notation."""
    value = macs / 1e9
    if value < 0.001:
        return "<0.001"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _grid_table(
    grid: Grid,
    key: tuple[str, int, int],
    title: str,
    cell: Callable[[dict[str, dict[str, Any]]], str],
) -> str:
    """One Markdown table of ``grid[key]``: rows T, columns B, each ``cell(point)``."""
    cells = grid[key]
    ts = sorted({t for t, _ in cells})
    bs = sorted({b for _, b in cells})
    precision, features, state = key
    lines = [
        f"| {precision}, F={features}, S={state}{title} | "
        + " | ".join(f"B={b}" for b in bs)
        + " |",
        "|---|" + "---:|" * len(bs),
    ]
    for t in ts:
        row = [cell(cells[(t, b)]) if (t, b) in cells else "" for b in bs]
        lines.append(f"| T={t} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def _speedup_goals(results: Sequence[dict[str, Any]], base: str) -> str:
    """The speedup goals that apply to ``results``: the grid's, and that of nn.LSTM's options.

    Both are of forward + backward: inference rows have none.
    """
    results = [r for r in results if not r.get("inference")]
    goals = []
    options = sorted({o for r in results for o in ("bidirectional", "packed") if r.get(o)})
    if any(not (r.get("bidirectional") or r.get("packed")) for r in results):
        goals.append(
            f"The goal: at least {SPEEDUP_GOAL_WORST:.1f}x everywhere, a median of at "
            f"least {SPEEDUP_GOAL_MEDIAN:.1f}x (float32 and float16)."
        )
    if options:
        goals.append(
            f"The goal {' and '.join(options)}: at least {SPEEDUP_GOAL_WORST:.1f}x everywhere "
            f"against {base} with the same options."
        )
    return " ".join(goals)


def _packed_tables(results: Sequence[dict[str, Any]], grid: Grid, variant: str) -> list[str]:
    """The sweep's packed / padded tables of ``variant`` and their summary (none unpacked)."""
    packed = packed_summary(results, variant)
    if not packed["precisions"]:
        return []

    def cell(point: dict[str, dict[str, Any]]) -> str:
        v = point.get(variant, {}).get("packed_vs_padded")
        return f"{v:.2f}" if v is not None else "n/a"

    out = [
        (
            f"Packed / padded: {variant_label(variant, results)}'s median wall time on the packed "
            "batch / on the same batch padded to its longest sequence (layer-padded, the "
            "lengths ignored); below 1 the lengths save time."
        ),
        *(
            _grid_table(grid, key, ", packed / padded", cell)
            for key, cells in grid.items()
            if any(p.get(variant, {}).get("packed") for p in cells.values())
        ),
    ]
    lines = [
        f"| precision | points | worst | median | above {PACKED_GOAL} | n/a | fill |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    entries = [*packed["precisions"].items()]
    if len(entries) > 1:
        entries.append(("all", packed["overall"]))
    for p, s in entries:
        median = f"{s['median']:.2f}" if s["median"] is not None else "n/a"
        fill = f"{s['fill_median']:.2f}" if s["fill_median"] is not None else "n/a"
        lines.append(
            f"| {p} | {s['points']} | {at_point(s['worst'], '')} | {median} | "
            f"{s['above_goal']} | {s['missing']} | {fill} |"
        )
    out.append(
        "\n".join(lines)
        + f"\n\nThe goal: at most {PACKED_GOAL} everywhere. fill: the median of the tokens "
        "/ the padded batch's cells, the ratio of a time proportional to the tokens."
    )
    return out


def _forced_tables(results: Sequence[dict[str, Any]], grid: Grid, variant: str) -> list[str]:
    """The default / best forced path of ``variant`` per point, and its summary (none unforced)."""
    forced = forced_summary(results, variant)
    if not forced["precisions"]:
        return []

    def ratio(point: dict[str, dict[str, Any]]) -> float | None:
        return point.get(variant, {}).get("default_vs_forced")

    def cell(point: dict[str, dict[str, Any]]) -> str:
        v = ratio(point)
        return f"{v:.2f}" if v is not None else "n/a"

    keys = [k for k, cells in grid.items() if any(ratio(p) is not None for p in cells.values())]
    lines = ["| precision | points | worst | median | n/a |", "|---|---:|---|---:|---:|"]
    entries = [*forced["precisions"].items()]
    if len(entries) > 1:
        entries.append(("all", forced["overall"]))
    for p, s in entries:
        median = num_text(s["median"], ".2f")
        lines.append(
            f"| {p} | {s['points']} | {at_point(s['worst'], '')} | {median} | {s['missing']} |"
        )
    return [
        (
            f"Default / best forced path: {variant_label(variant, results)}'s median wall time "
            "/ the fastest forced path's (above 1: a forced path beat the default choice)."
        ),
        *(_grid_table(grid, key, ", default / best forced", cell) for key in keys),
        "\n".join(lines),
    ]


def _drawn_table(results: Sequence[dict[str, Any]], variant: str, base: str, a: str, b: str) -> str:
    """Off-grid points (a random sweep's): a Markdown row each, in the order they ran.

    The columns that the grid gives tables of: the speedup, the packed /
    padded ratio, the default / best forced path, the GPU time per step, the
    host ratio and the path.
    """
    points: dict[tuple[str, int, int, int, int], dict[str, dict[str, Any]]] = {}
    for r in results:
        key = (row_setting(r), r["steps"], r["batch"], r["features"], r["state"])
        points.setdefault(key, {})[r["variant"]] = r
    ours = [r for r in results if r["variant"] == variant]
    with_padded = any(r.get("packed") for r in ours)
    with_forced = any(r.get("default_vs_forced") is not None for r in ours)
    with_gpu = any(r.get("gpu_us_per_step") is not None for r in results)
    with_host = any(r.get("host_ratio") is not None for r in results)
    with_paths = any(r.get("path") for r in ours)
    head = f"| T,B,F,S | precision | GMAC | {a} ms | {b} ms | speedup |"
    rule = "|---|---|---:|---:|---:|---:|"
    for on, title, align in (
        (with_padded, "packed / padded", "---:|"),
        (with_forced, "default / best forced", "---:|"),
        (with_gpu, f"µs/step {a} / {b}", "---:|"),
        (with_host, f"host ratio {a} / {b}", "---:|"),
        (with_paths, "path", "---|"),
    ):
        if on:
            head += f" {title} |"
            rule += align
    lines = [head, rule]
    for (setting, t, batch, f, s), point in points.items():
        ours_row, base_row = point.get(variant, {}), point.get(base, {})
        speedup = speedup_at(point, variant, base)
        line = (
            f"| {t},{batch},{f},{s} | {setting} | {_gmac(forward_macs(t, batch, f, s))} | "
            f"{num_text(ours_row.get('median_ms'))} | {num_text(base_row.get('median_ms'))} | "
            f"{f'{speedup:.2f}' if speedup is not None else 'n/a'} |"
        )
        if with_padded:
            line += f" {num_text(ours_row.get('packed_vs_padded'), '.2f')} |"
        if with_forced:
            line += f" {num_text(ours_row.get('default_vs_forced'), '.2f')} |"
        if with_gpu:
            per_step = (_us(r.get("gpu_us_per_step")) for r in (ours_row, base_row))
            line += f" {' / '.join(per_step)} |"
        if with_host:
            host = (num_text(r.get("host_ratio"), ".2f") for r in (ours_row, base_row))
            line += f" {' / '.join(host)} |"
        if with_paths:
            line += f" {ours_row.get('path') or 'n/a'} |"
        lines.append(line)
    return "\n".join(lines) + (
        "\n\nGMAC: the forward's multiply-adds per direction, T*B*3*S*(S+F), in billions."
    )


def format_sweep_tables(
    results: Sequence[dict[str, Any]], variant: str = "layer", base: str = "nn.LSTM"
) -> str:
    """Markdown: the speedup of ``variant`` over ``base`` per (precision, F, S), rows T, columns B.

    Then the worst and median speedup; the sequence path that ``variant``
    ran at each point (where the rows name it); for packed batches,
    ``variant``'s packed / padded time ratio and its worst and median; the
    GPU time per step of both (graph replay / T, in microseconds) and the host ratio
    (eager wall / graph replay) of both, when measured. A precision that ran
    with options, or in inference, is named with them (``float16,
    bidirectional``). Off-grid rows (a random sweep's) are one table of a row
    per point instead, with those figures as columns; the summaries count them.
    """
    grid = grid_of([r for r in results if not r.get("off_grid")])
    drawn = [r for r in results if r.get("off_grid")]

    def table(
        key: tuple[str, int, int], title: str, cell: Callable[[dict[str, dict[str, Any]]], str]
    ) -> str:
        return _grid_table(grid, key, title, cell)

    def speedup_cell(point: dict[str, dict[str, Any]]) -> str:
        s = speedup_at(point, variant, base)
        return f"{s:.2f}" if s is not None else "n/a"

    def per_step(point: dict[str, dict[str, Any]]) -> str:
        values = [point.get(n, {}).get("gpu_us_per_step") for n in (variant, base)]
        return " / ".join(_us(v) for v in values)

    def host(point: dict[str, dict[str, Any]]) -> str:
        values = [point.get(n, {}).get("host_ratio") for n in (variant, base)]
        return " / ".join(f"{v:.2f}" if v is not None else "n/a" for v in values)

    def path(point: dict[str, dict[str, Any]]) -> str:
        return point.get(variant, {}).get("path") or "n/a"

    def grid_rows(key: str) -> bool:
        # Whether any grid point has ``key`` measured (the drawn points have columns).
        return any(r.get(key) is not None for r in results if not r.get("off_grid"))

    a, b = variant_label(variant, results), variant_label(base, results)
    notes = {
        r["precision"]: PRECISIONS[r["precision"]].note
        for r in results
        if r.get("precision") in PRECISIONS and PRECISIONS[r["precision"]].note
    }
    out = [
        (
            f"Speedup of {a} over {b}: {b}'s median wall time / {a}'s, "
            f"{timed_call(results)}. Above 1 means the layer is faster."
        ),
        *(f"{p}: {note}." for p, note in notes.items()),
    ]
    out += [table(key, "", speedup_cell) for key in grid]
    if drawn:
        out.append(_drawn_table(drawn, variant, base, a, b))
    summary = sweep_summary(results, variant, base)
    lines = [
        "| precision | points | worst | median | below 1.0 | n/a |",
        "|---|---:|---|---:|---:|---:|",
    ]
    entries = [*summary["precisions"].items()]
    if len(entries) > 1:
        entries.append(("all", summary["overall"]))
    for p, s in entries:
        median = f"{s['median']:.2f}x" if s["median"] is not None else "n/a"
        lines.append(
            f"| {p} | {s['points']} | {at_point(s['worst'])} | {median} | {s['below_1']} | "
            f"{s['missing']} |"
        )
    goals = _speedup_goals(results, b)
    out.append("\n".join(lines) + (f"\n\n{goals}" if goals else ""))
    if any(r.get("path") for r in results if r["variant"] == variant and not r.get("off_grid")):
        out.append(
            f"The sequence path that {a} ran at each point: forward/backward, one name where "
            "both ran the same or the forward ran alone (inference), a+b where blocks of steps "
            "(directions, packed segments) ran different paths."
        )
        out += [table(key, ", path", path) for key in grid]
    out += _packed_tables(results, grid, variant)
    out += _forced_tables(results, grid, variant)
    if any(r.get("gpu_us_per_step") is not None for r in results):
        if grid_rows("gpu_us_per_step"):
            out.append(
                f"GPU time per step, µs: {a} / {b} (the {timed_call(results, short=True)} "
                "replayed as a CUDA graph, divided by T)."
            )
            out += [table(key, ", µs/step", per_step) for key in grid]
        lines = ["| precision | worst | median | below 1.0 |", "|---|---|---:|---:|"]
        for p, s in entries:
            median = f"{s['gpu_median']:.2f}x" if s["gpu_median"] is not None else "n/a"
            lines.append(f"| {p} | {at_point(s['gpu_worst'])} | {median} | {s['gpu_below_1']} |")
        out.append(
            f"Speedup of {a} over {b} in GPU time (the goal: {a}'s GPU time per step at most "
            f"{b}'s):\n\n" + "\n".join(lines)
        )
    if any(r.get("host_ratio") is not None for r in results):
        if grid_rows("host_ratio"):
            out.append(
                f"Host overhead: eager wall time / CUDA-graph replay time, {a} / {b} "
                "(1.00: the host adds nothing)."
            )
            out += [table(key, ", host ratio", host) for key in grid]
        worst = [
            f"{p}: {at_point(s['host_ratio_max'])}, {s['host_ratio_above_goal']} above "
            f"{HOST_RATIO_GOAL}"
            for p, s in entries
        ]
        out.append(f"Largest host ratio of {a}: " + "; ".join(worst) + ".")
    return "\n\n".join(out)
