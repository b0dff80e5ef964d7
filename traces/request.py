"""A request as cdbsim replays it: lengths, arrival time and one exit depth per decoded token."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# The latest arrival a request may have (11.6 days): the simulator's float64 clock still resolves launch times to
# a nanosecond there, and a later arrival is a unit mistake, not a workload.
MAX_ARRIVAL_S = 1e6


@dataclass(slots=True)
class Request:
    """One request of a trace; ``depths[j - 1]`` is the exit depth (core loops, 1-indexed) asked for by output token
    ``j`` (token 0 comes from prefill at full depth); schedulers clamp it to ``[r_min, r_max]``."""

    request_id: int
    prompt_len: int
    output_len: int
    arrival: float = 0.0
    depths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))

    @property
    def kv_positions(self) -> int:
        """KV positions the request holds at its end: the prompt plus every output token but the last."""
        return self.prompt_len + self.output_len - 1
