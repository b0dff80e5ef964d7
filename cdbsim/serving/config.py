"""Serving configuration: policy, widths, budgets, exit timing, and the executor's graph sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

from cdbsim.errors import require
from cdbsim.model.arch import ArchSpec, KVLayout
from traces.choice import Choice


class Policy(Choice):
    """How launches are chosen: CB (token-level continuous batching at full depth), or CDB without refill (lock-step
    waves), with refill, or adaptive refill; :mod:`cdbsim.serving.scheduler` gives each rule."""

    CB = "cb"
    NOREFILL = "norefill"
    REFILL = "refill"
    ADAPTIVE = "adaptive"

    @classmethod
    def aliases(cls) -> dict[str, str]:
        return {"no-refill": "norefill", "continuous": "cb", "cdb": "refill"}


class Timing(Choice):
    """When the host learns exit decisions, and so how far it plans ahead (:mod:`cdbsim.serving.pipeline`)."""

    SYNC = "sync"
    ASYNC = "async"
    LOOKAHEAD = "lookahead"

    @classmethod
    def what(cls) -> str:
        return "exit timing"


class CoreLaunch(Choice):
    """Which ready tokens one core launch may carry: up to W at any loop step (MIXED), or only those at the head
    token's step (PER_STEP, as the CDB paper's engine composes recurrent batches)."""

    MIXED = "mixed"
    PER_STEP = "per-step"

    @classmethod
    def aliases(cls) -> dict[str, str]:
        return {"per_step": "per-step", "homogeneous": "per-step"}

    @classmethod
    def what(cls) -> str:
        return "core launch"


def decode_graph_sizes(width: int) -> tuple[int, ...]:
    """Padded batch sizes with a CUDA graph: 1, 2, 4, 8, 12, 16..256 by 8, 272..496 by 16, 512.. by 32, W."""
    sizes = {1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 497, 16), *range(512, width + 1, 32), width}
    return tuple(sorted(s for s in sizes if s <= width))


def prefill_graph_sizes(budget: int) -> tuple[int, ...]:
    """Padded prefill token counts: 16..256 by 16, 288..512 by 32, 576..1024 by 64, 1280..4096 by 256,
    4608.. by 512, and the budget M itself."""
    sizes = {*range(16, 257, 16), *range(288, 513, 32), *range(576, 1025, 64), *range(1280, 4097, 256),
             *range(4608, budget + 1, 512), budget}
    return tuple(sorted(s for s in sizes if s <= budget))


def padding_table(sizes: tuple[int, ...], limit: int) -> list[int]:
    """``table[n]`` = the smallest size >= n (n = 0 .. limit)."""
    table = [0] * (limit + 1)
    j = 0
    for n in range(1, limit + 1):
        while sizes[j] < n:
            j += 1
        table[n] = sizes[j]
    return table


@dataclass(frozen=True)
class ServeConfig:
    """How a looped model is served; defaults follow the CDB paper's engine (arXiv 2608.09444). ``width`` (W) bounds
    resident requests and tokens per decode-type launch, ``coda_batch`` (K) is the coda size refill waits for,
    ``prefill_budget`` (M) bounds prompt tokens per prefill launch, ``kv_margin`` the free-block share below which no
    prompt is admitted while others decode, ``min_free_slots`` (default max(1, W/8)) the free slots it waits for."""

    policy: Policy = Policy.REFILL
    width: int = 64
    coda_batch: int = 1
    prefill_budget: int = 8192
    timing: Timing = Timing.LOOKAHEAD
    layout: KVLayout = KVLayout.DEPTH
    kv_margin: float = 0.2
    min_free_slots: int | None = None
    max_coda_in_flight: int = 2
    block_size: int = 16
    graph_sizes: tuple[int, ...] | None = field(default=None)
    core_launch: CoreLaunch = CoreLaunch.MIXED

    def __post_init__(self) -> None:
        for name, choice in (("policy", Policy), ("timing", Timing), ("layout", KVLayout), ("core_launch", CoreLaunch)):
            object.__setattr__(self, name, choice.parse(getattr(self, name)))
        require(self.width >= 1, f"W must be >= 1, got {self.width}")
        require(self.coda_batch >= 1, f"K must be >= 1, got {self.coda_batch}")
        require(self.coda_batch <= self.width, f"K ({self.coda_batch}) must not exceed W ({self.width})")
        require(self.prefill_budget >= 1, f"M must be >= 1, got {self.prefill_budget}")
        require(self.width <= self.prefill_budget,
                f"W ({self.width}) must not exceed the prefill budget M ({self.prefill_budget})")
        require(0.0 <= self.kv_margin < 1.0, f"the KV margin must be in [0, 1), got {self.kv_margin}")
        require(self.min_free_slots is None or 1 <= self.min_free_slots <= self.width,
                f"min_free_slots must be in [1, W], got {self.min_free_slots}")
        require(self.max_coda_in_flight >= 1, "max_coda_in_flight must be >= 1")
        require(self.block_size >= 1, "block_size must be >= 1")
        if self.graph_sizes is not None:
            require(len(self.graph_sizes) > 0 and max(self.graph_sizes) >= self.width,
                    f"graph sizes must include a size >= W ({self.width})")

    def r_min(self, arch: ArchSpec) -> int:
        """Effective minimum exit depth: the model's, raised to 2 by the lookahead gate."""
        return min(max(arch.r_min, 2 if self.timing is Timing.LOOKAHEAD else 1), arch.r_max)

    def decode_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.graph_sizes)) if self.graph_sizes else decode_graph_sizes(self.width)

    def describe(self) -> str:
        k = f" K={self.coda_batch}" if self.policy is Policy.REFILL else ""
        per_step = " per-step-core" if self.core_launch is CoreLaunch.PER_STEP else ""
        return (f"{self.policy.value}{k} W={self.width} M={self.prefill_budget} {self.timing.value} "
                f"{self.layout.value}-KV{per_step}")
