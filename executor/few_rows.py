"""The few-row matmul: ``x @ w.T`` for up to :data:`MAX_ROWS` rows on the tensor cores, PDL-chained, optionally with
the SwiGLU of a fused gate/up projection in its epilogue (``silu(gate) * up``, each rounded as the torch backend).

"Swap AB": a program computes its ``BLOCK_N`` output columns as ``w_tile @ x.T``, the rows padded to ``BLOCK_M`` by
masking, over software-pipelined ``BLOCK_K`` chunks of ``K``. Which launches take it:
:func:`cdbsim.latency.gpu_work.few_rows`. CPU tensors run under ``TRITON_INTERPRET=1`` (float32, IEEE products).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from cdbsim.latency.gpu_work import FEW_ROWS_MAX
from executor.chain import check_operands, launch_options, let_successor_launch, pdl_mode, rounded, wait_for_predecessor

MAX_ROWS = 64  # most rows the kernel takes; served launches take it up to cdbsim.latency.gpu_work.FEW_ROWS_MAX rows
MIN_BLOCK_M = 16  # rows per MMA at least (tl.dot's smallest dimension); rows past M are masked, never loaded
SHARED_BUDGET = 224 * 1024  # bytes of tiles a program may hold in shared memory (an H200 block: 227 KB)
assert FEW_ROWS_MAX <= MAX_ROWS


class FewRowsConfig(NamedTuple):
    """A launch configuration: output columns per program (per half with SwiGLU), K chunk, warps, stages."""

    block_n: int
    block_k: int
    num_warps: int
    stages: int


# (N, K, swiglu) -> config tuned on the H200, else default_config; Huginn-3.5B's serve Ops(few_rows=...) only
CONFIGS: dict[tuple[int, int, bool], FewRowsConfig] = {
    (6144, 2048, False): FewRowsConfig(64, 256, 4, 3),  # ouro.wqkv
    (2048, 2048, False): FewRowsConfig(16, 256, 4, 4),  # ouro.wo
    (5632, 2048, True): FewRowsConfig(32, 128, 2, 4),  # ouro.gate_up
    (2048, 5632, False): FewRowsConfig(16, 256, 4, 6),  # ouro.down
    (15840, 5280, False): FewRowsConfig(64, 256, 4, 4),  # huginn.wqkv
    (5280, 5280, False): FewRowsConfig(64, 128, 4, 4),  # huginn.wo
    (17920, 5280, True): FewRowsConfig(64, 128, 2, 2),  # huginn.gate_up
    (5280, 17920, False): FewRowsConfig(32, 256, 4, 4),  # huginn.down
    (5280, 10560, False): FewRowsConfig(32, 256, 2, 4),  # huginn.adapter
}


def default_config(n: int, k: int, swiglu: bool = False) -> FewRowsConfig:
    """16 columns (32 for a wide output) over 256-column chunks, four warps, four stages."""
    block_n = 32 if n >= 8192 and not swiglu else 16
    return FewRowsConfig(block_n, min(256, max(16, triton.next_power_of_2(k))), 4, 4)


def config_for(n: int, k: int, swiglu: bool = False) -> FewRowsConfig:
    """The launch config of an ``[n, k]`` projection: its :data:`CONFIGS` entry, else :func:`default_config`."""
    return CONFIGS.get((n, k, swiglu)) or default_config(n, k, swiglu)


def block_rows(m: int) -> int:
    """The MMA's row tile for ``m`` rows: 16, 32 or 64."""
    return max(MIN_BLOCK_M, triton.next_power_of_2(m))


def warps_for(cfg: FewRowsConfig, block_m: int) -> int:
    """``cfg``'s warps scaled with the row tile (at most 8): per thread as many fp32 accumulators as at 16 rows."""
    return min(8, cfg.num_warps * block_m // MIN_BLOCK_M)


def stages_for(cfg: FewRowsConfig, block_m: int, swiglu: bool) -> int:
    """``cfg``'s pipeline stages (its own at 16 rows), fewer where a taller row tile would not fit
    :data:`SHARED_BUDGET`: Triton holds ``stages + 1`` tiles of weights and rows."""
    if block_m <= MIN_BLOCK_M:
        return cfg.stages
    return max(2, min(cfg.stages, SHARED_BUDGET // stage_bytes(cfg, block_m, swiglu) - 1))


def stage_bytes(cfg: FewRowsConfig, block_m: int, swiglu: bool) -> int:
    """Shared memory of one pipeline stage: a chunk of weights (both halves with SwiGLU) and of rows, bf16."""
    return ((2 if swiglu else 1) * cfg.block_n + block_m) * cfg.block_k * 2


@triton.jit
def _dot(w, x, acc, IEEE: tl.constexpr):
    """``acc + w @ x.T`` in fp32 (IEEE products for fp32 inputs, which the interpreter checks)."""
    if IEEE:
        return tl.dot(w, tl.trans(x), acc, input_precision="ieee")
    return tl.dot(w, tl.trans(x), acc)


@triton.jit
def _few_rows_kernel(X, W, OUT, M, N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, SWIGLU: tl.constexpr,
                     IEEE: tl.constexpr, PDL: tl.constexpr):
    """``OUT[m, n] = sum_k X[m, k] W[n, k]`` for this program's ``BLOCK_N`` columns and all ``M`` rows; with
    ``SWIGLU``, ``W`` has ``2N`` rows and ``OUT[m, n] = silu(gate) * up`` of rows ``n`` and ``N + n``."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    col_ok = (cols < N)[:, None]
    row_ok = (rows < M)[:, None]
    w_ptrs = W + cols.to(tl.int64)[:, None] * K + ks[None, :]
    x_ptrs = X + rows.to(tl.int64)[:, None] * K + ks[None, :]
    dt = OUT.dtype.element_ty
    k_ok = (ks < K)[None, :]
    w = tl.load(w_ptrs, mask=col_ok & k_ok, other=0.0, eviction_policy="evict_first")
    u = w
    if SWIGLU:
        u = tl.load(w_ptrs + N * K, mask=col_ok & k_ok, other=0.0, eviction_policy="evict_first")
    wait_for_predecessor(PDL)
    x = tl.load(x_ptrs, mask=row_ok & k_ok, other=0.0)
    acc = _dot(w, x, tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), IEEE)
    acc_up = acc
    if SWIGLU:
        acc_up = _dot(u, x, tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), IEEE)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
        k_ok = ((k0 + ks) < K)[None, :]
        w = tl.load(w_ptrs + k0, mask=col_ok & k_ok, other=0.0, eviction_policy="evict_first")
        x = tl.load(x_ptrs + k0, mask=row_ok & k_ok, other=0.0)
        acc = _dot(w, x, acc, IEEE)
        if SWIGLU:
            u = tl.load(w_ptrs + N * K + k0, mask=col_ok & k_ok, other=0.0, eviction_policy="evict_first")
            acc_up = _dot(u, x, acc_up, IEEE)
    let_successor_launch(PDL)
    if SWIGLU:
        gate = rounded(acc, dt)
        acc = gate / (1.0 + tl.exp(-gate)) * rounded(acc_up, dt)
    out_ptrs = OUT + rows.to(tl.int64)[None, :] * N + cols[:, None]
    tl.store(out_ptrs, acc.to(dt), mask=col_ok & (rows < M)[None, :])


def linear(x: torch.Tensor, w: torch.Tensor, swiglu: bool = False, config: FewRowsConfig | None = None) -> torch.Tensor:
    """``F.linear(x, w)`` for ``x`` ``[M <= MAX_ROWS, K]``, ``w`` ``[N, K]`` (with ``swiglu``: ``silu_mul`` of it)."""
    check_operands("few-row matmul", MAX_ROWS, x, w, swiglu=swiglu)
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    pdl = pdl_mode(x, late=True)
    cfg = config or config_for(n, k, swiglu)
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    block_m = block_rows(m)
    stages, warps = stages_for(cfg, block_m, swiglu), warps_for(cfg, block_m)
    _few_rows_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, w, out, m, N=n, K=k, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, STAGES=stages,
        SWIGLU=swiglu, IEEE=x.dtype == torch.float32, PDL=pdl, num_warps=warps, **launch_options(pdl))
    return out
