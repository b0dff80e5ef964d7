"""A tensor-core matmul for a few rows (2-32): a candidate for the projections of small decode batches.

Why: from two rows on, the executor's projections run on cuBLAS, and at 2-32 rows cuBLAS reads the
weights of a 2,048-wide model at 1.3-3.3 TB/s on the H200 (the kernel profile's GEMM table: ``[2, 2048] x
[2048, 2048]`` in 6.2 us, ``[2, 2048] x [6144, 2048]`` in 10.0 us, ``[2, 2048] x [11264, 2048]`` in 14.1
us), against about 4.3 TB/s of copy bandwidth. A core step of Ouro-1.4B at 2-32 rows is 1.8-2.3x its
weights + KV roofline (``benchmarks/results/attention-sweep/stages-L512.csv``), and the four projections
are three quarters of its layer's kernel time at two rows (42 of 57 us in the kernel profile).

Design. One program owns ``BLOCK_N`` output columns over the whole of ``K`` and all the rows (padded to
16, the tensor cores' smallest M): it streams a ``BLOCK_K x BLOCK_N`` tile of the weights per step,
pipelined ``num_stages`` deep, and accumulates ``x_tile @ w_tile.T`` with ``tl.dot`` in fp32. Narrow
columns (16-64) give a few hundred programs even for a 2,048-wide output, so every SM streams weights;
there is no split-K (its reduction would be another launch, and the launch is what costs at these sizes).

Not on the serving path: ``benchmarks/bench_skinny.py`` times it against cuBLAS over the shipped models'
projections and 2-32 rows (``bash benchmarks/gpu_session.sh skinny``), which decides whether and where
the executor should use it. Runs on CUDA, and on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests
check it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

MIN_ROWS, MAX_ROWS = 1, 32
MMA_ROWS = 16  # the tensor cores' smallest M: fewer rows are padded to it (masked loads, no traffic)


class SkinnyConfig(NamedTuple):
    """One launch configuration: output columns per program, weight columns per step, warps, stages."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4


def default_config(n: int, k: int, sms: int = 132) -> SkinnyConfig:
    """The widest column block (64, 32 or 16) that still gives every SM at least one program; steps of
    256 weight columns (fewer for a narrow ``K``)."""
    block_n = next((b for b in (64, 32) if triton.cdiv(n, b) >= sms), 16)
    return SkinnyConfig(block_n, min(256, max(16, triton.next_power_of_2(k))))


@triton.jit
def _skinny_kernel(X, W, OUT, M, N, K, stride_x, stride_w, stride_o,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``OUT[:M, cols] = X[:M] @ W[cols].T`` for this program's ``BLOCK_N`` columns."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows[:, None] < M
    col_ok = cols[None, :] < N
    x_ptrs = X + rows[:, None] * stride_x + ks[None, :]
    w_ptrs = W + cols[None, :] * stride_w + ks[:, None]  # the weight tile transposed: [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_ok = (k + ks) < K
        a = tl.load(x_ptrs + k, mask=row_ok & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs + k, mask=col_ok & k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(OUT + rows[:, None] * stride_o + cols[None, :], acc.to(OUT.dtype.element_ty), mask=row_ok & col_ok)


def skinny_linear(x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig | None = None) -> torch.Tensor:
    """``F.linear(x, w)`` for ``x`` ``[M, K]`` with ``M`` in 1..32 and ``w`` ``[N, K]``, both contiguous in
    ``K`` and of one dtype; ``config`` defaults to :func:`default_config`."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"skinny_linear: x {tuple(x.shape)} and w {tuple(w.shape)} do not fit ([M, K] and [N, K])")
    if not MIN_ROWS <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"skinny_linear takes {MIN_ROWS}..{MAX_ROWS} rows, got {x.shape[0]}")
    if x.dtype != w.dtype or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError("skinny_linear: x and w must share a dtype and be contiguous along K")
    (m, k), n = x.shape, w.shape[0]
    cfg = config or default_config(n, k)
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    block_m = max(MMA_ROWS, triton.next_power_of_2(m))
    _skinny_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    return out
