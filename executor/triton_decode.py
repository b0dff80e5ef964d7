"""Paged split-KV decode attention in Triton, with the signatures of :mod:`executor.ops`: ``decode_attention``
(a grid that depends only on rows, heads and head size, so it fits a CUDA graph, plus a small merge kernel) and
``rope_decode_attention`` (RoPE, the KV write and attention in one kernel with an in-kernel merge, for the chained
path's one or two rows). CPU tensors run under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cdbsim.latency.gpu_work import CHAINED_BLOCK, MIN_SPLIT_POSITIONS, PAGE, decode_splits, head_parts
from executor.chain import EARLY, launch_options, let_successor_launch, pdl_mode, wait_for_predecessor
from executor.kv_cache import PagedKVCache
from executor.rope import RopeTable
from executor.triton_pointwise import _kv_offset, _row_offset

BLOCK_N = CHAINED_BLOCK  # positions per tile of the fused single-row kernel (rope_decode_attention)
DECODE_TILES = {1: (32, 1), 2: (16, 1)}  # decode_attention's (positions per tile, warps) by the head's part count
DECODE_EVICT = ""  # decode_attention's eviction policy for KV loads (Triton's default)


@triton.jit
def _split_range(seq, split, SPLITS: tl.constexpr, MIN_PER: tl.constexpr, PAGE: tl.constexpr):
    """Positions ``start .. end`` of a row's split (empty past the context) and how many of the row's splits hold
    positions (at least split 0, which stores even an empty row's partial)."""
    per = tl.cdiv(tl.maximum(tl.cdiv(seq, SPLITS), MIN_PER), PAGE) * PAGE  # cdbsim.latency.gpu_work.split_positions
    start = split * per
    return start, tl.minimum(start + per, seq), tl.maximum(tl.minimum(tl.cdiv(seq, per), SPLITS), 1)


@triton.jit
def _tile_rows(BT, b, bt_stride, page_base, kvh, t0, end, pos, KVH: tl.constexpr, D: tl.constexpr,
               PAGE: tl.constexpr, BLOCK: tl.constexpr, SKIP_OWN: tl.constexpr):
    """Element offsets of KV head ``kvh`` at positions ``t0 .. t0 + BLOCK`` and which to read: none past ``end``
    and, with ``SKIP_OWN``, not the launch's own token ``pos``."""
    t = t0 + tl.arange(0, BLOCK)
    tm = t < end
    blk = tl.load(BT + b * bt_stride + t // PAGE, mask=tm, other=0).to(tl.int64)
    if SKIP_OWN:
        tm = tm & (t != pos)
    return _kv_offset(page_base + blk, t % PAGE, kvh, KVH, D, PAGE), tm


@triton.jit
def _kv_part(KC, VC, base, tm, D: tl.constexpr, D0: tl.constexpr, DW: tl.constexpr, EVICT: tl.constexpr):
    """K and V ``[BLOCK, DW]``: columns ``D0 ..`` of the rows at ``base``, zero where masked or past ``D``."""
    d = D0 + tl.arange(0, DW)
    off = base[:, None] + d[None, :]
    km = tm[:, None] & (d < D)[None, :]
    return (tl.load(KC + off, mask=km, other=0.0, eviction_policy=EVICT),
            tl.load(VC + off, mask=km, other=0.0, eviction_policy=EVICT))


@triton.jit
def _softmax_step(ka, va, kb, vb, t, end, qa, qb, s_own, v_new, pos, m_i, l_i, acc_a, acc_b, DB: tl.constexpr,
                  OWN: tl.constexpr):
    """Fold one K/V tile (positions ``t``) into the online softmax ``(m_i, l_i, acc_a, acc_b)``; the head's
    columns come in two parts ``a`` and ``b`` (``DB == 0``: ``a`` alone)."""
    s = tl.sum(ka.to(tl.float32) * qa[None, :], axis=1)
    if DB > 0:
        s += tl.sum(kb.to(tl.float32) * qb[None, :], axis=1)
    if OWN:
        s = tl.where(t == pos, s_own, s)
    s = tl.where(t < end, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    acc_a = acc_a * alpha + tl.sum(p[:, None] * va.to(tl.float32), axis=0)
    if DB > 0:
        acc_b = acc_b * alpha + tl.sum(p[:, None] * vb.to(tl.float32), axis=0)
    if OWN:
        acc_a += tl.sum(tl.where(t == pos, p, 0.0), axis=0) * v_new
    return m_new, l_i * alpha + tl.sum(p, axis=0), acc_a, acc_b


@triton.jit
def _store_part(DST, x, D: tl.constexpr, D0: tl.constexpr, DW: tl.constexpr):
    """Store ``x`` as columns ``D0 .. D0 + DW`` of the row at ``DST`` (none past the head's ``D``)."""
    d = D0 + tl.arange(0, DW)
    tl.store(DST + d, x.to(DST.dtype.element_ty), mask=d < D)


@triton.jit
def _attend(qa, qb, k_new, v_new, pos, k, v, start, end, used, KC, VC, BT, MO, ML, CNT, OUT, b, h, split, kvh,
            page_base, bt_stride, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, DA: tl.constexpr,
            DB: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr, OWN: tl.constexpr,
            PEEL: tl.constexpr, MERGE_HERE: tl.constexpr, EVICT: tl.constexpr):
    """One (row, head, split) of split-KV decode attention: the online softmax of the scaled fp32 query (columns
    ``qa``, ``qb``; ``DB == 0``: ``qa`` alone) over ``start .. end``, stored as the output (one split) or as one of
    the row's ``used`` partials, merged by the last split (``MERGE_HERE``) or :func:`_decode_attn_merge`. ``PEEL``:
    the first tile is ``k, v``; ``OWN``: position ``pos`` is the launch's own token ``k_new``/``v_new``."""
    tl.static_assert(DB == 0 or not (OWN or PEEL), "the launch's own token and a peeled tile take one part")
    s_own = tl.sum(k_new * qa, axis=0)
    m_i, l_i = -float("inf"), 0.0
    acc_a = tl.zeros([DA], dtype=tl.float32)
    acc_b = acc_a
    if DB > 0:
        acc_b = tl.zeros([DB], dtype=tl.float32)
    first = start
    if PEEL:
        if start < end:
            m_i, l_i, acc_a, acc_b = _softmax_step(k, v, k, v, start + tl.arange(0, BLOCK), end, qa, qb, s_own,
                                                   v_new, pos, m_i, l_i, acc_a, acc_b, DB, OWN)
        first = start + BLOCK
    for t0 in range(first, end, BLOCK):
        base, tm = _tile_rows(BT, b, bt_stride, page_base, kvh, t0, end, pos, KVH, D, PAGE, BLOCK, OWN)
        ka, va = _kv_part(KC, VC, base, tm, D, 0, DA, EVICT)
        kb, vb = ka, va
        if DB > 0:
            kb, vb = _kv_part(KC, VC, base, tm, D, DA, DB, EVICT)
        m_i, l_i, acc_a, acc_b = _softmax_step(ka, va, kb, vb, t0 + tl.arange(0, BLOCK), end, qa, qb, s_own, v_new,
                                               pos, m_i, l_i, acc_a, acc_b, DB, OWN)
    if SPLITS == 1:
        _store_part(OUT + (b * H + h) * D, acc_a / l_i, D, 0, DA)
        if DB > 0:
            _store_part(OUT + (b * H + h) * D, acc_b / l_i, D, DA, DB)
    elif split < used:
        idx = (b * H + h) * SPLITS + split
        nonempty = l_i > 0.0  # an empty row's split 0 writes a zero weight (log-sum-exp -inf) for the merge
        safe = tl.where(nonempty, l_i, 1.0)
        _store_part(MO + idx * D, acc_a / safe, D, 0, DA)
        if DB > 0:
            _store_part(MO + idx * D, acc_b / safe, D, DA, DB)
        tl.store(ML + idx, tl.where(nonempty, m_i + tl.log(safe), -float("inf")))
        if MERGE_HERE:
            # the last used split of (row, head) to finish merges them: its partial stores, then a gpu-scope
            # acquire-release count; the merge reads the partials from L2 (.cg), never a stale L1 line
            tl.debug_barrier()
            done = tl.atomic_add(CNT + b * H + h, 1, sem="acq_rel", scope="gpu")
            if done == used - 1:
                _merge_splits(MO, ML, OUT, b, h, used, H, D, DA, SPLITS, ".cg")
                tl.store(CNT + b * H + h, 0)  # ready for the next launch


@triton.jit(do_not_specialize=["layer"])
def _decode_attn_kernel(Q, KC, VC, BT, LB, SL, MO, ML, OUT, layer, pages_per_layer, scale, bt_stride,
                        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr,
                        PAGE: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr, MIN_PER: tl.constexpr,
                        PDL: tl.constexpr, EVICT: tl.constexpr):
    wait_for_predecessor(PDL)  # before any cache read: the predecessor (rope_write_kv) writes this launch's k/v
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    split = tl.program_id(2)
    kvh = h // (H // KVH)
    start, end, used = _split_range(tl.load(SL + b), split, SPLITS, MIN_PER, PAGE)
    page_base = (tl.load(LB + b).to(tl.int64) + layer) * pages_per_layer
    da = tl.arange(0, DA)
    qa = tl.load(Q + (b * H + h) * D + da, mask=da < D, other=0.0).to(tl.float32) * scale
    qb = qa
    if DB > 0:
        db = DA + tl.arange(0, DB)
        qb = tl.load(Q + (b * H + h) * D + db, mask=db < D, other=0.0).to(tl.float32) * scale
    _attend(qa, qb, qa, qa, 0, qa, qa, start, end, used, KC, VC, BT, MO, ML, ML, OUT, b, h, split, kvh, page_base,
            bt_stride, H, KVH, D, DA, DB, PAGE, BLOCK, SPLITS, False, False, False, EVICT)
    let_successor_launch(PDL)


@triton.jit
def _rope_angles(COS, SIN, pos, HALF: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    """RoPE at position ``pos`` in head-dimension order: ``(cos, sin, first, partner)``; element ``d`` pairs with
    ``partner[d]`` (``d ^ 1`` interleaved, ``d +- HALF`` rotate-half), ``first`` marks a pair's leading element."""
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    if INTERLEAVED:
        first = d % 2 == 0
        partner = tl.where(first, d + 1, d - 1)
        freq = d // 2
    else:
        first = d < HALF
        partner = tl.where(first, d + HALF, d - HALF)
        freq = tl.where(first, d, d - HALF)
    c = tl.load(COS + pos * HALF + freq, mask=dm, other=0.0)
    s = tl.load(SIN + pos * HALF + freq, mask=dm, other=0.0)
    return c, s, first, partner


@triton.jit
def _rotate(SRC, BIAS, c, s, first, partner, D: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr):
    """One head of q or k (``D`` values at ``SRC``, plus ``BIAS``) rotated by :func:`_rope_angles`, fp32."""
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    x = tl.load(SRC + d, mask=dm, other=0.0).to(tl.float32)
    xp = tl.load(SRC + partner, mask=dm, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(BIAS + d, mask=dm, other=0.0).to(tl.float32)
        xp += tl.load(BIAS + partner, mask=dm, other=0.0).to(tl.float32)
    return tl.where(first, x * c - xp * s, x * c + xp * s)


@triton.jit(do_not_specialize=["layer"])
def _rope_decode_attn_kernel(QKV, QB, KB, POS, COS, SIN, ROW0, FILL, KC, VC, BT, LB, SL, MO, ML, CNT, OUT, layer,
                             rows_per_layer, slot_stride, qkv_stride, pages_per_layer, scale, bt_stride,
                             H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                             HALF: tl.constexpr, HAS_BIAS: tl.constexpr, INTERLEAVED: tl.constexpr,
                             PAGE: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr,
                             MIN_PER: tl.constexpr, PDL: tl.constexpr):
    """RoPE, the KV write and decode attention in one launch. Every program rotates its q head and its KV head's new
    k and uses the new k/v from registers; split 0 of each KV group's first head writes them (and the fill slots).
    No program reads a cache row the launch or its predecessor writes, so metadata, RoPE angles and the first K/V
    tile load before the wait."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    split = tl.program_id(2)
    kvh = h // (H // KVH)
    pos = tl.load(POS + b).to(tl.int64)
    start, end, used = _split_range(tl.load(SL + b), split, SPLITS, MIN_PER, PAGE)
    cache_layer = tl.load(LB + b).to(tl.int64) + layer
    page_base = cache_layer * pages_per_layer
    base, tm = _tile_rows(BT, b, bt_stride, page_base, kvh, start, end, pos, KVH, D, PAGE, BLOCK, True)
    k, v = _kv_part(KC, VC, base, tm, D, 0, BLOCK_D, "")  # the first tile, one padded part
    c, s, first, partner = _rope_angles(COS, SIN, pos, HALF, D, BLOCK_D, INTERLEAVED)
    wait_for_predecessor(PDL)
    src = QKV + b * qkv_stride
    q = _rotate(src + h * D, QB + h * D, c, s, first, partner, D, BLOCK_D, HAS_BIAS)
    q = q.to(QKV.dtype.element_ty).to(tl.float32) * scale
    k_new = _rotate(src + (H + kvh) * D, KB + kvh * D, c, s, first, partner, D, BLOCK_D, HAS_BIAS)
    k_new = k_new.to(KC.dtype.element_ty)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    v_new = tl.load(src + (H + KVH + kvh) * D + d, mask=dm, other=0.0).to(VC.dtype.element_ty)
    if (split == 0) & (h % (H // KVH) == 0):
        row = cache_layer * rows_per_layer + tl.load(ROW0 + b).to(tl.int64)
        for j in range(0, tl.load(FILL + b) + 1):
            dst = _row_offset(row + j * slot_stride, kvh, KVH, D, PAGE) + d
            tl.store(KC + dst, k_new, mask=dm)
            tl.store(VC + dst, v_new, mask=dm)
    _attend(q, q, k_new.to(tl.float32), v_new.to(tl.float32), pos, k, v, start, end, used, KC, VC, BT, MO, ML, CNT,
            OUT, b, h, split, kvh, page_base, bt_stride, H, KVH, D, BLOCK_D, 0, PAGE, BLOCK, SPLITS, True, True,
            True, "")
    let_successor_launch(PDL)


@triton.jit
def _merge_splits(MO, ML, OUT, b, h, used, H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  SPLITS: tl.constexpr, CACHE: tl.constexpr):
    """Combine the first ``used`` partials of (row, head) (of its ``SPLITS``, the rest never written) by their
    log-sum-exp into the output row (partials loaded with cache modifier ``CACHE``)."""
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    base = (b * H + h) * SPLITS
    m = tl.load(ML + base, cache_modifier=CACHE)  # split 0 always holds position 0, so it is never empty
    acc = tl.load(MO + base * D + d, mask=dm, other=0.0, cache_modifier=CACHE)
    l_sum = 1.0
    for split in range(1, used):
        lse = tl.load(ML + base + split, cache_modifier=CACHE)
        o = tl.load(MO + (base + split) * D + d, mask=dm, other=0.0, cache_modifier=CACHE)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)
        acc = acc * alpha + o * w
        l_sum = l_sum * alpha + w
        m = m_new
    tl.store(OUT + (b * H + h) * D + d, (acc / l_sum).to(OUT.dtype.element_ty), mask=dm)


@triton.jit
def _decode_attn_merge(MO, ML, OUT, SL, H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                       SPLITS: tl.constexpr, MIN_PER: tl.constexpr, PAGE: tl.constexpr, PDL: tl.constexpr):
    """The merge of :func:`decode_attention`'s splits, one program per (row, head), over the splits the row's
    context fills (a separate kernel keeps the many-row attention kernel lean)."""
    b = tl.program_id(0).to(tl.int64)
    used = _split_range(tl.load(SL + b), 0, SPLITS, MIN_PER, PAGE)[2]  # seq_len is the launch's metadata
    wait_for_predecessor(PDL)
    _merge_splits(MO, ML, OUT, b, tl.program_id(1), used, H, D, BLOCK_D, SPLITS, "")


_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


def split_counters(device: torch.device, numel: int) -> torch.Tensor:
    """Zeroed int32 counters (one per row x head) for the in-kernel merge of KV splits; launches leave them zero, so
    one buffer per device serves all (a larger need allocates a larger one; older ones stay for their graphs)."""
    held = _COUNTERS.setdefault(device, [])
    if not held or held[-1].numel() < numel:
        held.append(torch.zeros(max(numel, 1 << 15), device=device, dtype=torch.int32))
    return held[-1]


def _splits_and_partials(n: int, heads: int, d: int, splits: int | None, out: torch.Tensor, counters: bool
                         ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split count, the merge's fp32 partials and (in-kernel merge) its counters; ``out`` stands in for the rest."""
    splits = splits or decode_splits(n, heads, d)
    if splits == 1:
        return 1, out, out, out
    return (splits, torch.empty((n, heads, splits, d), device=out.device, dtype=torch.float32),
            torch.empty((n, heads, splits), device=out.device, dtype=torch.float32),
            split_counters(out.device, n * heads) if counters else out)


def decode_tile(d: int) -> tuple[int, int]:
    """Positions per tile and warps per program of :func:`decode_attention` for ``d``-wide heads."""
    return DECODE_TILES[1 if head_parts(d)[1] == 0 else 2]


def decode_attention(q: torch.Tensor, cache: PagedKVCache, block_table: torch.Tensor,
                     layer_base: torch.Tensor, layer: int, seq_len: torch.Tensor, scale: float,
                     splits: int | None = None, min_split: int = MIN_SPLIT_POSITIONS, block: int | None = None,
                     parts: tuple[int, int] | None = None) -> torch.Tensor:
    """See :func:`executor.ops.decode_attention`. ``splits`` (:func:`cdbsim.latency.gpu_work.decode_splits`),
    ``min_split`` (fewest positions a split covers), ``block`` and ``parts`` override the launch shape."""
    q = q.contiguous()
    n, heads, d = q.shape
    geo = cache.geometry
    assert geo.block_size == PAGE, "split boundaries are whole KV pages"
    out = torch.empty_like(q)
    splits, mid_o, mid_l, _ = _splits_and_partials(n, heads, d, splits, out, counters=False)
    da, db = parts or head_parts(d)
    default_block, warps = decode_tile(d)
    pdl = pdl_mode(q)
    _decode_attn_kernel[(n, heads, splits)](
        q, cache.k, cache.v, block_table, layer_base, seq_len, mid_o, mid_l, out, layer, geo.pages_per_layer,
        scale, block_table.stride(0), H=heads, KVH=cache.kv_heads, D=d, DA=da, DB=db, PAGE=geo.block_size,
        BLOCK=block or default_block, SPLITS=splits, MIN_PER=min_split, PDL=pdl, EVICT=DECODE_EVICT,
        num_warps=warps, **launch_options(pdl))
    if splits > 1:
        _decode_attn_merge[(n, heads)](mid_o, mid_l, out, seq_len, H=heads, D=d, BLOCK_D=triton.next_power_of_2(d),
                                       SPLITS=splits, MIN_PER=min_split, PAGE=geo.block_size, PDL=min(pdl, EARLY),
                                       num_warps=1, **launch_options(pdl))
    return out.reshape(n, heads * d)


def rope_decode_attention(qkv: torch.Tensor, q_bias: torch.Tensor | None, k_bias: torch.Tensor | None,
                          pos: torch.Tensor, rope: RopeTable, cache: PagedKVCache, row0: torch.Tensor,
                          layer_base: torch.Tensor, layer: int, fill: torch.Tensor, max_fill: int,
                          block_table: torch.Tensor, seq_len: torch.Tensor, scale: float,
                          splits: int | None = None, min_split: int = MIN_SPLIT_POSITIONS) -> torch.Tensor:
    """See :func:`executor.ops.rope_decode_attention`; every row attends up to its own position ``pos``
    (``seq_len = pos + 1``). ``splits`` and ``min_split`` as in :func:`decode_attention`."""
    qkv = qkv.contiguous()
    kvh, d = cache.kv_heads, cache.head_dim
    n, heads = qkv.shape[0], qkv.shape[1] // d - 2 * kvh
    geo = cache.geometry
    assert geo.block_size == PAGE, "split boundaries are whole KV pages"
    out = torch.empty((n, heads, d), device=qkv.device, dtype=qkv.dtype)
    splits, mid_o, mid_l, counters = _splits_and_partials(n, heads, d, splits, out, counters=True)
    has_bias = q_bias is not None
    pdl = pdl_mode(qkv)
    _rope_decode_attn_kernel[(n, heads, splits)](
        qkv, q_bias if has_bias else qkv, k_bias if has_bias else qkv, pos, rope.cos, rope.sin, row0, fill,
        cache.k, cache.v, block_table, layer_base, seq_len, mid_o, mid_l, counters, out, layer, geo.rows_per_layer,
        geo.core * geo.rows_per_layer, qkv.stride(0), geo.pages_per_layer, scale, block_table.stride(0),
        H=heads, KVH=kvh, D=d, BLOCK_D=triton.next_power_of_2(d), HALF=d // 2, HAS_BIAS=has_bias,
        INTERLEAVED=rope.interleaved, PAGE=geo.block_size, BLOCK=BLOCK_N, SPLITS=splits,
        MIN_PER=min_split, PDL=pdl, num_warps=4, **launch_options(pdl))
    return out.reshape(n, heads * d)
