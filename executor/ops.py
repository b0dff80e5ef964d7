"""The executor's elementwise and attention primitives in two interchangeable backends: ``torch`` (plain PyTorch,
anywhere; the CPU correctness path) and ``triton`` (the same signatures as fused GPU kernels, :class:`Ops`).

KV addressing (:mod:`executor.kv_cache`): a token's row in cache layer ``layer_base[i] + layer`` is
``(layer_base[i] + layer) * rows_per_layer + row0[i]``; with ``fill[i] = f`` it also writes rows
``+ k * core * rows_per_layer`` for ``k = 1..f`` (the last-exited fill, done at write time).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from types import SimpleNamespace

import torch

from executor.kv_cache import PagedKVCache
from executor.prefill import PrefillMeta
from executor.rope import RopeTable


def to_device(array, device: torch.device) -> torch.Tensor:
    """A host array on ``device`` without blocking the host: through pinned memory on CUDA (a copy from
    pageable memory would wait for the stream's queued work and break the host/device overlap)."""
    tensor = torch.as_tensor(array)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as both authors' models round it: normalised in float32, rounded to ``x``'s dtype, then times the
    weight and rounded again (``modeling_ouro.py``: ``weight * h.to(dtype)``; Huginn: ``norm(x.float()).type_as(x) *
    weight``)."""
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (normed.float() * w.float()).to(x.dtype)


def residual_norm(branch: torch.Tensor, x: torch.Tensor, w_post: torch.Tensor, w_next: torch.Tensor | None,
                  eps: float, sandwich: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Close a block branch: ``x + norm_post(branch)`` (sandwich, Ouro) or ``norm_post(branch + x)`` (Huginn), each
    sum rounded to ``x``'s dtype as the authors' code adds; returns the new residual and, if ``w_next`` is given,
    ``norm_next`` of it (the next pre-norm)."""
    if sandwich:
        x_new = (x.float() + rms_norm(branch.to(x.dtype), w_post, eps).float()).to(x.dtype)
    else:
        x_new = rms_norm((branch.float() + x.float()).to(x.dtype), w_post, eps)
    return x_new, (rms_norm(x_new, w_next, eps) if w_next is not None else None)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of a fused ``[..., 2I]`` projection (gate first, as Huginn's ``fc``)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate_up.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[N, heads, D]`` with per-row ``cos``/``sin`` ``[N, D/2]``."""
    xf = x.float()
    x0, x1 = (xf[..., 0::2], xf[..., 1::2]) if interleaved else xf.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    r0, r1 = x0 * c - x1 * s, x1 * c + x0 * s
    out = torch.stack((r0, r1), dim=-1).flatten(-2) if interleaved else torch.cat((r0, r1), dim=-1)
    return out.to(x.dtype)


def rope_write_kv(qkv: torch.Tensor, q_bias: torch.Tensor | None, k_bias: torch.Tensor | None,
                  pos: torch.Tensor, rope: RopeTable, cache: PagedKVCache, row0: torch.Tensor,
                  layer_base: torch.Tensor, layer: int, fill: torch.Tensor, max_fill: int) -> torch.Tensor:
    """Add the q/k bias, rotate q and k, write k and v into the cache; returns q ``[N, heads, D]``."""
    kvh, d = cache.kv_heads, cache.head_dim
    n, heads = qkv.shape[0], qkv.shape[1] // d - 2 * kvh
    q, k, v = qkv.split((heads * d, kvh * d, kvh * d), dim=-1)
    q, k, v = q.reshape(n, heads, d), k.reshape(n, kvh, d), v.reshape(n, kvh, d)
    if q_bias is not None:
        q = q + q_bias.view(heads, d)
        k = k + k_bias.view(kvh, d)
    cos, sin = rope.cos[pos.long()], rope.sin[pos.long()]
    q, k = rotate(q, cos, sin, rope.interleaved), rotate(k, cos, sin, rope.interleaved)
    geo = cache.geometry
    dst = (layer_base.long() + layer) * geo.rows_per_layer + row0.long()
    cache.write_rows(dst, k, v)
    stride = geo.core * geo.rows_per_layer
    for j in range(1, max_fill + 1):
        extra = torch.where(fill >= j, dst + j * stride, torch.full_like(dst, geo.trash_row))
        cache.write_rows(extra, k, v)
    return q


def decode_attention(q: torch.Tensor, cache: PagedKVCache, block_table: torch.Tensor,
                     layer_base: torch.Tensor, layer: int, seq_len: torch.Tensor, scale: float
                     ) -> torch.Tensor:
    """Each row ``i`` attends positions ``0 .. seq_len[i]-1`` of cache layer ``layer_base[i] + layer`` through its
    block-table row (so one call mixes loop steps). Returns ``[N, heads * D]``."""
    geo = cache.geometry
    n, heads, d = q.shape
    pages = (layer_base.long() + layer)[:, None] * geo.pages_per_layer + block_table.long()
    k = cache.k_pages[pages].flatten(1, 2)
    v = cache.v_pages[pages].flatten(1, 2)
    if heads != cache.kv_heads:
        k = k.repeat_interleave(heads // cache.kv_heads, dim=2)
        v = v.repeat_interleave(heads // cache.kv_heads, dim=2)
    scores = torch.einsum("nhd,nthd->nht", q.float(), k.float()) * scale
    visible = torch.arange(k.shape[1], device=q.device)[None, :] < seq_len.long()[:, None]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    out = torch.einsum("nht,nthd->nhd", torch.softmax(scores, dim=-1), v.float())
    return out.to(q.dtype).reshape(n, heads * d)


def rope_decode_attention(qkv: torch.Tensor, q_bias: torch.Tensor | None, k_bias: torch.Tensor | None,
                          pos: torch.Tensor, rope: RopeTable, cache: PagedKVCache, row0: torch.Tensor,
                          layer_base: torch.Tensor, layer: int, fill: torch.Tensor, max_fill: int,
                          block_table: torch.Tensor, seq_len: torch.Tensor, scale: float) -> torch.Tensor:
    """:func:`rope_write_kv` then :func:`decode_attention` (the triton backend does both in one kernel)."""
    q = rope_write_kv(qkv, q_bias, k_bias, pos, rope, cache, row0, layer_base, layer, fill, max_fill)
    return decode_attention(q, cache, block_table, layer_base, layer, seq_len, scale)


def prefill_attention(q: torch.Tensor, cache: PagedKVCache, meta: PrefillMeta, layer: int, scale: float
                      ) -> torch.Tensor:
    """Packed prefill attention: chunk ``c``'s query ``i`` attends positions ``0 .. start + i`` of cache ``layer``;
    rows in no chunk are zero. ``[T, heads * D]``. Loops over chunks on the host (no CUDA graph)."""
    geo = cache.geometry
    tokens, heads, d = q.shape
    out = torch.zeros_like(q)
    for c, (start, n, off) in enumerate(zip(meta.start.tolist(), meta.length.tolist(), meta.qoff.tolist(),
                                            strict=True)):
        if n <= 0:
            continue
        kv_len = start + n
        pages = layer * geo.pages_per_layer + meta.block_table[c, : -(-kv_len // geo.block_size)].long()
        k = cache.k_pages[pages].flatten(0, 1)[:kv_len].float()
        v = cache.v_pages[pages].flatten(0, 1)[:kv_len].float()
        if heads != cache.kv_heads:
            k = k.repeat_interleave(heads // cache.kv_heads, dim=1)
            v = v.repeat_interleave(heads // cache.kv_heads, dim=1)
        scores = torch.einsum("nhd,thd->hnt", q[off: off + n].float(), k) * scale
        visible = torch.arange(kv_len, device=q.device)[None, :] <= start + torch.arange(n, device=q.device)[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[off: off + n] = torch.einsum("hnt,thd->nhd", torch.softmax(scores, dim=-1), v).to(q.dtype)
    return out.reshape(tokens, heads * d)


# skinny matmuls with the op feeding them fused in (the triton backend's executor.chain); here composed
def gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w)


def gemv_rmsnorm(x: torch.Tensor, w_norm: torch.Tensor, eps: float, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(rms_norm(x, w_norm, eps), w)


def gemv_residual(branch: torch.Tensor, x: torch.Tensor, w_post: torch.Tensor, w_next: torch.Tensor, eps: float,
                  sandwich: bool, w: torch.Tensor, swiglu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    x_new, h = residual_norm(branch, x, w_post, w_next, eps, sandwich)
    return _few_linear(h, w, swiglu), x_new


class Ops:
    """The primitives of one backend, ``"torch"`` or ``"triton"``. Batches of at most ``fuse_rows`` rows run layers
    as four skinny matmuls with norms, residual adds and SwiGLU fused in (:meth:`executor.model.Layer.forward_fused`,
    on triton :mod:`executor.chain`); other launches of at most ``few_rows`` rows project on :mod:`executor.few_rows`.
    Both 0 (off) unless given (:func:`executor.model.default_ops` picks the models' defaults)."""

    def __init__(self, backend: str = "torch", fuse_rows: int | None = None, few_rows: int | None = None) -> None:
        if backend not in ("torch", "triton"):
            raise ValueError(f"unknown ops backend {backend!r}; expected 'torch' or 'triton'")
        self.backend = backend
        self.fuse_rows = fuse_rows or 0
        self.few_rows = few_rows or 0
        self._fused_attention_rows: int | None = None
        self._pdl_behind = None
        skinny = few = pointwise = decode = prefill = _TorchOps
        if backend == "triton":  # Triton is optional: imported only for its backend
            from executor import chain as skinny
            from executor import few_rows as few
            from executor import triton_decode as decode
            from executor import triton_pointwise as pointwise
            from executor import triton_prefill as prefill
            for name, value, most in (("fuse_rows", self.fuse_rows, skinny.MAX_ROWS),
                                      ("few_rows", self.few_rows, few.MAX_ROWS)):
                if not 0 <= value <= most:  # the torch backend composes either path at any size
                    raise ValueError(f"{name} must be 0..{most} on the triton backend, got {value}")
            self._pdl_behind = skinny.pdl_behind
        self._few_linear = few.linear
        self.gemv = skinny.gemv
        self.gemv_rmsnorm = skinny.gemv_rmsnorm
        self.gemv_residual = skinny.gemv_residual
        self.rms_norm = pointwise.rms_norm
        self.residual_norm = pointwise.residual_norm
        self.silu_mul = pointwise.silu_mul
        self.rope_write_kv = pointwise.rope_write_kv
        self.decode_attention = decode.decode_attention
        self.rope_decode_attention = decode.rope_decode_attention
        self.prefill_attention = prefill.prefill_attention

    @property
    def fused_attention_rows(self) -> int:
        """Decode launches of at most this many rows (``fuse_rows`` unless set) run :meth:`rope_decode_attention`,
        larger ones :meth:`rope_write_kv` then :meth:`decode_attention`."""
        return self.fuse_rows if self._fused_attention_rows is None else self._fused_attention_rows

    @fused_attention_rows.setter
    def fused_attention_rows(self, rows: int | None) -> None:
        self._fused_attention_rows = rows

    def pdl_scope(self, rows: int) -> AbstractContextManager[None]:
        """A block of a launch of ``rows`` rows: its Triton kernels are PDL-launched only if its projections are
        this package's kernels, not cuBLAS (:func:`executor.chain.pdl_behind`)."""
        if self._pdl_behind is None:
            return nullcontext()
        return self._pdl_behind(rows <= max(self.fuse_rows, self.few_rows))

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``x @ w.T``: the few-row matmul for launches of at most ``few_rows`` rows, else ``F.linear``."""
        if x.shape[0] <= self.few_rows:
            return self._few_linear(x.contiguous(), w)
        return torch.nn.functional.linear(x, w)

    def linear_swiglu(self, x: torch.Tensor, w_gate_up: torch.Tensor) -> torch.Tensor:
        """``silu_mul(x @ w_gate_up.T)``: one few-row matmul with the SwiGLU in its epilogue for launches of at
        most ``few_rows`` rows, else a GEMM and the SwiGLU kernel."""
        if x.shape[0] <= self.few_rows:
            return self._few_linear(x.contiguous(), w_gate_up, swiglu=True)
        return self.silu_mul(torch.nn.functional.linear(x, w_gate_up))


def _few_linear(x: torch.Tensor, w: torch.Tensor, swiglu: bool = False) -> torch.Tensor:
    out = torch.nn.functional.linear(x, w)
    return silu_mul(out) if swiglu else out


_TorchOps = SimpleNamespace(linear=_few_linear, **{f.__name__: f for f in (
    rms_norm, residual_norm, silu_mul, rope_write_kv, decode_attention, rope_decode_attention, prefill_attention, gemv,
    gemv_rmsnorm, gemv_residual)})


def default_backend(device: torch.device | str) -> str:
    """``triton`` on CUDA when Triton imports, else ``torch``."""
    if torch.device(device).type != "cuda":
        return "torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "torch"
    return "triton"
