"""``cdbsim.capacity``: the highest Poisson request rate one GPU serves within latency SLOs.

A request counts if it meets every per-request limit given (TTFT, TPOT, normalized latency), as vLLM's serving
benchmark counts goodput; the SLOs hold when at least ``attainment`` of requests count (default 99%) and the mean
normalized latency, if limited, is within it. As Vidur's capacity search, the rate is found by bisection with the
same seed at every rate: an offline run gives the throughput ``R``; the search brackets between ``R / 64`` and
``4 R`` and halves the ratio (geometric midpoints) until within ``tolerance``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from cdbsim.errors import ConfigError, require
from cdbsim.planner.experiment import Experiment
from cdbsim.report.logs import RunLog
from cdbsim.report.metrics import Report, latency_samples
from cdbsim.serving.config import Policy

BRACKET = 64.0           # the search starts between R / BRACKET and R (R: offline throughput)
TOLERANCE = 0.02         # the rate is found to within this share
MAX_SIMULATIONS = 12
ABOVE = 4.0              # the SLOs still holding at 4 R means the run is too short to load the GPU


MAX_TARGET_RATE = 1e6   # req/s: more than any deployment serves; beyond it a GPU count is no longer a plan


class Unreachable(ConfigError):
    """The SLOs are not met even at a light load: ``reason``, after ``checks`` (the simulations that showed it)."""

    def __init__(self, policy: str, reason: str, checks: list[Check]) -> None:
        super().__init__(f"{policy}: {reason}")
        self.reason, self.checks = reason, checks


@dataclass(frozen=True)
class SLO:
    """Latency limits in seconds (None: not limited) and the share of requests that must meet all of them."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    normalized_s: float | None = None
    normalized_mean_s: float | None = None
    attainment: float = 0.99

    def __post_init__(self) -> None:
        limits = self.limits()
        require(bool(limits) or self.normalized_mean_s is not None,
                "give at least one SLO (TTFT, TPOT, normalized latency or its mean)")
        for name, value in [*limits.items(), ("mean normalized latency", self.normalized_mean_s)]:
            require(value is None or (math.isfinite(value) and value > 0),
                    f"the {name} limit must be a finite number > 0, got {value}")
        require(0 < self.attainment <= 1, f"the attainment must be in (0, 1], got {self.attainment}")

    def limits(self) -> dict[str, float]:
        """The per-request limits given, by name."""
        named = {"TTFT": self.ttft_s, "TPOT": self.tpot_s, "normalized latency": self.normalized_s}
        return {name: value for name, value in named.items() if value is not None}

    def describe(self) -> str:
        share = f"p{self.attainment * 100:g}"
        parts = [f"{share} {name} <= {_seconds(value)}" for name, value in self.limits().items()]
        if self.normalized_mean_s is not None:
            parts.append(f"mean normalized latency <= {_seconds(self.normalized_mean_s)}")
        return ", ".join(parts)


def _seconds(value: float) -> str:
    return f"{value * 1e3:g} ms" if value < 1 else f"{value:g} s"


@dataclass
class Check:
    """One simulated rate: whether the SLOs held, and what was measured."""

    rate: float | None          # requests/s offered (None: offline, every request at t = 0)
    met: bool
    attainment: float           # share of requests meeting every per-request limit
    goodput: float              # those requests per second of the run
    why: str                    # the limit that failed, in words ("" when met)
    report: Report

    @classmethod
    def of(cls, rate: float | None, log: RunLog, report: Report, slo: SLO) -> Check:
        samples = latency_samples(log)
        one_token = log.requests["output_len"].to_numpy(float) <= 1  # no TPOT: meets any limit
        measured = {"TTFT": samples["ttft_s"], "TPOT": np.where(one_token, 0.0, samples["tpot_s"]),
                    "normalized latency": samples["normalized_s"]}
        good = np.ones(len(log.requests), dtype=bool)
        shares = {}
        for name, limit in slo.limits().items():
            meets = measured[name] <= limit
            shares[name] = float(meets.mean())
            good &= meets
        attainment = float(good.mean()) if len(good) else 0.0
        why = ""
        if attainment < slo.attainment:
            each = ", ".join(f"{name} <= {_seconds(slo.limits()[name])}: {share:.1%}" for name, share in shares.items())
            why = f"{attainment:.1%} of requests meet every limit, below {slo.attainment:.1%} ({each})"
        mean = report.normalized_s.mean
        if slo.normalized_mean_s is not None and not mean <= slo.normalized_mean_s:
            why = why or f"mean normalized latency {_seconds(mean)} > {_seconds(slo.normalized_mean_s)}"
        return cls(rate, not why, attainment, float(good.sum()) / report.makespan_s, why, report)


@dataclass
class CapacityResult:
    """The highest rate found to meet the SLOs for one policy, and every rate simulated to find it."""

    policy: str
    slo: SLO
    rate: float = math.nan      # requests/s per GPU (one simulated replica)
    upper: float = math.nan     # the lowest rate found not to meet them (NaN: throughput-bound)
    offline_rate: float = math.nan
    checks: list[Check] = field(default_factory=list)
    unreachable: str = ""       # why the SLOs are not met even at a light load ("" when they are)

    @property
    def simulations(self) -> int:
        return len(self.checks)

    @property
    def at_rate(self) -> Check | None:
        """The simulation at the rate reported."""
        met = [c for c in self.checks if c.met]
        return max(met, key=lambda c: c.rate if c.rate is not None else math.inf) if met else None

    @property
    def throughput_bound(self) -> bool:
        """True when the SLOs held even offline: throughput, not latency, sets the capacity."""
        return bool(self.checks) and self.checks[0].met

    @property
    def too_short(self) -> bool:
        """True when the SLOs still held at ``ABOVE`` times the offline throughput (too few requests)."""
        return self.rate >= ABOVE * self.offline_rate

    def gpus_for(self, target_rate: float) -> int:
        """GPUs (replicas) needed to serve ``target_rate`` requests/s within the SLOs."""
        check_target_rate(target_rate)
        require(self.rate > 0, f"{self.policy} cannot meet the SLOs ({self.unreachable})")
        return math.ceil(target_rate / self.rate - 1e-9)

    def row(self, target_rate: float | None = None) -> dict:
        """A flat summary for tables and JSON."""
        check = self.at_rate
        row = {"policy": self.policy, "req/s per GPU": self.rate,
               "output tok/s per GPU": check.report.output_tps if check else math.nan,
               "goodput req/s": check.goodput if check else math.nan,
               "attainment %": 100 * check.attainment if check else math.nan,
               "TTFT p99 s": check.report.ttft_s.p99 if check else math.nan,
               "TPOT p99 ms": 1e3 * check.report.tpot_s.p99 if check else math.nan,
               "search within %": 100 * (self.upper / self.rate - 1) if self.upper > 0 else None,
               "simulations": self.simulations}
        if target_rate is not None:
            row[f"GPUs for {target_rate:g} req/s"] = self.gpus_for(target_rate) if self.rate > 0 else "-"
        if self.unreachable:
            row["note"] = self.unreachable
        elif self.throughput_bound:
            row["note"] = ("offline bound only: the SLOs hold even offline (throughput-bound); too few requests to "
                           "bracket the knee")
        elif self.too_short:
            row["note"] = (f"lower bound only: the SLOs hold at {ABOVE:g}x its offline throughput: too few requests "
                           f"to bracket the knee")
        elif math.isnan(self.upper):
            row["note"] = f"lower bound only: no failing rate found in {self.simulations} simulations"
        return row


def check_target_rate(target_rate: float) -> float:
    """A rate to size GPUs for: a finite number > 0 and at most :data:`MAX_TARGET_RATE` (checked before a search,
    not after its minutes)."""
    require(math.isfinite(target_rate) and target_rate > 0,
            f"the target rate must be a finite number > 0 req/s, got {target_rate:g}")
    require(target_rate <= MAX_TARGET_RATE, f"the target rate {target_rate:g} req/s is above {MAX_TARGET_RATE:g} "
                                            "req/s, more than any deployment serves; give a lower one")
    return target_rate


def simulate_rate(exp: Experiment, rate: float | None, slo: SLO) -> Check:
    """Run ``exp`` at Poisson ``rate`` (None: offline) and check the SLOs."""
    from cdbsim.planner.study import predict

    result = predict(exp.override({"workload.rate": rate}))
    return Check.of(rate, result.log, result.report, slo)


def search(exp: Experiment, slo: SLO, tolerance: float = TOLERANCE,
           max_simulations: int = MAX_SIMULATIONS) -> CapacityResult:
    """The capacity of ``exp`` under ``slo`` by bisection; unreachable SLOs raise :class:`Unreachable`."""
    require(exp.workload.trace is None, "capacity draws Poisson arrivals for a workload preset; it cannot vary "
                                        f"the arrivals of the trace file {exp.workload.trace} (unset workload.trace)")
    require(tolerance > 0, f"the tolerance must be > 0, got {tolerance}")
    require(max_simulations >= 3, f"the search needs at least 3 simulations, got {max_simulations}")
    result = CapacityResult(str(exp.serve.policy), slo)
    offline = simulate_rate(exp, None, slo)
    result.checks.append(offline)
    result.offline_rate = offline.report.request_rate
    if offline.met:
        result.rate = result.offline_rate
        return result
    low = result.offline_rate / BRACKET
    check = simulate_rate(exp, low, slo)
    result.checks.append(check)
    if not check.met:
        raise Unreachable(result.policy, f"the SLOs ({slo.describe()}) are not met even at {low:.3g} req/s, "
                          f"1/{BRACKET:g} of its offline throughput: {check.why}", result.checks)
    high = result.offline_rate
    while (check := simulate_rate(exp, high, slo)).met:  # Poisson arrivals may be served faster than a burst
        result.checks.append(check)
        low, high = high, 2 * high
        if low >= ABOVE * result.offline_rate or result.simulations >= max_simulations:
            result.rate = low
            return result
    result.checks.append(check)
    while high / low > 1 + tolerance and result.simulations < max_simulations:
        mid = math.sqrt(low * high)
        check = simulate_rate(exp, mid, slo)
        result.checks.append(check)
        low, high = (mid, high) if check.met else (low, mid)
    result.rate, result.upper = low, high
    return result


@dataclass(frozen=True)
class CapacityTask:
    """One policy's search, as a worker gets it."""

    experiment: Experiment
    slo: SLO
    tolerance: float = TOLERANCE
    max_simulations: int = MAX_SIMULATIONS


def run_search(task: CapacityTask) -> CapacityResult:
    """A worker's search; unreachable SLOs come back as a result saying so."""
    try:
        return search(task.experiment, task.slo, task.tolerance, task.max_simulations)
    except Unreachable as exc:
        return CapacityResult(str(task.experiment.serve.policy), task.slo, rate=0.0, checks=exc.checks,
                              unreachable=exc.reason)


def capacity(experiment: Experiment, slo: SLO | None = None, policies: Sequence[Policy | str] | None = None, *,
             tolerance: float = TOLERANCE, max_simulations: int = MAX_SIMULATIONS, jobs: int = 1,
             dask: str | None = None, progress: Callable[[int, int], None] | None = None,
             **limits: float) -> list[CapacityResult]:
    """The capacity of ``experiment`` under ``slo`` (or limits as keywords: ``ttft_s=2, tpot_s=0.05``) per policy,
    searched on ``jobs`` processes or Dask. A policy that cannot meet the SLOs has ``rate`` 0 and a reason in
    ``unreachable``; if none can, a :class:`ConfigError`."""
    from cdbsim.planner.parallel import Job, in_order, runner
    from cdbsim.planner.sweep import impossible

    slo = slo if slo is not None else SLO(**limits)
    chosen = [Policy.parse(p) for p in policies] if policies is not None else [experiment.serve.policy]
    require(bool(chosen), f"no policy to search; choose from: {', '.join(p.value for p in Policy)}")
    require(len(set(chosen)) == len(chosen), f"a policy is given twice: {', '.join(map(str, chosen))}")
    experiments = [experiment.override({"serve.policy": p}) for p in chosen]
    for exp in experiments:
        reason = impossible(exp)
        require(reason is None, f"{exp.serve.policy}: {reason}")
    tasks = [Job(i, arg=CapacityTask(exp, slo, tolerance, max_simulations), ready=False)
             for i, exp in enumerate(experiments)]
    with runner(jobs, dask) as run:
        results = []
        for _, result in in_order(tasks, run_search, run):
            results.append(result)
            if progress is not None:
                progress(len(results), len(tasks))
    if all(r.unreachable for r in results):
        reasons = [f"{r.policy}: {r.unreachable}" for r in results]
        raise ConfigError(reasons[0] if len(results) == 1 else "no policy meets the SLOs; " + "; ".join(reasons))
    return results
