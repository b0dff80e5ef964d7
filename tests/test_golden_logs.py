"""Fixed-seed runs whose launch and request logs must not change by a single bit.

Refactors and speed work on the scheduler, the simulator, the latency model and the recorder must leave
every simulated launch where it was. Each case simulates a small seeded run with an H200 profile
(interpolated tables, mixed-context lookup, metadata copies) and hashes its logs column by column; a
deliberate change of behaviour updates the hashes here, in the same commit, with the reason. The profiles
are frozen copies in ``tests/data/golden-profiles/`` (the shipped ones as measured on 2026-11-30, before
their host line was re-measured), so that recalibrating a shipped profile does not move these hashes.
The requests come from numpy's seeded generator alone, so the hashes do not depend on the exit-model code.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cdbsim.latency.model import LatencyModel
from cdbsim.latency.profile import load_profile_file
from cdbsim.model.arch import load_arch
from cdbsim.report.logs import RunLog
from cdbsim.serving.config import ServeConfig
from cdbsim.simulator.sim import simulate
from traces import Request


def seeded_requests(n: int, r_max: int, seed: int, rate: float | None = None) -> list[Request]:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(4, 900, size=n)
    outputs = rng.integers(1, 300, size=n)
    gaps = rng.exponential(1.0 / rate, size=n) if rate else np.zeros(n)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [Request(i, int(p), int(o), float(t), rng.integers(1, r_max + 1, size=int(o) - 1).astype(np.int16))
            for i, (p, o, t) in enumerate(zip(prompts, outputs, arrivals, strict=True))]


def log_digest(log: RunLog) -> str:
    digest = hashlib.sha256()
    for frame in (log.launches, log.requests):
        for name in frame.columns:
            column = frame[name]
            digest.update(name.encode())
            if pd.api.types.is_numeric_dtype(column):
                digest.update(np.ascontiguousarray(column.to_numpy()).tobytes())
            else:
                digest.update("\x00".join(map(str, column)).encode())
    for times in log.token_times:
        digest.update(np.asarray(times, dtype=float).tobytes())
    return digest.hexdigest()[:16]


CASES = {
    # name: (arch, split, serve config, requests, rate, KV blocks)
    "ouro-refill": ("ouro-1.4b", None, {"policy": "refill", "width": 32}, 80, None, 4000),
    "ouro-norefill": ("ouro-1.4b", None, {"policy": "norefill", "width": 32}, 80, None, 4000),
    "ouro-cb-online": ("ouro-1.4b", None, {"policy": "cb", "width": 32}, 80, 20.0, 4000),
    "ouro-refill-preempting": ("ouro-1.4b", None, {"policy": "refill", "width": 32}, 80, None, 300),
    "huginn-refill-K8-shared": ("huginn-3.5b", None, {"policy": "refill", "width": 32, "coda_batch": 8,
                                                      "layout": "shared"}, 40, None, 4000),
    "huginn040-sync": ("huginn-3.5b", "0-4-0", {"policy": "refill", "width": 16, "coda_batch": 4,
                                                 "timing": "sync"}, 40, None, 4000),
}
PROFILES = Path(__file__).parent / "data" / "golden-profiles"
# a graph's padded rows count as one-position rows in the decode lookups (cdbsim.latency.gpu_work.padded_mean); a single
# row on the chained path is looked up at the length of its whole tiles (cdbsim.latency.gpu_work.chained_walk_length);
# a prefill is priced on the curve through its measured points (cdbsim.latency.prefill), not on one line; the launch
# gap is the current build's 1.30 us; the tables are the least-squares non-decreasing grid through the points
# (cdbsim.latency.interp.monotone_grid), not their running maximum (the launches are the same, their times not); the
# prefill curve's coefficients are solved on unit columns, with non-negative least squares where a bound binds,
# and kept to 10 significant digits, so that no CPU's BLAS kernels move a launch's time (cdbsim.latency.prefill);
# one Ouro row has 32 attention splits, not 16 (cdbsim.latency.gpu_work.MIN_PROGRAMS), so its tile steps are 2,048
# positions apart
GOLDEN = {
    "huginn-refill-K8-shared": "0fbab61eef06e981",  # 4,454 launches
    "huginn040-sync": "bf40706b3aa54ffd",           # 7,412 launches
    "ouro-cb-online": "309d536f74ce03cb",           # 773 launches
    "ouro-norefill": "724e0d66e5c84f81",            # 3,272 launches
    "ouro-refill": "a3cb7792dcd4ebad",              # 4,464 launches
    "ouro-refill-preempting": "b8047cc8f1e920ed",   # 14,715 launches, 2 preemptions
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulated_logs_are_bit_identical(name: str) -> None:
    arch_name, split, serve, n, rate, kv_blocks = CASES[name]
    arch = load_arch(arch_name, split=split)
    config = ServeConfig(**serve)
    requests = seeded_requests(n, arch.r_max, seed=7, rate=rate)
    profile = load_profile_file(PROFILES / f"h200-{arch_name}.json")
    log = simulate(arch, config, requests, LatencyModel(arch, profile), kv_blocks)
    assert log_digest(log) == GOLDEN[name], f"{name}: the simulated logs changed"
