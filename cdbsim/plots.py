"""PNG figures (matplotlib, headless): rate sweeps, predicted-vs-measured scatters, launch timelines."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


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
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_coda_batch(launches: dict[str, Any], path: str | Path, title: str, window: int = 25) -> Path:
    """The coda batch of every coda launch over the run (adaptive's effective K), one colour per run
    (``launches``: label -> launch log frame), with a rolling mean over ``window`` coda launches."""
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
    ax.legend(fontsize=8)
    ax.set_title(textwrap.fill(title, 150), fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
