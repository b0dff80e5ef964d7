"""What a run serves: the requests of a workload preset or a trace file, with exit depths for one model."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum

from cdbsim.errors import ConfigError, require
from cdbsim.model.arch import ArchSpec, LayerStyle
from cdbsim.report.progress import ProgressFactory
from cdbsim.serving.memory import size_text
from traces import ExitModel, Request, build_trace, length_model, read_trace

DEFAULT_REQUESTS = {"alpaca": 2000, "sharegpt": 1000, "arxiv": 200}
MAX_MODEL_LEN = 16384

# Memory a run holds per request and per output token (requests, scheduler state, logs), an upper fit of
# `cdbsim predict` runs; requests alone (``trace``) hold far less.
RUN_BYTES_PER_REQUEST, RUN_BYTES_PER_TOKEN = 4096, 256
TRACE_BYTES_PER_REQUEST, TRACE_BYTES_PER_TOKEN = 1024, 16
KV_BYTES_PER_BLOCK = 40  # the scheduler's free list holds one Python int per KV block


def default_mean_depth(r_max: int, r_min: int = 1, served_min: int = 1) -> float:
    """The mean depth used when none is given: the midpoint of the model's depths r_min..r_max (2.5 for Ouro's
    1..4), raised to ``served_min``, the least depth served (2 under lookahead timing), where it is below it."""
    return max((r_min + r_max) / 2, served_min)


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

    @property
    def count(self) -> int:
        """How many requests a preset draws (the given number, else the preset's default)."""
        require(self.requests is None or self.requests >= 1,
                f"the number of requests must be >= 1, got {self.requests}")
        return self.requests if self.requests is not None else DEFAULT_REQUESTS.get(self.workload, 1000)

    def memory_estimate(self, simulated: bool = True) -> float:
        """Bytes a preset's requests need (``simulated``: and a simulated run of them, logs included)."""
        if self.trace:
            return 0.0
        per_request, per_token = ((RUN_BYTES_PER_REQUEST, RUN_BYTES_PER_TOKEN) if simulated
                                  else (TRACE_BYTES_PER_REQUEST, TRACE_BYTES_PER_TOKEN))
        tokens = min(length_model(self.workload).mean_output, MAX_MODEL_LEN)
        return self.count * (per_request + per_token * tokens)

    def check_memory(self, simulated: bool = True, kv_blocks: int = 0, available: int | None = None) -> None:
        """Refuse a run whose estimated memory (requests, simulated state and logs, ``kv_blocks`` free-list entries)
        exceeds ``available`` bytes (default: physical memory), before anything is generated."""
        if available is None:
            try:
                available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            except (AttributeError, ValueError, OSError):  # the platform does not say
                return
        requests, blocks = self.memory_estimate(simulated), kv_blocks * KV_BYTES_PER_BLOCK
        if requests + blocks <= available:
            return
        parts = [f"{self.count:,} {self.workload} requests {'simulated' if simulated else 'generated'}: "
                 f"{size_text(requests)}, {requests / self.count / 1e3:,.1f} kB each"] if requests else []
        parts += [f"a KV cache of {kv_blocks:,} blocks to track: {size_text(blocks)}"] if blocks else []
        raise ConfigError(f"this run would need about {size_text(requests + blocks)} of memory ("
                          f"{'; '.join(parts)}), more than this machine's {size_text(available)}; "
                          f"use {'a smaller KV cache' if blocks > requests else 'fewer requests'}")

    def build(self, arch: ArchSpec, r_min: int, progress: ProgressFactory | None = None,
              simulated: bool = True, kv_blocks: int = 0) -> list[Request]:
        """The requests, depths on ``[r_min, arch.r_max]``, after :meth:`check_memory`."""
        self.check_memory(simulated, kv_blocks)
        if self.trace:
            return read_trace(self.trace, r_max=arch.r_max)
        n = self.count
        return build_trace(self.workload, n, r_max=arch.r_max, r_min=r_min, exits=self.exits,
                           rate=self.rate, seed=self.seed, max_total_len=MAX_MODEL_LEN,
                           progress=progress(f"generating {n:,} {self.workload} requests", n) if progress else None)

    def describe(self) -> str:
        if self.trace:
            return f"trace {self.trace}"
        arrivals = "offline" if self.rate is None else f"{self.arrival.value.title()} {self.rate:g} req/s"
        return f"{self.workload} x{self.count} ({arrivals}), exits: {self.exits.describe()}, seed {self.seed}"


DISPERSION, CORRELATION = 0.3, 0.5


@dataclass(frozen=True)
class PaperPoint:
    """The mean requested depth at one threshold, and whether the paper reports it or it is inferred."""

    mean_depth: float
    reported: bool


PAPER_DEPTHS: dict[LayerStyle, dict[float, PaperPoint]] = {
    LayerStyle.OURO: {0.2: PaperPoint(2.5, True), 0.4: PaperPoint(2.875, False), 0.5: PaperPoint(3.0625, False),
                      0.7: PaperPoint(3.4375, False), 1.0: PaperPoint(4.0, True)},
    LayerStyle.HUGINN: {0.28: PaperPoint(8.0, True), 0.16: PaperPoint(8.0 + 8.0 * 0.12 / 0.28, False),
                        0.10: PaperPoint(8.0 + 8.0 * 0.18 / 0.28, False), 0.0: PaperPoint(16.0, True)},
}
PAPER_R_MAX = {LayerStyle.OURO: 4, LayerStyle.HUGINN: 16}


def paper_point(arch: ArchSpec, q: float) -> PaperPoint:
    """The paper's mean exit depth of ``arch``'s model family at threshold ``q``, rescaled to ``arch``'s
    r_max when it is not the one the paper served (the same share of the loop budget)."""
    table = PAPER_DEPTHS[arch.style]
    require(q in table, f"the paper's thresholds for {arch.style}-style models are q in "
                        f"{', '.join(f'{k:g}' for k in sorted(table))}; got q = {q:g}")
    point = table[q]
    served = PAPER_R_MAX[arch.style]
    if arch.r_max == served:
        return point
    return PaperPoint(1.0 + (point.mean_depth - 1.0) * (arch.r_max - 1) / (served - 1), False)
