"""Attention over the paged cache for the two kinds of launch.

A model layer calls ``attn(qkv, layer, q_bias, k_bias)``: the context adds the bias, rotates q and k, writes
this launch's k and v into cache layer ``layer`` (+ the row's own slot offset), and attends. The model
never sees pages or block tables.

* :class:`DecodeAttention` (prelude, core, coda, CB decode): one query per row. Row ``i`` reads cache layer
  ``layer_base[i] + layer`` through its own block-table row, so a core launch mixes tokens at different
  loop steps (= different slots) in one call; ``fill[i]`` makes an exiting token also write its deeper slots.
* :class:`PrefillAttention`: several prompt chunks packed into one launch; each chunk attends causally to
  itself plus every earlier position of its request. Keys are gathered densely per chunk from the pages
  and fed to SDPA with a mask (one call for all chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from executor.kv_cache import PagedKVCache
from executor.ops import Ops, RopeTable, to_device


@dataclass
class DecodeAttention:
    """Paged attention for one query per row; all tensors have one entry per (padded) row."""

    ops: Ops
    cache: PagedKVCache
    rope: RopeTable
    pos: torch.Tensor
    row0: torch.Tensor
    layer_base: torch.Tensor
    fill: torch.Tensor
    seq_len: torch.Tensor
    block_table: torch.Tensor
    max_fill: int
    scale: float

    def __call__(self, qkv: torch.Tensor, layer: int, q_bias: torch.Tensor | None,
                 k_bias: torch.Tensor | None) -> torch.Tensor:
        q = self.ops.rope_write_kv(qkv, q_bias, k_bias, self.pos, self.rope, self.cache, self.row0,
                                   self.layer_base, layer, self.fill, self.max_fill)
        return self.ops.decode_attention(q, self.cache, self.block_table, self.layer_base, layer,
                                         self.seq_len, self.scale)


@dataclass
class PrefillAttention:
    """Causal attention for packed prompt chunks.

    Per token: ``pos`` and ``row0``. Per chunk: ``chunk_pages`` (its request's block ids, padded with the
    trash block), ``q_chunk``/``q_slot`` (where each packed token sits in the padded ``[chunks, max_len]``
    query grid) and ``mask`` ``[chunks, 1, max_q, max_k]`` (True = may attend).
    """

    ops: Ops
    cache: PagedKVCache
    rope: RopeTable
    pos: torch.Tensor
    row0: torch.Tensor
    zeros: torch.Tensor
    chunk_pages: torch.Tensor
    q_chunk: torch.Tensor
    q_slot: torch.Tensor
    mask: torch.Tensor
    scale: float

    @classmethod
    def build(cls, ops: Ops, cache: PagedKVCache, rope: RopeTable, pos: torch.Tensor, row0: torch.Tensor,
              starts: list[int], lens: list[int], pages: list[list[int]], scale: float) -> PrefillAttention:
        """From the chunk list (``pages[c]``: block ids the chunk's keys span); the mask is built on the
        device from per-chunk starts and lengths, so only small arrays cross from the host."""
        device = pos.device
        n_chunks = len(starts)
        max_q = max(lens)
        max_k = max(s + n for s, n in zip(starts, lens, strict=True))
        width = max(len(p) for p in pages)
        table = np.full((n_chunks, width), cache.geometry.trash_block, dtype=np.int64)
        for c, p in enumerate(pages):
            table[c, : len(p)] = p
        q_chunk = np.repeat(np.arange(n_chunks), lens)
        q_slot = np.concatenate([np.arange(n) for n in lens])
        start = to_device(np.asarray(starts, dtype=np.int64), device)[:, None, None]
        length = to_device(np.asarray(lens, dtype=np.int64), device)[:, None, None]
        i = torch.arange(max_q, device=device)[None, :, None]
        j = torch.arange(max_k, device=device)[None, None, :]
        mask = (i < length) & (j <= start + i)
        mask |= (i >= length) & (j == 0)  # padded query rows attend key 0 so softmax stays finite
        return cls(ops, cache, rope, pos, row0, torch.zeros_like(pos), to_device(table, device),
                   to_device(q_chunk, device), to_device(q_slot, device), mask[:, None], scale)

    def __call__(self, qkv: torch.Tensor, layer: int, q_bias: torch.Tensor | None,
                 k_bias: torch.Tensor | None) -> torch.Tensor:
        cache, geo = self.cache, self.cache.geometry
        q = self.ops.rope_write_kv(qkv, q_bias, k_bias, self.pos, self.rope, cache, self.row0, self.zeros,
                                   layer, self.zeros, 0)
        n_chunks, max_q, max_k = self.mask.shape[0], self.mask.shape[2], self.mask.shape[3]
        heads, d = q.shape[1], q.shape[2]
        pages = layer * geo.pages_per_layer + self.chunk_pages
        k = cache.k_pages[pages].flatten(1, 2)[:, :max_k]
        v = cache.v_pages[pages].flatten(1, 2)[:, :max_k]
        if heads != cache.kv_heads:
            k = k.repeat_interleave(heads // cache.kv_heads, dim=2)
            v = v.repeat_interleave(heads // cache.kv_heads, dim=2)
        grid = q.new_zeros((n_chunks, max_q, heads, d))
        grid[self.q_chunk, self.q_slot] = q
        out = torch.nn.functional.scaled_dot_product_attention(
            grid.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=self.mask, scale=self.scale)
        return out.transpose(1, 2)[self.q_chunk, self.q_slot].reshape(q.shape[0], heads * d)
