"""The goals of the sequence benchmark, and the summaries of its rows against them."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from .variants import forced_variants

__all__ = [
    "HOST_RATIO_GOAL",
    "PACKED_GOAL",
    "SPEEDUP_GOAL_MEDIAN",
    "SPEEDUP_GOAL_WORST",
    "Grid",
    "forced_summary",
    "grid_of",
    "packed_summary",
    "row_setting",
    "speedup_at",
    "sweep_summary",
]

# The layer over nn.LSTM: at least 1.0x everywhere, 1.3x in the median; wall / GPU at most 1.15.
SPEEDUP_GOAL_WORST, SPEEDUP_GOAL_MEDIAN, HOST_RATIO_GOAL = 1.0, 1.3, 1.15
# The packed goal: the packed layer's time / the padded layer's, at most.
PACKED_GOAL = 0.75


def row_setting(r: dict[str, Any]) -> str:
    """A row's precision, options and mode: ``float32``, ``float16, packed, inference``.

    The tables and summaries group by it, so that runs with other options,
    or of the forward alone, never share a cell.
    """
    options = [n for n in ("bidirectional", "packed", "inference") if r.get(n)]
    return ", ".join([r.get("precision", r["dtype"]), *options])


Grid = dict[tuple[str, int, int], dict[tuple[int, int], dict[str, dict[str, Any]]]]


def grid_of(results: Sequence[dict[str, Any]]) -> Grid:
    """The rows by (setting: the precision and options, F, S), then (T, B), then variant."""
    grid: Grid = {}
    for r in results:
        key = (row_setting(r), r["features"], r["state"])
        grid.setdefault(key, {}).setdefault((r["steps"], r["batch"]), {})[r["variant"]] = r
    return grid


def speedup_at(
    point: dict[str, dict[str, Any]], variant: str, base: str, metric: str = "wall"
) -> float | None:
    """``base``'s time / ``variant``'s at one point: above 1, ``variant`` is faster."""
    key = {"wall": "median_ms", "gpu": "gpu_ms"}[metric]
    a, b = point.get(variant, {}).get(key), point.get(base, {}).get(key)
    return b / a if a and b else None


def sweep_summary(
    results: Sequence[dict[str, Any]], variant: str = "layer", base: str = "nn.LSTM"
) -> dict[str, Any]:
    """The worst and median speedup of ``variant`` over ``base``, per precision and overall.

    ``precisions`` is keyed by the precision and the options it ran with
    (``float32``, ``float16, bidirectional``). Each entry: ``points``
    (measured), ``missing`` (n/a), ``below_1``, ``worst`` and ``best``
    (``speedup`` and where), ``median``; the same on GPU
    times as ``gpu_worst``/``gpu_median``/``gpu_below_1``; and
    ``host_ratio_max`` of ``variant`` (the worst eager / graph-replay ratio,
    and where) and ``host_ratio_above_goal`` (how many exceed
    :data:`HOST_RATIO_GOAL`).
    """

    def summarize(
        points: list[tuple[tuple[Any, ...], dict[str, dict[str, Any]]]],
    ) -> dict[str, Any]:
        def where(key: tuple[Any, ...], value: float) -> dict[str, Any]:
            precision, features, state, steps, batch = key
            return {
                "value": value,
                "precision": precision,
                "steps": steps,
                "batch": batch,
                "features": features,
                "state": state,
            }

        out: dict[str, Any] = {"points": 0, "missing": 0, "below_1": 0}
        for metric, prefix in (("wall", ""), ("gpu", "gpu_")):
            values = [(k, speedup_at(p, variant, base, metric)) for k, p in points]
            found = [(k, v) for k, v in values if v is not None]
            out[f"{prefix}below_1"] = sum(1 for _, v in found if v < 1.0)
            if metric == "wall":
                out["points"] = len(found)
                out["missing"] = len(values) - len(found)
            if found:
                worst = min(found, key=lambda kv: kv[1])
                best = max(found, key=lambda kv: kv[1])
                out[f"{prefix}worst"] = where(*worst)
                out[f"{prefix}best"] = where(*best)
                out[f"{prefix}median"] = statistics.median(v for _, v in found)
            else:
                out[f"{prefix}worst"] = out[f"{prefix}best"] = out[f"{prefix}median"] = None
        ratios = [
            (k, p[variant]["host_ratio"])
            for k, p in points
            if p.get(variant, {}).get("host_ratio") is not None
        ]
        out["host_ratio_max"] = where(*max(ratios, key=lambda kv: kv[1])) if ratios else None
        out["host_ratio_above_goal"] = sum(1 for _, v in ratios if v > HOST_RATIO_GOAL)
        return out

    grid = grid_of(results)
    every = [((*key, *tb), point) for key, cells in grid.items() for tb, point in cells.items()]
    precisions = list(dict.fromkeys(k[0] for k in grid))
    return {
        "variant": variant,
        "base": base,
        "precisions": {p: summarize([kp for kp in every if kp[0][0] == p]) for p in precisions},
        "overall": summarize(every),
    }


def _where(r: dict[str, Any], key: str) -> dict[str, Any]:
    """A row's ``key`` and where: its setting and size."""
    return {
        "value": r[key],
        "precision": row_setting(r),
        "steps": r["steps"],
        "batch": r["batch"],
        "features": r["features"],
        "state": r["state"],
    }


def _ratios(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The rows' ``key`` (a ratio, lower is better): measured, missing, worst, best, median."""
    found = [r for r in rows if r.get(key) is not None]
    return {
        "points": len(found),
        "missing": len(rows) - len(found),
        "worst": _where(max(found, key=lambda r: r[key]), key) if found else None,
        "best": _where(min(found, key=lambda r: r[key]), key) if found else None,
        "median": statistics.median(r[key] for r in found) if found else None,
    }


def _per_setting(
    rows: list[dict[str, Any]], summarize: Callable[[list[dict[str, Any]]], dict[str, Any]]
) -> dict[str, Any]:
    """``summarize`` of the rows of each setting, and of all of them."""
    settings = list(dict.fromkeys(row_setting(r) for r in rows))
    return {
        "precisions": {p: summarize([r for r in rows if row_setting(r) == p]) for p in settings},
        "overall": summarize(rows),
    }


def packed_summary(results: Sequence[dict[str, Any]], variant: str = "layer") -> dict[str, Any]:
    """The packed goal's ratio: ``variant``'s packed wall time / ``layer-padded``'s.

    Per precision (with its options, as :func:`sweep_summary` keys them) and
    overall: ``points`` (measured), ``missing`` (packed points without a
    ratio), ``above_goal`` (above :data:`PACKED_GOAL`), ``worst`` (the
    largest ratio, and where), ``best``, ``median`` and ``fill_median`` (what
    a time proportional to the tokens would give). No packed rows: no
    precisions, and ``overall`` counts none.
    """

    def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
        s = _ratios(rows, "packed_vs_padded")
        fills = [r["fill"] for r in rows if r.get("fill") is not None]
        return {
            "points": s["points"],
            "missing": s["missing"],
            "above_goal": sum(1 for r in rows if (r.get("packed_vs_padded") or 0) > PACKED_GOAL),
            "worst": s["worst"],
            "best": s["best"],
            "median": s["median"],
            "fill_median": statistics.median(fills) if fills else None,
        }

    rows = [r for r in results if r["variant"] == variant and r.get("packed")]
    return {
        "variant": variant,
        "base": "layer-padded",
        "goal": PACKED_GOAL,
        **_per_setting(rows, summarize),
    }


def forced_summary(results: Sequence[dict[str, Any]], variant: str = "layer") -> dict[str, Any]:
    """The default path choice against the best forced path: ``variant``'s ``default_vs_forced``.

    That is ``variant``'s wall time / the fastest forced variant's at the same
    point (above 1: a forced path beat the default choice). Per precision
    (with its options) and overall: ``points`` (measured), ``missing``
    (points that ran forced variants, none of them to the end), ``worst``
    (the largest ratio, and where), ``best`` and ``median``. No forced
    variants: no precisions, and ``overall`` counts none.
    """

    def point(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["device"], row_setting(r), r["steps"], r["batch"], r["features"], r["state"])

    tried = {point(r) for r in results if r["variant"] in forced_variants(r["device"])}
    rows = [r for r in results if r["variant"] == variant and point(r) in tried]
    return {
        "variant": variant,
        "base": "the best forced path",
        **_per_setting(rows, lambda rows: _ratios(rows, "default_vs_forced")),
    }
