"""KV capacity in blocks, from a token count, a block count or the device memory the weights leave."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdbsim.errors import require
from cdbsim.model.arch import ArchSpec, KVLayout
from cdbsim.serving.blocks import BLOCK_SIZE
from cdbsim.serving.config import ServeConfig

if TYPE_CHECKING:
    from cdbsim.latency.model import LatencyModel


def capacity_blocks(arch: ArchSpec, layout: KVLayout | str, *, tokens: int | None = None,
                    blocks: int | None = None, memory_bytes: float | None = None,
                    block_size: int = BLOCK_SIZE) -> int:
    """KV capacity in blocks from exactly one of: tokens, blocks, or bytes of memory for the cache."""
    require(sum(x is not None for x in (tokens, blocks, memory_bytes)) == 1,
            "give the KV capacity as exactly one of tokens, blocks or memory bytes")
    if blocks is not None:
        result = blocks
    elif tokens is not None:
        result = tokens // block_size
    else:
        result = int(memory_bytes // (arch.kv_bytes_per_token(layout) * block_size))
    require(result >= 1, f"the KV capacity ({result} blocks of {block_size} tokens) must be >= 1 block")
    return int(result)


def size_text(n_bytes: float) -> str:
    """Bytes as messages print them: GB, or MB below 0.1 GB."""
    return f"{n_bytes / 1e9:,.1f} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:,.1f} MB"


@dataclass(frozen=True)
class KVCapacity:
    """The KV cache size: tokens or blocks if given, else what the device memory leaves after weights."""

    tokens: int | None = None
    blocks: int | None = None
    memory_fraction: float = 0.9

    def blocks_for(self, arch: ArchSpec, config: ServeConfig, latency: LatencyModel) -> int:
        memory = latency.profile.memory_bytes
        weights = arch.total_params * arch.dtype_bytes
        if self.tokens is not None or self.blocks is not None:
            blocks = capacity_blocks(arch, config.layout, tokens=self.tokens, blocks=self.blocks,
                                     block_size=config.block_size)
            cache = blocks * config.block_size * arch.kv_bytes_per_token(config.layout)
            tokens = blocks * config.block_size
            require(memory <= 0 or weights + cache <= memory,
                    f"the weights of {arch.name} ({size_text(weights)}) and a KV cache of {tokens:,} tokens "
                    f"({size_text(cache)}) need more than the device's {size_text(memory)}; lower --kv-tokens or "
                    f"choose a larger device")
            return blocks
        require(memory > 0, f"profile {latency.profile.name} does not give the device memory; pass --kv-tokens")
        usable = f"{self.memory_fraction:.0%} of the device's {size_text(memory)}"
        require(weights < memory * self.memory_fraction,
                f"the weights of {arch.name} ({size_text(weights)}) do not fit in {usable}: nothing is left for the "
                f"KV cache (fewer layers, or --kv-tokens to size the cache regardless)")
        free = max(0.0, memory * self.memory_fraction - weights)
        block = arch.kv_bytes_per_token(config.layout) * config.block_size
        require(block <= free, f"one KV block of {config.block_size} tokens needs {size_text(block)} "
                               f"({arch.cache_layers(config.layout):,} layer slots per token with the "
                               f"{config.layout.value} layout at r_max {arch.r_max}), more than the {size_text(free)} "
                               f"left after the weights in {usable}; lower r_max or use the shared layout")
        return capacity_blocks(arch, config.layout, memory_bytes=free, block_size=config.block_size)
