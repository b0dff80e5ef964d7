"""Arrival times: offline (everything at t = 0) or a Poisson process at a given rate."""

from __future__ import annotations

import numpy as np

from traces.errors import require


def offline(n: int) -> np.ndarray:
    """All ``n`` requests present at t = 0 (a throughput run)."""
    return np.zeros(n)


def poisson(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of ``n`` requests of a Poisson process with ``rate`` requests per second."""
    require(rate > 0, f"request rate must be > 0, got {rate}")
    return np.cumsum(rng.exponential(1.0 / rate, size=n))
