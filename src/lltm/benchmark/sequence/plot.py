"""The heat map of a sweep: the speedup over nn.LSTM per (precision, F, S), rows T, columns B."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .._common import progress, pyplot
from .summary import grid_of, speedup_at
from .tables import timed_call, variant_label

__all__ = ["plot_sweep"]


def plot_sweep(
    results: Sequence[dict[str, Any]],
    path: str,
    *,
    variant: str = "layer",
    base: str = "nn.LSTM",
    metric: str = "wall",
) -> None:
    """A heat map of the speedup over ``base``: one panel per (precision, F, S), rows T, columns B.

    The colormap diverges at 1.0 (red: slower than ``base``, blue: faster), on
    a log scale shared by all panels; each cell is annotated. ``metric``:
    ``wall`` (eager medians) or ``gpu`` (graph replays).
    """
    plt = pyplot()
    import numpy as np  # noqa: PLC0415 - matplotlib's own dependency
    from matplotlib.colors import LogNorm  # noqa: PLC0415

    grid = grid_of(results)
    precisions = list(dict.fromkeys(k[0] for k in grid))
    shapes = list(dict.fromkeys((f, s) for _, f, s in grid))
    values = [
        v
        for cells in grid.values()
        for p in cells.values()
        if (v := speedup_at(p, variant, base, metric))
    ]
    # Symmetric around 1 in log, so 2x and 0.5x look alike; past 8x the annotation tells.
    span = min(8.0, max([2.0, *(max(v, 1 / v) for v in values)]))
    norm = LogNorm(vmin=1 / span, vmax=span)
    cmap = plt.get_cmap("RdBu")
    fig, axes = plt.subplots(
        len(precisions),
        len(shapes),
        figsize=(4.2 * len(shapes) + 1.2, 3.4 * len(precisions) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    image = None
    for i, precision in enumerate(precisions):
        for j, (features, state) in enumerate(shapes):
            ax = axes[i][j]
            cells = grid.get((precision, features, state))
            if not cells:
                ax.set_axis_off()
                continue
            ts = sorted({t for t, _ in cells})
            bs = sorted({b for _, b in cells})
            data = np.full((len(ts), len(bs)), np.nan)
            for (t, b), point in cells.items():
                s = speedup_at(point, variant, base, metric)
                if s is not None:
                    data[ts.index(t), bs.index(b)] = s
            image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto")
            for (y, x), v in np.ndenumerate(data):
                text = "n/a" if np.isnan(v) else f"{v:.2f}"
                dark = not np.isnan(v) and abs(math.log(v)) > 0.6 * math.log(span)
                ax.text(
                    x,
                    y,
                    text,
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if dark else "black",
                )
            ax.set_xticks(range(len(bs)), [str(b) for b in bs])
            ax.set_yticks(range(len(ts)), [str(t) for t in ts])
            ax.set(
                xlabel="batch B", ylabel="steps T", title=f"{precision}, F={features}, S={state}"
            )
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.8, label=f"speedup over {base} ({metric} time)")
        # Powers of two, written out: LogNorm's default ticks read 2 x 10^-1.
        ticks = [2.0**k for k in range(-3, 4) if 1 / span <= 2.0**k <= span]
        bar.ax.minorticks_off()
        bar.set_ticks(ticks, labels=[f"{t:g}x" for t in ticks])
    fig.suptitle(
        f"{variant_label(variant, results)} over {variant_label(base, results)}: "
        f"{timed_call(results, short=True)}, "
        f"{'wall' if metric == 'wall' else 'GPU'} time (above 1: faster)"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    progress(f"wrote {path}")
