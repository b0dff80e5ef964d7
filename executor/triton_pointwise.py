"""Triton kernels of the row-wise ops, with the signatures of the torch backend in :mod:`executor.ops`: ``rms_norm``,
``residual_norm`` (closes a block branch and opens the next in one pass), ``silu_mul`` and ``rope_write_kv`` (q/k
bias, RoPE and the paged K/V write, with the last-exited fill), plus the paged-KV addressing the attention kernels
share. Each waits for its predecessor under PDL; CPU tensors run under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from executor.chain import launch_options, normed, pdl_enabled, rounded, wait_for_predecessor
from executor.kv_cache import PagedKVCache
from executor.rope import RopeTable


@triton.jit
def _rms_norm_kernel(X, W, Y, n_cols, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_predecessor(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(Y + row * n_cols + cols, normed(x, inv, w, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _residual_norm_kernel(A, X, WP, WN, XO, HO, n_cols, eps, SANDWICH: tl.constexpr, HAS_NEXT: tl.constexpr,
                          BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_predecessor(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dt = XO.dtype.element_ty
    a = tl.load(A + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    wp = tl.load(WP + cols, mask=mask, other=0.0).to(tl.float32)
    if SANDWICH:  # x + norm(a)
        x = rounded(x + normed(a, tl.rsqrt(tl.sum(a * a, axis=0) / n_cols + eps), wp, dt), dt)
    else:  # norm(a + x), the sum rounded first
        s = rounded(a + x, dt)
        x = normed(s, tl.rsqrt(tl.sum(s * s, axis=0) / n_cols + eps), wp, dt)
    tl.store(XO + row * n_cols + cols, x.to(dt), mask=mask)
    if HAS_NEXT:
        wn = tl.load(WN + cols, mask=mask, other=0.0).to(tl.float32)
        h = normed(x, tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps), wn, dt)
        tl.store(HO + row * n_cols + cols, h.to(HO.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(GU, Y, inter, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_predecessor(PDL)
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
    pdl = pdl_enabled(x)
    _rms_norm_kernel[(x.numel() // n_cols,)](x, w, y, n_cols, eps, BLOCK=block, PDL=pdl,
                                             num_warps=_norm_warps(block), **launch_options(pdl))
    return y


def residual_norm(branch: torch.Tensor, x: torch.Tensor, w_post: torch.Tensor, w_next: torch.Tensor | None,
                  eps: float, sandwich: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    branch, x = branch.contiguous(), x.contiguous()
    n_cols = x.shape[-1]
    x_out = torch.empty_like(x)
    h_out = torch.empty_like(x) if w_next is not None else x_out
    block = triton.next_power_of_2(n_cols)
    pdl = pdl_enabled(x)
    _residual_norm_kernel[(x.numel() // n_cols,)](
        branch, x, w_post, w_next if w_next is not None else w_post, x_out, h_out, n_cols, eps,
        SANDWICH=sandwich, HAS_NEXT=w_next is not None, BLOCK=block, PDL=pdl, num_warps=_norm_warps(block),
        **launch_options(pdl))
    return x_out, (h_out if w_next is not None else None)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * inter)
    y = torch.empty((*gate_up.shape[:-1], inter), device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    pdl = pdl_enabled(gate_up)
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, y, inter, BLOCK=block, PDL=pdl, num_warps=4,
                                                        **launch_options(pdl))
    return y


@triton.jit
def _kv_offset(page, offset, kvh, KVH: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr):
    """Element offset of KV head ``kvh`` at position ``offset`` (0-15) of global page ``page`` (cache layer
    x pages per layer + block): pages are head-major, ``[page, KVH, PAGE, D]`` (:mod:`executor.kv_cache`)."""
    return ((page * KVH + kvh) * PAGE + offset) * D


@triton.jit
def _row_offset(row, kvh, KVH: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr):
    """:func:`_kv_offset` of cache row ``row`` (global page x ``PAGE`` + position in the page)."""
    return _kv_offset(row // PAGE, row % PAGE, kvh, KVH, D, PAGE)


@triton.jit
def _load_pairs(src, rows_ok, HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
                INTERLEAVED: tl.constexpr):
    """The rotation pairs ``(x0, x1)`` ``[BLOCK_T, BLOCK_HALF]`` of the heads at ``src``: elements ``2i, 2i + 1``
    (interleaved: read whole and split in registers, not by slow stride-2 loads) or ``i, i + HALF``."""
    if INTERLEAVED:
        d = tl.arange(0, 2 * BLOCK_HALF)
        x = tl.load(src + d[None, :], mask=rows_ok[:, None] & (d < 2 * HALF)[None, :], other=0.0)
        x0, x1 = tl.split(tl.reshape(x, [BLOCK_T, BLOCK_HALF, 2]))
    else:
        i = tl.arange(0, BLOCK_HALF)
        m = rows_ok[:, None] & (i < HALF)[None, :]
        x0 = tl.load(src + i[None, :], mask=m, other=0.0)
        x1 = tl.load(src + HALF + i[None, :], mask=m, other=0.0)
    return x0, x1


@triton.jit
def _store_pairs(dst, x0, x1, rows_ok, HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    """Store pairs as :func:`_load_pairs` reads them (interleaved: joined back, one contiguous store)."""
    if INTERLEAVED:
        d = tl.arange(0, 2 * BLOCK_HALF)
        x = tl.reshape(tl.join(x0, x1), [BLOCK_T, 2 * BLOCK_HALF])
        tl.store(dst + d[None, :], x.to(dst.dtype.element_ty), mask=rows_ok[:, None] & (d < 2 * HALF)[None, :])
    else:
        i = tl.arange(0, BLOCK_HALF)
        m = rows_ok[:, None] & (i < HALF)[None, :]
        tl.store(dst + i[None, :], x0.to(dst.dtype.element_ty), mask=m)
        tl.store(dst + HALF + i[None, :], x1.to(dst.dtype.element_ty), mask=m)


@triton.jit
def _rotated_pairs(src, bias, rows_ok, c, s, HAS_BIAS: tl.constexpr, HALF: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """One head of q or k for ``BLOCK_T`` rows (plus ``bias``), rotated: fp32 pairs."""
    x0, x1 = _load_pairs(src, rows_ok, HALF, BLOCK_T, BLOCK_HALF, INTERLEAVED)
    x0, x1 = x0.to(tl.float32), x1.to(tl.float32)
    if HAS_BIAS:
        b0, b1 = _load_pairs(bias + tl.zeros([BLOCK_T, 1], dtype=tl.int32), rows_ok, HALF, BLOCK_T, BLOCK_HALF,
                             INTERLEAVED)
        x0, x1 = x0 + b0.to(tl.float32), x1 + b1.to(tl.float32)
    return x0 * c - x1 * s, x1 * c + x0 * s


@triton.jit(do_not_specialize=["layer"])
def _rope_kv_kernel(QKV, QB, KB, POS, COS, SIN, QO, KC, VC, ROW0, LB, FILL, n,
                    layer, rows_per_layer, slot_stride, qkv_stride,
                    H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                    BLOCK_HALF: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
                    INTERLEAVED: tl.constexpr, PAGE: tl.constexpr, PDL: tl.constexpr):
    """``BLOCK_T`` rows of one head: q rotated into ``QO``, or k rotated and v cached (own slot, ``FILL`` deeper)."""
    wait_for_predecessor(PDL)
    b = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    bm = b < n
    i = tl.arange(0, BLOCK_HALF)
    m = bm[:, None] & (i < HALF)[None, :]
    pos = tl.load(POS + b, mask=bm, other=0).to(tl.int64)
    c = tl.load(COS + pos[:, None] * HALF + i[None, :], mask=m, other=0.0)
    s = tl.load(SIN + pos[:, None] * HALF + i[None, :], mask=m, other=0.0)
    row_src = QKV + b[:, None] * qkv_stride
    if h < H:
        q0, q1 = _rotated_pairs(row_src + h * D, QB + h * D, bm, c, s, HAS_BIAS, HALF, BLOCK_T, BLOCK_HALF,
                                INTERLEAVED)
        _store_pairs(QO + (b[:, None] * H + h) * D, q0, q1, bm, HALF, BLOCK_T, BLOCK_HALF, INTERLEAVED)
    else:
        kh = h - H
        k0, k1 = _rotated_pairs(row_src + (H + kh) * D, KB + kh * D, bm, c, s, HAS_BIAS, HALF, BLOCK_T,
                                BLOCK_HALF, INTERLEAVED)
        v0, v1 = _load_pairs(row_src + (H + KVH + kh) * D, bm, HALF, BLOCK_T, BLOCK_HALF, INTERLEAVED)
        cache_layer = tl.load(LB + b, mask=bm, other=0).to(tl.int64) + layer
        row = cache_layer * rows_per_layer + tl.load(ROW0 + b, mask=bm, other=0).to(tl.int64)
        fill = tl.load(FILL + b, mask=bm, other=0)
        for j in range(0, tl.max(fill, axis=0) + 1):  # every row its own slot, then up to its fill
            dst = _row_offset(row + j * slot_stride, kh, KVH, D, PAGE)[:, None]
            mj = bm & (j <= fill)
            _store_pairs(KC + dst, k0, k1, mj, HALF, BLOCK_T, BLOCK_HALF, INTERLEAVED)
            _store_pairs(VC + dst, v0, v1, mj, HALF, BLOCK_T, BLOCK_HALF, INTERLEAVED)


ROPE_ROWS = 16  # rows per program of rope_write_kv (one row each leaves a long prefill latency-bound)


def rope_write_kv(qkv: torch.Tensor, q_bias: torch.Tensor | None, k_bias: torch.Tensor | None,
                  pos: torch.Tensor, rope: RopeTable, cache: PagedKVCache, row0: torch.Tensor,
                  layer_base: torch.Tensor, layer: int, fill: torch.Tensor, max_fill: int,
                  block_rows: int | None = None) -> torch.Tensor:
    """See :func:`executor.ops.rope_write_kv`; ``max_fill`` is not needed (each row reads its own fill).
    ``block_rows``: rows per program (default ``ROPE_ROWS``, fewer for a smaller launch)."""
    qkv = qkv.contiguous()
    kvh, d = cache.kv_heads, cache.head_dim
    n, heads = qkv.shape[0], qkv.shape[1] // d - 2 * kvh
    q = torch.empty((n, heads, d), device=qkv.device, dtype=qkv.dtype)
    geo = cache.geometry
    has_bias = q_bias is not None
    pdl = pdl_enabled(qkv)
    block = block_rows or min(ROPE_ROWS, triton.next_power_of_2(max(n, 1)))
    _rope_kv_kernel[(triton.cdiv(n, block), heads + kvh)](
        qkv, q_bias if has_bias else qkv, k_bias if has_bias else qkv, pos, rope.cos, rope.sin, q,
        cache.k, cache.v, row0, layer_base, fill, n, layer, geo.rows_per_layer, geo.core * geo.rows_per_layer,
        qkv.stride(0), H=heads, KVH=kvh, D=d, HALF=d // 2, BLOCK_HALF=triton.next_power_of_2(d // 2), BLOCK_T=block,
        HAS_BIAS=has_bias, INTERLEAVED=rope.interleaved, PAGE=geo.block_size, PDL=pdl,
        num_warps=1 if block <= 2 else 4, **launch_options(pdl))
    return q
