"""GPU memory as one plan for the simulator and the executor: weights, KV cache, the executor's run-time buffers.

The run-time terms follow the executor's own allocations (:mod:`executor.engine`, :mod:`executor.graphs`): the token
store, RoPE table and loop-state bank; each CUDA graph's metadata buffer; the widest launch's working memory (a
prefill of M tokens at full depth, with its logits); cuBLAS workspaces. ``benchmarks/memory.py`` measures them.
A KV cache is sized, or checked, against ``memory_fraction`` of the device, as vLLM's GPU memory utilization.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from cdbsim.errors import ConfigError, require
from cdbsim.model.arch import ArchSpec, KVLayout, LayerStyle
from cdbsim.serving.blocks import BLOCK_SIZE
from cdbsim.serving.config import Policy, ServeConfig, prefill_graph_sizes
from cdbsim.serving.launch import ENTRY_BYTES, FIELDS

if TYPE_CHECKING:
    from cdbsim.latency.model import LatencyModel
    from traces import Request


def capacity_blocks(*, tokens: int | None = None, blocks: int | None = None, block_size: int = BLOCK_SIZE) -> int:
    """KV capacity in blocks from exactly one of: tokens or blocks."""
    require((tokens is None) != (blocks is None), "give the KV capacity as exactly one of tokens or blocks")
    result = blocks if blocks is not None else tokens // block_size
    require(result >= 1, f"the KV capacity ({result} blocks of {block_size} tokens) must be >= 1 block")
    return int(result)


def size_text(n_bytes: float) -> str:
    """Bytes as messages print them: GB, or MB below 0.1 GB."""
    return f"{n_bytes / 1e9:,.1f} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:,.1f} MB"


def gib(n_bytes: float) -> str:
    """Bytes in GiB, as GPU memory is quoted."""
    return f"{n_bytes / 2**30:,.1f} GiB"


MEMORY_FRACTION = 0.9  # share of the device's memory for weights, KV cache and run time (vLLM's default)
LOGIT_BYTES = 4  # the head's logits are float32
TOKEN_BYTES = 8  # the token store holds int64 ids
PREFILL_ITEM_TOKENS = 64  # queries per prefill-attention work item (the executor's BLOCK_M)
WORKSPACE_BYTES = 3 * 32 * 2**20  # cuBLAS workspaces of the launch, warm-up and capture streams (32 MiB each)


@dataclass(frozen=True)
class RequestShape:
    """What the executor's per-run buffers depend on: how many requests, and the longest prompt + output."""

    count: int
    longest: int

    FEWEST: ClassVar[RequestShape]  # the least any run holds: what is checked before requests are drawn

    @classmethod
    def of(cls, requests: Sequence[Request]) -> RequestShape:
        return cls(len(requests), max((r.prompt_len + r.output_len for r in requests), default=1))


RequestShape.FEWEST = RequestShape(0, 1)


def prefill_meta_entries(tokens: int, chunks: int, width: int) -> int:
    """int32 entries of a prefill launch's metadata (the layout of :class:`executor.prefill.PrefillLayout`): three per
    token, five per chunk, two per attention work item, a block-table row per chunk."""
    items = -(-tokens // PREFILL_ITEM_TOKENS) + chunks
    return 3 * tokens + 5 * chunks + 2 * items + chunks * width


@dataclass(frozen=True)
class Runtime:
    """The executor's GPU memory beside weights and KV cache, in bytes, at its peak."""

    requests: float     # token store, RoPE table, loop-state bank
    metadata: float     # every CUDA graph's int32 input buffer
    activations: float  # the widest launch's working memory and float32 logits, which every graph reuses
    workspace: float = WORKSPACE_BYTES

    @property
    def total(self) -> float:
        return self.requests + self.metadata + self.activations + self.workspace


def prefill_token_bytes(arch: ArchSpec) -> int:
    """Working memory per token of a full-depth prefill at its peak: the prelude output, the loop state and the
    layer's residual and normed input (4 x hidden), the attention output, the next residual pair, and the MLP's
    gate/up product with its SwiGLU output (3 x intermediate); or, where larger, the attention's qkv, q and output."""
    layer = arch.layer
    q = layer.heads * layer.head_dim
    qkv = q + 2 * layer.kv_heads * layer.head_dim
    base = 4 * layer.hidden
    return arch.dtype_bytes * (base + max(q + 2 * layer.hidden + 3 * layer.intermediate, qkv + 2 * q))


def executor_runtime(arch: ArchSpec, config: ServeConfig, shape: RequestShape) -> Runtime:
    """The run-time terms of :class:`Runtime` for serving ``shape``'s requests with ``config`` on the GPU executor
    (CUDA graphs for every decode-type stage and every padded prefill size)."""
    layer, width, bs = arch.layer, config.width, config.block_size
    stride = shape.longest + 1
    bank = (width + 1) * layer.hidden * arch.dtype_bytes * (2 if arch.style is LayerStyle.HUGINN else 1)
    rope = 2 * stride * (layer.head_dim // 2) * 4
    requests = (shape.count + 1) * stride * TOKEN_BYTES + rope + bank
    table = -(-shape.longest // bs)
    decode = config.decode_sizes()
    stages = 1 if config.policy is Policy.CB else 3  # decode; else prelude, core, coda
    prefill = prefill_graph_sizes(config.prefill_budget)
    chunks = [max(1, min(t, width)) for t in prefill]
    prefill_meta = sum(prefill_meta_entries(t, c, table) + t for t, c in zip(prefill, chunks, strict=True))
    metadata = ENTRY_BYTES * (stages * sum(b * (len(FIELDS) + table) for b in decode) + prefill_meta)
    # the largest prefill graph's working memory and logits (a row per chunk); no graph keeps its output, so the
    # graphs' shared pool reuses this memory for every other graph
    activations = max(prefill) * prefill_token_bytes(arch) + chunks[-1] * arch.vocab * LOGIT_BYTES
    return Runtime(requests, metadata, activations)


@dataclass(frozen=True)
class MemoryPlan:
    """Weights, KV cache and run time against ``fraction`` of a device's memory."""

    arch: ArchSpec
    layout: KVLayout
    kv_blocks: int
    block_size: int
    runtime: Runtime
    device: str
    device_bytes: float
    fraction: float = MEMORY_FRACTION

    @classmethod
    def of(cls, arch: ArchSpec, config: ServeConfig, kv_blocks: int, shape: RequestShape, device: str,
           device_bytes: float, fraction: float = MEMORY_FRACTION) -> MemoryPlan:
        return cls(arch, config.layout, kv_blocks, config.block_size, executor_runtime(arch, config, shape), device,
                   device_bytes, fraction)

    @property
    def weights(self) -> float:
        return float(self.arch.total_params * self.arch.dtype_bytes)

    @property
    def block_bytes(self) -> float:
        return float(self.arch.kv_bytes_per_token(self.layout) * self.block_size)

    @property
    def kv(self) -> float:
        """The cache as the executor allocates it: one trash block beyond the scheduler's."""
        return (self.kv_blocks + 1) * self.block_bytes

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.runtime.total

    @property
    def usable(self) -> float:
        return self.fraction * self.device_bytes

    @property
    def headroom(self) -> float:
        return self.usable - self.total

    @property
    def fits(self) -> bool:
        return self.device_bytes <= 0 or self.total <= self.usable

    def summary(self) -> dict:
        """The plan in GiB, as logs, tables and JSON show it."""
        parts = {"weights": self.weights, "kv": self.kv, "runtime": self.runtime.total, "total": self.total,
                 "usable": self.usable, "headroom": self.headroom}
        return {"device": self.device, "memory_fraction": self.fraction, "kv_tokens": self.kv_tokens,
                "fits": self.fits, **{f"{key}_gib": value / 2**30 for key, value in parts.items()}}

    def largest_blocks(self, layout: KVLayout | None = None) -> int:
        """The most KV blocks that fit beside weights and run time (with ``layout``: in that layout)."""
        block = self.arch.kv_bytes_per_token(layout or self.layout) * self.block_size
        return max(0, math.floor((self.usable - self.weights - self.runtime.total) / block) - 1)

    def explain(self) -> str:
        """One line: what the plan needs, what the device has, what would fit."""
        arch, tokens = self.arch, self.kv_tokens
        head = (f"{arch.name} ({arch.split}, r_max {arch.r_max}), {self.layout.value} layout: {tokens:,} KV tokens "
                f"need {gib(self.kv)}, plus {gib(self.weights)} of weights and {gib(self.runtime.total)} at run time; "
                f"{self.fraction:.0%} of the {self.device}'s {gib(self.device_bytes)} is {gib(self.usable)}")
        fit = self.largest_blocks() * self.block_size
        advice = [f"at most {fit:,} tokens fit" if fit else "no KV cache fits beside the weights"]
        for other in (KVLayout.FIRST_SHARED, KVLayout.SHARED):
            more = self.largest_blocks(other) * self.block_size
            if other is not self.layout and more >= max(tokens, 1) and arch.cache_layers(other) < \
                    arch.cache_layers(self.layout):
                advice.append(f", or use the {other.value} layout ({more:,} fit)")
                break
        return f"{head}; {''.join(advice)}; --memory-fraction sets the share"


@dataclass(frozen=True)
class KVCapacity:
    """The KV cache: tokens or blocks if given (checked against the device), else what ``memory_fraction`` of the
    device leaves after weights and run time; ``over_memory`` lets a what-if simulate a cache the device cannot hold."""

    tokens: int | None = None
    blocks: int | None = None
    memory_fraction: float = MEMORY_FRACTION
    over_memory: bool = False

    def __post_init__(self) -> None:
        require(0 < self.memory_fraction <= 1, f"memory_fraction must be in (0, 1], got {self.memory_fraction}")

    @property
    def given(self) -> bool:
        return self.tokens is not None or self.blocks is not None

    def plan(self, arch: ArchSpec, config: ServeConfig, shape: RequestShape, device: str,
             device_bytes: float) -> MemoryPlan:
        """The memory plan on a device of ``device_bytes`` (0: unknown; a given size is then taken as it is)."""
        if self.given:
            blocks = capacity_blocks(tokens=self.tokens, blocks=self.blocks, block_size=config.block_size)
            plan = MemoryPlan.of(arch, config, blocks, shape, device, device_bytes, self.memory_fraction)
            if not plan.fits and not self.over_memory:
                raise ConfigError(f"{plan.explain()}, --over-memory simulates it anyway")
            return plan
        require(device_bytes > 0, f"the {device} has no known memory size to size the KV cache from; pass "
                                  f"--kv-tokens")
        plan = MemoryPlan.of(arch, config, 0, shape, device, device_bytes, self.memory_fraction)
        blocks = plan.largest_blocks()
        if blocks < 1:
            left = plan.usable - plan.weights - plan.runtime.total
            share = f"{plan.fraction:.0%} of the {device}'s {gib(device_bytes)}"
            what = (f"the weights of {arch.name} ({gib(plan.weights)}) and its run-time buffers "
                    f"({gib(plan.runtime.total)})")
            if left <= 0:
                raise ConfigError(f"{what} do not fit in {share}: nothing is left for the KV cache (a larger device "
                                  f"or --memory-fraction, or --kv-tokens with --over-memory for a what-if)")
            raise ConfigError(f"one KV block of {config.block_size} tokens needs {gib(plan.block_bytes)} "
                              f"({arch.cache_layers(config.layout):,} layer slots per token with the "
                              f"{config.layout.value} layout at r_max {arch.r_max}), and the cache takes one more; "
                              f"{gib(left)} is left after {what} in {share}; lower r_max or use the shared layout")
        return MemoryPlan.of(arch, config, blocks, shape, device, device_bytes, self.memory_fraction)

    def blocks_for(self, arch: ArchSpec, config: ServeConfig, latency: LatencyModel,
                   shape: RequestShape) -> int:
        """KV blocks on the latency model's device (its profile's memory)."""
        return self.plan_on(arch, config, latency, shape).kv_blocks

    def plan_on(self, arch: ArchSpec, config: ServeConfig, latency: LatencyModel, shape: RequestShape) -> MemoryPlan:
        profile = latency.profile
        return self.plan(arch, config, shape, profile.device.get("name", "device"), profile.memory_bytes)
