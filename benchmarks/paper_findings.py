"""The CDB paper's findings, side by side with cdbsim's predictions on the shipped H200 profiles.
Run time: a few minutes on two cores with ``--jobs 2`` (CPU only).

Every finding of the paper (``reference/paper-facts.md``) that a serving simulator can address is run
with cdbsim's defaults (mixed core launches, the synthetic exit model, the measured H200 profile) and
compared with the paper's number: ✓ when cdbsim's value(s) fall inside the paper's own spread (its
reported range; where it gives one number, ±10%, or ±1 point for an idle share; for a best-K finding,
the paper's K within 2% of the best K's throughput). For every ✗ the finding is run again with each of
three switches turned on alone, to show which one closes the gap:

* ``per-step``: core launches split by loop step, as the paper's engine does (``serve.core_launch``);
* ``paper exits``: the paper's operating points (``--exits paper --q Q``) instead of the synthetic model;
* ``h100``: the H100's measured profiles (``--device h100-sxm``), the paper's GPU.

The paper ran on an H100 with thousands of requests per point; this runs small request counts (printed
with the table) so that the whole table takes minutes on two cores. Ratios (speed-ups, knee ratios,
shares) are compared, never absolute rates.

    python benchmarks/paper_findings.py [--json FILE] [--csv FILE] [--jobs 2]
    python benchmarks/paper_findings.py --h100-curves benchmarks/results/paper/h100/curves.csv

``--h100-curves`` measures the paper's capacity knees as the paper does (600 s of Poisson arrivals per rate) on the
H100's profiles, three seeds; ``benchmarks/tables.py`` makes README's table from the curves.
"""

# ruff: noqa: E402  (the imports follow the sys.path line that picks this checkout)
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's packages, not an installed copy
    sys.path.insert(0, str(ROOT))

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import cdbsim
from cdbsim.model.arch import PRESETS
from cdbsim.planner.study import latency_knee

OURO, HUGINN = "ouro-1.4b", "huginn-3.5b"
KV_TOKENS = 327_680  # the paper's KV cache: tokens of the model's physical layers (what an H100 80GB holds)
REQUESTS = {  # (model, workload) -> requests per offline point
    (OURO, "alpaca"): 256, (OURO, "sharegpt"): 64, (HUGINN, "alpaca"): 128, (HUGINN, "sharegpt"): 48}
ONLINE_REQUESTS = {(OURO, "alpaca"): 192, (OURO, "sharegpt"): 64, (HUGINN, "sharegpt"): 48}
RATE_FACTORS = (0.25, 0.5, 0.8, 1.1, 1.4, 1.8, 2.4)  # x CB's offline request rate
WIDTHS = (16, 64, 256, 512)
PAPER_Q = {OURO: (0.2, 0.4, 0.5, 0.7), HUGINN: (0.28, 0.16, 0.10)}  # the paper's thresholds with exits
DEFAULT_Q = {OURO: 0.2, HUGINN: 0.28}  # the threshold of the paper's single-q experiments


def paper_kv_tokens(model: str, split: str | None, layout: str) -> int:
    """The paper's KV memory (:data:`KV_TOKENS` of the model as published) in tokens of ``split`` and ``layout``:
    a depth-indexed cache spends a slot per loop step."""
    base = PRESETS[model]
    spec = base.with_split(split) if split else base
    return KV_TOKENS * (base.prelude + base.core + base.coda) // spec.cache_layers(layout)


@dataclass(frozen=True)
class Switches:
    """Which of the three differences from the paper's setting are turned on."""

    per_step: bool = False
    paper_exits: bool = False
    h100: bool = False

    @property
    def label(self) -> str:
        on = [n for n, v in (("per-step", self.per_step), ("paper exits", self.paper_exits), ("h100", self.h100)) if v]
        return " + ".join(on) or "defaults"

    def thresholds(self, model: str, sweep_q: bool) -> Sequence[float | None]:
        """The exit thresholds to run: None (the synthetic default), or the paper's (all or the single one)."""
        if not self.paper_exits:
            return (None,)
        return PAPER_Q[model] if sweep_q else (DEFAULT_Q[model],)

    def experiment(self, model: str, workload: str, requests: int, q: float | None, split: str | None = None,
                   exits: str | None = None, **serve: Any) -> cdbsim.Experiment:
        """The experiment of one point: W = 64 and the paper's KV cache unless ``serve`` says otherwise."""
        exit_model = {"model": exits} if exits else {"model": "paper", "q": q} if q is not None else {}
        latency = {"device": "h100-sxm"} if self.h100 else {}  # auto: the H100's measured profiles
        serve = {"width": 64, "kv_tokens": paper_kv_tokens(model, split, serve.get("kv_layout", "depth")), **serve,
                 "core_launch": "per-step" if self.per_step else "mixed"}
        return cdbsim.Experiment(arch={"name": model, "split": split}, serve=serve, exits=exit_model,
                                 latency=latency, workload={"name": workload, "requests": requests, "seed": 1})


SWITCHES = (Switches(per_step=True), Switches(paper_exits=True), Switches(h100=True))


@dataclass
class Measured:
    """cdbsim's value(s) for a finding and a note on how they came about."""

    values: list[float]
    note: str = ""

    def text(self, fmt: str) -> str:
        finite = [v for v in self.values if math.isfinite(v)]
        if not finite:
            return "n/a"
        low, high = min(finite), max(finite)
        return format(low, fmt) if format(low, fmt) == format(high, fmt) else f"{low:{fmt}}–{high:{fmt}}"


@dataclass(frozen=True)
class Finding:
    """One finding: what the paper reports, the band that counts as agreement, and how cdbsim measures it."""

    name: str
    source: str
    paper: str
    band: tuple[float, float]
    fmt: str
    measure: Callable[[Switches, Runner], Measured]
    online: bool = False

    def agrees(self, measured: Measured) -> bool:
        finite = [v for v in measured.values if math.isfinite(v)]
        return bool(finite) and all(self.band[0] - 1e-9 <= v <= self.band[1] + 1e-9 for v in finite)


@dataclass
class Runner:
    """Runs experiments as the points of one sweep (on ``jobs`` processes) through one cache, so a point
    two findings share runs once."""

    jobs: int
    cache: Path
    progress: Progress
    task: Any
    points: int = 0

    def sweep(self, experiments: list[cdbsim.Experiment], baseline: bool = False) -> pd.DataFrame:
        """One row per experiment, in order (CB on the same requests too if ``baseline``)."""
        base = cdbsim.Experiment()
        points = [{f"{section}.{key}": value for section, values in exp.to_dict().items()
                   for key, value in values.items() if value is not None} for exp in experiments]
        done = self.points
        total = self.progress.tasks[0].total or 0
        self.progress.update(self.task, total=total + len(points))
        rows = cdbsim.sweep(base, points=points, baseline=baseline, jobs=self.jobs, cache=self.cache,
                            progress=lambda n, _: self.progress.update(self.task, completed=done + n))
        self.points += len(points)
        bad = rows[rows["status"] != "ok"]
        if len(bad):
            raise RuntimeError(f"a point did not run: {bad['reason'].iloc[0]}")
        return rows


# ----- measurements --------------------------------------------------------------------------------
def offline(model: str, sweep_q: bool, metric: str, **serve: Any) -> Callable[[Switches, Runner], Measured]:
    """``metric`` of one policy against CB (speed-up or share of S_e2e) on Alpaca and ShareGPT."""
    def measure(sw: Switches, run: Runner) -> Measured:
        exps = [sw.experiment(model, wl, REQUESTS[(model, wl)], q, **serve)
                for wl in ("alpaca", "sharegpt") for q in sw.thresholds(model, sweep_q)]
        rows = run.sweep(exps, baseline=True)
        scale = 100.0 if metric == "bound_realised" else 1.0
        return Measured([scale * v for v in rows[metric]], "Alpaca, ShareGPT")
    return measure


def refill_over_norefill(sw: Switches, run: Runner) -> Measured:
    """Huginn W = 64: refill K = 16 throughput over no-refill (the paper: no-refill wins, so <= 1)."""
    values = []
    for wl in ("alpaca", "sharegpt"):
        for q in sw.thresholds(HUGINN, sweep_q=True):
            rows = run.sweep([sw.experiment(HUGINN, wl, REQUESTS[(HUGINN, wl)], q, policy=p, coda_batch=k)
                              for p, k in (("refill", 16), ("norefill", 1))])
            values.append(rows["output_tps"].iloc[0] / rows["output_tps"].iloc[1])
    return Measured(values, "Alpaca, ShareGPT")


def best_k(split: str, paper_k: int) -> Callable[[Switches, Runner], Measured]:
    """Huginn re-split: throughput at the paper's best K over the best of K in 1..64 (Alpaca, W = 64)."""
    ks = (1, 4, 8, 16, 32, 64)

    def measure(sw: Switches, run: Runner) -> Measured:
        values, notes = [], []
        for q in sw.thresholds(HUGINN, sweep_q=False):
            exps = [sw.experiment(HUGINN, "alpaca", REQUESTS[(HUGINN, "alpaca")], q, split=split, coda_batch=k)
                    for k in ks]
            tps = run.sweep(exps)["output_tps"].to_numpy()
            values.append(float(tps[ks.index(paper_k)] / tps.max()))
            notes.append(f"best K={ks[int(tps.argmax())]}")
        return Measured(values, ", ".join(notes))
    return measure


def width_peak(sw: Switches, run: Runner) -> Measured:
    """Huginn Alpaca: the best CDB policy's speed-up over CB, maximised over W = 16..512 (K = W/4)."""
    values, notes = [], []
    for q in sw.thresholds(HUGINN, sweep_q=False):
        best = []
        for w in WIDTHS:
            n = max(REQUESTS[(HUGINN, "alpaca")], 2 * w)
            rows = run.sweep([sw.experiment(HUGINN, "alpaca", n, q, policy=p, width=w, coda_batch=k)
                              for p, k in (("refill", max(1, w // 4)), ("norefill", 1))], baseline=True)
            best.append(float(rows["speedup"].max()))
        values.append(max(best))
        notes.append(f"peak at W={WIDTHS[int(np.argmax(best))]}")
    return Measured(values, ", ".join(notes) + f"; requests max({REQUESTS[(HUGINN, 'alpaca')]}, 2W)")


def full_depth(sw: Switches, run: Runner) -> Measured:
    """Ouro with no exits (the paper's q = 1.0): refill over CB, Alpaca and ShareGPT."""
    exps = [sw.experiment(OURO, wl, REQUESTS[(OURO, wl)], None, exits="none", policy="refill")
            for wl in ("alpaca", "sharegpt")]
    return Measured(list(run.sweep(exps, baseline=True)["speedup"]), "Alpaca, ShareGPT")


def idle_share(timing: str) -> Callable[[Switches, Runner], Measured]:
    """Ouro ShareGPT W = 64, K = 1: the device's idle share (%) under one exit timing."""
    def measure(sw: Switches, run: Runner) -> Measured:
        exps = [sw.experiment(OURO, "sharegpt", REQUESTS[(OURO, "sharegpt")], q, timing=timing)
                for q in sw.thresholds(OURO, sweep_q=False)]
        return Measured([100 * v for v in run.sweep(exps)["device_idle"]])
    return measure


@dataclass
class LoadCurve:
    """Mean normalized latency against Poisson rate for CB, no-refill and refill, and each one's knee."""

    rates: list[float]
    latency: dict[str, list[float]] = field(default_factory=dict)

    def knee(self, policy: str) -> float:
        knee = latency_knee(self.rates, self.latency[policy])
        return knee if knee is not None else math.nan


LOAD_CURVES: dict[tuple[str, str, Switches, float | None], LoadCurve] = {}


def load_curve(model: str, workload: str, sw: Switches, q: float | None, run: Runner) -> LoadCurve:
    """Rates at fixed multiples of CB's offline request rate, the same arrivals for every policy."""
    key = (model, workload, sw, q)
    if key not in LOAD_CURVES:
        n = ONLINE_REQUESTS[(model, workload)]
        k = 16 if model == HUGINN else 1
        cb = run.sweep([sw.experiment(model, workload, n, q, policy="cb")])
        rates = [f * float(cb["request_rate"].iloc[0]) for f in RATE_FACTORS]
        curve = LoadCurve(rates)
        for policy in ("cb", "norefill", "refill"):
            exps = [sw.experiment(model, workload, n, q, policy=policy, coda_batch=k if policy == "refill" else 1)
                    .override({"workload.rate": r}) for r in rates]
            curve.latency[policy] = list(run.sweep(exps)["normalized_s_mean"])
        LOAD_CURVES[key] = curve
    return LOAD_CURVES[key]


def knee_ratio(model: str, workload: str, policy: str) -> Callable[[Switches, Runner], Measured]:
    """A policy's latency knee (mean normalized latency twice its light-load value) over CB's."""
    def measure(sw: Switches, run: Runner) -> Measured:
        curves = [load_curve(model, workload, sw, q, run) for q in sw.thresholds(model, sweep_q=False)]
        return Measured([c.knee(policy) / c.knee("cb") for c in curves],
                        f"{ONLINE_REQUESTS[(model, workload)]} requests per rate")
    return measure


def latency_cut(sw: Switches, run: Runner) -> Measured:
    """How much lower (%) the better CDB policy's mean normalized latency is than CB's, at CB's knee rate."""
    values = []
    for model, workload in ONLINE_REQUESTS:
        for q in sw.thresholds(model, sweep_q=False):
            c = load_curve(model, workload, sw, q, run)
            at = c.knee("cb")
            cb = np.interp(at, c.rates, c.latency["cb"])
            cdb = min(np.interp(at, c.rates, c.latency[p]) for p in ("norefill", "refill"))
            values.append(100 * (1 - cdb / cb))
    return Measured(values, "Ouro Alpaca, Ouro ShareGPT, Huginn ShareGPT")


def within(value: float, share: float = 0.10) -> tuple[float, float]:
    return value * (1 - share), value * (1 + share)


FINDINGS: list[Finding] = [
    Finding("Ouro refill / CB, offline, W=64", "Results, Ouro", "1.32–1.58x", (1.32, 1.58), ".2f",
            offline(OURO, True, "speedup", policy="refill", coda_batch=1)),
    Finding("Ouro refill, % of S_e2e", "Results, Ouro", "94–99%", (94, 99), ".0f",
            offline(OURO, True, "bound_realised", policy="refill", coda_batch=1)),
    Finding("Huginn no-refill / CB, offline, W=64", "Results, Huginn", "1.30–1.37x", (1.30, 1.37), ".2f",
            offline(HUGINN, True, "speedup", policy="norefill")),
    Finding("Huginn refill K=16 / no-refill, W=64", "Results, Huginn", "<= 1 (no-refill wins)", (0.0, 1.0), ".2f",
            refill_over_norefill),
    Finding("Huginn best CDB, % of S_e2e", "Results, Huginn", "73–96%", (73, 96), ".0f",
            offline(HUGINN, True, "bound_realised", policy="norefill")),
    Finding("Huginn 2-4-2: K=W/4 best (tput at K=16 / best)", "Results, best K", "K = W/4 = 16", (0.98, 1.0), ".3f",
            best_k("2-4-2", 16)),
    Finding("Huginn 0-4-0: K=1 near-optimal (tput at K=1 / best)", "Results, best K", "K = 1", (0.98, 1.0), ".3f",
            best_k("0-4-0", 1)),
    Finding("Huginn best CDB / CB, peak over W=16, 64, 256, 512", "Results, Huginn", "up to 1.9x", within(1.9), ".2f",
            width_peak),
    Finding("Ouro full depth: refill / CB", "Results, Ouro", "0.95–0.99 (1–5% overhead)", (0.95, 0.99), ".3f",
            full_depth),
    Finding("GPU idle, synchronous (%)", "Results, idle", "10.27%", (9.27, 11.27), ".2f", idle_share("sync")),
    Finding("GPU idle, async (%)", "Results, idle", "10.05%", (9.05, 11.05), ".2f", idle_share("async")),
    Finding("GPU idle, async + lookahead (%)", "Results, idle", "0.56%", (0.0, 1.56), ".2f", idle_share("lookahead")),
    Finding("Knee Ouro Alpaca, no-refill / CB", "Capacity knees", "1.13 (39.5/34.9)", within(39.5 / 34.9), ".2f",
            knee_ratio(OURO, "alpaca", "norefill"), online=True),
    Finding("Knee Ouro Alpaca, refill / CB", "Capacity knees", "1.54 (53.9/34.9)", within(53.9 / 34.9), ".2f",
            knee_ratio(OURO, "alpaca", "refill"), online=True),
    Finding("Knee Ouro ShareGPT q=0.2, no-refill / CB", "Capacity knees", "1.21 (5.7/4.7)", within(5.7 / 4.7), ".2f",
            knee_ratio(OURO, "sharegpt", "norefill"), online=True),
    Finding("Knee Ouro ShareGPT q=0.2, refill / CB", "Capacity knees", "1.53 (7.2/4.7)", within(7.2 / 4.7), ".2f",
            knee_ratio(OURO, "sharegpt", "refill"), online=True),
    Finding("Knee Huginn ShareGPT q=0.28, no-refill / CB", "Capacity knees", "1.33 (2.44/1.84)",
            within(2.44 / 1.84), ".2f", knee_ratio(HUGINN, "sharegpt", "norefill"), online=True),
    Finding("Knee Huginn ShareGPT q=0.28, refill / CB", "Capacity knees", "1.32 (2.43/1.84)",
            within(2.43 / 1.84), ".2f", knee_ratio(HUGINN, "sharegpt", "refill"), online=True),
    Finding("Normalized latency under load, % lower than CB", "Results, online", "45–90%", (45, 90), ".0f",
            latency_cut, online=True),
]


@dataclass
class Row:
    """One line of the table."""

    finding: Finding
    measured: Measured
    ok: bool
    switches: dict[str, tuple[str, bool]] = field(default_factory=dict)  # switch -> (value, agrees)

    def closes(self) -> str:
        if self.ok:
            return ""
        if not self.switches:
            return "not run (--online-switches)"
        fixed = [name for name, (_, ok) in self.switches.items() if ok]
        return ", ".join(fixed) if fixed else "none alone"

    def record(self) -> dict[str, Any]:
        f = self.finding
        return {"finding": f.name, "paper_source": f.source, "paper": f.paper, "band": list(f.band),
                "cdbsim": self.measured.text(f.fmt), "cdbsim_values": self.measured.values,
                "note": self.measured.note, "agrees": self.ok,
                "switches": {k: {"value": v, "agrees": ok} for k, (v, ok) in self.switches.items()},
                "closed_by": self.closes()}


def evaluate(jobs: int, console: Console, cache: Path | None, online_switches: bool) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True) as progress:
        task = progress.add_task("points", total=0)
        run = Runner(jobs, cache or Path(tmp) / "points.sqlite", progress, task)
        for finding in FINDINGS:
            progress.update(task, description=finding.name[:40])
            measured = finding.measure(Switches(), run)
            row = Row(finding, measured, finding.agrees(measured))
            if not row.ok and (online_switches or not finding.online):
                for sw in SWITCHES:
                    other = finding.measure(sw, run)
                    row.switches[sw.label] = (other.text(finding.fmt), finding.agrees(other))
            rows.append(row)
    return rows


def table(rows: list[Row], title: str) -> Table:
    out = Table(title=title, show_lines=False)
    for col in ("finding", "paper (source)", "cdbsim", "", *(s.label for s in SWITCHES), "closed by"):
        out.add_column(col, overflow="fold")
    for row in rows:
        f = row.finding
        out.add_row(f.name, f"{f.paper} ({f.source})", row.measured.text(f.fmt) +
                    (f" [{row.measured.note}]" if row.measured.note else ""), "✓" if row.ok else "✗",
                    *(("" if s.label not in row.switches else
                       f"{row.switches[s.label][0]} {'✓' if row.switches[s.label][1] else '✗'}") for s in SWITCHES),
                    row.closes())
    return out


# ----- the paper's knees, measured its way on the H100 ------------------------------------------------
# 600 s of Poisson arrivals per rate (``600 x rate`` requests) over a grid around CB's offline request rate, on the
# H100's profiles, W = 64, M = 8,192, the paper's KV memory, --exits paper; three seeds; every curve kept
# (``--h100-curves``). A knee is where mean normalized latency reaches KNEE_FACTOR x its light-load value: at 2x, CDB
# refill's latency doubles as its batches fill, long before its queue grows without bound.
DURATION_S = 600.0  # the paper's Poisson arrivals last 600 s
KNEE_RATES = (0.2, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0,
                2.2)  # x CB's offline request rate
KNEE_FACTOR = 10.0  # a knee: mean normalized latency this many times its value at the lowest rate
OFFLINE_REQUESTS = 1024  # requests of the CB run that sets the rate grid
KNEE_SEEDS = (1, 2, 3)
KNEE_POLICIES = ("cb", "norefill", "refill")


@dataclass(frozen=True)
class Case:
    """One of the paper's knee experiments and its reported knees (req/s, CB / no-refill / refill)."""

    model: str
    workload: str
    q: float
    coda_batch: int
    paper: tuple[float, float, float]

    @property
    def name(self) -> str:
        return f"{self.model} {self.workload} q={self.q:g}"

    def point(self, policy: str, seed: int, requests: int, rate: float | None) -> dict[str, object]:
        return {"arch.name": self.model, "workload.name": self.workload, "workload.requests": requests,
                "workload.seed": seed, "workload.rate": rate, "exits.model": "paper", "exits.q": self.q,
                "serve.policy": policy, "serve.coda_batch": self.coda_batch if policy == "refill" else 1,
                "serve.width": 64, "serve.prefill_budget": 8192,
                "serve.kv_tokens": paper_kv_tokens(self.model, None, "depth"),
                "latency.device": "h100-sxm"}


KNEE_CASES = (Case(OURO, "sharegpt", 0.2, 1, (4.7, 5.7, 7.2)), Case(OURO, "alpaca", 0.2, 1, (34.9, 39.5, 53.9)),
              Case(HUGINN, "sharegpt", 0.28, 16, (1.84, 2.44, 2.43)))


def knee_curves(jobs: int) -> pd.DataFrame:
    """One row per case, seed, policy and rate: the requests of its 600 s and their mean normalized latency."""
    base = cdbsim.Experiment()
    rows = []
    with Progress() as progress:
        task = progress.add_task("load curves",
                                 total=len(KNEE_CASES) * len(KNEE_SEEDS) * (1 + len(KNEE_POLICIES) * len(KNEE_RATES)))
        for case in KNEE_CASES:
            for seed in KNEE_SEEDS:
                offline = cdbsim.sweep(base, points=[case.point("cb", seed, OFFLINE_REQUESTS, None)])
                progress.advance(task)
                rate0 = float(offline["request_rate"].iloc[0])
                for policy in KNEE_POLICIES:
                    points = [case.point(policy, seed, max(64, math.ceil(DURATION_S * f * rate0)), f * rate0)
                              for f in KNEE_RATES]
                    done = progress.tasks[0].completed
                    frame = cdbsim.sweep(base, points=points, jobs=jobs,
                                         progress=lambda n, _, d=done: progress.update(task, completed=d + n))
                    bad = frame[frame["status"] != "ok"]
                    if len(bad):
                        raise SystemExit(f"error: {case.name} {policy}: {bad['reason'].iloc[0]}")
                    rows += [{"case": case.name, "policy": policy, "seed": seed, "cb_offline_rate": rate0,
                              "rate": p["workload.rate"], "requests": p["workload.requests"],
                              "normalized_s_mean": y}
                             for p, y in zip(points, frame["normalized_s_mean"], strict=True)]
    return pd.DataFrame(rows)


def knees(curves: pd.DataFrame) -> pd.DataFrame:
    """Each case, policy and seed's knee (req/s; NaN where the latency never reaches ``KNEE_FACTOR`` x)."""
    rows = []
    for (case, policy, seed), curve in curves.groupby(["case", "policy", "seed"], sort=False):
        knee = latency_knee(list(curve["rate"]), list(curve["normalized_s_mean"]), KNEE_FACTOR)
        rows.append({"case": case, "policy": policy, "seed": seed, "knee": math.nan if knee is None else knee})
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    parser.add_argument("--csv", type=Path, help="also write the rows as CSV to this file")
    parser.add_argument("--jobs", type=int, default=2, help="processes to simulate points on (default 2)")
    parser.add_argument("--cache", type=Path, help="keep simulated points in this SQLite file (reruns reuse them)")
    parser.add_argument("--online-switches", action="store_true",
                        help="also rerun the online findings (knees, latency under load) with each switch (slow)")
    parser.add_argument("--h100-curves", type=Path, metavar="CSV",
                        help="instead: the paper's knees measured its way on the H100 profiles; write every load "
                             "curve to CSV (README's table; 46 min on two cores)")
    args = parser.parse_args(argv)
    if args.h100_curves:
        curves = knee_curves(args.jobs)
        args.h100_curves.parent.mkdir(parents=True, exist_ok=True)
        curves.to_csv(args.h100_curves, index=False, float_format="%.5g")
        print(knees(curves).groupby(["case", "policy"], sort=False)["knee"].agg(["mean", "min", "max"]).round(3))
        return 0
    console = Console(width=200)
    start = time.perf_counter()
    rows = evaluate(args.jobs, console, args.cache, args.online_switches)
    counts = ", ".join(f"{m} {w} {n}" for (m, w), n in REQUESTS.items())
    online = ", ".join(f"{m} {w} {n}" for (m, w), n in ONLINE_REQUESTS.items())
    title = "The CDB paper's findings on cdbsim (shipped H200 profiles)"
    console.print(table(rows, title))
    console.print(f"offline requests per point: {counts}; online: {online} per rate at "
                  f"{', '.join(map(str, RATE_FACTORS))} x CB's offline rate; KV: the memory of {KV_TOKENS:,} tokens of "
                  f"the physical layers; {time.perf_counter() - start:.0f} s")
    records = [r.record() for r in rows]
    if args.json:
        args.json.write_text(json.dumps({"title": title, "requests": {f"{m} {w}": n for (m, w), n in REQUESTS.items()},
                                         "online_requests": {f"{m} {w}": n for (m, w), n in ONLINE_REQUESTS.items()},
                                         "rate_factors": RATE_FACTORS, "rows": records}, indent=2, default=float))
    if args.csv:
        pd.DataFrame([{k: v for k, v in r.items() if k not in ("switches", "cdbsim_values")} for r in records]).to_csv(
            args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
