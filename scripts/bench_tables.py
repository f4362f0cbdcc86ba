r"""Render benchmark JSON as the Markdown tables of docs/performance.md.

    python scripts/bench_tables.py bench.json [more.json ...]
    python scripts/bench_tables.py sweep-float32.json sweep-float16.json \\
        [--plot heatmap.png] [--plot-gpu heatmap-gpu.png] [--json sweep.json]

Each input is what ``python -m lltm.benchmark --json`` writes, or what
``scripts/gpu-check.sh`` gathers into one file (a dict of such reports).

* The cell benchmark: one table per problem: medians in µs, the speedup over
  eager, the ratio to the GEMM floor, the bytes saved for the backward and,
  when measured, the GPU operations of the forward and the backward.
* ``--sequence`` at sizes: one table of every size, precision and variant:
  wall and GPU time (ms), host ratio, the speedup over nn.LSTM, kernels.
* ``--sequence --sweep``: the rows of every sweep file together (one process
  per precision, as the goals want), as the speedup tables of the layer over
  nn.LSTM (rows T, columns B), the worst and median speedup, the packed /
  padded ratio of ``--packed`` sweeps, the GPU time per step and the host
  ratio; a precision run with ``--bidirectional`` or ``--packed`` has tables
  of its own. ``--plot`` draws their heat map (``--plot-gpu``
  the same on GPU times) and ``--json`` writes them as one report. The
  sequence reports need lltm importable (they use
  :mod:`lltm.benchmark.sequence`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def reports(path: Path) -> list[dict[str, Any]]:
    """The benchmark reports in a file: one report, or a dict of them."""
    data = json.loads(path.read_text())
    return [data] if "results" in data else list(data.values())


def table(rows: list[dict[str, Any]]) -> str:
    """One Markdown table for the rows of one problem of the cell benchmark."""
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


def cell_tables(report: dict[str, Any]) -> str:
    """One titled table per problem of a cell-benchmark report."""
    config = report["config"]
    problems: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in report["results"]:
        key = (r["device"], r["batch"], r["features"], r["state"], r["dtype"], r["grad"])
        problems.setdefault(key, []).append(r)
    out = []
    for (device, batch, features, state, dtype, grad), rows in problems.items():
        out.append(
            f"\n**{device}, batch {batch}, features {features}, state {state}, "
            f"{dtype}, grad={grad}** ({rows[0]['runs']} runs; torch {config['torch']}, "
            f"{config['threads']} threads{', ' + config['gpu'] if config['gpu'] else ''})"
            f"\n\n{table(rows)}"
        )
    return "\n".join(out)


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
                from lltm.benchmark.sequence import format_sequence_markdown  # noqa: PLC0415

                print(f"\n**The layer over whole sequences** ({_origin(config)})\n")
                print(format_sequence_markdown(rows))
            else:
                print(cell_tables(report))
    if (args.plot or args.plot_gpu or args.json) and not sweep_rows:
        parser.error(
            "--plot, --plot-gpu and --json need sweep reports (python -m lltm.benchmark --sequence --sweep)"
        )
    if sweep_rows:
        from lltm.benchmark import sequence as seq  # noqa: PLC0415

        origins = sorted({_origin(c) for c in sweep_configs})
        print(f"\n**The sweep** ({'; '.join(origins)})\n")
        print(seq.format_sweep_tables(sweep_rows), flush=True)
        if args.json:
            merged = {
                "config": {"mode": "sweep", "merged": sweep_configs},
                "results": sweep_rows,
                "summary": seq.sweep_summary(sweep_rows),
            }
            if any(r.get("packed") for r in sweep_rows):
                merged["packed_summary"] = seq.packed_summary(sweep_rows)
            Path(args.json).write_text(json.dumps(merged, indent=2))
        # Last: without matplotlib this stops, and the rest is done.
        if args.plot:
            seq.plot_sweep(sweep_rows, args.plot)
        if args.plot_gpu:
            seq.plot_sweep(sweep_rows, args.plot_gpu, metric="gpu")


if __name__ == "__main__":
    main()
