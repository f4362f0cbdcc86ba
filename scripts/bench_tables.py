"""Render benchmark JSON as the Markdown tables of docs/performance.md.

    python scripts/bench_tables.py bench.json [more.json ...]

Each input is what ``python -m lltm.benchmark --json`` writes, or what
``scripts/gpu-check.sh`` gathers into one file (a dict of such reports). One
table per problem: medians in µs, the speedup over eager, the ratio to the
GEMM floor, the bytes saved for the backward and, when measured, the GPU
operations of the forward and the backward.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def reports(path: Path) -> list[dict[str, Any]]:
    """The benchmark reports in a file: one report, or a dict of them."""
    data = json.loads(path.read_text())
    return [data] if "results" in data else list(data.values())


def table(rows: list[dict[str, Any]]) -> str:
    """One Markdown table for the rows of one problem."""
    launches = any(r.get("launches") for r in rows)
    head = "| variant | fwd | bwd | fwd+bwd | speedup | x floor | saved KB |"
    rule = "|---|---:|---:|---:|---:|---:|---:|"
    if launches:
        head += " launches fwd+bwd |"
        rule += "---:|"
    lines = [head, rule]
    for r in rows:
        saved = "-" if r["saved_bytes"] is None else f"{r['saved_bytes'] / 1024:,.0f}"
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        floor = "-" if r["vs_floor"] is None else f"{r['vs_floor']:.2f}x"
        line = (
            f"| {r['variant']} | {r['forward_us']['median']:,.0f} | "
            f"{r['backward_us']['median']:,.0f} | {r['step_us']['median']:,.0f} | "
            f"{speedup} | {floor} | {saved} |"
        )
        if launches:
            n = r.get("launches")
            line += f" {n['forward']}+{n['backward']} |" if n else " - |"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    """Print one titled table per problem found in the files on the command line."""
    for name in sys.argv[1:]:
        for report in reports(Path(name)):
            config = report["config"]
            problems: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
            for r in report["results"]:
                key = (r["device"], r["batch"], r["features"], r["state"], r["dtype"], r["grad"])
                problems.setdefault(key, []).append(r)
            for (device, batch, features, state, dtype, grad), rows in problems.items():
                print(
                    f"\n**{device}, batch {batch}, features {features}, state {state}, "
                    f"{dtype}, grad={grad}** ({rows[0]['runs']} runs; torch {config['torch']}, "
                    f"{config['threads']} threads{', ' + config['gpu'] if config['gpu'] else ''})"
                    f"\n\n{table(rows)}"
                )


if __name__ == "__main__":
    main()
