"""The KV block manager: which cache blocks each request holds, handed out from one free list.

A block holds ``block_size`` token positions across every layer and slot of the model, so a request
holding ``n`` positions needs ``ceil(n / block_size)`` blocks whatever the KV layout; the layout only
changes how many bytes a block is (:meth:`cdbsim.arch.ArchSpec.kv_bytes_per_token`). The ids are real:
the GPU executor indexes its paged cache with them, reading each launch's block lists from the launch.

Blocks of a finished request go back with :meth:`free`; a request preempted under KV pressure gives its
blocks back with :meth:`preempt`, which also records it, so the next launch can tell the backend to drop
whatever it keeps for that request (:attr:`cdbsim.launch.Launch.dropped`).
"""

from __future__ import annotations

from cdbsim.errors import require


class BlockManager:
    """Block ids ``0 .. total - 1`` shared by ``requests`` requests; low ids are handed out first."""

    def __init__(self, total: int, block_size: int, requests: int) -> None:
        require(total >= 1, f"the KV cache needs at least one block, got {total}")
        self.total = total
        self.block_size = block_size
        self.blocks: list[list[int]] = [[] for _ in range(requests)]
        self._free = list(range(total - 1, -1, -1))  # pop() hands out low ids first
        self._dropped: list[int] = []

    @property
    def num_free(self) -> int:
        """Blocks no request holds."""
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    def can_allocate(self, blocks: int) -> bool:
        return blocks <= len(self._free)

    def allocate(self, i: int, positions: int) -> bool:
        """Grow request ``i``'s blocks to hold ``positions`` token positions; False (and nothing taken) if
        too few blocks are free."""
        held = self.blocks[i]
        need = -(-positions // self.block_size) - len(held)
        if need <= 0:
            return True
        free = self._free
        if need > len(free):
            return False
        for _ in range(need):
            held.append(free.pop())
        return True

    def append(self, i: int, position: int) -> bool:
        """Make room for a decoded token at ``position``: a new block when it starts one; False if none
        is free."""
        held = self.blocks[i]
        if position // self.block_size < len(held):
            return True
        return self.allocate(i, position + 1)

    def free(self, i: int) -> None:
        """Request ``i`` finished: its blocks go back to the free list."""
        held = self.blocks[i]
        self._free.extend(reversed(held))
        held.clear()

    def preempt(self, i: int) -> None:
        """Request ``i`` is preempted: its blocks go back, and the backend is told to drop its state."""
        self.free(i)
        self._dropped.append(i)

    def take_dropped(self) -> list[int]:
        """Requests preempted since the last call (the next launch carries them to the backend)."""
        dropped, self._dropped = self._dropped, []
        return dropped
