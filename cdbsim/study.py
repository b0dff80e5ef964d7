"""What-if studies: one configuration against its CB baseline, the three policies side by side, and
latency against request rate. Each run simulates the same requests with the same profile."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from cdbsim.arch import ArchSpec
from cdbsim.config import Policy, ServeConfig
from cdbsim.errors import require
from cdbsim.kv import capacity_blocks, memory_for_kv, size_text
from cdbsim.latency import LatencyModel
from cdbsim.logs import RunLog
from cdbsim.progress import ProgressFactory
from cdbsim.report import Report, summarize
from cdbsim.sim import simulate
from traces.request import Request

Progress = ProgressFactory
"""A factory: given a run's label and its number of requests, a callback advanced per finished request."""


@dataclass(frozen=True)
class KVCapacity:
    """The KV cache size: tokens or blocks if given, else what the device memory leaves after weights."""

    tokens: int | None = None
    blocks: int | None = None
    memory_fraction: float = 0.9

    def blocks_for(self, arch: ArchSpec, config: ServeConfig, latency: LatencyModel) -> int:
        if self.tokens is not None or self.blocks is not None:
            return capacity_blocks(arch, config.layout, tokens=self.tokens, blocks=self.blocks,
                                   block_size=config.block_size)
        memory = latency.profile.memory_bytes
        require(memory > 0, f"profile {latency.profile.name} does not give the device memory; pass --kv-tokens")
        weights = arch.total_params * arch.dtype_bytes
        usable = f"{self.memory_fraction:.0%} of the device's {size_text(memory)}"
        require(weights < memory * self.memory_fraction,
                f"the weights of {arch.name} ({size_text(weights)}) do not fit in {usable}: nothing is left for the "
                f"KV cache (fewer layers, or --kv-tokens to size the cache regardless)")
        free = memory_for_kv(memory, weights, self.memory_fraction)
        block = arch.kv_bytes_per_token(config.layout) * config.block_size
        require(block <= free, f"one KV block of {config.block_size} tokens needs {size_text(block)} "
                               f"({arch.cache_layers(config.layout):,} layer slots per token with the "
                               f"{config.layout.value} layout at r_max {arch.r_max}), more than the {size_text(free)} "
                               f"left after the weights in {usable}; lower r_max or use the shared layout")
        return capacity_blocks(arch, config.layout, memory_bytes=free, block_size=config.block_size)


@dataclass
class RunResult:
    log: RunLog
    report: Report


def run_one(arch: ArchSpec, config: ServeConfig, requests: Sequence[Request], latency: LatencyModel,
            kv: KVCapacity, progress: Progress | None = None, label: str = "") -> RunResult:
    """Simulate one configuration and summarise it."""
    blocks = kv.blocks_for(arch, config, latency)
    callback = progress(label or config.describe(), len(requests)) if progress else None
    log = simulate(arch, config, requests, latency, blocks, callback)
    log.meta["kv_tokens"] = blocks * config.block_size
    return RunResult(log, summarize(log, arch, list(requests), config.r_min(arch)))


def with_baseline(arch: ArchSpec, config: ServeConfig, requests: Sequence[Request], latency: LatencyModel,
                  kv: KVCapacity, progress: Progress | None = None) -> tuple[RunResult, RunResult | None]:
    """The configuration and, unless it is CB itself, a CB run of the same requests to compare with."""
    result = run_one(arch, config, requests, latency, kv, progress)
    if config.policy is Policy.CB:
        return result, None
    baseline = run_one(arch, replace(config, policy=Policy.CB), requests, latency, kv, progress)
    result.report.with_baseline(baseline.report)
    return result, baseline


def compare_policies(arch: ArchSpec, config: ServeConfig, requests: Sequence[Request], latency: LatencyModel,
                     kv: KVCapacity, progress: Progress | None = None) -> list[RunResult]:
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
               progress: Progress | None = None) -> list[SweepPoint]:
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
