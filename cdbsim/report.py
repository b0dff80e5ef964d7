"""Metrics of a run, computed from its logs alone (so simulated and measured runs are scored alike).

Vocabulary follows vLLM's benchmarks: TTFT (first token - arrival), TPOT ((finish - first token) /
(output tokens - 1)), ITL (gaps between consecutive tokens of a request), E2E (finish - arrival) and
normalized latency (E2E / output tokens). Output-token throughput counts every generated token, the
prefill-produced first one included, over the makespan (first arrival to last token).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from cdbsim.arch import ArchSpec
from cdbsim.bounds import first_token_fraction, mean_depth, s_dec, s_e2e
from cdbsim.config import Policy
from cdbsim.logs import RunLog
from traces.request import Request

PERCENTILES = (50, 90, 99)


@dataclass
class Distribution:
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution:
        values = np.asarray(values, dtype=float)
        values = values[np.isfinite(values)]
        if values.size == 0:
            return cls(np.nan, np.nan, np.nan, np.nan)
        p50, p90, p99 = np.percentile(values, PERCENTILES)
        return cls(float(values.mean()), float(p50), float(p90), float(p99))


@dataclass
class Report:
    """Everything a result row shows; ``speedup`` and ``bound_realised`` need a CB baseline."""

    requests: int
    output_tokens: int
    makespan_s: float
    output_tps: float
    request_rate: float
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    normalized_s: Distribution
    launches: dict[str, int]
    mean_batch: dict[str, float]
    device_busy: float
    device_idle: float
    prefill_share: float
    mean_depth: float
    f1: float
    s_dec: float
    s_e2e: float | None = None
    speedup: float | None = None
    bound_realised: float | None = None
    meta: dict = field(default_factory=dict)

    def with_baseline(self, baseline: Report) -> Report:
        """Speed-up against a CB run of the same requests, and the share of S_e2e it realises.

        S_e2e uses the baseline's prefill share of device time (the paper's ``a``).
        """
        self.s_e2e = s_e2e(self.s_dec, min(baseline.prefill_share, 0.999), self.f1)
        self.speedup = self.output_tps / baseline.output_tps
        self.bound_realised = self.speedup / self.s_e2e
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def row(self) -> dict:
        """A flat summary row for tables, JSON and CSV."""
        row = {
            "policy": self.meta.get("policy", ""), "W": self.meta.get("width", ""),
            "K": self.meta.get("coda_batch", ""), "requests": self.requests,
            "output tok/s": self.output_tps, "req/s": self.request_rate, "makespan s": self.makespan_s,
            "TTFT p50 s": self.ttft_s.p50, "TPOT p50 ms": self.tpot_s.p50 * 1e3,
            "norm lat p50 ms": self.normalized_s.p50 * 1e3, "norm lat p99 ms": self.normalized_s.p99 * 1e3,
            "idle %": 100 * self.device_idle, "prefill %": 100 * self.prefill_share,
            "d-bar": self.mean_depth, "S_dec": self.s_dec,
        }
        for stage in ("core", "coda", "decode"):
            if stage in self.mean_batch:
                row[f"B {stage}"] = self.mean_batch[stage]
        if self.speedup is not None:
            row.update({"vs CB": self.speedup, "S_e2e": self.s_e2e, "% of S_e2e": 100 * self.bound_realised})
        return row


def idle_share(busy: float, span: float) -> float:
    """Share of ``span`` the device was idle; below a nanosecond per second it is summation noise, 0."""
    if span <= 0:
        return 0.0
    idle = 1.0 - busy / span
    return idle if idle > 1e-9 else 0.0


def summarize(log: RunLog, arch: ArchSpec, requests: list[Request], r_min: int) -> Report:
    """The :class:`Report` of ``log`` (a run of ``requests`` on ``arch``)."""
    launches, reqs = log.launches, log.requests
    arrival = reqs["arrival"].to_numpy(float)
    first = reqs["first_token"].to_numpy(float)
    finish = reqs["finish"].to_numpy(float)
    out_len = reqs["output_len"].to_numpy(float)
    start_time = float(arrival.min()) if len(arrival) else 0.0
    end_time = float(np.nanmax(finish)) if len(finish) else 0.0
    makespan = max(end_time - start_time, 1e-12)
    tokens = int(sum(len(t) for t in log.token_times))
    durations = (launches["end"] - launches["start"]).to_numpy(float)
    busy = float(durations.sum())
    by_stage = launches.assign(duration=durations).groupby("stage")
    counts = {str(k): int(v) for k, v in by_stage.size().items()}
    mean_batch = {str(k): float(v) for k, v in by_stage["size"].mean().items()}
    stage_time = {str(k): float(v) for k, v in by_stage["duration"].sum().items()}
    span = float(launches["end"].max() - launches["start"].min()) if len(launches) else 0.0
    itl = np.concatenate([np.diff(t) for t in log.token_times if len(t) > 1] or [np.zeros(0)])
    tpot = np.where(out_len > 1, (finish - first) / np.maximum(out_len - 1, 1), np.nan)
    cb = log.meta.get("policy") == Policy.CB  # CB runs every token at full depth
    dbar = float(arch.r_max) if cb else mean_depth(requests, arch.r_max, r_min)
    return Report(
        requests=len(reqs), output_tokens=tokens, makespan_s=makespan, output_tps=tokens / makespan,
        request_rate=len(reqs) / makespan,
        ttft_s=Distribution.of(first - arrival), tpot_s=Distribution.of(tpot), itl_s=Distribution.of(itl),
        e2e_s=Distribution.of(finish - arrival), normalized_s=Distribution.of((finish - arrival) / out_len),
        launches=counts, mean_batch=mean_batch,
        device_busy=min(1.0, busy / span) if span > 0 else 0.0,
        device_idle=idle_share(busy, span),
        prefill_share=stage_time.get("prefill", 0.0) / busy if busy > 0 else 0.0,
        mean_depth=dbar, f1=first_token_fraction(requests), s_dec=s_dec(arch, dbar),
        meta=dict(log.meta),
    )
