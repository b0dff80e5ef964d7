"""Assemble a trace: workload lengths + arrivals + exit depths, reproducibly from one seed."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from traces.errors import require
from traces.exits import ExitModel
from traces.request import MAX_ARRIVAL_S, Request
from traces.workloads import length_model


def build_trace(workload: str, n: int, r_max: int, r_min: int = 1,
                exits: ExitModel | None = None, rate: float | None = None, seed: int = 0,
                max_total_len: int | None = None, progress: Callable[[int], None] | None = None) -> list[Request]:
    """``n`` requests of preset ``workload`` with exit depths for a model looping up to ``r_max``: Poisson arrivals at
    ``rate`` (None: all at t = 0), outputs truncated to ``max_total_len``; ``progress`` follows the depth draws."""
    require(n >= 1, f"the number of requests must be >= 1, got {n}")
    if rate is not None:
        require(math.isfinite(rate) and rate > 0, f"the request rate must be a number > 0 req/s, got {rate}")
        require(n / rate <= MAX_ARRIVAL_S, f"{n} requests at {rate:g} req/s arrive over about {n / rate:.3g} s, "
                                           f"more than the {MAX_ARRIVAL_S:g} s a run may span")
    rng = np.random.default_rng(seed)
    prompt, output = length_model(workload).sample(n, rng)
    if max_total_len is not None:
        prompt = np.minimum(prompt, max_total_len - 1)
        output = np.clip(output, 1, max_total_len - prompt)
    times = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1.0 / rate, size=n))
    depths = (exits or ExitModel("none")).depths(output, r_min, r_max, rng, progress)
    return [Request(i, int(p), int(o), float(t), d)
            for i, (p, o, t, d) in enumerate(zip(prompt, output, times, depths, strict=True))]
