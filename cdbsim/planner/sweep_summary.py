"""What a sweep found, gathered as its rows stream past: the best point per objective, the Pareto fronts of
throughput per GPU (one model replica on one device) against p99 TPOT and against mean depth, and per swept field
the throughput range its values reached. No whole rows are kept."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cdbsim.planner.experiment import settings
from cdbsim.planner.options import unwrap_optional
from cdbsim.planner.sweep import Status
from cdbsim.report.outputs import atomic_file
from cdbsim.report.plots import plt, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_COLOURS = 8


@dataclass(frozen=True)
class Objective:
    """A metric column to optimise, how it is shown, and which way is better."""

    column: str
    label: str
    maximize: bool
    scale: float = 1.0

    def value(self, row: Mapping[str, Any]) -> float:
        """The row's value in display units (NaN when missing)."""
        value = row.get(self.column)
        return math.nan if value is None else float(value) * self.scale

    def better(self, a: float, b: float) -> bool:
        return a > b if self.maximize else a < b


THROUGHPUT = Objective("output_tps", "output tok/s per GPU", True)
TPOT = Objective("tpot_s_p99", "p99 TPOT ms", False, 1e3)
DEPTH = Objective("mean_depth", "mean depth (quality proxy)", True)
OBJECTIVES = (THROUGHPUT, Objective("request_rate", "req/s per GPU", True), TPOT,
              Objective("ttft_s_p99", "p99 TTFT s", False),
              Objective("normalized_s_p99", "p99 normalized latency ms", False, 1e3),
              Objective("normalized_s_mean", "mean normalized latency ms", False, 1e3), DEPTH,
              Objective("speedup", "speed-up vs CB", True))
FRONTS = ((THROUGHPUT, TPOT), (THROUGHPUT, DEPTH))


def point_label(row: Mapping[str, Any], fields: Sequence[str]) -> str:
    """``serve.width=64 serve.policy=refill``: what sets a point apart."""
    return " ".join(f"{key}={row.get(key)}" for key in fields) or "base"


@dataclass
class ParetoFront:
    """The points no other point beats on both objectives (kept sorted by the first)."""

    x: Objective
    y: Objective
    points: list[tuple[float, float, str]] = field(default_factory=list)

    def add(self, x: float, y: float, label: str) -> None:
        if math.isnan(x) or math.isnan(y):
            return
        if any(self._covers(p, (x, y)) for p in self.points):
            return
        self.points = [p for p in self.points if not self._covers((x, y), p)] + [(x, y, label)]
        self.points.sort(key=lambda p: p[0])

    def _covers(self, a: Sequence[float], b: Sequence[float]) -> bool:
        """``a`` is at least as good as ``b`` on both objectives (so ``b`` adds nothing)."""
        return not self.x.better(b[0], a[0]) and not self.y.better(b[1], a[1])


@dataclass
class FieldRange:
    """Throughput per GPU reached at one value of a swept field: the lowest and the highest."""

    low: float = math.inf
    high: float = -math.inf

    def add(self, value: float) -> None:
        self.low, self.high = min(self.low, value), max(self.high, value)


class SweepSummary:
    """Accumulates rows (:meth:`add`) into best points, fronts, per-field ranges and scatter data."""

    def __init__(self, fields: Sequence[str]) -> None:
        self.fields = list(fields)
        self.best: dict[str, tuple[float, dict[str, Any]]] = {}
        self.fronts = [ParetoFront(x, y) for x, y in FRONTS]
        self.ranges: dict[str, dict[Any, FieldRange]] = {key: {} for key in self.fields}
        self.scatter = {o.column: array("d") for o in (THROUGHPUT, TPOT, DEPTH)}
        self.codes = {key: array("b") for key in self.fields}  # a colour per point and field (-1: too many)
        self.skipped: list[dict[str, Any]] = []  # the points that could not run: point, settings, reason

    def add(self, row: Mapping[str, Any]) -> None:
        if row["status"] != Status.OK.value:
            self.skipped.append({"point": row["point"], "settings": point_label(row, self.fields),
                                 "reason": row["reason"]})
            return
        label = point_label(row, self.fields)
        for objective in OBJECTIVES:
            value = objective.value(row)
            if not math.isnan(value) and (objective.column not in self.best
                                          or objective.better(value, self.best[objective.column][0])):
                self.best[objective.column] = (value, {"point": label, **{o.label: o.value(row) for o in
                                                                          (THROUGHPUT, TPOT, DEPTH)}})
        for front in self.fronts:
            front.add(front.x.value(row), front.y.value(row), label)
        throughput = THROUGHPUT.value(row)
        for key in self.fields:
            values = self.ranges[key]
            values.setdefault(row.get(key), FieldRange()).add(throughput)
            code = list(values).index(row.get(key))
            self.codes[key].append(code if code < MAX_COLOURS else -1)
        for column, values in self.scatter.items():
            values.append(float(row.get(column)) if row.get(column) is not None else math.nan)

    # ----- tables --------------------------------------------------------------------------------------
    def best_rows(self) -> list[dict[str, Any]]:
        """One row per objective: its best value and the point that reached it."""
        objectives = {o.column: o for o in OBJECTIVES}
        return [{"objective": objectives[column].label, "best": value, **detail}
                for column, (value, detail) in self.best.items()]

    def front_rows(self, index: int = 0) -> list[dict[str, Any]]:
        front = self.fronts[index]
        return [{front.x.label: x, front.y.label: y, "point": label} for x, y, label in front.points]

    # ----- plots ---------------------------------------------------------------------------------------
    def colour_field(self) -> str | None:
        """The first swept field with 2 to 8 values: the points of the scatter are coloured by it."""
        return next((k for k in self.fields if 2 <= len(self.ranges[k]) <= MAX_COLOURS), None)

    def plot(self, stem: str | Path, title: str) -> list[Path]:
        """``STEM-pareto.png`` and ``STEM-fields.png``, written under temporary names and renamed."""
        pareto, fields = summary_paths(stem)
        plot_fronts(self, pareto, title)
        if not self.fields:
            return [pareto]
        plot_fields(self, fields, title)
        return [pareto, fields]


def summary_paths(stem: str | Path) -> tuple[Path, Path]:
    """Where :meth:`SweepSummary.plot` writes for ``stem``: ``STEM-pareto.png`` and ``STEM-fields.png``."""
    stem = Path(stem).with_suffix("") if Path(stem).suffix == ".parquet" else Path(stem)
    return stem.with_name(f"{stem.name}-pareto.png"), stem.with_name(f"{stem.name}-fields.png")


def is_numeric(key: str) -> bool:
    """True if a swept field holds numbers (an axis of values), not names (an axis of categories)."""
    hint = next(s.hint for s in settings() if s.key == key)
    return unwrap_optional(hint)[0] in (int, float)


def _save(fig: Figure, path: Path, title: str) -> None:
    fig.suptitle(title, fontsize=8)
    with atomic_file(path) as staging:
        save_figure(fig, staging, dpi=110)


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
