"""Fused GPU kernels (Triton) with the same signatures as the torch backend in :mod:`executor.ops`.

* ``rms_norm`` and ``residual_norm``: one row per program. ``residual_norm`` closes a block branch and opens
  the next in one pass (Ouro: ``x + norm(branch)``; Huginn: ``norm(branch + x)``; then the next pre-norm),
  so the residual stream is read and written once per branch instead of four or five times.
* ``silu_mul``: ``silu(gate) * up`` over the fused gate/up projection.
* ``rope_write_kv``: q/k bias, RoPE (rotate-half or interleaved pairs) and the paged K/V write in one
  kernel, one program per (row, head); an exiting token with ``fill = f`` writes its K/V into its slot and
  the ``f`` deeper slots (the last-exited fill) in the same program.
* ``decode_attention``: split-KV paged decode attention (two stages, after SGLang's decode_attention and
  vLLM's unified attention). Program (row, head, split) walks its share of the row's positions in tiles of
  ``BLOCK_N`` tokens, translating each through the row's own block-table row and cache layer
  (``layer_base[row] + layer``) - so one launch mixes rows at different loop steps - and keeps an online
  softmax; a second kernel merges the splits by their log-sum-exp. With one split the first kernel writes
  the output directly. The grid's split count comes from rows x heads only (never from lengths), so the
  launch shape is fixed for a CUDA graph; how many splits of a row do work depends on its context
  (:mod:`cdbsim.attention`), so short contexts do not pay for long ones' parallelism.

Runs on CUDA, and on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests check the kernels without a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cdbsim.attention import MIN_SPLIT_POSITIONS, PAGE, decode_splits
from executor.kv_cache import PagedKVCache
from executor.ops import RopeTable

BLOCK_N = 64


# ----- norms and activation --------------------------------------------------------------------------
@triton.jit
def _rms_norm_kernel(X, W, Y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(Y + row * n_cols + cols, (x * inv * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _residual_norm_kernel(A, X, WP, WN, XO, HO, n_cols, eps, SANDWICH: tl.constexpr, HAS_NEXT: tl.constexpr,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    a = tl.load(A + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    wp = tl.load(WP + cols, mask=mask, other=0.0).to(tl.float32)
    if SANDWICH:
        x = x + a * tl.rsqrt(tl.sum(a * a, axis=0) / n_cols + eps) * wp
    else:
        s = a + x
        x = s * tl.rsqrt(tl.sum(s * s, axis=0) / n_cols + eps) * wp
    xr = x.to(XO.dtype.element_ty)
    tl.store(XO + row * n_cols + cols, xr, mask=mask)
    if HAS_NEXT:
        x = xr.to(tl.float32)
        wn = tl.load(WN + cols, mask=mask, other=0.0).to(tl.float32)
        h = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * wn
        tl.store(HO + row * n_cols + cols, h.to(HO.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(GU, Y, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(GU + row * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(Y + row * inter + cols, y.to(Y.dtype.element_ty), mask=mask)


def _norm_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    n_cols = x.shape[-1]
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n_cols)
    _rms_norm_kernel[(x.numel() // n_cols,)](x, w, y, n_cols, eps, BLOCK=block, num_warps=_norm_warps(block))
    return y


def residual_norm(branch: torch.Tensor, x: torch.Tensor, w_post: torch.Tensor, w_next: torch.Tensor | None,
                  eps: float, sandwich: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    branch, x = branch.contiguous(), x.contiguous()
    n_cols = x.shape[-1]
    x_out = torch.empty_like(x)
    h_out = torch.empty_like(x) if w_next is not None else x_out
    block = triton.next_power_of_2(n_cols)
    _residual_norm_kernel[(x.numel() // n_cols,)](
        branch, x, w_post, w_next if w_next is not None else w_post, x_out, h_out, n_cols, eps,
        SANDWICH=sandwich, HAS_NEXT=w_next is not None, BLOCK=block, num_warps=_norm_warps(block))
    return x_out, (h_out if w_next is not None else None)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * inter)
    y = torch.empty((*gate_up.shape[:-1], inter), device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, y, inter, BLOCK=block, num_warps=4)
    return y


# ----- RoPE + KV write -------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["layer"])
def _rope_kv_kernel(QKV, QB, KB, POS, COS, SIN, QO, KC, VC, ROW0, LB, FILL,
                    layer, rows_per_layer, slot_stride, qkv_stride,
                    H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                    BLOCK_HALF: tl.constexpr, HAS_BIAS: tl.constexpr, INTERLEAVED: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    i = tl.arange(0, BLOCK_HALF)
    m = i < HALF
    pos = tl.load(POS + b).to(tl.int64)
    c = tl.load(COS + pos * HALF + i, mask=m, other=0.0)
    s = tl.load(SIN + pos * HALF + i, mask=m, other=0.0)
    if INTERLEAVED:
        o0 = 2 * i
        o1 = 2 * i + 1
    else:
        o0 = i
        o1 = i + HALF
    if h < H:
        src = QKV + b * qkv_stride + h * D
        x0 = tl.load(src + o0, mask=m, other=0.0).to(tl.float32)
        x1 = tl.load(src + o1, mask=m, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x0 += tl.load(QB + h * D + o0, mask=m, other=0.0).to(tl.float32)
            x1 += tl.load(QB + h * D + o1, mask=m, other=0.0).to(tl.float32)
        dst = QO + (b * H + h) * D
        tl.store(dst + o0, (x0 * c - x1 * s).to(QO.dtype.element_ty), mask=m)
        tl.store(dst + o1, (x1 * c + x0 * s).to(QO.dtype.element_ty), mask=m)
    else:
        kh = h - H
        src = QKV + b * qkv_stride + (H + kh) * D
        x0 = tl.load(src + o0, mask=m, other=0.0).to(tl.float32)
        x1 = tl.load(src + o1, mask=m, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x0 += tl.load(KB + kh * D + o0, mask=m, other=0.0).to(tl.float32)
            x1 += tl.load(KB + kh * D + o1, mask=m, other=0.0).to(tl.float32)
        k0 = (x0 * c - x1 * s).to(KC.dtype.element_ty)
        k1 = (x1 * c + x0 * s).to(KC.dtype.element_ty)
        vsrc = QKV + b * qkv_stride + (H + KVH + kh) * D
        v0 = tl.load(vsrc + o0, mask=m, other=0.0).to(VC.dtype.element_ty)
        v1 = tl.load(vsrc + o1, mask=m, other=0.0).to(VC.dtype.element_ty)
        cache_layer = tl.load(LB + b).to(tl.int64) + layer
        row = cache_layer * rows_per_layer + tl.load(ROW0 + b).to(tl.int64)
        fill = tl.load(FILL + b)
        for j in range(0, fill + 1):
            dst = (row + j * slot_stride) * (KVH * D) + kh * D
            tl.store(KC + dst + o0, k0, mask=m)
            tl.store(KC + dst + o1, k1, mask=m)
            tl.store(VC + dst + o0, v0, mask=m)
            tl.store(VC + dst + o1, v1, mask=m)


def rope_write_kv(qkv: torch.Tensor, q_bias: torch.Tensor | None, k_bias: torch.Tensor | None,
                  pos: torch.Tensor, rope: RopeTable, cache: PagedKVCache, row0: torch.Tensor,
                  layer_base: torch.Tensor, layer: int, fill: torch.Tensor, max_fill: int) -> torch.Tensor:
    """See :func:`executor.ops.rope_write_kv`; ``max_fill`` is not needed (each row reads its own fill)."""
    qkv = qkv.contiguous()
    kvh, d = cache.kv_heads, cache.head_dim
    n = qkv.shape[0]
    heads = qkv.shape[1] // d - 2 * kvh
    q = torch.empty((n, heads, d), device=qkv.device, dtype=qkv.dtype)
    geo = cache.geometry
    half = d // 2
    has_bias = q_bias is not None
    _rope_kv_kernel[(n, heads + kvh)](
        qkv, q_bias if has_bias else qkv, k_bias if has_bias else qkv, pos, rope.cos, rope.sin, q,
        cache.k, cache.v, row0, layer_base, fill, layer, geo.rows_per_layer, geo.core * geo.rows_per_layer,
        qkv.stride(0), H=heads, KVH=kvh, D=d, HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        HAS_BIAS=has_bias, INTERLEAVED=rope.interleaved, num_warps=1)
    return q


# ----- paged decode attention ------------------------------------------------------------------------
@triton.jit
def _split_positions(seq, SPLITS: tl.constexpr, MIN_PER: tl.constexpr, PAGE: tl.constexpr):
    """Positions per split of a row, as cdbsim.attention.split_positions counts them."""
    per = tl.maximum(tl.cdiv(seq, SPLITS), MIN_PER)
    return tl.cdiv(per, PAGE) * PAGE


@triton.jit(do_not_specialize=["layer"])
def _decode_attn_kernel(Q, KC, VC, BT, LB, SL, MO, ML, OUT, layer, pages_per_layer, scale, bt_stride,
                        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                        PAGE: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr, MIN_PER: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    split = tl.program_id(2)
    kvh = h // (H // KVH)
    seq = tl.load(SL + b)
    per = _split_positions(seq, SPLITS, MIN_PER, PAGE)
    start = split * per
    end = tl.minimum(start + per, seq)  # start >= end: a split past the context, which does nothing
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + (b * H + h) * D + d, mask=dm, other=0.0).to(tl.float32) * scale
    page_base = (tl.load(LB + b).to(tl.int64) + layer) * pages_per_layer
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for t0 in range(start, end, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        tm = t < end
        blk = tl.load(BT + b * bt_stride + t // PAGE, mask=tm, other=0).to(tl.int64)
        row = (page_base + blk) * PAGE + t % PAGE
        off = row[:, None] * (KVH * D) + kvh * D + d[None, :]
        km = tm[:, None] & dm[None, :]
        k = tl.load(KC + off, mask=km, other=0.0).to(tl.float32)
        v = tl.load(VC + off, mask=km, other=0.0).to(tl.float32)  # issued with K: both reads in flight
        s = tl.sum(k * q[None, :], axis=1)
        s = tl.where(tm, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    if SPLITS == 1:
        tl.store(OUT + (b * H + h) * D + d, (acc / l_i).to(OUT.dtype.element_ty), mask=dm)
    else:
        idx = (b * H + h) * SPLITS + split
        nonempty = l_i > 0.0  # an empty split writes a zero weight (log-sum-exp -inf) for the merge
        safe = tl.where(nonempty, l_i, 1.0)
        tl.store(MO + idx * D + d, acc / safe, mask=dm)
        tl.store(ML + idx, tl.where(nonempty, m_i + tl.log(safe), -float("inf")))


@triton.jit
def _decode_attn_merge(MO, ML, OUT, H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                       SPLITS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    base = (b * H + h) * SPLITS
    m = tl.load(ML + base)  # split 0 always holds position 0, so it is never empty
    acc = tl.load(MO + base * D + d, mask=dm, other=0.0)
    l_sum = 1.0
    for split in range(1, SPLITS):
        lse = tl.load(ML + base + split)
        o = tl.load(MO + (base + split) * D + d, mask=dm, other=0.0)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)
        acc = acc * alpha + o * w
        l_sum = l_sum * alpha + w
        m = m_new
    tl.store(OUT + (b * H + h) * D + d, (acc / l_sum).to(OUT.dtype.element_ty), mask=dm)


def decode_attention(q: torch.Tensor, cache: PagedKVCache, block_table: torch.Tensor,
                     layer_base: torch.Tensor, layer: int, seq_len: torch.Tensor, scale: float,
                     splits: int | None = None, min_split: int = MIN_SPLIT_POSITIONS) -> torch.Tensor:
    """See :func:`executor.ops.decode_attention`. ``splits`` overrides the grid's split count
    (:func:`cdbsim.attention.decode_splits`), ``min_split`` the fewest positions a split covers."""
    q = q.contiguous()
    n, heads, d = q.shape
    geo = cache.geometry
    assert geo.block_size == PAGE, "split boundaries are whole KV pages"
    splits = splits or decode_splits(n, heads)
    out = torch.empty_like(q)
    if splits > 1:
        mid_o = torch.empty((n, heads, splits, d), device=q.device, dtype=torch.float32)
        mid_l = torch.empty((n, heads, splits), device=q.device, dtype=torch.float32)
    else:
        mid_o = mid_l = out
    block_d = triton.next_power_of_2(d)
    _decode_attn_kernel[(n, heads, splits)](
        q, cache.k, cache.v, block_table, layer_base, seq_len, mid_o, mid_l, out, layer, geo.pages_per_layer,
        scale, block_table.stride(0), H=heads, KVH=cache.kv_heads, D=d, BLOCK_D=block_d, PAGE=geo.block_size,
        BLOCK=BLOCK_N, SPLITS=splits, MIN_PER=min_split, num_warps=4)
    if splits > 1:
        _decode_attn_merge[(n, heads)](mid_o, mid_l, out, H=heads, D=d, BLOCK_D=block_d, SPLITS=splits,
                                       num_warps=1)
    return out.reshape(n, heads * d)


# ----- packed prefill attention ----------------------------------------------------------------------
@triton.jit(do_not_specialize=["layer"])
def _prefill_attn_kernel(Q, KC, VC, OUT, BT, START, LEN, QOFF, ICHUNK, IQ0, layer, pages_per_layer, scale,
                         bt_stride, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                         PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         PRECISION: tl.constexpr):
    item = tl.program_id(0)
    h = tl.program_id(1)
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
        d = tl.arange(0, BLOCK_D)
        dm = d < D
        q_rows = (qoff + i).to(tl.int64)
        q = tl.load(Q + (q_rows[:, None] * H + h) * D + d[None, :], mask=im[:, None] & dm[None, :], other=0.0)
        q_pos = start + i
        end = tl.minimum(start + q0 + BLOCK_M, start + length)  # keys this tile can see: 0 .. end - 1
        page_base = layer.to(tl.int64) * pages_per_layer
        m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for j0 in range(0, end, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            jm = j < end
            blk = tl.load(BT + c * bt_stride + j // PAGE, mask=jm, other=0).to(tl.int64)
            row = (page_base + blk) * PAGE + j % PAGE
            off = row[:, None] * (KVH * D) + kvh * D + d[None, :]
            kvm = jm[:, None] & dm[None, :]
            k = tl.load(KC + off, mask=kvm, other=0.0)
            v = tl.load(VC + off, mask=kvm, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            # every row sees key 0 (its first tile), so the running max is finite after the first tile
            s = tl.where((j[None, :] <= q_pos[:, None]) & jm[None, :], s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(OUT + (q_rows[:, None] * H + h) * D + d[None, :], out.to(OUT.dtype.element_ty),
                 mask=im[:, None] & dm[None, :])


def prefill_attention(q: torch.Tensor, cache: PagedKVCache, meta, layer: int, scale: float) -> torch.Tensor:
    """See :func:`executor.ops.prefill_attention`; one program per (work item, head), no host sync, so
    it runs inside a CUDA graph. ``meta`` is an :class:`executor.prefill.PrefillMeta`."""
    from executor.prefill import BLOCK_M

    q = q.contiguous()
    tokens, heads, d = q.shape
    geo = cache.geometry
    out = torch.zeros_like(q)
    table = meta.block_table
    _prefill_attn_kernel[(meta.item_chunk.shape[0], heads)](
        q, cache.k, cache.v, out, table, meta.start, meta.length, meta.qoff, meta.item_chunk, meta.item_q0,
        layer, geo.pages_per_layer, scale, table.stride(0), H=heads, KVH=cache.kv_heads, D=d,
        BLOCK_D=max(16, triton.next_power_of_2(d)), PAGE=geo.block_size, BLOCK_M=BLOCK_M, BLOCK_N=64,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4, num_stages=2)
    return out.reshape(tokens, heads * d)
