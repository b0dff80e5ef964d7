"""Attention over the paged cache for the two kinds of launch.

A model layer calls ``attn(qkv, layer, q_bias, k_bias)``: the context adds the bias, rotates q and k, writes
this launch's k and v into cache layer ``layer`` (+ the row's own slot offset), and attends. The model
never sees pages or block tables.

* :class:`DecodeAttention` (prelude, core, coda, CB decode): one query per row. Row ``i`` reads cache layer
  ``layer_base[i] + layer`` through its own block-table row, so a core launch mixes tokens at different
  loop steps (= different slots) in one call; ``fill[i]`` makes an exiting token also write its deeper slots.
* :class:`executor.prefill.PagedPrefillAttention`: several prompt chunks packed into one launch; each
  chunk attends causally to itself plus every earlier position of its request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.kv_cache import PagedKVCache
from executor.ops import Ops, RopeTable


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
        if qkv.shape[0] <= self.ops.fused_attention_rows:  # one kernel (the chained path's rows by default)
            return self.ops.rope_decode_attention(qkv, q_bias, k_bias, self.pos, self.rope, self.cache, self.row0,
                                                  self.layer_base, layer, self.fill, self.max_fill,
                                                  self.block_table, self.seq_len, self.scale)
        q = self.ops.rope_write_kv(qkv, q_bias, k_bias, self.pos, self.rope, self.cache, self.row0,
                                   self.layer_base, layer, self.fill, self.max_fill)
        return self.ops.decode_attention(q, self.cache, self.block_table, self.layer_base, layer,
                                         self.seq_len, self.scale)
