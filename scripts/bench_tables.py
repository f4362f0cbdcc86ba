r"""Render benchmark JSON as the Markdown tables of docs/performance.md.

    python scripts/bench_tables.py bench.json [more.json ...]
    python scripts/bench_tables.py sweep-float32.json sweep-float16.json \\
        [--plot heatmap.png] [--plot-gpu heatmap-gpu.png] [--json sweep.json]

Each input is what ``python -m lltm.benchmark --json`` writes, or what
``scripts/gpu-check.sh`` gathers into one file (a dict of such reports).
The tables are the benchmark's own (:mod:`lltm.benchmark`); what this script
adds is reading them back from files and merging the sweeps of several
processes (one per precision, as the goals want), which one run of the
benchmark cannot do:

* the cell benchmark: one table per problem (:func:`lltm.benchmark.cell.format_markdown`);
* ``--sequence`` at sizes: one table of every size, precision and variant
  (:func:`lltm.benchmark.sequence.format_sequence_markdown`);
* ``--sequence --sweep``: the rows of every sweep file together, as the
  sweep's tables (:func:`lltm.benchmark.sequence.format_sweep_tables`).
  ``--plot`` draws their heat map (``--plot-gpu`` the same on GPU times)
  and ``--json`` writes them as one report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lltm.benchmark import cell
from lltm.benchmark import sequence as seq
from lltm.benchmark.cli.report import sweep_report


def reports(path: Path) -> list[dict[str, Any]]:
    """The benchmark reports in a file: one report, or a dict of them."""
    data = json.loads(path.read_text())
    return [data] if "results" in data else list(data.values())


def _origin(config: dict[str, Any]) -> str:
    gpu = config.get("gpu")
    return f"torch {config.get('torch')}{', ' + gpu if gpu else ''}"


def main(argv: list[str] | None = None) -> None:
    """Print the tables of the files on the command line; merge and plot the sweeps."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="benchmark JSON files")
    parser.add_argument("--plot", metavar="PNG", help="the sweeps' heat map (wall time)")
    parser.add_argument(
        "--plot-gpu", metavar="PNG", help="the same on GPU times (CUDA-graph replays)"
    )
    parser.add_argument("--json", metavar="PATH", help="the sweeps' rows as one report")
    args = parser.parse_args(argv)
    sweep_rows: list[dict[str, Any]] = []
    sweep_configs: list[dict[str, Any]] = []
    for name in args.files:
        for report in reports(name):
            config = report.get("config", {})
            rows = report["results"]
            mode = config.get("mode") or ("sequence" if rows and "steps" in rows[0] else "cell")
            if mode == "sweep":
                sweep_rows += rows
                sweep_configs.append(config)
            elif mode == "sequence":
                print(f"\n**The layer over whole sequences** ({_origin(config)})\n")
                print(seq.format_sequence_markdown(rows))
            else:
                print(cell.format_markdown(report))
    if (args.plot or args.plot_gpu or args.json) and not sweep_rows:
        parser.error(
            "--plot, --plot-gpu and --json need sweep reports (python -m lltm.benchmark --sequence --sweep)"
        )
    if sweep_rows:
        origins = sorted({_origin(c) for c in sweep_configs})
        print(f"\n**The sweep** ({'; '.join(origins)})\n")
        print(seq.format_sweep_tables(sweep_rows), flush=True)
        if args.json:
            merged = sweep_report(
                {"mode": "sweep", "merged": sweep_configs},
                sweep_rows,
                packed=any(r.get("packed") for r in sweep_rows),
            )
            Path(args.json).write_text(json.dumps(merged, indent=2))
        # Last: without matplotlib this stops, and the rest is done.
        if args.plot:
            seq.plot_sweep(sweep_rows, args.plot)
        if args.plot_gpu:
            seq.plot_sweep(sweep_rows, args.plot_gpu, metric="gpu")


if __name__ == "__main__":
    main()
