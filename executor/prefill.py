"""A prefill launch (chunks of several prompts packed into ``T`` padded tokens) as one int32 metadata buffer whose
layout depends only on ``T``, the chunk capacity ``C`` and the block-table width, so it replays as a CUDA graph:

* per token: ``tok`` (token-store index), ``pos``, ``row0`` (KV row in cache layer 0);
* per chunk: ``start`` (positions already cached), ``len``, ``qoff`` (first packed row), a block-table row;
* per sampled row: ``last`` (packed index of a finishing chunk's last token), ``out`` (token-store index);
* per attention work item (``T / BLOCK_M + C``): ``item_chunk``, ``item_q0``, most keys first (:func:`work_items`).

Padding touches no request: the scratch token, the trash KV row, length-0 chunks, work items of chunk -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cdbsim.serving.memory import PREFILL_ITEM_TOKENS, prefill_meta_entries

BLOCK_M = PREFILL_ITEM_TOKENS  # queries per attention work item (the prefill attention kernel's tile height)

TOKEN_FIELDS = ("tok", "pos", "row0")
CHUNK_FIELDS = ("start", "len", "qoff", "last", "out")
ITEM_FIELDS = ("item_chunk", "item_q0")


@dataclass(frozen=True)
class PrefillLayout:
    """Sizes and offsets of one prefill metadata buffer."""

    tokens: int
    chunks: int
    width: int

    @property
    def items(self) -> int:
        return -(-self.tokens // BLOCK_M) + self.chunks

    @property
    def numel(self) -> int:
        return prefill_meta_entries(self.tokens, self.chunks, self.width)  # the memory plan counts the same

    def split(self, buffer):
        """Views of ``buffer`` (array or tensor): ``(tokens [3, T], chunks [5, C], items [2, I], table [C, width])``."""
        t, c, i = self.tokens, self.chunks, self.items
        a = len(TOKEN_FIELDS) * t
        b = a + len(CHUNK_FIELDS) * c
        e = b + len(ITEM_FIELDS) * i
        return (buffer[:a].reshape(len(TOKEN_FIELDS), t), buffer[a:b].reshape(len(CHUNK_FIELDS), c),
                buffer[b:e].reshape(len(ITEM_FIELDS), i), buffer[e:].reshape(c, self.width))


def chunk_capacity(tokens: int, width: int) -> int:
    """Chunks a launch of ``tokens`` padded tokens can hold: one per resident request, at most one per token."""
    return max(1, min(tokens, width))


@dataclass
class PrefillMeta:
    """Device views of a prefill launch's metadata."""

    tok: torch.Tensor
    pos: torch.Tensor
    row0: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    qoff: torch.Tensor
    last: torch.Tensor
    out: torch.Tensor
    item_chunk: torch.Tensor
    item_q0: torch.Tensor
    block_table: torch.Tensor
    zeros: torch.Tensor  # one 0 per token: layer base and fill of prefill KV writes


def prefill_views(buffer: torch.Tensor, layout: PrefillLayout) -> PrefillMeta:
    tokens, chunks, items, table = layout.split(buffer)
    return PrefillMeta(*tokens.unbind(0), *chunks.unbind(0), *items.unbind(0), block_table=table,
                       zeros=torch.zeros(layout.tokens, dtype=buffer.dtype, device=buffer.device))


def scratch_prefill(layout: PrefillLayout, scratch_token: int, trash_block: int, block_size: int) -> np.ndarray:
    """A buffer of padding only: what a graph is captured with and what a launch's buffer starts from."""
    buf = np.zeros(layout.numel, dtype=np.int32)
    tokens, chunks, items, table = layout.split(buf)
    tokens[0] = scratch_token
    tokens[2] = trash_block * block_size
    chunks[4] = scratch_token
    items[0] = -1
    table[:] = trash_block
    return buf


def work_items(lens: list[int], block_m: int = BLOCK_M,
               starts: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(chunk, first query) of every attention work item of ``block_m`` queries, those that see the most keys first
    (so a long item does not start last and run alone)."""
    starts = starts if starts is not None else [0] * len(lens)
    chunk = np.concatenate([np.full(-(-n // block_m), c) for c, n in enumerate(lens)] or [np.zeros(0)])
    q0 = np.concatenate([np.arange(0, n, block_m) for n in lens] or [np.zeros(0)])
    keys = np.asarray(starts, dtype=np.int64)[chunk.astype(np.int64)] + q0
    order = np.argsort(-keys, kind="stable")
    return chunk[order].astype(np.int32), q0[order].astype(np.int32)


@dataclass(frozen=True)
class Chunk:
    """Positions ``start .. start + length - 1`` of a request with block ids ``blocks`` and position 0 at token-store
    index ``token_base``; a ``final`` chunk ends the prompt and has its last token's successor sampled."""

    start: int
    length: int
    blocks: np.ndarray
    token_base: int
    final: bool


def pack(layout: PrefillLayout, chunks: list[Chunk], scratch_token: int, trash_block: int,
         block_size: int) -> np.ndarray:
    """The metadata buffer of a launch of ``chunks`` (padding everywhere else)."""
    if len(chunks) > layout.chunks or sum(c.length for c in chunks) > layout.tokens:
        raise ValueError(f"{len(chunks)} chunks of {sum(c.length for c in chunks)} tokens do not fit a "
                         f"prefill graph of {layout.chunks} chunks and {layout.tokens} tokens")
    buf = scratch_prefill(layout, scratch_token, trash_block, block_size)
    tok_f, chunk_f, item_f, table = layout.split(buf)
    offset = sampled = 0
    for c, chunk in enumerate(chunks):
        p = np.arange(chunk.start, chunk.start + chunk.length, dtype=np.int64)
        end = offset + chunk.length
        tok_f[:, offset:end] = (chunk.token_base + p, p, chunk.blocks[p // block_size] * block_size + p % block_size)
        used = -(-(chunk.start + chunk.length) // block_size)
        table[c, :used] = chunk.blocks[:used]
        chunk_f[:3, c] = (chunk.start, chunk.length, offset)
        if chunk.final:
            chunk_f[3:, sampled] = (end - 1, chunk.token_base + chunk.start + chunk.length)
            sampled += 1
        offset = end
    item_chunk, item_q0 = work_items([c.length for c in chunks], starts=[c.start for c in chunks])
    item_f[:, : len(item_chunk)] = (item_chunk, item_q0)
    return buf
