"""Metrics of a run, computed from its logs alone (so simulated and measured runs are scored alike).

Vocabulary follows vLLM's benchmarks: TTFT (first token - arrival), TPOT ((finish - first token) /
(output tokens - 1)), ITL (gaps between consecutive tokens of a request), E2E (finish - arrival) and
normalized latency (E2E / output tokens). Output-token throughput counts every generated token, the
prefill-produced first one included, over the makespan (first arrival to last token).

Against a CB run of the same requests a report adds the speed-up, S_e2e (:func:`cdbsim.bounds.e2e_bound`,
a bound of this run's time) and the share of it realised, at most 100%. An *online* run (requests
arriving over time, e.g. Poisson) finishes when its last request arrives and is served, whatever the
policy: its makespan measures the arrivals, so S_e2e and the share realised are None there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from cdbsim.arch import ArchSpec
from cdbsim.bounds import (
    DeviceTimes,
    decoded_depth,
    e2e_bound,
    first_token_fraction,
    mean_depth,
    parameter_loop_share,
    s_dec,
)
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
    """Everything a result row shows; ``speedup``, ``s_e2e`` and ``bound_realised`` need a CB baseline, and
    the last two are None for online runs (module docstring). ``times``, ``r_max`` and ``loop_share`` (the
    loops' share of a full-depth token in parameters) are what S_e2e is priced with."""

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
    times: DeviceTimes = field(default_factory=lambda: DeviceTimes(0.0, 0.0, 0.0))
    r_max: int = 1
    loop_share: float = 1.0
    online: bool = False
    s_e2e: float | None = None
    speedup: float | None = None
    bound_realised: float | None = None
    meta: dict = field(default_factory=dict)

    def with_baseline(self, baseline: Report) -> Report:
        """Speed-up against a CB run of the same requests and, offline, S_e2e and the share realised."""
        self.speedup = self.output_tps / baseline.output_tps
        if self.online or baseline.online:
            self.s_e2e = self.bound_realised = None
            return self
        depth = decoded_depth(self.mean_depth, self.f1, self.r_max)
        self.s_e2e = e2e_bound(self.times, baseline.times, self.r_max, self.loop_share, depth)
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
            row["vs CB"] = self.speedup
        if self.bound_realised is not None:
            row.update({"S_e2e": self.s_e2e, "% of S_e2e": 100 * self.bound_realised})
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
    sizes = launches.groupby("stage")["size"].sum()
    decode_time = busy - stage_time.get("prefill", 0.0)
    times = DeviceTimes(makespan=makespan, prefill=stage_time.get("prefill", 0.0), decode=decode_time,
                        per_token=stage_time.get("prelude", 0.0) + stage_time.get("coda", 0.0),
                        per_loop=stage_time.get("core", 0.0), decoded_tokens=int(sizes.get("prelude", 0)),
                        loop_tokens=int(sizes.get("core", 0)))
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
        times=times, r_max=arch.r_max, loop_share=parameter_loop_share(arch),
        online=bool(len(arrival)) and float(np.ptp(arrival)) > 0, meta=dict(log.meta),
    )
