"""PNG figures (matplotlib, headless): rate sweeps, latency CDFs, predicted-vs-measured scatters, launch
timelines."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter, ScalarFormatter


def plot_rate_sweep(points: list[Any], knees: dict[str, float | None], path: str | Path, title: str) -> Path:
    """Mean normalized latency and output throughput against request rate, one line per policy."""
    fig, (ax_lat, ax_tps) = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy in dict.fromkeys(p.policy for p in points):
        mine = sorted((p for p in points if p.policy == policy), key=lambda p: p.rate)
        rates = [p.rate for p in mine]
        (line,) = ax_lat.plot(rates, [p.report.normalized_s.mean * 1e3 for p in mine], "o-", label=policy)
        ax_tps.plot(rates, [p.report.output_tps for p in mine], "o-", color=line.get_color(), label=policy)
        if knees.get(policy):
            ax_lat.axvline(knees[policy], color=line.get_color(), ls=":", lw=1)
    ax_lat.set(xlabel="request rate (req/s)", ylabel="mean normalized latency (ms/token)", yscale="log")
    ax_tps.set(xlabel="request rate (req/s)", ylabel="output tokens/s")
    for ax in (ax_lat, ax_tps):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=8)
    return save_figure(fig, path)


CDF_PANELS = (("ttft_s", "TTFT (s)", 1.0), ("tpot_s", "TPOT (ms)", 1e3), ("itl_s", "ITL (ms)", 1e3),
              ("normalized_s", "normalized latency (ms/token)", 1e3))


def plot_latency_cdfs(samples: dict[str, dict[str, np.ndarray]], path: str | Path, title: str) -> Path:
    """Empirical CDFs of TTFT, TPOT, ITL and normalized latency, one line per run (``{run: samples}``)."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (key, label, scale) in zip(axes.flat, CDF_PANELS, strict=True):
        lowest = np.inf
        for run, values in samples.items():
            x = np.asarray(values[key], dtype=float)
            x = np.sort(x[np.isfinite(x)]) * scale
            if x.size:
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=run)
                lowest = min(lowest, float(x[0]))
        ax.set(xlabel=label, ylabel="fraction of " + ("gaps" if key == "itl_s" else "requests"), ylim=(0, 1.01))
        if 0 < lowest < np.inf:  # latencies span decades: a log axis, labelled in plain numbers
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 140), fontsize=8)
    return save_figure(fig, path)


def plot_coda_batch(launches: dict[str, Any], path: str | Path, title: str, window: int = 25) -> Path:
    """The coda batch of every coda launch (``launches``: label -> launch log frame), with a rolling mean over
    ``window`` coda launches."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for label, frame in launches.items():
        coda = frame[frame["stage"] == "coda"]
        if coda.empty:
            continue
        (dots,) = ax.plot(coda["start"], coda["size"], ".", ms=2, alpha=0.3)
        ax.plot(coda["start"], coda["size"].rolling(window, min_periods=1).mean(), "-",
                color=dots.get_color(), label=f"{label} (mean {coda['size'].mean():.1f})")
    ax.set(xlabel="time (s)", ylabel="tokens per coda launch (effective K)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:  # runs with no coda launch draw nothing to name
        ax.legend(fontsize=8)
    ax.set_title(textwrap.fill(title, 150), fontsize=7)
    return save_figure(fig, path)


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Lay out ``fig``, write it as PNG and close it (written or not)."""
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return Path(path)
