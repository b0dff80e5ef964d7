"""PNG figures of a sweep (matplotlib, headless): the Pareto fronts over every point, and a panel per swept
field. Each is saved under a temporary name and renamed, like the sweep's table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from cdbsim.outputs import atomic_file

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from cdbsim.sweep_summary import SweepSummary


def _save(fig: Figure, path: Path, title: str) -> None:
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    try:
        with atomic_file(path) as staging:
            fig.savefig(staging, dpi=110, format="png")
    finally:
        plt.close(fig)


def plot_fronts(summary: SweepSummary, path: Path, title: str) -> None:
    """Throughput per GPU against p99 TPOT and against mean depth: every point, the front drawn over them."""
    fig, axes = plt.subplots(1, len(summary.fronts), figsize=(6 * len(summary.fronts), 4.4))
    colour_by = summary.colour_field()
    for ax, front in zip(np.atleast_1d(axes), summary.fronts, strict=True):
        x = np.asarray(summary.scatter[front.x.column]) * front.x.scale
        y = np.asarray(summary.scatter[front.y.column]) * front.y.scale
        if colour_by is None:
            ax.scatter(y, x, s=12, alpha=0.5, color="tab:gray", label="points")
        else:
            codes = np.asarray(summary.codes[colour_by])
            for code, value in enumerate(summary.ranges[colour_by]):
                mine = codes == code
                ax.scatter(y[mine], x[mine], s=12, alpha=0.6, label=f"{colour_by}={value}")
        fx = [p[0] for p in front.points]
        fy = [p[1] for p in front.points]
        ax.plot(fy, fx, "k-o", lw=1.2, ms=5, mfc="none", label="Pareto front")
        ax.set(xlabel=front.y.label, ylabel=front.x.label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, path, title)


def plot_fields(summary: SweepSummary, path: Path, title: str) -> None:
    """One panel per swept field: the highest and lowest throughput per GPU reached at each of its values."""
    from cdbsim.sweep_summary import THROUGHPUT, is_numeric

    n = len(summary.fields)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    for ax, key in zip(axes.flat, summary.fields, strict=False):
        ranges = summary.ranges[key]
        values = list(ranges)
        numeric = is_numeric(key) and all(v is not None for v in values)
        if numeric:
            values.sort()
        x = np.asarray(values, dtype=float) if numeric else np.arange(len(values))
        high = [ranges[v].high for v in values]
        low = [ranges[v].low for v in values]
        ax.fill_between(x, low, high, alpha=0.2, step=None)
        ax.plot(x, high, "o-", label="best")
        ax.plot(x, low, ".--", lw=0.8, label="worst")
        if not numeric:
            ax.set_xticks(x, [str(v) for v in values], rotation=30 if len(values) > 4 else 0, fontsize=7)
        ax.set(xlabel=key, ylabel=THROUGHPUT.label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    _save(fig, path, title)
