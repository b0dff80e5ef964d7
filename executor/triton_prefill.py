"""Paged attention of packed prefill chunks in Triton (:func:`prefill_attention`, the signature of
:func:`executor.ops.prefill_attention`): no host sync, so it fits a CUDA graph. CPU tensors run interpreted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cdbsim.latency.gpu_work import head_parts
from executor.kv_cache import PagedKVCache
from executor.prefill import BLOCK_M, PrefillMeta
from executor.triton_pointwise import _kv_offset


@triton.jit
def _load_cols(ptr, rows_ok, D0: tl.constexpr, DW: tl.constexpr, D: tl.constexpr, MASK_ROWS: tl.constexpr):
    """Columns ``D0 .. D0 + DW`` of the rows at ``ptr`` (``[rows, 1]`` pointers), zero past the head's ``D``
    and, with ``MASK_ROWS``, in rows where ``rows_ok`` is false. A mask the shape makes true is left out."""
    d = D0 + tl.arange(0, DW)
    if MASK_ROWS:
        if D0 + DW <= D:
            return tl.load(ptr + d[None, :], mask=rows_ok[:, None], other=0.0)
        return tl.load(ptr + d[None, :], mask=rows_ok[:, None] & (d < D)[None, :], other=0.0)
    if D0 + DW <= D:
        return tl.load(ptr + d[None, :])
    return tl.load(ptr + d[None, :], mask=(d < D)[None, :], other=0.0)


@triton.jit
def _prefill_tile(qa, qb, KC, VC, BT, c, bt_stride, page_base, kvh, j0, end, q_pos, qk_scale, m_i, l_i, acc_a,
                  acc_b, KVH: tl.constexpr, D: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr,
                  PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Fold keys ``j0 .. j0 + BLOCK_N`` into the tile's online softmax (base 2). ``MASKED``: the tile reaches
    the causal diagonal or the chunk's end; otherwise every query sees every key and nothing is masked."""
    j = j0 + tl.arange(0, BLOCK_N)
    jm = j < end
    if MASKED:
        blk = tl.load(BT + c * bt_stride + j // PAGE, mask=jm, other=0).to(tl.int64)
    else:
        blk = tl.load(BT + c * bt_stride + j // PAGE).to(tl.int64)
    row = _kv_offset(page_base + blk, j % PAGE, kvh, KVH, D, PAGE)
    ka = _load_cols(KC + row[:, None], jm, 0, DA, D, MASKED)
    s = tl.dot(qa, tl.trans(ka), input_precision=PRECISION)
    if DB > 0:
        kb = _load_cols(KC + row[:, None], jm, DA, DB, D, MASKED)
        s = tl.dot(qb, tl.trans(kb), acc=s, input_precision=PRECISION)
    s = s * qk_scale
    if MASKED:  # every row sees key 0 (in its first tile), so the running max is finite from there on
        s = tl.where((j[None, :] <= q_pos[:, None]) & jm[None, :], s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    va = _load_cols(VC + row[:, None], jm, 0, DA, D, MASKED)
    acc_a = tl.dot(p.to(va.dtype), va, acc=acc_a * alpha[:, None], input_precision=PRECISION)
    if DB > 0:
        vb = _load_cols(VC + row[:, None], jm, DA, DB, D, MASKED)
        acc_b = tl.dot(p.to(vb.dtype), vb, acc=acc_b * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc_a, acc_b


@triton.jit(do_not_specialize=["layer"])
def _prefill_attn_kernel(Q, KC, VC, OUT, BT, START, LEN, QOFF, ICHUNK, IQ0, layer, pages_per_layer, qk_scale,
                         bt_stride, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, DA: tl.constexpr,
                         DB: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         PRECISION: tl.constexpr):
    """One work item (up to ``BLOCK_M`` queries of one chunk) of one head, its columns in parts ``DA`` + ``DB``. Key
    tiles below the item's first query skip every mask; the rest (diagonal, chunk end) mask."""
    h = tl.program_id(0)  # heads vary fastest: every head of the longest item starts first
    item = tl.program_id(1)
    chunk = tl.load(ICHUNK + item)
    if chunk >= 0:
        c = chunk.to(tl.int64)
        q0 = tl.load(IQ0 + item)
        start = tl.load(START + c)
        length = tl.load(LEN + c)
        qoff = tl.load(QOFF + c).to(tl.int64)
        kvh = h // (H // KVH)
        i = q0 + tl.arange(0, BLOCK_M)
        im = i < length
        q_ptr = Q + ((qoff + i).to(tl.int64) * H + h)[:, None] * D
        qa = _load_cols(q_ptr, im, 0, DA, D, True)
        qb = qa
        if DB > 0:
            qb = _load_cols(q_ptr, im, DA, DB, D, True)
        q_pos = start + i
        end = tl.minimum(start + q0 + BLOCK_M, start + length)  # keys this item can see: 0 .. end - 1
        page_base = layer.to(tl.int64) * pages_per_layer
        m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc_a = tl.zeros([BLOCK_M, DA], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_M, DB if DB > 0 else 16], dtype=tl.float32)
        full = (start + q0) // BLOCK_N * BLOCK_N
        for j0 in range(0, full, BLOCK_N):
            m_i, l_i, acc_a, acc_b = _prefill_tile(qa, qb, KC, VC, BT, c, bt_stride, page_base, kvh, j0, end,
                                                   q_pos, qk_scale, m_i, l_i, acc_a, acc_b, KVH, D, DA, DB,
                                                   PAGE, BLOCK_N, False, PRECISION)
        for j0 in range(full, end, BLOCK_N):
            m_i, l_i, acc_a, acc_b = _prefill_tile(qa, qb, KC, VC, BT, c, bt_stride, page_base, kvh, j0, end,
                                                   q_pos, qk_scale, m_i, l_i, acc_a, acc_b, KVH, D, DA, DB,
                                                   PAGE, BLOCK_N, True, PRECISION)
        o_ptr = OUT + ((qoff + i).to(tl.int64) * H + h)[:, None] * D
        _store_rows(o_ptr, acc_a / l_i[:, None], im, 0, DA, D)
        if DB > 0:
            _store_rows(o_ptr, acc_b / l_i[:, None], im, DA, DB, D)


@triton.jit
def _store_rows(ptr, x, rows_ok, D0: tl.constexpr, DW: tl.constexpr, D: tl.constexpr):
    """Store ``x`` as columns ``D0 .. D0 + DW`` of the rows at ``ptr`` where ``rows_ok`` (none past ``D``)."""
    d = D0 + tl.arange(0, DW)
    tl.store(ptr + d[None, :], x.to(ptr.dtype.element_ty), mask=rows_ok[:, None] & (d < D)[None, :])


@dataclass(frozen=True)
class PrefillTiles:
    """Launch shape of the prefill attention kernel: keys per tile, warps, pipeline stages (the query tile
    is :data:`executor.prefill.BLOCK_M`, the metadata's work-item height)."""

    block_n: int = 64
    warps: int = 4
    stages: int = 2


def prefill_tiles(d: int) -> PrefillTiles:
    """The launch shape for head size ``d``: a head in two parts (96 = 64 + 32) holds fewer columns per key, so
    twice the keys per tile and one more stage; a power-of-two head 64 keys, two stages, and eight warps beyond
    128 columns (a 256-wide accumulator spills from four warps' registers)."""
    if prefill_head_parts(d)[1]:
        return PrefillTiles(128, 4, 3)
    return PrefillTiles(64, 8 if d > 128 else 4, 2)


LOG2E = 1.4426950408889634


def prefill_head_parts(d: int) -> tuple[int, int]:
    """:func:`head_parts`, except that a part narrower than 16 columns (too narrow for ``tl.dot``) is not
    split off: the head is then loaded as one padded part."""
    a, b = head_parts(d)
    return (a, b) if b == 0 or b >= 16 else (triton.next_power_of_2(d), 0)


def prefill_attention(q: torch.Tensor, cache: PagedKVCache, meta: PrefillMeta, layer: int, scale: float,
                      tiles: PrefillTiles | None = None, block_m: int | None = None) -> torch.Tensor:
    """See :func:`executor.ops.prefill_attention`; no host sync (fits a CUDA graph). ``block_m``: the height of
    ``meta``'s work items (default :data:`executor.prefill.BLOCK_M`); ``tiles`` overrides the launch shape."""
    q = q.contiguous()
    tokens, heads, d = q.shape
    geo = cache.geometry
    out = torch.zeros_like(q)
    table = meta.block_table
    tiles = tiles or prefill_tiles(d)
    da, db = prefill_head_parts(d)
    _prefill_attn_kernel[(heads, meta.item_chunk.shape[0])](
        q, cache.k, cache.v, out, table, meta.start, meta.length, meta.qoff, meta.item_chunk, meta.item_q0,
        layer, geo.pages_per_layer, scale * LOG2E, table.stride(0), H=heads, KVH=cache.kv_heads, D=d, DA=da,
        DB=db, PAGE=geo.block_size, BLOCK_M=block_m or BLOCK_M, BLOCK_N=tiles.block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=tiles.warps, num_stages=tiles.stages)
    return out.reshape(tokens, heads * d)
