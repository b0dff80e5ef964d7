"""Simulated against measured: the same requests and exit depths, two logs, one table of signed errors.

Reads two :class:`~cdbsim.report.logs.RunLog` objects only (the executor runs in ``calibration.validation``), so a
comparison can be redone from saved logs without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cdbsim.latency.profile import Fit, fit_points
from cdbsim.report.logs import RunLog
from cdbsim.report.metrics import Report
from cdbsim.serving.launch import Launch, Stage

OFFLINE_METRICS = ("output_tps", "makespan_s", "device_idle")
ONLINE_METRICS = (("ttft_s", "p50"), ("ttft_s", "p99"), ("tpot_s", "p50"), ("tpot_s", "p99"),
                  ("normalized_s", "p50"), ("normalized_s", "p99"))


def _value(report: Report, key: str | tuple[str, str]) -> float:
    return float(getattr(getattr(report, key[0]), key[1]) if isinstance(key, tuple) else getattr(report, key))


def _name(key: str | tuple[str, str]) -> str:
    return f"{key[0]} {key[1]}" if isinstance(key, tuple) else key


def launch_from_row(row: object) -> Launch:
    """A launch-log row as a :class:`Launch` with the fields a latency model reads."""
    items, tokens = int(row.items), int(row.tokens)
    prefill = row.stage == Stage.PREFILL.value
    return Launch(index=int(row.index), stage=Stage(row.stage), requests=[0] * items, positions=[0] * items,
                  chunk_lens=[0] * items if prefill else [],
                  finishes=[True] * tokens + [False] * (items - tokens) if prefill else [],
                  size=int(row.size), padded=int(row.padded), context=int(row.context),
                  longest=int(getattr(row, "longest", 0)), kv_copies=int(row.kv_copies))


BATCH_BINS = (16, 64, 128, 256)  # upper edges of the padded-batch ranges stage errors are broken into


def batch_range(padded: int) -> str:
    """The range of :data:`BATCH_BINS` a padded batch size falls in, e.g. ``"65-128"``."""
    low = 1
    for high in BATCH_BINS:
        if padded <= high:
            return f"{low}-{high}"
        low = high + 1
    return f"{low}+"


QUEUED_GAP_S = 3e-6  # a launch that starts this close to the previous end was queued behind it


def stage_errors(log: RunLog, launch_time: Callable[[Launch], float]) -> list[dict]:
    """Per stage, and per padded-batch range of each decode-type stage: measured device time of the logged
    launches against the latency model's time for the same launches (the latency model apart from the schedule).
    ``queued error`` counts only launches queued behind their predecessor: one that found the device idle also
    holds host time that no device model predicts."""
    rows = []
    launches = log.launches.assign(predicted=[launch_time(launch_from_row(r))
                                              for r in log.launches.itertuples(index=False)])
    gaps = launches["start"] - launches["end"].shift()
    launches = launches.assign(queued=(gaps <= QUEUED_GAP_S).to_numpy())
    for stage, group in launches.groupby("stage", sort=False):
        parts = [("all", group)]
        if stage != Stage.PREFILL:
            parts += list(group.groupby(group["padded"].map(batch_range), sort=False))
            parts[1:] = sorted(parts[1:], key=lambda part: int(part[0].split("-")[0].rstrip("+")))
        for batch, part in parts:
            measured, predicted = _summed_times(part)
            queued = part[part["queued"]]
            rows.append({"stage": str(stage), "batch": batch, "launches": len(part), "measured s": measured,
                         "predicted s": predicted, "error": signed_error(predicted, measured),
                         "queued launches": len(queued), "queued error": signed_error(*_summed_times(queued)[::-1])})
    return rows


def _summed_times(launches: object) -> tuple[float, float]:
    """Measured and predicted device seconds summed over ``launches``."""
    return float((launches["end"] - launches["start"]).sum()), float(launches["predicted"].sum())


def signed_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured; NaN when measured is 0 or missing."""
    return (predicted - measured) / measured if np.isfinite(measured) and measured != 0 else float("nan")


def host_points(launches: object) -> list[list[float]]:
    """Rows ``[items, 0, median host seconds]`` of a launch log's decode-type launches, one per item count
    seen at least three times: the points a profile's host component is fitted to."""
    return [[float(items), 0.0, float(group["host_s"].median())]
            for items, group in _decode_type(launches).groupby("items") if len(group) >= 3]


@dataclass(frozen=True)
class RunHost:
    """The host's speed in one executor run: per stage, seconds per launch against items (fitted through the
    mean: the slow tail counts); a pooled line over decode-type medians for other stages; the median per launch."""

    pooled: Fit
    stages: dict[Stage, Fit]
    median_s: float


MIN_STAGE_LAUNCHES = 3  # a stage's host line needs this many launches; fewer keep the pooled line


def run_host(log: RunLog) -> RunHost | None:
    """The host's speed of an executor run's own log, or None where its decode-type launches have too few
    distinct sizes to fit a line."""
    points = host_points(log.launches)
    if len(points) < 2:
        return None
    stages = {}
    for stage, group in _decode_type(log.launches).groupby("stage"):
        if len(group) < MIN_STAGE_LAUNCHES:
            continue
        if group["items"].nunique() < 2:
            stages[Stage(stage)] = Fit(delta=float(group["host_s"].mean()))
            continue
        rows = np.column_stack([group["items"], np.zeros(len(group)), group["host_s"]]).astype(float)
        stages[Stage(stage)] = fit_points(rows, with_context=False, relative=False)
    median = float(_decode_type(log.launches)["host_s"].median())
    return RunHost(fit_points(np.asarray(points, dtype=float), with_context=False), stages, median)


def _decode_type(launches: object) -> object:
    return launches[launches["stage"] != "prefill"]


@dataclass
class Comparison:
    """One configuration: measured and predicted reports and the rows of the side-by-side table."""

    name: str
    measured: Report
    predicted: Report
    online: bool
    rows: list[dict] = field(default_factory=list)
    measured_log: RunLog | None = None
    predicted_log: RunLog | None = None
    stages: list[dict] = field(default_factory=list)
    host_us: float = float("nan")            # the run's median host time per decode-type launch
    own_host: Report | None = None           # the prediction with the run's own host line
    own_host_times: Report | None = None     # ... with its own host time of every launch (offline runs)

    @classmethod
    def of(cls, name: str, measured: Report, predicted: Report, online: bool,
           measured_log: RunLog | None = None, predicted_log: RunLog | None = None) -> Comparison:
        comp = cls(name, measured, predicted, online, measured_log=measured_log, predicted_log=predicted_log)
        keys: list = list(OFFLINE_METRICS) + (list(ONLINE_METRICS) if online else [])
        for key in keys:
            m, p = _value(measured, key), _value(predicted, key)
            err = p - m if key == "device_idle" else signed_error(p, m)
            comp.rows.append({"metric": _name(key), "measured": m, "predicted": p,
                              "error": err, "error kind": "abs" if key == "device_idle" else "rel"})
        for stage in sorted(set(measured.launches) | set(predicted.launches)):
            for label, source in (("launches", "launches"), ("mean B", "mean_batch")):
                m = float(getattr(measured, source).get(stage, 0))
                p = float(getattr(predicted, source).get(stage, 0))
                comp.rows.append({"metric": f"{stage} {label}", "measured": m, "predicted": p,
                                  "error": signed_error(p, m), "error kind": "rel"})
        return comp

    def _tps_error(self, report: Report | None) -> float:
        return float("nan") if report is None else signed_error(report.output_tps, self.measured.output_tps)

    @property
    def throughput_error(self) -> float:
        return self._tps_error(self.predicted)

    @property
    def normalized_p50_error(self) -> float:
        return signed_error(self.predicted.normalized_s.p50, self.measured.normalized_s.p50)

    def _online_error(self, metric: str, percentile: str) -> float:
        """Signed error of an online latency percentile; NaN for an offline run."""
        if not self.online:
            return float("nan")
        return signed_error(getattr(getattr(self.predicted, metric), percentile),
                            getattr(getattr(self.measured, metric), percentile))

    @property
    def ttft_p99_error(self) -> float:
        return self._online_error("ttft_s", "p99")

    @property
    def tpot_p99_error(self) -> float:
        return self._online_error("tpot_s", "p99")

    @property
    def own_host_error(self) -> float:
        """Throughput error with the run's own host speed: what the device model and the scheduler leave."""
        return self._tps_error(self.own_host)

    @property
    def own_host_times_error(self) -> float:
        """Throughput error replaying the run's own host time of every launch: what the device model and the
        pipeline rule leave (offline runs, whose launches come in the same order)."""
        return self._tps_error(self.own_host_times)

    @property
    def own_host_p50_error(self) -> float:
        """Normalized latency p50 error with the run's own host speed (online runs)."""
        if self.own_host is None or not self.online:
            return float("nan")
        return signed_error(self.own_host.normalized_s.p50, self.measured.normalized_s.p50)

    def summary(self) -> dict:
        return {"config": self.name, "measured tok/s": self.measured.output_tps,
                "predicted tok/s": self.predicted.output_tps, "tok/s error %": 100 * self.throughput_error,
                "measured idle %": 100 * self.measured.device_idle,
                "predicted idle %": 100 * self.predicted.device_idle,
                "norm p50 error %": 100 * self.normalized_p50_error if self.online else float("nan"),
                "TTFT p99 error %": 100 * self.ttft_p99_error, "TPOT p99 error %": 100 * self.tpot_p99_error,
                "run host us": self.host_us, "error with run's host %": 100 * self.own_host_error,
                "norm p50 error with run's host %": 100 * self.own_host_p50_error,
                "error with run's host times %": 100 * self.own_host_times_error}


def error_summary(comparisons: list[Comparison]) -> dict:
    """Median and worst |error| of offline throughput, and of online normalized p50, TTFT p99 and TPOT p99 latency."""
    offline = [abs(c.throughput_error) for c in comparisons if not c.online]
    online = [abs(c.normalized_p50_error) for c in comparisons if c.online]
    own_host = [abs(c.own_host_error) for c in comparisons if not c.online and np.isfinite(c.own_host_error)]
    own_p50 = [abs(c.own_host_p50_error) for c in comparisons if np.isfinite(c.own_host_p50_error)]
    own_times = [abs(c.own_host_times_error) for c in comparisons if np.isfinite(c.own_host_times_error)]
    out = {"configs": len(comparisons)}
    if offline:
        out.update({"offline tok/s |error| median %": 100 * float(np.median(offline)),
                    "offline tok/s |error| worst %": 100 * float(np.max(offline))})
    if own_host:
        out["offline |error| with run's host worst %"] = 100 * float(np.max(own_host))
    if own_p50:
        out["online p50 |error| with run's host worst %"] = 100 * float(np.max(own_p50))
    if own_times:
        out["offline |error| with run's host times worst %"] = 100 * float(np.max(own_times))
    if online:
        out.update({"online norm p50 |error| median %": 100 * float(np.median(online)),
                    "online norm p50 |error| worst %": 100 * float(np.max(online))})
    for name, errors in (("TTFT p99", [c.ttft_p99_error for c in comparisons]),
                         ("TPOT p99", [c.tpot_p99_error for c in comparisons])):
        tails = [abs(e) for e in errors if np.isfinite(e)]
        if tails:
            out.update({f"online {name} |error| median %": 100 * float(np.median(tails)),
                        f"online {name} |error| worst %": 100 * float(np.max(tails))})
    return out


def plot_scatter(comparisons: list[Comparison], path: str | Path, title: str = "") -> Path:
    """Predicted against measured output throughput over the matrix, with the +-7% band."""
    from cdbsim.report.plots import plt, save_figure

    fig, ax = plt.subplots(figsize=(6, 5.5))
    measured = np.array([c.measured.output_tps for c in comparisons])
    predicted = np.array([c.predicted.output_tps for c in comparisons])
    for comp, m, p in zip(comparisons, measured, predicted, strict=True):
        ax.plot(m, p, "s" if comp.online else "o", color="C1" if comp.online else "C0")
        ax.annotate(comp.name, (m, p), fontsize=6, xytext=(3, 3), textcoords="offset points")
    low, high = 0.8 * min(measured.min(), predicted.min()), 1.2 * max(measured.max(), predicted.max())
    grid = np.array([low, high])
    ax.plot(grid, grid, "k-", lw=1)
    ax.fill_between(grid, grid * 0.93, grid * 1.07, color="grey", alpha=0.2, label="±7%")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel="measured output tok/s",
           ylabel="predicted output tok/s", title=title or "simulated vs measured")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=130)


def plot_timelines(measured: RunLog, predicted: RunLog, path: str | Path, launches: int = 120,
                   title: str = "") -> Path:
    """The first launches of both runs on one time axis, one lane per stage."""
    from cdbsim.report.plots import plt, save_figure

    stages = ["prefill", "prelude", "core", "coda", "decode"]
    fig, ax = plt.subplots(figsize=(11, 3.8))
    for offset, (log, color, label) in enumerate(((measured, "C0", "measured"), (predicted, "C3", "predicted"))):
        rows = log.launches.head(launches)
        for _, row in rows.iterrows():
            lane = stages.index(row["stage"]) + (0.4 if offset else 0.0)
            ax.broken_barh([(row["start"] * 1e3, (row["end"] - row["start"]) * 1e3)], (lane, 0.35),
                           color=color, alpha=0.8)
        ax.plot([], [], color=color, lw=6, label=label)
    ax.set_yticks([i + 0.375 for i in range(len(stages))], stages)
    ax.set(xlabel="time (ms)", title=title or f"first {launches} launches")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path, dpi=130)
