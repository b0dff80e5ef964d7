"""Paged, depth-aware KV cache: one page table shared by every layer, loop slot and request.

K and V are ``[cache_layers, blocks + 1, kv_heads, 16, head_dim]``: head-major pages, so one KV head's 16 positions
are contiguous. A cache layer is a (layer, slot) pair: prelude ``l`` -> ``l``, core ``l`` in slot ``s`` ->
``P + s * C + l``, coda ``l`` -> ``P + S * C + l``. Blocks are the scheduler's ids (16 positions of one request in
every cache layer); the extra last block is the trash block padded rows write to. Position ``p`` in block ``b`` of
cache layer ``L`` is row ``L * rows_per_layer + b * 16 + p % 16``, head ``h`` of row ``r`` at element
``((r // 16) * kv_heads + h) * 16 * head_dim + (r % 16) * head_dim``. Slots, fills: :class:`cdbsim.model.arch.KVLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cdbsim.model.arch import KVLayout

BLOCK_SIZE = 16


@dataclass(frozen=True)
class CacheGeometry:
    """Layer counts and layout of a cache; pure arithmetic, no tensors."""

    prelude: int
    core: int
    coda: int
    r_max: int
    layout: KVLayout
    num_blocks: int
    block_size: int = BLOCK_SIZE

    @property
    def slots(self) -> int:
        return self.layout.slots(self.r_max)

    @property
    def layers(self) -> int:
        return self.prelude + self.slots * self.core + self.coda

    @property
    def pages_per_layer(self) -> int:
        """Blocks per cache layer, including the trash block."""
        return self.num_blocks + 1

    @property
    def trash_block(self) -> int:
        return self.num_blocks

    @property
    def rows_per_layer(self) -> int:
        return self.pages_per_layer * self.block_size

    @property
    def trash_row(self) -> int:
        """A row no real token reads: first position of the trash block in cache layer 0."""
        return self.trash_block * self.block_size

    def core_layer(self, slot: int, layer: int = 0) -> int:
        return self.prelude + slot * self.core + layer

    def coda_layer(self, layer: int = 0) -> int:
        return self.prelude + self.slots * self.core + layer

    def slot_of_step(self, step: int) -> int:
        return self.layout.slot_of_step(step, self.r_max)

    def fill_count(self, step: int) -> int:
        """Deeper slots a token exiting after 0-based ``step`` writes its KV into (last-exited fill)."""
        return self.layout.fill_copies(step, self.r_max)

    @property
    def max_fill(self) -> int:
        return max((self.fill_count(s) for s in range(self.r_max)), default=0)


class PagedKVCache:
    """K and V pages for every cache layer, plus the geometry to address them."""

    def __init__(self, geometry: CacheGeometry, kv_heads: int, head_dim: int, *,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        self.geometry = geometry
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        shape = (geometry.layers, geometry.pages_per_layer, kv_heads, geometry.block_size, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    def _pages(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(-1, self.kv_heads, self.geometry.block_size, self.head_dim).transpose(1, 2)

    @property
    def k_pages(self) -> torch.Tensor:
        """K as ``[pages, block_size, kv_heads, head_dim]``, one page per (cache layer, block): a strided view
        of the head-major storage (writes through it land in the cache)."""
        return self._pages(self.k)

    @property
    def v_pages(self) -> torch.Tensor:
        return self._pages(self.v)

    @property
    def k_rows(self) -> torch.Tensor:
        """K as ``[rows, kv_heads, head_dim]``, one row per (cache layer, block, offset): a copy (the storage is
        head-major), for reading; :meth:`write_rows` writes rows."""
        return self.k_pages.reshape(-1, self.kv_heads, self.head_dim)

    @property
    def v_rows(self) -> torch.Tensor:
        return self.v_pages.reshape(-1, self.kv_heads, self.head_dim)

    def write_rows(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k`` and ``v`` (``[n, kv_heads, head_dim]``) at cache rows ``rows`` (``[n]``, int64); a row
        named twice keeps one of its values."""
        page, offset = rows // self.geometry.block_size, rows % self.geometry.block_size
        self.k_pages[page, offset] = k.to(self.k.dtype)
        self.v_pages[page, offset] = v.to(self.v.dtype)
