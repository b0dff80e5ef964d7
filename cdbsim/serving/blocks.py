"""The KV block manager: which cache blocks each request holds, handed out from one free list.

A block holds ``block_size`` positions across every layer and slot, so ``n`` positions need ``ceil(n / block_size)``
blocks whatever the layout. The ids are the GPU executor's paged-cache ids. The free list is a stack (returned blocks
first, most recent first), then never-used ids in ascending order, kept as a counter.
"""

from __future__ import annotations

from cdbsim.errors import require


class BlockManager:
    """Block ids ``0 .. total - 1`` shared by ``requests`` requests; ``capacity[i]`` is the positions request ``i``'s
    blocks hold."""

    def __init__(self, total: int, block_size: int, requests: int) -> None:
        require(total >= 1, f"the KV cache needs at least one block, got {total}")
        self.total = total
        self.block_size = block_size
        self.blocks: list[list[int]] = [[] for _ in range(requests)]
        self.capacity = [0] * requests
        self.used = 0                    # blocks some request holds
        self._returned: list[int] = []   # given back; the top of the stack is handed out next
        self._fresh = 0                  # ids from here up were never handed out
        self._dropped: list[int] = []

    def allocate(self, i: int, positions: int) -> bool:
        """Grow request ``i``'s blocks to hold ``positions``; False (and nothing taken) if too few are free."""
        held = self.blocks[i]
        need = -(-positions // self.block_size) - len(held)
        if need <= 0:
            return True
        if need > self.total - self.used:
            return False
        returned = self._returned
        reuse = min(need, len(returned))
        if reuse:
            held.extend(returned[:-reuse - 1:-1])  # popped one by one: the top of the stack first
            del returned[-reuse:]
        if need > reuse:
            fresh = self._fresh
            self._fresh = fresh + need - reuse
            held.extend(range(fresh, self._fresh))
        self.used += need
        self.capacity[i] = len(held) * self.block_size
        return True

    def append(self, i: int, position: int) -> bool:
        """Make room for a decoded token at ``position``; False if no block is free."""
        return position < self.capacity[i] or self.allocate(i, position + 1)

    def free(self, i: int) -> None:
        """Request ``i`` finished: its blocks go back to the free list."""
        held = self.blocks[i]
        self._returned.extend(reversed(held))
        self.used -= len(held)
        self.capacity[i] = 0
        held.clear()

    def preempt(self, i: int) -> None:
        """Request ``i`` is preempted: its blocks go back, and the backend is told to drop its state."""
        self.free(i)
        self._dropped.append(i)

    def take_dropped(self) -> list[int]:
        """Requests preempted since the last call (the next launch carries them to the backend)."""
        dropped, self._dropped = self._dropped, []
        return dropped


BLOCK_SIZE = 16


def need_blocks(prompt_len: int, output_len: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks a request holds at its end (prompt + every output token but the last)."""
    return -(-max(prompt_len, prompt_len + output_len - 1) // block_size)
