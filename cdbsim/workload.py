"""What a run serves: the requests of a workload preset or a trace file, with exit depths for one model."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from cdbsim.arch import ArchSpec
from traces import ExitModel, Request, build_trace, read_trace

DEFAULT_REQUESTS = {"alpaca": 2000, "sharegpt": 1000, "arxiv": 200}
MAX_MODEL_LEN = 16384


def default_mean_depth(r_max: int) -> float:
    """The midpoint of 1..r_max (2.5 for Ouro's r_max = 4), used when no mean depth is given."""
    return (r_max + 1) / 2


class Arrival(str, Enum):
    """How requests arrive when a rate is given (without one, every request is present at t = 0)."""

    POISSON = "poisson"


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload preset (or a trace file), how many requests, their arrivals and their exit model."""

    workload: str = "sharegpt"
    requests: int | None = None
    rate: float | None = None
    exits: ExitModel = field(default_factory=lambda: ExitModel("synthetic", mean=2.5))
    seed: int = 0
    trace: str | None = None
    arrival: Arrival = Arrival.POISSON

    def build(self, arch: ArchSpec, r_min: int) -> list[Request]:
        """The requests, with depths on ``[r_min, arch.r_max]`` (a trace file is checked against r_max)."""
        if self.trace:
            return read_trace(self.trace, r_max=arch.r_max)
        n = self.requests or DEFAULT_REQUESTS.get(self.workload, 1000)
        return build_trace(self.workload, n, r_max=arch.r_max, r_min=r_min, exits=self.exits,
                           rate=self.rate, seed=self.seed, max_total_len=MAX_MODEL_LEN)

    def describe(self) -> str:
        if self.trace:
            return f"trace {self.trace}"
        n = self.requests or DEFAULT_REQUESTS.get(self.workload, 1000)
        arrivals = "offline" if self.rate is None else f"{self.arrival.value.title()} {self.rate:g} req/s"
        return f"{self.workload} x{n} ({arrivals}), exits: {self.exits.describe()}, seed {self.seed}"
