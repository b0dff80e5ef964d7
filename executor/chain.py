"""Skinny matmuls for launches of one or two rows, chained with programmatic dependent launch (PDL), and the PDL
helpers every Triton kernel of the executor uses.

A program holds ``TILES`` tiles of ``BLOCK_N`` output columns over all of ``K`` in registers and loads its first tile
before it waits for its predecessor; after the wait it builds each activation row from the predecessor's outputs (no
prologue, a norm, or a residual add and a norm). fp32 accumulation, intermediates rounded where the torch backend
rounds. CPU tensors run under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

TILE_ELEMENTS = 8192  # default weight elements per tile (16 KB of bf16; two tiles live per program)
PROGRAMS_PER_SM = 3  # default programs per SM: each keeps a tile load in flight
PROGRAMS_PER_SM_ROWS = 4  # the same for launches of more than one row (their tiles are smaller)

PLAIN, RMSNORM, RESIDUAL = 0, 1, 2
OPS = {"gemv": PLAIN, "rmsnorm": RMSNORM, "residual": RESIDUAL}


class ChainConfig(NamedTuple):
    """One launch configuration: output columns per tile (per half with SwiGLU), warps, tiles per program."""

    block_n: int
    num_warps: int
    tiles: int


# (op, N, K, rows) -> config tuned on the H200 (op "swiglu": the gate/up projection); lookup: config_for
CONFIGS: dict[tuple[str, int, int, int], ChainConfig] = {
    ("gemv", 6144, 2048, 1): ChainConfig(4, 8, 3),  # ouro.wqkv
    ("gemv", 2048, 2048, 1): ChainConfig(4, 4, 1),  # ouro.wo
    ("swiglu", 5632, 2048, 1): ChainConfig(2, 8, 11),  # ouro.gate_up
    ("gemv", 2048, 5632, 1): ChainConfig(2, 8, 2),  # ouro.down
    ("gemv", 49152, 2048, 1): ChainConfig(8, 8, 12),  # ouro.head
    ("gemv", 6144, 2048, 2): ChainConfig(8, 4, 3),  # ouro.wqkv
    ("gemv", 2048, 2048, 2): ChainConfig(8, 8, 1),  # ouro.wo
    ("swiglu", 5632, 2048, 2): ChainConfig(1, 4, 11),  # ouro.gate_up
    ("gemv", 2048, 5632, 2): ChainConfig(2, 4, 4),  # ouro.down
}


def split_k(k: int) -> tuple[int, int]:
    """``K`` as register pieces ``(K1, K2)``: the largest power of two <= ``K``, the rest rounded up to one (or 0)."""
    k1 = 1 << (k.bit_length() - 1)
    return k1, (triton.next_power_of_2(k - k1) if k > k1 else 0)


def default_config(n: int, k: int, swiglu: bool = False, sms: int = 132, tile_elements: int | None = None,
                   programs_per_sm: int | None = None, num_warps: int = 4, rows: int = 1) -> ChainConfig:
    """About ``tile_elements`` (default ``TILE_ELEMENTS / rows``) weights per tile, in a power of two of columns, and
    tiles per program for about ``programs_per_sm`` programs per SM (default by ``rows``)."""
    tile_elements = TILE_ELEMENTS // rows if tile_elements is None else tile_elements
    if programs_per_sm is None:
        programs_per_sm = PROGRAMS_PER_SM if rows == 1 else PROGRAMS_PER_SM_ROWS
    k1, k2 = split_k(k)
    block_n = max(1, tile_elements // ((k1 + k2) * (2 if swiglu else 1)))
    block_n = min(1 << (block_n.bit_length() - 1), triton.next_power_of_2(n))
    tiles = max(1, round(triton.cdiv(n, block_n) / (programs_per_sm * sms)))
    return ChainConfig(block_n, num_warps, tiles)


def config_for(op: str, n: int, k: int, swiglu: bool = False, sms: int = 132, rows: int = 1) -> ChainConfig:
    """The table entry of ``(op, n, k, rows)``, else the plain entry of the shape at those rows, else the default.
    A SwiGLU launch never takes a plain entry: its tile holds twice the weights and would spill registers."""
    entry = CONFIGS.get(("swiglu" if swiglu else op, n, k, rows))
    if entry is None and not swiglu:
        entry = CONFIGS.get(("gemv", n, k, rows))
    return entry or default_config(n, k, swiglu, sms, rows=rows)


MAX_ROWS = 2  # most rows a launch takes: beyond, the few-row matmul's tensor cores win over these CUDA-core multiplies


@functools.cache
def _properties(device_index: int):
    return torch.cuda.get_device_properties(device_index)


def _cuda_properties(device: torch.device):
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 elsewhere (the interpreter)."""
    return _cuda_properties(device).multi_processor_count if device.type == "cuda" else 4


_BEHIND_OWN: ContextVar[bool] = ContextVar("cdbsim_pdl_behind_own", default=True)


@contextmanager
def pdl_behind(own_kernels: bool) -> Iterator[None]:
    """Within the block, PDL-launch the Triton kernels only if ``own_kernels`` (their predecessors are this package's
    kernels): cuBLAS lets dependents launch early, so they would sit resident while the GEMM still has tiles."""
    token = _BEHIND_OWN.set(own_kernels)
    try:
        yield
    finally:
        _BEHIND_OWN.reset(token)


def pdl_allowed_here() -> bool:
    """Whether the enclosing :func:`pdl_behind` block (if any) lets kernels be PDL-launched."""
    return _BEHIND_OWN.get()


def pdl_enabled(t: torch.Tensor) -> bool:
    """Whether kernels on ``t``'s device launch with PDL: CUDA, compute capability >= 9, not interpreted,
    and not in a :func:`pdl_behind` block of a cuBLAS path."""
    if t.device.type != "cuda" or triton.knobs.runtime.interpret or not pdl_allowed_here():
        return False
    return _cuda_properties(t.device).major >= 9


def launch_options(pdl: bool) -> dict:
    """The launch keyword that asks for PDL (empty without it: the interpreter takes no such option)."""
    return {"launch_pdl": True} if pdl else {}


EARLY, LATE = 1, 2  # a PDL kernel's PDL constexpr: when it lets its successor launch (0: not PDL-launched)


def pdl_mode(t: torch.Tensor, late: bool = False) -> int:
    """The ``PDL`` constexpr of a kernel on ``t``'s device: 0 without PDL (:func:`pdl_enabled`), else :data:`LATE`
    (the successor may launch after the main loop: the few-row matmul) or :data:`EARLY` (right after the wait)."""
    return (LATE if late else EARLY) if pdl_enabled(t) else 0


@triton.jit
def wait_for_predecessor(PDL: tl.constexpr):
    """Under PDL: wait for the previous kernel's writes, then (``EARLY``) let the next kernel launch; else a no-op."""
    if PDL:
        gdc_wait()
        if PDL == 1:
            gdc_launch_dependents()


@triton.jit
def let_successor_launch(PDL: tl.constexpr):
    """The late trigger (``PDL == LATE``), at the end of a kernel's main loop: the next kernel may launch."""
    if PDL == 2:
        gdc_launch_dependents()


@triton.jit
def rounded(x, DT: tl.constexpr):
    """fp32 ``x`` rounded to ``DT``'s precision (nearest, ties to even) and kept in fp32, where the torch backend
    rounds an intermediate. bf16 rounds by integer arithmetic on the bits, which no compiler fold can drop and which
    the interpreter (whose casts truncate) computes alike."""
    if DT == tl.bfloat16:  # noqa: SIM300 (DT is the constexpr compared)
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(DT).to(tl.float32)


@triton.jit
def normed(v, inv, w, DT: tl.constexpr):
    """RMSNorm of ``v`` (``inv``: its reciprocal RMS) as :func:`executor.ops.rms_norm` rounds it: to ``DT``, times
    the weight, to ``DT`` again; in fp32."""
    return rounded(rounded(v * inv, DT) * w, DT)


@triton.jit
def _slab(W, rows, row_mask, K: tl.constexpr, OFF: tl.constexpr, BK: tl.constexpr):
    """Weight rows ``rows`` at columns ``OFF .. OFF + BK`` (masked at ``K``), streamed (evict first)."""
    cols = OFF + tl.arange(0, BK)
    ptrs = W + rows.to(tl.int64)[:, None] * K + cols[None, :]
    return tl.load(ptrs, mask=row_mask[:, None] & (cols < K)[None, :], other=0.0, eviction_policy="evict_first")


@triton.jit
def _vec(P, K: tl.constexpr, OFF: tl.constexpr, BK: tl.constexpr):
    """Columns ``OFF .. OFF + BK`` of a length-``K`` vector in fp32 (zero past ``K``)."""
    cols = OFF + tl.arange(0, BK)
    return tl.load(P + cols, mask=cols < K, other=0.0).to(tl.float32)


@triton.jit
def _operand(X, BR, WP, K: tl.constexpr, OFF: tl.constexpr, BK: tl.constexpr, PROLOGUE: tl.constexpr,
             SANDWICH: tl.constexpr, DT: tl.constexpr):
    """One row's prologue inputs over one register piece in fp32, ``(x, v, w_post, sum of squares of v)``: ``v`` is
    what the first norm normalises, the branch (sandwich) or ``branch + x`` rounded to ``DT``; unused slots repeat
    ``x``. The caller adds the pieces' sums."""
    x = _vec(X, K, OFF, BK)
    if PROLOGUE == 2:
        br = _vec(BR, K, OFF, BK)
        wp = _vec(WP, K, OFF, BK)
        v = br if SANDWICH else rounded(br + x, DT)
        return x, v, wp, tl.sum(v * v, axis=0)
    return x, x, x, tl.sum(x * x, axis=0)


@triton.jit
def _residual_piece(x, v, wp, inv1, XO, write, K: tl.constexpr, OFF: tl.constexpr, BK: tl.constexpr,
                    SANDWICH: tl.constexpr, DT: tl.constexpr):
    """``x_new`` of one piece, ``x + norm(branch)`` (sandwich) or ``norm(branch + x)`` (``v`` as :func:`_operand`
    gives it), rounded to ``DT`` (stored by the writing program) and back in fp32."""
    cols = OFF + tl.arange(0, BK)
    x_new = normed(v, inv1, wp, DT)
    if SANDWICH:
        x_new = rounded(x + x_new, DT)
    tl.store(XO + cols, x_new.to(DT), mask=(cols < K) & write)
    return x_new


@triton.jit
def _load_tile(W, rows, valid, N: tl.constexpr, K: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr,
               SWIGLU: tl.constexpr):
    """One tile's weights: rows ``rows`` in two pieces ``(w1, w2)``, and with ``SWIGLU`` the up rows
    ``N + rows`` ``(u1, u2)``; absent pieces repeat ``w1`` (no load). ``valid`` false loads nothing."""
    mask = (rows < N) & valid
    w1 = _slab(W, rows, mask, K, 0, K1)
    w2, u1, u2 = w1, w1, w1
    if K2 > 0:
        w2 = _slab(W, rows, mask, K, K1, K2)
    if SWIGLU:
        u1 = _slab(W, rows + N, mask, K, 0, K1)
        if K2 > 0:
            u2 = _slab(W, rows + N, mask, K, K1, K2)
    return w1, w2, u1, u2


@triton.jit
def _tile_out(w1, w2, u1, u2, a1, a2, K2: tl.constexpr, SWIGLU: tl.constexpr, DT: tl.constexpr):
    """One tile's outputs in fp32: ``w . a`` per row, or ``silu(gate) * up`` (each rounded to ``DT`` first)."""
    acc = tl.sum(w1.to(tl.float32) * a1[None, :], axis=1)
    if K2 > 0:
        acc += tl.sum(w2.to(tl.float32) * a2[None, :], axis=1)
    if SWIGLU:
        up = tl.sum(u1.to(tl.float32) * a1[None, :], axis=1)
        if K2 > 0:
            up += tl.sum(u2.to(tl.float32) * a2[None, :], axis=1)
        gate = rounded(acc, DT)
        acc = gate / (1.0 + tl.exp(-gate)) * rounded(up, DT)
    return acc


@triton.jit
def _row_operand(X, BR, WP, WN, XO, write, eps, K: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr,
                 PROLOGUE: tl.constexpr, SANDWICH: tl.constexpr, DT: tl.constexpr):
    """One row's activation ``a`` after the prologue, as two fp32 register pieces ``(a1, a2)`` (``a2``
    repeats ``a1`` when ``K`` is one piece); with the residual prologue the writing program stores ``x_new``."""
    x1, b1, p1, ss = _operand(X, BR, WP, K, 0, K1, PROLOGUE, SANDWICH, DT)
    x2 = x1
    if K2 > 0:
        x2, b2, p2, ss2 = _operand(X, BR, WP, K, K1, K2, PROLOGUE, SANDWICH, DT)
        ss += ss2
    if PROLOGUE == 2:  # x_new, then the next norm of it
        inv1 = tl.rsqrt(ss / K + eps)
        x1 = _residual_piece(x1, b1, p1, inv1, XO, write, K, 0, K1, SANDWICH, DT)
        ss = tl.sum(x1 * x1, axis=0)
        if K2 > 0:
            x2 = _residual_piece(x2, b2, p2, inv1, XO, write, K, K1, K2, SANDWICH, DT)
            ss += tl.sum(x2 * x2, axis=0)
    if PROLOGUE != 0:
        inv = tl.rsqrt(ss / K + eps)
        x1 = normed(x1, inv, _vec(WN, K, 0, K1), DT)
        if K2 > 0:
            x2 = normed(x2, inv, _vec(WN, K, K1, K2), DT)
    return x1, x2


@triton.jit
def _chain_gemv_kernel(X, BR, WP, WN, W, OUT, XO, eps, N: tl.constexpr, K: tl.constexpr, K1: tl.constexpr,
                       K2: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr, ROWS: tl.constexpr,
                       PROLOGUE: tl.constexpr, SANDWICH: tl.constexpr, SWIGLU: tl.constexpr, PDL: tl.constexpr):
    """``OUT[m, n] = sum_k a[m, k] * W[n, k]`` for ``ROWS`` (1 or 2) rows and this program's ``TILES`` tiles of
    ``BLOCK_N`` columns (each read once); with ``SWIGLU``, ``W`` has ``2N`` rows, ``OUT = silu(gate) * up``."""
    pid = tl.program_id(0)
    dt = OUT.dtype.element_ty
    rows = pid * (TILES * BLOCK_N) + tl.arange(0, BLOCK_N)
    w1, w2, u1, u2 = _load_tile(W, rows, True, N, K, K1, K2, SWIGLU)
    wait_for_predecessor(PDL)
    write = pid == 0
    a1, a2 = _row_operand(X, BR, WP, WN, XO, write, eps, K, K1, K2, PROLOGUE, SANDWICH, dt)
    b1, b2 = a1, a2
    if ROWS > 1:
        b1, b2 = _row_operand(X + K, BR + K, WP, WN, XO + K, write, eps, K, K1, K2, PROLOGUE, SANDWICH, dt)
    for t in range(1, TILES + 1):
        following = rows + BLOCK_N
        n1, n2, v1, v2 = _load_tile(W, following, t < TILES, N, K, K1, K2, SWIGLU)
        live = rows < N
        tl.store(OUT + rows, _tile_out(w1, w2, u1, u2, a1, a2, K2, SWIGLU, dt).to(dt), mask=live)
        if ROWS > 1:
            tl.store(OUT + N + rows, _tile_out(w1, w2, u1, u2, b1, b2, K2, SWIGLU, dt).to(dt), mask=live)
        w1, w2, u1, u2 = n1, n2, v1, v2
        rows = following
    let_successor_launch(PDL)


def check_operands(what: str, max_rows: int, x: torch.Tensor, w: torch.Tensor, *vectors: torch.Tensor,
                   swiglu: bool = False) -> None:
    """Shapes, dtypes and contiguity of a skinny matmul's inputs (metadata only: no device work, no sync);
    ``vectors``: norm weights, one per column of ``x``; with ``swiglu`` ``w`` is a fused gate/up weight."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or x.dtype != w.dtype:
        raise ValueError(f"{what}: activation {tuple(x.shape)} {x.dtype} does not fit weight "
                         f"{tuple(w.shape)} {w.dtype}")
    if not 1 <= x.shape[0] <= max_rows:
        raise ValueError(f"{what}: takes 1..{max_rows} rows, got {x.shape[0]}")
    if any(v.shape != (w.shape[1],) for v in vectors):
        raise ValueError(f"{what}: norm weights must have shape ({w.shape[1]},)")
    if not all(t.is_contiguous() for t in (x, w, *vectors)):
        raise ValueError(f"{what}: inputs must be contiguous")
    if swiglu and w.shape[0] % 2:
        raise ValueError(f"{what}: a fused gate/up weight has an even row count, got {w.shape[0]}")


def _launch(op: str, x: torch.Tensor, w: torch.Tensor, *, branch: torch.Tensor | None = None,
            w_post: torch.Tensor | None = None, w_norm: torch.Tensor | None = None,
            x_out: torch.Tensor | None = None, eps: float = 0.0, sandwich: bool = False, swiglu: bool = False,
            config: ChainConfig | None = None) -> torch.Tensor:
    k = x.shape[1]
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    cfg = config or config_for(op, n, k, swiglu, sm_count(x.device), x.shape[0])
    k1, k2 = split_k(k)
    out = torch.empty((x.shape[0], n), device=x.device, dtype=x.dtype)
    pdl = pdl_mode(x)
    _chain_gemv_kernel[(triton.cdiv(n, cfg.block_n * cfg.tiles),)](
        x, x if branch is None else branch, x if w_post is None else w_post, x if w_norm is None else w_norm, w, out,
        x if x_out is None else x_out, eps, N=n, K=k, K1=k1, K2=k2, BLOCK_N=cfg.block_n, TILES=cfg.tiles,
        ROWS=x.shape[0], PROLOGUE=OPS[op], SANDWICH=sandwich, SWIGLU=swiglu, PDL=pdl, num_warps=cfg.num_warps,
        num_stages=1, **launch_options(pdl))
    return out


def gemv(x: torch.Tensor, w: torch.Tensor, config: ChainConfig | None = None) -> torch.Tensor:
    """``x @ w.T`` (``F.linear(x, w)``) for ``x`` ``[M, K]``, ``w`` ``[N, K]``."""
    check_operands("chain gemv", MAX_ROWS, x, w)
    return _launch("gemv", x, w, config=config)


def gemv_rmsnorm(x: torch.Tensor, w_norm: torch.Tensor, eps: float, w: torch.Tensor,
                 config: ChainConfig | None = None) -> torch.Tensor:
    """``rms_norm(x, w_norm) @ w.T`` (the norm rounded to ``x.dtype`` first)."""
    check_operands("chain gemv", MAX_ROWS, x, w, w_norm)
    return _launch("rmsnorm", x, w, w_norm=w_norm, eps=eps, config=config)


def gemv_residual(branch: torch.Tensor, x: torch.Tensor, w_post: torch.Tensor, w_next: torch.Tensor,
                  eps: float, sandwich: bool, w: torch.Tensor, swiglu: bool = False,
                  config: ChainConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual_norm(branch, x, w_post, w_next, eps, sandwich)`` then its ``h @ w.T`` (``silu_mul`` of it
    with ``swiglu``): returns ``(that, x_new)``; ``x_new`` is a new tensor (the inputs are left as they are)."""
    check_operands("chain gemv_residual", MAX_ROWS, x, w, w_post, w_next, swiglu=swiglu)
    if branch.shape != x.shape or branch.dtype != x.dtype or not branch.is_contiguous():
        raise ValueError(f"chain gemv_residual: branch {tuple(branch.shape)} does not match x {tuple(x.shape)}")
    x_new = torch.empty_like(x)
    out = _launch("residual", x, w, branch=branch, w_post=w_post, w_norm=w_next, x_out=x_new, eps=eps,
                  sandwich=sandwich, swiglu=swiglu, config=config)
    return out, x_new
