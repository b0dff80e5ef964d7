"""The few-row matmul with weights loaded straight into MMA registers (``csrc/few_rows_direct.cu``): ``x @ w.T`` for
up to 16 bf16 rows, with the SwiGLU of a fused gate/up projection in the epilogue, PDL-launched like the Triton
kernels around it.

Why a third few-row kernel: the Triton one (:mod:`executor.few_rows`) and the tensor-copy one
(:mod:`executor.few_rows_tma`) stage weights in shared memory, and at a few rows the instructions around that
staging, not the bytes, bound them. Here a lane's 16-byte weight load is already an MMA operand, each warp holds 64
weight rows (32 at 9-16 rows) so a fragment of the rows feeds four MMAs (two), and the splits of K that spread a
narrow projection over the SMs meet through the shared memory of a thread-block cluster (the source file says how).
Selected by ``CDBSIM_FEW_ROWS_KERNEL=direct`` (:func:`executor.few_rows.linear`) for the shapes where it measured
faster than the Triton kernel (:data:`FASTER`), by ``direct-all`` for every shape it takes, on a Hopper GPU only.

``CDBSIM_DIRECT_SPLITS`` (1-8) fixes how many CTAs share a block's K; by default :func:`splits_for` picks them.
"""

from __future__ import annotations

import ctypes
import os

import torch

from executor import cuda_driver

PDL_KIND = "few_rows_direct"  # its name in executor.chain.pdl_mode (one of LATE_KINDS)
SOURCE = cuda_driver.CSRC / "few_rows_direct.cu"
NAMES = ("few_rows_direct_8", "few_rows_direct_16", "few_rows_direct_swiglu_8", "few_rows_direct_swiglu_16")
MAX_ROWS = 16  # two MMAs of 8 rows
THREADS = 256  # the source's WARPS x 32
CTAS_PER_SM = 2  # the source's launch bounds
STEP = 32  # K columns of a warp step
MAX_SPLITS = 8  # CTAs of a cluster (the portable limit)
DEFAULT_MAX_SPLITS = 6  # most splits splits_for picks (8-CTA clusters measured slower)
MIN_WARP_STEPS = 2  # splits_for keeps each warp at least this many steps


# (N, K, swiglu) -> most rows up to which this kernel measured faster than the Triton few-row matmul in a graph of 20
# calls under PDL (benchmarks/bench_chain.py --parts direct on the H200, benchmarks/results/few-row-direct)
FASTER: dict[tuple[int, int, bool], int] = {
    (2048, 2048, False): 8,  # ouro.wo
    (2048, 5632, False): 8,  # ouro.down
}


def faster(rows: int, n: int, k: int, swiglu: bool) -> bool:
    """Whether an ``rows``-row launch of this ``[n, k]`` projection is one :data:`FASTER` gives this kernel."""
    return rows <= FASTER.get((n, k, swiglu), 0)


def block_cols(rows: int, swiglu: bool) -> int:
    """Output columns of a CTA's block: its warps hold four 16-row weight tiles at up to 8 rows of x, two at 9-16
    (the source's TILES; 128 registers a thread), half of them gate and half up rows with SwiGLU."""
    weight_rows = 64 if rows <= 8 else 32
    return weight_rows // 2 if swiglu else weight_rows


def splits_for(blocks: int, steps: int, sms: int) -> int:
    """CTAs sharing each block's ``steps`` K steps: enough to give every SM its two CTAs when the blocks alone do
    not (at most :data:`DEFAULT_MAX_SPLITS`, and each of a CTA's 8 warps :data:`MIN_WARP_STEPS` steps or more), one
    when they do."""
    fill = CTAS_PER_SM * sms // blocks
    return max(1, min(DEFAULT_MAX_SPLITS, fill, steps // (8 * MIN_WARP_STEPS)))


def splits_from_env() -> int | None:
    """``CDBSIM_DIRECT_SPLITS`` when set (1..8), else None."""
    raw = os.environ.get("CDBSIM_DIRECT_SPLITS")
    if raw is None:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_SPLITS:
        raise ValueError(f"CDBSIM_DIRECT_SPLITS must be 1..{MAX_SPLITS}, got {raw!r}")
    return int(raw)


def shape_problem(m: int, n: int, k: int, swiglu: bool) -> str | None:
    """Why an ``m``-row launch of ``n`` output columns over ``k`` does not fit the kernel (None when it does): at most
    :data:`MAX_ROWS` rows, ``k`` a multiple of 32 (a warp step), ``n`` of 16 (a weight tile; per half with SwiGLU)."""
    if not 1 <= m <= MAX_ROWS:
        return f"1..{MAX_ROWS} rows, got {m}"
    if k % STEP:
        return f"K a multiple of {STEP}, got {k}"
    if n % 16:
        return f"N a multiple of 16{' per half' if swiglu else ''}, got {n}"
    return None


def supports(x: torch.Tensor, w: torch.Tensor, swiglu: bool) -> str | None:
    """Why this kernel cannot take ``x @ w.T`` (None when it can)."""
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    return cuda_driver.operand_problem(x, w) or shape_problem(x.shape[0], n, x.shape[1], swiglu)


def linear(x: torch.Tensor, w: torch.Tensor, swiglu: bool = False, pdl: int = 0,
           splits: int | None = None) -> torch.Tensor:
    """``x @ w.T`` for contiguous bf16 ``x`` ``[M, K]`` (``M <= 16``) and ``w`` ``[N, K]``; with ``swiglu``,
    ``silu(gate) * up`` of the fused ``[2N, K]`` projection (gate and up each rounded to bf16 first, as the torch
    backend rounds). ``pdl``: :func:`executor.chain.pdl_mode`'s value: 0 a plain launch; under PDL the successor
    may launch right after the wait (``EARLY``) or once every warp is past its main loop (``LATE``). ``splits``:
    CTAs per block (default ``CDBSIM_DIRECT_SPLITS``, else :func:`splits_for`)."""
    why = supports(x, w, swiglu)
    if why:
        raise ValueError(f"few-row direct matmul: {why}")
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    blocks = -(-n // block_cols(m, swiglu))
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    splits = splits or splits_from_env() or splits_for(blocks, k // STEP, sms)
    if not 1 <= splits <= min(MAX_SPLITS, k // STEP):
        raise ValueError(f"few-row direct matmul: 1..{min(MAX_SPLITS, k // STEP)} splits for K = {k}, got {splits}")
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    name = f"few_rows_direct{'_swiglu' if swiglu else ''}_{8 if m <= 8 else 16}"
    kernels = cuda_driver.functions(SOURCE, NAMES, cuda_driver.device_index(x))
    args = [ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
            ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k), ctypes.c_int(splits), ctypes.c_int(pdl)]
    cuda_driver.launch(kernels, name, x.device, blocks * splits, THREADS, 0, [ctypes.addressof(a) for a in args],
                       bool(pdl), cluster=splits)
    return out
