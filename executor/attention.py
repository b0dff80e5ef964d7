"""Attention contexts over the paged cache. A layer calls ``attn(qkv, layer, q_bias, k_bias)``: the context adds
the bias, rotates q and k, writes the launch's k and v into cache layer ``layer`` (plus the row's slot offset) and
attends, so the model never sees pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.kv_cache import PagedKVCache
from executor.ops import Ops
from executor.prefill import PrefillMeta
from executor.rope import RopeTable


@dataclass
class DecodeAttention:
    """One query per (padded) row, one entry per row in every tensor: row ``i`` in cache layer ``layer_base[i] + layer``
    (one call mixes loop steps; ``fill[i]`` writes an exiting token's deeper slots)."""

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
        if qkv.shape[0] <= self.ops.fused_attention_rows:  # one kernel (the chained path's rows by default)
            return self.ops.rope_decode_attention(qkv, q_bias, k_bias, self.pos, self.rope, self.cache, self.row0,
                                                  self.layer_base, layer, self.fill, self.max_fill,
                                                  self.block_table, self.seq_len, self.scale)
        q = self.ops.rope_write_kv(qkv, q_bias, k_bias, self.pos, self.rope, self.cache, self.row0,
                                   self.layer_base, layer, self.fill, self.max_fill)
        return self.ops.decode_attention(q, self.cache, self.block_table, self.layer_base, layer,
                                         self.seq_len, self.scale)


@dataclass
class PagedPrefillAttention:
    """Packed prompt chunks, each causal over its request's cached positions and its own (cached first)."""

    ops: Ops
    cache: PagedKVCache
    rope: RopeTable
    meta: PrefillMeta
    scale: float

    def __call__(self, qkv: torch.Tensor, layer: int, q_bias: torch.Tensor | None,
                 k_bias: torch.Tensor | None) -> torch.Tensor:
        m = self.meta
        q = self.ops.rope_write_kv(qkv, q_bias, k_bias, m.pos, self.rope, self.cache, m.row0, m.zeros, layer,
                                   m.zeros, 0)
        return self.ops.prefill_attention(q, self.cache, m, layer, self.scale)
