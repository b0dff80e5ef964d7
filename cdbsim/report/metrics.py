"""Metrics of a run, computed from its logs alone (so simulated and measured runs are scored alike).

As in vLLM's benchmarks: TTFT (first token - arrival), TPOT ((finish - first token) / (output tokens - 1)), ITL (gaps
between a request's tokens), E2E (finish - arrival), normalized latency (E2E / output tokens); throughput counts
every output token over the makespan. Against a CB baseline a report adds the speed-up, S_e2e
(:func:`cdbsim.model.bounds.e2e_bound`) and the share realised; online runs have no S_e2e (their makespan measures
the arrivals).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from cdbsim.errors import ConfigError, require
from cdbsim.model.arch import ArchSpec
from cdbsim.model.bounds import (
    DeviceTimes,
    decoded_depth,
    e2e_bound,
    first_token_fraction,
    mean_depth,
    parameter_loop_share,
    s_dec,
)
from cdbsim.report.logs import RunLog
from cdbsim.serving.config import Policy
from traces.request import Request

PERCENTILES = (50, 90, 99)  # always computed (p50, p90, p99 fields); more on request (``percentiles``)


def percentile_name(q: float) -> str:
    """``p50``, ``p99.9``: how a percentile is named in reports and tables."""
    return f"p{q:g}"


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99.9"`` as percentiles, each in (0, 100]; anything else is a one-line error."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"--percentiles must be comma-separated numbers in (0, 100], got {text!r}") from None
    require(all(0 < q <= 100 for q in values), f"--percentiles must each lie in (0, 100], got {text!r}")
    return tuple(dict.fromkeys(values))


MEMORY_ROWS = (("weights", "weights"), ("kv", "KV cache"), ("runtime", "run time"), ("headroom", "headroom"))


@dataclass
class Distribution:
    """Mean, standard deviation and percentiles of one latency metric over a run (NaN when empty)."""

    mean: float
    p50: float
    p90: float
    p99: float
    std: float = float("nan")
    percentiles: dict[str, float] = field(default_factory=dict)  # the ones asked for, by percentile_name

    @classmethod
    def of(cls, values: np.ndarray, percentiles: tuple[float, ...] = PERCENTILES) -> Distribution:
        values = np.asarray(values, dtype=float)
        values = values[np.isfinite(values)]
        wanted = tuple(dict.fromkeys((*PERCENTILES, *percentiles)))
        if values.size == 0:
            return cls(np.nan, np.nan, np.nan, np.nan, np.nan, {percentile_name(q): np.nan for q in percentiles})
        at = dict(zip(wanted, map(float, np.percentile(values, wanted)), strict=True))
        return cls(float(values.mean()), at[50], at[90], at[99], float(values.std()),
                   {percentile_name(q): at[q] for q in percentiles})


LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "normalized_s", "scheduling_s")
"""The latency metrics a report holds as distributions (``scheduling_s``: first scheduled - arrival)."""


def latency_samples(log: RunLog) -> dict[str, np.ndarray]:
    """Per-request (ITL: per-gap) samples of each metric of :data:`LATENCIES`, from the logs alone."""
    reqs = log.requests
    arrival = reqs["arrival"].to_numpy(float)
    first = reqs["first_token"].to_numpy(float)
    finish = reqs["finish"].to_numpy(float)
    out_len = reqs["output_len"].to_numpy(float)
    itl = np.concatenate([np.diff(t) for t in log.token_times if len(t) > 1] or [np.zeros(0)])
    tpot = np.where(out_len > 1, (finish - first) / np.maximum(out_len - 1, 1), np.nan)
    return {"ttft_s": first - arrival, "tpot_s": tpot, "itl_s": itl, "e2e_s": finish - arrival,
            "normalized_s": (finish - arrival) / out_len,
            "scheduling_s": reqs["scheduled"].to_numpy(float) - arrival}


def kv_in_use(launches: pd.DataFrame) -> tuple[float | None, int | None]:
    """Mean (over time) and peak KV blocks in use from the launch log's ``kv_used`` (each value holds until the next
    launch starts); None without it."""
    if "kv_used" not in launches.columns or launches.empty:
        return None, None
    used = launches["kv_used"].to_numpy(float)
    start = launches["start"].to_numpy(float)
    held = np.diff(np.append(start, launches["end"].to_numpy(float)[-1]))
    span = float(held.sum())
    mean = float((used * held).sum() / span) if span > 0 else float(used.mean())
    return mean, int(used.max())


@dataclass
class Report:
    """Everything a result row shows; ``speedup``, ``s_e2e`` and ``bound_realised`` need a CB baseline (the last two
    are None online); ``times``, ``r_max`` and ``loop_share`` price S_e2e."""

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
    input_tokens: int = 0
    scheduling_s: Distribution = field(default_factory=lambda: Distribution.of(np.zeros(0)))
    preemptions: int | None = None
    kv_blocks_mean: float | None = None
    kv_blocks_peak: int | None = None

    def with_percentiles(self, log: RunLog, percentiles: tuple[float, ...]) -> Report:
        """The latency distributions recomputed from ``log`` (this report's run) with ``percentiles``."""
        for name, values in latency_samples(log).items():
            setattr(self, name, Distribution.of(values, percentiles))
        return self

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
            "d-bar": self.mean_depth, "S_dec": self.s_dec, "input tokens": self.input_tokens,
            "sched delay p50 s": self.scheduling_s.p50, "preemptions": self.preemptions,
            "KV blocks mean": self.kv_blocks_mean, "KV blocks peak": self.kv_blocks_peak,
        }
        memory = self.meta.get("memory")
        if memory:  # the device memory plan of a simulated run (weights, KV cache, run time)
            row.update({f"{label} GiB": memory[f"{key}_gib"] for key, label in MEMORY_ROWS})
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
    finish = reqs["finish"].to_numpy(float)
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
    latency = {name: Distribution.of(values) for name, values in latency_samples(log).items()}
    kv_mean, kv_peak = kv_in_use(launches)
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
        **latency, input_tokens=int(reqs["prompt_len"].sum()), preemptions=log.meta.get("preemptions"),
        kv_blocks_mean=kv_mean, kv_blocks_peak=kv_peak,
        launches=counts, mean_batch=mean_batch,
        device_busy=min(1.0, busy / span) if span > 0 else 0.0,
        device_idle=idle_share(busy, span),
        prefill_share=stage_time.get("prefill", 0.0) / busy if busy > 0 else 0.0,
        mean_depth=dbar, f1=first_token_fraction(requests), s_dec=s_dec(arch, dbar),
        times=times, r_max=arch.r_max, loop_share=parameter_loop_share(arch),
        online=bool(len(arrival)) and float(np.ptp(arrival)) > 0, meta=dict(log.meta),
    )
