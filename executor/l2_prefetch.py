"""Weights pulled into L2 ahead of the kernel that reads them, while a decode layer's attention runs.

Why: at a few rows a layer's projections are bound by a fixed cost per kernel (filling the memory pipe), and
between the QKV and O projections the layer runs RoPE / KV write and attention, which at short contexts leave
HBM mostly idle. One small kernel launched there issues Hopper's bulk L2 prefetch
(``cp.async.bulk.prefetch.L2.global``) for the O projection's weights and the first bytes of every row of
the gate/up projection (what its programs read first), so those kernels start from L2.

The kernel is PDL-launched behind the QKV projection: it lets its successor launch at once, issues its
prefetches (fire and forget: nothing waits for them, nothing depends on them) and then waits for its
predecessor before it exits, so the kernel after it still sees the QKV projection finished.

Experimental: off unless ``CDBSIM_L2_PREFETCH=O_BYTES,GATE_UP_BYTES`` (bytes per weight row, rounded down to
16; ``0`` leaves that weight out), on CUDA devices of compute capability 9 with PDL on. On CPU and under
Triton's interpreter it does nothing (the instruction has no interpreted form and changes no result).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from executor.chain import launch_options, pdl_mode

ROWS_PER_PROGRAM = 64  # weight rows one program issues prefetches for (one per lane)


def setting() -> tuple[int, int] | None:
    """``(o_bytes, gate_up_bytes)`` per weight row from ``CDBSIM_L2_PREFETCH``, or None when off."""
    env = os.environ.get("CDBSIM_L2_PREFETCH", "").strip()
    if env in ("", "0", "off"):
        return None
    try:
        o_bytes, gate_up_bytes = (int(v) for v in env.split(","))
    except ValueError:
        raise ValueError(f"CDBSIM_L2_PREFETCH must be 'O_BYTES,GATE_UP_BYTES' (bytes per weight row), "
                         f"got {env!r}") from None
    if o_bytes < 0 or gate_up_bytes < 0:
        raise ValueError(f"CDBSIM_L2_PREFETCH: bytes per row must be >= 0, got {env!r}")
    return o_bytes, gate_up_bytes


@triton.jit
def _prefetch_rows(W, rows, n_rows, row_bytes, nbytes):
    """One bulk L2 prefetch of ``nbytes`` from the start of each of ``rows`` (rows past ``n_rows`` repeat row 0)."""
    addr = W.to(tl.pointer_type(tl.int8)) + tl.where(rows < n_rows, rows, 0).to(tl.int64) * row_bytes
    size = tl.full(rows.shape, 0, tl.int32) + nbytes
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                              [addr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_kernel(A, A_ROWS, A_ROW_BYTES, A_BYTES, B, B_ROWS, B_ROW_BYTES, B_BYTES,
                        A_PROGRAMS, ROWS: tl.constexpr, PDL: tl.constexpr):
    """Programs ``0 .. A_PROGRAMS`` prefetch rows of ``A``, the rest rows of ``B``; then wait for the predecessor."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    if pid < A_PROGRAMS:
        _prefetch_rows(A, pid * ROWS + tl.arange(0, ROWS), A_ROWS, A_ROW_BYTES, A_BYTES)
    else:
        _prefetch_rows(B, (pid - A_PROGRAMS) * ROWS + tl.arange(0, ROWS), B_ROWS, B_ROW_BYTES, B_BYTES)
    if PDL:
        gdc_wait()


def prefetch(a: torch.Tensor, a_bytes: int, b: torch.Tensor, b_bytes: int) -> None:
    """Prefetch the first ``a_bytes`` / ``b_bytes`` of every row of the 2-D weights ``a`` and ``b`` into L2
    (rounded down to 16 bytes and capped at the row; a weight with 0 bytes is skipped). A no-op off CUDA."""
    if a.device.type != "cuda":
        return
    a_bytes, b_bytes = (min(n, t.shape[1] * t.element_size()) // 16 * 16 for n, t in ((a_bytes, a), (b_bytes, b)))
    a_programs = triton.cdiv(a.shape[0], ROWS_PER_PROGRAM) if a_bytes else 0
    b_programs = triton.cdiv(b.shape[0], ROWS_PER_PROGRAM) if b_bytes else 0
    if not a_programs + b_programs:
        return
    if not pdl_mode(a, "l2_prefetch"):
        return  # without PDL it would be one more serialized launch, no overlap
    _l2_prefetch_kernel[(a_programs + b_programs,)](
        a, a.shape[0], a.stride(0) * a.element_size(), a_bytes, b, b.shape[0], b.stride(0) * b.element_size(),
        b_bytes, a_programs, ROWS=ROWS_PER_PROGRAM, PDL=True, num_warps=2, **launch_options(True))
