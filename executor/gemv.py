"""Skinny matmuls (``M = 1 .. 16`` rows, bf16 weights) as Triton kernels that stream the weight near peak
bandwidth, with the elementwise op that feeds each projection fused into the kernel's prologue.

Why: at batch 1 on an H200 a decode step of Ouro-1.4B takes 2.4x its weight-read roofline. cuBLAS GEMV
reaches only ~2.74 TB/s of the ~4.3 TB/s HBM bandwidth on its decode shapes (N x K = 6144 x 2048,
2048 x 2048, 11264 x 2048, 2048 x 5632), and each layer runs ~9 kernels (norms, SiLU, residuals and the
four projections), each paying a launch gap that is comparable to the projection itself (the 2048 x 2048
``wo`` is 8 MB: ~2 us at full bandwidth).

Measured (``benchmarks/bench_gemv.py``, H200, 20-call CUDA graphs, weights read from HBM): the plain
kernel is 0.99-1.16x cuBLAS on Ouro's shapes (1.15x on ``down``, 1.1x on ``wqkv``) and 0.96-1.08x on the
large ones, where both reach 4.0-4.4 TB/s (a large copy: 4.24). What bounds the small shapes is a fixed
~3-4 us per kernel (the bare launch gap in a graph is ~1.2 us): a 2048 x 2048 projection takes ~6.2 us
either way, 1.35 TB/s. So a fused prologue pays only where it costs less than the separate kernel it
replaces (~1.5-2.5 us): SiLU does (1.00-1.14x the unfused path), RMSNorm at M <= 4 mostly does
(0.97-1.13x), the residual prologue (two dependent pre-passes before the weight stream) does not
(0.51-1.02x, worst at M = 16, where its activation re-reads rival the weight bytes).

Kernels (all ``out = a @ w.T`` with ``a`` the ``[M, K]`` activation after the prologue, fp32 accumulation):

* ``gemv``           no prologue (same as ``F.linear(x, w)``);
* ``gemv_silu``      ``a = silu(gate) * up`` of a fused ``[M, 2I]`` gate/up projection (``ops.silu_mul``);
* ``gemv_rmsnorm``   ``a = rms_norm(x, w_norm)`` (``ops.rms_norm``);
* ``gemv_residual``  ``x_new, a = residual_norm(branch, x, ...)`` (``ops.residual_norm``), also returning
  ``x_new``; program (0, 0) writes it, to a fresh tensor (the others still read ``x``).

The intermediates are rounded to the activation dtype at the same points as the torch backend. Every
program recomputes its prologue from the (L2-resident) activation rows: they are ``M x K`` against the
program's ``BLOCK_N x K`` weight slice, so the extra reads are a small multiple (the number of activation
arrays read) of ``M / BLOCK_N`` of the weight bytes, and come from L2, not HBM. The norms first need a
pre-pass over the rows (two dependent ones for ``gemv_residual``), done on the real rows in wide tiles;
the prologue's inputs are then prefetched one ``K`` tile ahead (Triton pipelines, through shared memory,
only the loads that feed ``tl.dot`` directly: the weight's and a plain activation's).

Each program owns ``BLOCK_N`` output columns (and one of ``SPLIT_K`` slices of ``K``) and loops over ``K``
in ``[BLOCK_N, BLOCK_K]`` weight tiles (16-byte vector loads, evict-first), combining them with the
``[BLOCK_M, BLOCK_K]`` activation tile in one of three ways (``GemvConfig.mode``):
0 broadcast multiply and ``tl.sum`` over ``K``; 1 ``tl.dot(a, w.T)`` with ``M`` padded to 16;
2 ``tl.dot(w, a.T)`` (the weight as the left operand). The dot modes win everywhere on the H200 (mode 0
is 2-3x slower: its weight loads are not pipelined), 2 at most points, even at ``M = 1``. With
``SPLIT_K > 1`` programs write fp32 partials and a second small kernel sums them in a fixed order
(deterministic; no atomics, no host sync, fixed launch shapes: CUDA-graph capturable).

Configs come from ``CONFIGS``, keyed ``(op, m_bucket, N, K)`` (``op`` one of ``gemv``, ``silu``,
``rmsnorm``, ``residual``; ``m_bucket`` the power of two at or above ``M``; ``N, K`` the weight's shape),
falling back to the ``gemv`` entry of the same shape and then to :func:`default_config`. The table is
filled from ``benchmarks/bench_gemv.py``, which prints the entries in this format. Nothing is tuned at
call time: the launch is a pure function of the shapes, so CUDA-graph replays are repeatable.

Runs on CUDA, and on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests check the kernels).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

SMALL_M = 16
NUM_SMS = 132  # H200; only the default config for unseen shapes uses it
PRE_ELEMENTS = 8192  # activation elements per tile of the norms' pre-passes (rows x PRE_K)
SUM_BLOCK = 1024  # outputs per program of the split-K sum

PLAIN, SILU, RMSNORM, RESIDUAL = 0, 1, 2, 3
OPS = {"gemv": PLAIN, "silu": SILU, "rmsnorm": RMSNORM, "residual": RESIDUAL}


class GemvConfig(NamedTuple):
    """One launch configuration: ``mode`` 0 broadcast + sum, 1 ``dot(a, w.T)``, 2 ``dot(w, a.T)``."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    mode: int


# (op, m_bucket, N, K) -> config, as benchmarks/bench_gemv.py prints it (and writes to its JSON's
# "config_table"); comments: time per call and speedup over cuBLAS (gemv) or over the unfused path
# (the Triton prologue kernel + cuBLAS). Measured on one H200 (torch 2.11, triton 3.6), full sweep.
CONFIGS: dict[tuple[str, int, int, int], GemvConfig] = {
    ('gemv', 1, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 8.5 us, 1.09x
    ('gemv', 2, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 8.5 us, 1.14x
    ('gemv', 4, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 8.4 us, 1.14x
    ('gemv', 8, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 8.4 us, 1.13x
    ('gemv', 16, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 8.5 us, 1.14x
    ('gemv', 1, 2048, 2048): GemvConfig(64, 256, 4, 4, 4, 2),  # ouro.wo: 6.2 us, 1.00x
    ('gemv', 2, 2048, 2048): GemvConfig(64, 128, 4, 4, 4, 2),  # ouro.wo: 6.1 us, 1.05x
    ('gemv', 4, 2048, 2048): GemvConfig(64, 128, 4, 4, 4, 2),  # ouro.wo: 6.2 us, 1.00x
    ('gemv', 8, 2048, 2048): GemvConfig(64, 128, 4, 4, 4, 2),  # ouro.wo: 6.3 us, 0.99x
    ('gemv', 16, 2048, 2048): GemvConfig(64, 128, 4, 4, 4, 2),  # ouro.wo: 6.3 us, 0.99x
    ('gemv', 1, 11264, 2048): GemvConfig(64, 128, 1, 4, 4, 2),  # ouro.gate_up: 13.2 us, 1.01x
    ('gemv', 2, 11264, 2048): GemvConfig(64, 128, 1, 4, 4, 2),  # ouro.gate_up: 13.3 us, 1.00x
    ('gemv', 4, 11264, 2048): GemvConfig(64, 128, 1, 4, 4, 2),  # ouro.gate_up: 13.4 us, 1.00x
    ('gemv', 8, 11264, 2048): GemvConfig(64, 128, 1, 4, 4, 2),  # ouro.gate_up: 13.6 us, 0.99x
    ('gemv', 16, 11264, 2048): GemvConfig(64, 128, 1, 4, 4, 2),  # ouro.gate_up: 13.8 us, 0.99x
    ('gemv', 1, 2048, 5632): GemvConfig(64, 256, 4, 4, 4, 2),  # ouro.down: 9.8 us, 1.15x
    ('gemv', 2, 2048, 5632): GemvConfig(64, 256, 4, 4, 4, 2),  # ouro.down: 9.7 us, 1.16x
    ('gemv', 4, 2048, 5632): GemvConfig(64, 256, 4, 4, 4, 2),  # ouro.down: 9.8 us, 1.16x
    ('gemv', 8, 2048, 5632): GemvConfig(64, 256, 4, 4, 3, 2),  # ouro.down: 9.9 us, 1.15x
    ('gemv', 16, 2048, 5632): GemvConfig(64, 256, 4, 4, 3, 2),  # ouro.down: 10.1 us, 1.15x
    ('gemv', 1, 15840, 5280): GemvConfig(64, 128, 1, 4, 3, 2),  # huginn.wqkv: 41.5 us, 0.99x
    ('gemv', 2, 15840, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.wqkv: 41.9 us, 0.98x
    ('gemv', 4, 15840, 5280): GemvConfig(64, 128, 1, 4, 3, 2),  # huginn.wqkv: 42.0 us, 0.98x
    ('gemv', 8, 15840, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.wqkv: 42.3 us, 0.96x
    ('gemv', 16, 15840, 5280): GemvConfig(128, 128, 1, 8, 4, 2),  # huginn.wqkv: 42.8 us, 0.96x
    ('gemv', 1, 5280, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.wo: 16.0 us, 1.04x
    ('gemv', 2, 5280, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.wo: 16.1 us, 1.02x
    ('gemv', 4, 5280, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.wo: 16.3 us, 1.00x
    ('gemv', 8, 5280, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.wo: 16.5 us, 0.98x
    ('gemv', 16, 5280, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.wo: 17.1 us, 0.97x
    ('gemv', 1, 35840, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.gate_up: 92.2 us, 1.07x
    ('gemv', 2, 35840, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.gate_up: 92.6 us, 1.07x
    ('gemv', 4, 35840, 5280): GemvConfig(64, 128, 1, 4, 1, 2),  # huginn.gate_up: 92.8 us, 1.07x
    ('gemv', 8, 35840, 5280): GemvConfig(64, 128, 1, 4, 1, 2),  # huginn.gate_up: 93.0 us, 1.07x
    ('gemv', 16, 35840, 5280): GemvConfig(64, 128, 1, 4, 1, 2),  # huginn.gate_up: 93.2 us, 1.08x
    ('gemv', 1, 5280, 17920): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.down: 46.4 us, 1.04x
    ('gemv', 2, 5280, 17920): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.down: 46.6 us, 1.05x
    ('gemv', 4, 5280, 17920): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.down: 46.7 us, 1.05x
    ('gemv', 8, 5280, 17920): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.down: 47.2 us, 1.05x
    ('gemv', 16, 5280, 17920): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.down: 48.3 us, 1.02x
    ('gemv', 1, 5280, 10560): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.adapter: 29.5 us, 1.06x
    ('gemv', 2, 5280, 10560): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.adapter: 29.8 us, 1.04x
    ('gemv', 4, 5280, 10560): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.adapter: 29.9 us, 1.06x
    ('gemv', 8, 5280, 10560): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.adapter: 30.1 us, 1.05x
    ('gemv', 16, 5280, 10560): GemvConfig(64, 128, 4, 4, 3, 2),  # huginn.adapter: 30.7 us, 1.04x
    ('gemv', 1, 49152, 2048): GemvConfig(64, 128, 1, 4, 3, 2),  # ouro.head: 46.6 us, 1.04x
    ('gemv', 2, 49152, 2048): GemvConfig(64, 128, 1, 4, 3, 2),  # ouro.head: 47.0 us, 1.04x
    ('gemv', 4, 49152, 2048): GemvConfig(128, 128, 1, 8, 1, 2),  # ouro.head: 47.4 us, 1.04x
    ('gemv', 8, 49152, 2048): GemvConfig(128, 128, 1, 8, 1, 2),  # ouro.head: 47.3 us, 1.05x
    ('gemv', 16, 49152, 2048): GemvConfig(128, 128, 1, 8, 1, 2),  # ouro.head: 47.2 us, 1.06x
    ('gemv', 1, 65536, 5280): GemvConfig(64, 256, 1, 4, 3, 1),  # huginn.head: 158.5 us, 1.04x
    ('gemv', 2, 65536, 5280): GemvConfig(64, 256, 1, 4, 3, 1),  # huginn.head: 159.2 us, 1.04x
    ('gemv', 4, 65536, 5280): GemvConfig(64, 256, 1, 4, 3, 1),  # huginn.head: 160.7 us, 1.03x
    ('gemv', 8, 65536, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.head: 161.7 us, 1.02x
    ('gemv', 16, 65536, 5280): GemvConfig(64, 256, 1, 4, 4, 2),  # huginn.head: 164.5 us, 1.01x
    ('rmsnorm', 1, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 10.5 us, 1.13x
    ('residual', 1, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 13.4 us, 0.92x
    ('rmsnorm', 2, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 10.8 us, 1.07x
    ('residual', 2, 6144, 2048): GemvConfig(64, 256, 1, 8, 4, 2),  # ouro.wqkv: 14.1 us, 0.85x
    ('rmsnorm', 4, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 10.9 us, 1.03x
    ('residual', 4, 6144, 2048): GemvConfig(64, 256, 1, 8, 4, 2),  # ouro.wqkv: 14.7 us, 0.80x
    ('rmsnorm', 8, 6144, 2048): GemvConfig(64, 256, 1, 4, 4, 2),  # ouro.wqkv: 11.9 us, 0.94x
    ('residual', 8, 6144, 2048): GemvConfig(64, 256, 1, 8, 3, 2),  # ouro.wqkv: 17.7 us, 0.66x
    ('rmsnorm', 16, 6144, 2048): GemvConfig(64, 256, 1, 8, 4, 2),  # ouro.wqkv: 13.2 us, 0.84x
    ('residual', 16, 6144, 2048): GemvConfig(64, 256, 1, 8, 3, 2),  # ouro.wqkv: 23.0 us, 0.51x
    ('residual', 1, 11264, 2048): GemvConfig(128, 128, 1, 8, 3, 2),  # ouro.gate_up: 16.9 us, 0.95x
    ('residual', 2, 11264, 2048): GemvConfig(128, 128, 1, 8, 3, 2),  # ouro.gate_up: 17.1 us, 0.94x
    ('residual', 4, 11264, 2048): GemvConfig(128, 128, 1, 8, 3, 2),  # ouro.gate_up: 17.5 us, 0.92x
    ('residual', 8, 11264, 2048): GemvConfig(64, 256, 1, 4, 3, 2),  # ouro.gate_up: 23.0 us, 0.71x
    ('residual', 16, 11264, 2048): GemvConfig(128, 128, 1, 8, 4, 2),  # ouro.gate_up: 26.3 us, 0.62x
    ('silu', 1, 2048, 5632): GemvConfig(32, 256, 4, 4, 3, 2),  # ouro.down: 11.1 us, 1.14x
    ('silu', 2, 2048, 5632): GemvConfig(64, 256, 4, 8, 3, 1),  # ouro.down: 11.8 us, 1.07x
    ('silu', 4, 2048, 5632): GemvConfig(64, 256, 4, 8, 3, 1),  # ouro.down: 12.1 us, 1.07x
    ('silu', 8, 2048, 5632): GemvConfig(64, 256, 4, 8, 3, 1),  # ouro.down: 12.1 us, 1.06x
    ('silu', 16, 2048, 5632): GemvConfig(64, 256, 4, 8, 3, 1),  # ouro.down: 12.5 us, 1.05x
    ('residual', 1, 15840, 5280): GemvConfig(64, 128, 1, 4, 4, 2),  # huginn.wqkv: 47.4 us, 0.95x
    ('residual', 2, 15840, 5280): GemvConfig(64, 256, 1, 4, 3, 2),  # huginn.wqkv: 48.2 us, 0.93x
    ('residual', 4, 15840, 5280): GemvConfig(128, 128, 1, 8, 3, 2),  # huginn.wqkv: 51.7 us, 0.87x
    ('residual', 8, 15840, 5280): GemvConfig(128, 128, 1, 4, 4, 2),  # huginn.wqkv: 60.3 us, 0.74x
    ('residual', 16, 15840, 5280): GemvConfig(128, 128, 1, 4, 3, 2),  # huginn.wqkv: 74.0 us, 0.60x
    ('residual', 1, 35840, 5280): GemvConfig(128, 128, 1, 4, 2, 2),  # huginn.gate_up: 100.8 us, 1.02x
    ('residual', 2, 35840, 5280): GemvConfig(128, 128, 1, 4, 2, 2),  # huginn.gate_up: 103.6 us, 0.99x
    ('residual', 4, 35840, 5280): GemvConfig(128, 128, 1, 4, 2, 2),  # huginn.gate_up: 106.8 us, 0.96x
    ('residual', 8, 35840, 5280): GemvConfig(128, 128, 1, 4, 2, 2),  # huginn.gate_up: 118.4 us, 0.88x
    ('residual', 16, 35840, 5280): GemvConfig(128, 128, 1, 4, 4, 2),  # huginn.gate_up: 203.2 us, 0.51x
    ('silu', 1, 5280, 17920): GemvConfig(32, 128, 4, 4, 3, 1),  # huginn.down: 47.2 us, 1.08x
    ('silu', 2, 5280, 17920): GemvConfig(64, 128, 4, 4, 3, 1),  # huginn.down: 50.1 us, 1.02x
    ('silu', 4, 5280, 17920): GemvConfig(128, 128, 4, 8, 3, 2),  # huginn.down: 51.4 us, 1.00x
    ('silu', 8, 5280, 17920): GemvConfig(64, 128, 4, 4, 3, 1),  # huginn.down: 50.8 us, 1.03x
    ('silu', 16, 5280, 17920): GemvConfig(64, 128, 4, 4, 4, 2),  # huginn.down: 51.4 us, 1.01x
    ('rmsnorm', 1, 49152, 2048): GemvConfig(64, 128, 1, 4, 2, 2),  # ouro.head: 48.3 us, 1.05x
    ('rmsnorm', 2, 49152, 2048): GemvConfig(64, 128, 1, 4, 2, 2),  # ouro.head: 48.9 us, 1.04x
    ('rmsnorm', 4, 49152, 2048): GemvConfig(128, 128, 1, 4, 2, 2),  # ouro.head: 49.0 us, 1.04x
    ('rmsnorm', 8, 49152, 2048): GemvConfig(128, 128, 1, 4, 2, 2),  # ouro.head: 50.2 us, 1.02x
    ('rmsnorm', 16, 49152, 2048): GemvConfig(128, 128, 1, 4, 2, 1),  # ouro.head: 52.3 us, 0.99x
    ('rmsnorm', 1, 65536, 5280): GemvConfig(128, 256, 1, 4, 2, 1),  # huginn.head: 166.7 us, 1.00x
    ('rmsnorm', 2, 65536, 5280): GemvConfig(64, 256, 1, 8, 3, 1),  # huginn.head: 172.4 us, 0.97x
    ('rmsnorm', 4, 65536, 5280): GemvConfig(64, 256, 1, 4, 2, 2),  # huginn.head: 171.0 us, 0.98x
    ('rmsnorm', 8, 65536, 5280): GemvConfig(64, 256, 1, 4, 2, 2),  # huginn.head: 182.3 us, 0.92x
    ('rmsnorm', 16, 65536, 5280): GemvConfig(128, 128, 1, 4, 3, 2),  # huginn.head: 184.5 us, 0.92x
}


def use_gemv(m: int) -> bool:
    """Whether a projection of ``m`` rows should use these kernels rather than cuBLAS."""
    return 1 <= m <= SMALL_M


def m_bucket(m: int) -> int:
    """The power of two at or above ``m`` (the ``M`` a kernel is compiled for)."""
    return 1 if m <= 1 else 1 << (m - 1).bit_length()


def default_config(op: str, bucket: int, n: int, k: int) -> GemvConfig:
    """A config for a shape the table lacks, following the H200 sweep: ``dot(w, a.T)``, 64 columns per
    program, 4 warps; split ``K`` four ways where the columns alone leave the SMs idle (under one wave
    of programs) and ``K`` is long, or where there are only ~32 programs."""
    programs = triton.cdiv(n, 64)
    block_k = 256 if k <= 6144 else 128
    split = programs < NUM_SMS and (k >= 8192 or programs <= NUM_SMS // 4) and k >= 8 * block_k
    return GemvConfig(64, block_k, 4 if split else 1, 4, 4 if block_k == 256 else 3, 2)


def config_for(op: str, m: int, n: int, k: int) -> GemvConfig:
    """The config ``op`` launches with at ``m`` rows of an ``[n, k]`` weight: its table entry, else the
    plain ``gemv`` entry of the same shape, else :func:`default_config`."""
    bucket = m_bucket(m)
    return (CONFIGS.get((op, bucket, n, k)) or CONFIGS.get(("gemv", bucket, n, k))
            or default_config(op, bucket, n, k))


# ----- device functions --------------------------------------------------------------------------------
_PLAIN: tl.constexpr = tl.constexpr(PLAIN)
_SILU: tl.constexpr = tl.constexpr(SILU)
_RMSNORM: tl.constexpr = tl.constexpr(RMSNORM)
_RESIDUAL: tl.constexpr = tl.constexpr(RESIDUAL)


@triton.jit
def _sum_squares(A, B, M, K, stride, ADD_B: tl.constexpr, ROWS: tl.constexpr, PRE_K: tl.constexpr):
    """``sum(v * v)`` over each row of ``v = A`` (or ``A + B``), ``[ROWS]`` in fp32."""
    rows = tl.arange(0, ROWS)[:, None]
    ss = tl.zeros([ROWS], dtype=tl.float32)
    for k0 in range(0, K, PRE_K):
        cols = k0 + tl.arange(0, PRE_K)[None, :]
        mask = (rows < M) & (cols < K)
        v = tl.load(A + rows * stride + cols, mask=mask, other=0.0).to(tl.float32)
        if ADD_B:
            v += tl.load(B + rows * stride + cols, mask=mask, other=0.0).to(tl.float32)
        ss += tl.sum(v * v, axis=1)
    return ss


@triton.jit
def _residual(x, br, wp, inv1, SANDWICH: tl.constexpr):
    """``x_new`` in fp32, not yet rounded: ``x + norm(branch)`` (sandwich) or ``norm(branch + x)``."""
    if SANDWICH:
        return x + br * inv1 * wp
    return (br + x) * inv1 * wp


@triton.jit
def _residual_pass(A, B, WP, XO, M, K, stride, inv1, write, SANDWICH: tl.constexpr, ROWS: tl.constexpr,
                   PRE_K: tl.constexpr):
    """``sum(x_new * x_new)`` per row (``[ROWS]``) of the rounded ``x_new``; stores ``x_new`` to ``XO``
    where ``write`` holds (one program)."""
    rows = tl.arange(0, ROWS)[:, None]
    inv1 = inv1[:, None]
    ss = tl.zeros([ROWS], dtype=tl.float32)
    for k0 in range(0, K, PRE_K):
        cols = k0 + tl.arange(0, PRE_K)[None, :]
        col_mask = cols < K
        mask = (rows < M) & col_mask
        x = tl.load(A + rows * stride + cols, mask=mask, other=0.0).to(tl.float32)
        br = tl.load(B + rows * stride + cols, mask=mask, other=0.0).to(tl.float32)
        wp = tl.load(WP + cols, mask=col_mask, other=0.0).to(tl.float32)
        x_new = _residual(x, br, wp, inv1, SANDWICH).to(XO.dtype.element_ty)
        tl.store(XO + rows * stride + cols, x_new, mask=mask & write)
        x_new = x_new.to(tl.float32)
        ss += tl.sum(x_new * x_new, axis=1)
    return ss


@triton.jit
def _expand_rows(v, ROWS: tl.constexpr, BLOCK_M: tl.constexpr):
    """``[ROWS]`` per-row values as a ``[BLOCK_M, 1]`` column, zero past ``ROWS``."""
    if ROWS == BLOCK_M:
        return v[:, None]
    pick = tl.arange(0, BLOCK_M)[:, None] == tl.arange(0, ROWS)[None, :]
    return tl.sum(tl.where(pick, v[None, :], 0.0), axis=1)[:, None]


@triton.jit
def _scales(A, B, WP, XO, M, K, stride, eps, write, PROLOGUE: tl.constexpr, SANDWICH: tl.constexpr,
            ROWS: tl.constexpr, BLOCK_M: tl.constexpr, PRE_K: tl.constexpr):
    """The norms' per-row ``1 / rms`` as ``[BLOCK_M, 1]`` columns: ``inv1`` of the post-norm's input
    (``RESIDUAL``), ``inv2`` of the matmul operand's norm (``RMSNORM``, ``RESIDUAL``). The pre-passes run on
    the ``ROWS`` real rows (not the 16 a dot pads to), in few wide tiles: their loads are not pipelined."""
    inv1 = tl.zeros([ROWS], dtype=tl.float32)
    inv2 = inv1
    if PROLOGUE == _RMSNORM:
        inv2 = tl.rsqrt(_sum_squares(A, A, M, K, stride, False, ROWS, PRE_K) / K + eps)
    elif PROLOGUE == _RESIDUAL:
        if SANDWICH:
            ss = _sum_squares(B, B, M, K, stride, False, ROWS, PRE_K)
        else:
            ss = _sum_squares(A, B, M, K, stride, True, ROWS, PRE_K)
        inv1 = tl.rsqrt(ss / K + eps)
        inv2 = tl.rsqrt(_residual_pass(A, B, WP, XO, M, K, stride, inv1, write, SANDWICH, ROWS, PRE_K) / K + eps)
    return _expand_rows(inv1, ROWS, BLOCK_M), _expand_rows(inv2, ROWS, BLOCK_M)


@triton.jit
def _act_loads(A, B, WP, WN, rows, row_mask, cols, K, stride, PROLOGUE: tl.constexpr):
    """The raw inputs of one activation tile (prefetched an iteration ahead of their use): SiLU
    ``(gate, up)``, RMSNORM ``(x, w_norm)``, RESIDUAL ``(x, branch, w_post, w_next)``; unused slots repeat."""
    col_mask = cols < K
    mask = row_mask & col_mask
    p = tl.load(A + rows * stride + cols, mask=mask, other=0.0, eviction_policy="evict_last")
    q = p
    r = p
    s = p
    if PROLOGUE == _SILU:
        q = tl.load(A + rows * stride + K + cols, mask=mask, other=0.0, eviction_policy="evict_last")
    elif PROLOGUE == _RMSNORM:
        r = tl.load(WN + cols, mask=col_mask, other=0.0, eviction_policy="evict_last")
    elif PROLOGUE == _RESIDUAL:
        q = tl.load(B + rows * stride + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        r = tl.load(WN + cols, mask=col_mask, other=0.0, eviction_policy="evict_last")
        s = tl.load(WP + cols, mask=col_mask, other=0.0, eviction_policy="evict_last")
    return p, q, r, s


@triton.jit
def _act_tile(p, q, r, s, inv1, inv2, PROLOGUE: tl.constexpr, SANDWICH: tl.constexpr, DT: tl.constexpr):
    """The matmul operand from :func:`_act_loads`' tiles, rounded to ``DT`` where the torch path rounds."""
    if PROLOGUE == _SILU:
        g = p.to(tl.float32)
        a = (g / (1.0 + tl.exp(-g)) * q.to(tl.float32)).to(DT)
    elif PROLOGUE == _RMSNORM:
        a = (p.to(tl.float32) * inv2 * r.to(tl.float32)).to(DT)
    else:
        x_new = _residual(p.to(tl.float32), q.to(tl.float32), s.to(tl.float32), inv1, SANDWICH).to(DT)
        a = (x_new.to(tl.float32) * inv2 * r.to(tl.float32)).to(DT)
    return a


@triton.jit
def _w_tile(W, rows64, n_mask, cols, K, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    """A ``[BLOCK_N, BLOCK_K]`` weight tile, streamed (evict first)."""
    ptrs = W + rows64 * K + cols
    if EVEN_N and EVEN_K:
        return tl.load(ptrs, eviction_policy="evict_first")
    return tl.load(ptrs, mask=n_mask & (cols < K), other=0.0, eviction_policy="evict_first")


@triton.jit
def _mma(acc, a, w, MODE: tl.constexpr, PRECISION: tl.constexpr):
    """``acc += a @ w.T`` (``[BLOCK_M, BLOCK_N]``; ``[BLOCK_N, BLOCK_M]`` for ``MODE`` 2)."""
    if MODE == 0:
        acc += tl.sum(a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    elif MODE == 1:
        acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
    else:
        acc = tl.dot(w, tl.trans(a), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _gemv_kernel(A, B, WP, WN, W, OUT, XO, M, N, K, stride, eps, k_chunk,
                 PROLOGUE: tl.constexpr, SANDWICH: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE_K: tl.constexpr,
                 MODE: tl.constexpr, PARTIAL: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                 PRECISION: tl.constexpr):
    """``OUT[m, n] = sum_k act[m, k] * W[n, k]`` over program ``(n-block, k-slice)``'s share; ``PARTIAL``:
    fp32 partials at ``OUT[k-slice, m, n]``, else the result in ``OUT``'s dtype."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    dt = A.dtype.element_ty
    rows = tl.arange(0, BLOCK_M)[:, None]
    row_mask = rows < M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n[:, None] < N
    rows64 = offs_n[:, None].to(tl.int64)
    cols = pid_k * k_chunk + tl.arange(0, BLOCK_K)[None, :]
    if MODE == 2:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    p, q, r, s = _act_loads(A, B, WP, WN, rows, row_mask, cols, K, stride, PROLOGUE)  # overlaps the pre-passes
    inv1, inv2 = _scales(A, B, WP, XO, M, K, stride, eps, (pid_n == 0) & (pid_k == 0), PROLOGUE, SANDWICH,
                         ROWS, BLOCK_M, PRE_K)
    for _ in range(0, k_chunk // BLOCK_K):  # tiles past K (last slice): masked, EVEN_K is false
        w = _w_tile(W, rows64, n_mask, cols, K, EVEN_N, EVEN_K)
        if PROLOGUE == _PLAIN:  # a plain operand load, which Triton pipelines with the weight's
            a = tl.load(A + rows * stride + cols, mask=row_mask & (cols < K), other=0.0,
                        eviction_policy="evict_last")
        else:  # computed from the tiles loaded last iteration; prefetch the next
            a = _act_tile(p, q, r, s, inv1, inv2, PROLOGUE, SANDWICH, dt)
            p, q, r, s = _act_loads(A, B, WP, WN, rows, row_mask, cols + BLOCK_K, K, stride, PROLOGUE)
        acc = _mma(acc, a, w, MODE, PRECISION)
        cols += BLOCK_K
    if MODE == 2:
        acc = tl.trans(acc)

    cols_n = offs_n[None, :]
    mask = row_mask & (cols_n < N)
    if PARTIAL:
        tl.store(OUT + pid_k * M * N + rows * N + cols_n, acc, mask=mask)
    else:
        tl.store(OUT + rows * N + cols_n, acc.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _split_sum_kernel(P, OUT, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """``OUT = sum_s P[s]`` (fp32 partials, summed in order), rounded to ``OUT``'s dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(P + s * MN + offs, mask=mask, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)


# ----- host side ---------------------------------------------------------------------------------------
class _Prologue(NamedTuple):
    kind: int
    branch: torch.Tensor | None = None
    w_post: torch.Tensor | None = None
    w_norm: torch.Tensor | None = None
    x_out: torch.Tensor | None = None
    eps: float = 0.0
    sandwich: bool = False


def _check(act: torch.Tensor, w: torch.Tensor, k_act: int, *vectors: torch.Tensor) -> None:
    """Shapes, dtypes and contiguity (metadata only: no device work, no sync)."""
    if act.dim() != 2 or w.dim() != 2 or act.shape[1] != k_act or act.dtype != w.dtype:
        raise ValueError(f"gemv: activation {tuple(act.shape)} {act.dtype} does not fit weight "
                         f"{tuple(w.shape)} {w.dtype}")
    if any(v.shape != (w.shape[1],) for v in vectors):
        raise ValueError(f"gemv: norm weights must have shape ({w.shape[1]},)")
    if not all(t.is_contiguous() for t in (act, w, *vectors)):
        raise ValueError("gemv: inputs must be contiguous")


class _Plan(NamedTuple):
    grid: tuple[int, int]
    split: int
    k_chunk: int
    meta: dict


def _plan(op: str, m: int, n: int, k: int, dtype: torch.dtype, sandwich: bool, cfg: GemvConfig) -> _Plan:
    """The launch of ``op`` for ``M, N, K``: grid, effective split, ``K`` per split and the constexprs."""
    rows = m_bucket(m)
    block_m = max(rows, 16 if cfg.mode else 1)
    k_chunk = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_chunk)
    pre_k = min(triton.next_power_of_2(k), PRE_ELEMENTS // rows)
    meta = dict(PROLOGUE=OPS[op], SANDWICH=sandwich and op == "residual", ROWS=rows,
                BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PRE_K=pre_k, MODE=cfg.mode,
                PARTIAL=split > 1, EVEN_N=n % cfg.block_n == 0, EVEN_K=k % k_chunk == 0,
                PRECISION="ieee" if dtype == torch.float32 else "tf32", num_warps=cfg.num_warps,
                num_stages=cfg.num_stages)
    return _Plan((triton.cdiv(n, cfg.block_n), split), split, k_chunk, meta)


def _launch(op: str, act: torch.Tensor, w: torch.Tensor, pro: _Prologue, config: GemvConfig | None
            ) -> torch.Tensor:
    """``act'[M, K] @ w.T`` with the prologue ``pro`` applied to ``act`` (``[M, K]``, ``[M, 2K]`` for SiLU)."""
    m, stride = act.shape
    n, k = w.shape
    plan = _plan(op, m, n, k, act.dtype, pro.sandwich, config or config_for(op, m, n, k))
    out = torch.empty((m, n), device=act.device, dtype=act.dtype)
    dst = out if plan.split == 1 else torch.empty((plan.split, m, n), device=act.device, dtype=torch.float32)
    _gemv_kernel[plan.grid](act, _or(pro.branch, act), _or(pro.w_post, act), _or(pro.w_norm, act), w, dst,
                            _or(pro.x_out, act), m, n, k, stride, pro.eps, plan.k_chunk, **plan.meta)
    if plan.split > 1:
        _split_sum_kernel[(triton.cdiv(m * n, SUM_BLOCK),)](dst, out, m * n, SPLIT_K=plan.split, BLOCK=SUM_BLOCK,
                                                             num_warps=4)
    return out


def _or(t: torch.Tensor | None, fallback: torch.Tensor) -> torch.Tensor:
    return fallback if t is None else t


def precompile(op: str, m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16, sandwich: bool = False,
               config: GemvConfig | None = None) -> None:
    """Compile (without running) the kernels ``op`` launches for an ``[m, k] x [n, k]`` product, so a
    later call, e.g. under CUDA-graph capture, finds them built; ``op`` as in :data:`OPS`."""
    plan = _plan(op, m, n, k, dtype, sandwich, config or config_for(op, m, n, k))
    stride = 2 * k if op == "silu" else k
    out_dtype = dtype if plan.split == 1 else torch.float32
    _gemv_kernel.warmup(dtype, dtype, dtype, dtype, dtype, out_dtype, dtype, m, n, k, stride, 1e-6,
                        plan.k_chunk, grid=plan.grid, **plan.meta)
    if plan.split > 1:
        _split_sum_kernel.warmup(torch.float32, dtype, m * n, SPLIT_K=plan.split, BLOCK=SUM_BLOCK, num_warps=4,
                                 grid=(triton.cdiv(m * n, SUM_BLOCK),))


def gemv(x: torch.Tensor, w: torch.Tensor, config: GemvConfig | None = None) -> torch.Tensor:
    """``x @ w.T`` (``F.linear(x, w)``) for ``x`` ``[M, K]``, ``w`` ``[N, K]``."""
    _check(x, w, w.shape[1])
    return _launch("gemv", x, w, _Prologue(PLAIN), config)


def gemv_silu(gu: torch.Tensor, w: torch.Tensor, config: GemvConfig | None = None) -> torch.Tensor:
    """``silu_mul(gu) @ w.T`` for the fused gate/up ``gu`` ``[M, 2I]`` (gate first), ``w`` ``[N, I]``."""
    _check(gu, w, 2 * w.shape[1])
    return _launch("silu", gu, w, _Prologue(SILU), config)


def gemv_rmsnorm(x: torch.Tensor, w_norm: torch.Tensor, eps: float, w: torch.Tensor,
                 config: GemvConfig | None = None) -> torch.Tensor:
    """``rms_norm(x, w_norm) @ w.T`` (the norm rounded to ``x.dtype`` first)."""
    _check(x, w, w.shape[1], w_norm)
    return _launch("rmsnorm", x, w, _Prologue(RMSNORM, w_norm=w_norm, eps=eps), config)


def gemv_residual(branch: torch.Tensor, x: torch.Tensor, w_post: torch.Tensor, w_next: torch.Tensor,
                  eps: float, sandwich: bool, w: torch.Tensor, config: GemvConfig | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual_norm(branch, x, w_post, w_next, eps, sandwich)`` then its ``h @ w.T``: returns
    ``(h @ w.T, x_new)``; ``x_new`` is a new tensor (``x`` and ``branch`` are left as they are)."""
    _check(x, w, w.shape[1], w_post, w_next)
    if branch.shape != x.shape or branch.dtype != x.dtype or not branch.is_contiguous():
        raise ValueError(f"gemv_residual: branch {tuple(branch.shape)} does not match x {tuple(x.shape)}")
    x_new = torch.empty_like(x)
    pro = _Prologue(RESIDUAL, branch=branch, w_post=w_post, w_norm=w_next, x_out=x_new, eps=eps,
                    sandwich=sandwich)
    return _launch("residual", x, w, pro, config), x_new
