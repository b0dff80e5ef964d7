"""KV capacity: how many blocks of ``block_size`` token positions a run's cache holds, and how many
one request needs (block accounting itself is :mod:`cdbsim.blocks`)."""

from __future__ import annotations

from cdbsim.arch import ArchSpec
from cdbsim.errors import require
from cdbsim.kvlayout import KVLayout

BLOCK_SIZE = 16


def capacity_blocks(arch: ArchSpec, layout: KVLayout | str, *, tokens: int | None = None,
                    blocks: int | None = None, memory_bytes: float | None = None,
                    block_size: int = BLOCK_SIZE) -> int:
    """KV capacity in blocks from exactly one of: tokens, blocks, or bytes of memory for the cache."""
    given = [x is not None for x in (tokens, blocks, memory_bytes)]
    require(sum(given) == 1, "give the KV capacity as exactly one of tokens, blocks or memory bytes")
    if blocks is not None:
        result = blocks
    elif tokens is not None:
        result = tokens // block_size
    else:
        per_block = arch.kv_bytes_per_token(layout) * block_size
        result = int(memory_bytes // per_block)
    require(result >= 1, f"the KV capacity ({result} blocks of {block_size} tokens) must be >= 1 block")
    return int(result)


def memory_for_kv(device_bytes: float, weight_bytes: float, fraction: float = 0.9) -> float:
    """Bytes left for the KV cache when ``fraction`` of device memory may be used and weights sit in it."""
    return max(0.0, device_bytes * fraction - weight_bytes)


def size_text(n_bytes: float) -> str:
    """Bytes as messages print them: GB, or MB below 0.1 GB."""
    return f"{n_bytes / 1e9:,.1f} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:,.1f} MB"


def need_blocks(prompt_len: int, output_len: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks a request holds at its end (prompt + every output token but the last)."""
    return -(-max(prompt_len, prompt_len + output_len - 1) // block_size)
