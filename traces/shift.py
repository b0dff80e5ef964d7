"""A load that shifts during a run: one workload's requests in phases, each with its own Poisson rate and exit model,
each phase arriving after the previous one's last request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from traces.build import build_trace
from traces.errors import require
from traces.exits import ExitModel
from traces.request import Request


@dataclass(frozen=True)
class Phase:
    """``requests`` requests at ``rate`` requests/s (None: all at the phase's start) with ``exits``."""

    requests: int
    rate: float | None
    exits: ExitModel


def shifting_trace(workload: str, phases: Sequence[Phase], r_max: int, r_min: int = 1, seed: int = 0,
                   max_total_len: int | None = None) -> list[Request]:
    """The phases' requests one after the other, numbered from 0 (each phase drawn with its own seed)."""
    require(len(phases) >= 1, "a shifting trace needs at least one phase")
    out: list[Request] = []
    start = 0.0
    for k, phase in enumerate(phases):
        part = build_trace(workload, phase.requests, r_max, r_min, phase.exits, phase.rate, seed + k,
                           max_total_len)
        out += [Request(len(out) + j, r.prompt_len, r.output_len, r.arrival + start, r.depths)
                for j, r in enumerate(part)]
        start = out[-1].arrival
    return out
