"""KV block accounting: a pool of fixed-size blocks handed out by id.

A block holds ``block_size`` token positions across every layer and slot of the model, so a request
holds ``ceil(positions / block_size)`` blocks whatever the layout; the layout only changes how many
bytes a block is (see :meth:`cdbsim.arch.ArchSpec.kv_bytes_per_token`). The ids are real: the GPU
executor indexes its paged cache with them.
"""

from __future__ import annotations

from cdbsim.arch import ArchSpec
from cdbsim.errors import require
from cdbsim.kvlayout import KVLayout

BLOCK_SIZE = 16


class BlockPool:
    """A free list of block ids ``0 .. total - 1``."""

    def __init__(self, total: int) -> None:
        require(total >= 1, f"the KV cache needs at least one block, got {total}")
        self.total = total
        self._free = list(range(total - 1, -1, -1))  # pop() hands out low ids first

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    def take(self, n: int, into: list[int]) -> bool:
        """Append ``n`` free block ids to ``into``; False (and nothing taken) if fewer are free."""
        if n > len(self._free):
            return False
        for _ in range(n):
            into.append(self._free.pop())
        return True

    def give_back(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
        blocks.clear()


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


def need_blocks(prompt_len: int, output_len: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks a request holds at its end (prompt + every output token but the last)."""
    return -(-max(prompt_len, prompt_len + output_len - 1) // block_size)
