"""A request as cdbsim replays it: lengths, arrival time and one exit depth per decoded token."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class Request:
    """One request of a trace.

    ``depths[j - 1]`` is the exit depth (number of core loops, 1-indexed) the model asks for when it
    generates output token ``j`` for ``j = 1 .. output_len - 1``. Output token 0 has no entry: prefill
    produces it at full depth. A scheduler clamps each depth to ``[r_min, r_max]``; token-level
    continuous batching ignores them and runs every token at ``r_max``.
    """

    request_id: int
    prompt_len: int
    output_len: int
    arrival: float = 0.0
    depths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))

    @property
    def kv_positions(self) -> int:
        """KV positions the request holds at its end: the prompt plus every output token but the last."""
        return self.prompt_len + self.output_len - 1


def total_output_tokens(requests: list[Request]) -> int:
    return int(sum(r.output_len for r in requests))
