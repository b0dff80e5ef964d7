"""What-if studies: one configuration against its CB baseline, the three policies side by side, and
latency against request rate. Each run simulates the same requests with the same profile."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from cdbsim.latency.model import LatencyModel
from cdbsim.model.arch import ArchSpec
from cdbsim.planner.experiment import BuiltExperiment, Experiment
from cdbsim.report.logs import RunLog
from cdbsim.report.metrics import Report, summarize
from cdbsim.report.progress import ProgressFactory
from cdbsim.serving.config import Policy, ServeConfig
from cdbsim.serving.memory import KVCapacity, RequestShape
from cdbsim.simulator.sim import simulate
from traces.request import Request

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class RunResult:
    log: RunLog
    report: Report


def run_one(arch: ArchSpec, config: ServeConfig, requests: Sequence[Request], latency: LatencyModel,
            kv: KVCapacity, progress: ProgressFactory | None = None, label: str = "") -> RunResult:
    """Simulate one configuration and summarise it."""
    memory = kv.plan_on(arch, config, latency, RequestShape.of(requests))
    callback = progress(label or config.describe(), len(requests)) if progress else None
    log = simulate(arch, config, requests, latency, memory.kv_blocks, callback)
    log.meta["kv_tokens"] = memory.kv_tokens
    log.meta["memory"] = memory.summary()
    return RunResult(log, summarize(log, arch, list(requests), config.r_min(arch)))


def with_baseline(arch: ArchSpec, config: ServeConfig, requests: Sequence[Request], latency: LatencyModel,
                  kv: KVCapacity, progress: ProgressFactory | None = None) -> tuple[RunResult, RunResult | None]:
    """The configuration and, unless it is CB itself, a CB run of the same requests to compare with."""
    result = run_one(arch, config, requests, latency, kv, progress)
    if config.policy is Policy.CB:
        return result, None
    baseline = run_one(arch, replace(config, policy=Policy.CB), requests, latency, kv, progress)
    result.report.with_baseline(baseline.report)
    return result, baseline


def compare_policies(arch: ArchSpec, config: ServeConfig, requests: Sequence[Request], latency: LatencyModel,
                     kv: KVCapacity, progress: ProgressFactory | None = None) -> list[RunResult]:
    """CB, no-refill, refill and adaptive on the same requests; the CDB rows carry speed-up and % of S_e2e."""
    results = [run_one(arch, replace(config, policy=p), requests, latency, kv, progress)
               for p in (Policy.CB, Policy.NOREFILL, Policy.REFILL, Policy.ADAPTIVE)]
    for result in results[1:]:
        result.report.with_baseline(results[0].report)
    results[0].report.with_baseline(results[0].report)
    return results


@dataclass
class SweepPoint:
    policy: str
    rate: float
    report: Report


def rate_sweep(arch: ArchSpec, config: ServeConfig, make_requests: Callable[[float], list[Request]],
               rates: Sequence[float], latency: LatencyModel, kv: KVCapacity,
               policies: Sequence[Policy] = (Policy.CB, Policy.NOREFILL, Policy.REFILL),
               progress: ProgressFactory | None = None) -> list[SweepPoint]:
    """Each policy at each Poisson rate (the same arrivals for every policy at a rate)."""
    points = []
    for rate in rates:
        requests = make_requests(rate)
        for policy in policies:
            run = run_one(arch, replace(config, policy=policy), requests, latency, kv, progress,
                          label=f"{policy.value} @ {rate:.3g} req/s")
            points.append(SweepPoint(policy.value, rate, run.report))
    return points


def latency_knee(rates: Sequence[float], normalized: Sequence[float], factor: float = 2.0) -> float | None:
    """The rate at which mean normalized latency first reaches ``factor`` x its value at the lowest rate
    (linear interpolation between swept rates); None if it never does."""
    r = np.asarray(rates, dtype=float)
    y = np.asarray(normalized, dtype=float)
    order = np.argsort(r)
    r, y = r[order], y[order]
    limit = factor * y[0]
    above = np.nonzero(y >= limit)[0]
    if len(above) == 0:
        return None
    j = int(above[0])
    if j == 0:
        return float(r[0])
    return float(r[j - 1] + (limit - y[j - 1]) * (r[j] - r[j - 1]) / (y[j] - y[j - 1]))


@dataclass
class Prediction:
    """A simulated run of an experiment: its report and logs, and the CB run it was compared with."""

    setup: BuiltExperiment
    report: Report
    log: RunLog
    baseline: RunResult | None = None

    def to_frame(self) -> pd.DataFrame:
        """The report's flat row (with speed-up and bound share when a baseline ran) as a one-row frame."""
        import pandas as pd

        return pd.DataFrame([self.report.row()])


def predict(experiment: Experiment | BuiltExperiment, baseline: bool = False,
            progress: ProgressFactory | None = None) -> Prediction:
    """Simulate ``experiment``; with ``baseline``, also CB on the same requests (speed-up and S_e2e share)."""
    setup = experiment.build() if isinstance(experiment, Experiment) else experiment
    args = (setup.arch, setup.config, setup.requests, setup.latency, setup.kv, progress)
    result, base = with_baseline(*args) if baseline else (run_one(*args), None)
    return Prediction(setup, result.report, result.log, base)
