"""A few-row layer's MLP block as one persistent kernel: gate/up with SwiGLU, down, residual norm.

Why: at 2-16 rows each kernel of a layer pays a fixed cost to fill and drain the memory pipe (about 3 us a kernel
on the H200, ``docs/executor.md``), and the MLP block is three of them: the gate/up projection (SwiGLU in its
epilogue), the down projection and the residual norm after it. Here one launch runs all three as work items
taken from a queue in dependency order, so a program that finishes a gate/up tile goes straight on to a down tile
and loads that tile's first weights *before* it waits for the last gate/up tile: the next phase's weight stream
starts under the tail of the last, with no launch between them. Each program's first gate/up tile likewise loads
its first weights before it waits for the kernel before (PDL), as :mod:`executor.few_rows` does.

Work items, in queue order: ``cdiv(INTER, BN_A)`` gate/up tiles (``BN_A`` columns of ``silu(gate) * up`` for every
row), ``cdiv(H, BN_B)`` down tiles (``BN_B`` output columns, rounded to the activation dtype as ``F.linear``
rounds), then one residual norm per row (:func:`executor.ops.residual_norm`'s arithmetic). A tile of a later phase
waits until every item of the phase before has finished: each finished item counts itself with a gpu-scope
release (after a block barrier, so every thread's stores are in), the waiter spins on an acquire load, and reads
the earlier phase's outputs through L2 (``.cg``). An item only ever waits for items earlier in the queue, which
programs already running hold, so the kernel cannot deadlock however many programs are resident. The last
program to leave resets the queue and the counters for the next launch (a CUDA graph replays the same buffer).

Under Triton's interpreter the programs run one after another: the first takes every item in order (each finds its
inputs ready) and the others find the queue empty; that is how the tests check it against the torch composition.
A candidate, not yet measured on a GPU: layers take it when ``Ops.persistent_mlp`` is set
(``benchmarks/bench_executor.py --persistent-mlp``; ``benchmarks/bench_chain.py --parts layers`` compares it with
the few-row path; ``bash benchmarks/gpu_session.sh persistent`` runs both). The engine's path is
:mod:`executor.few_rows` and the residual-norm kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from executor.chain import LATE, launch_options, let_successor_launch, pdl_mode, sm_count
from executor.few_rows import MAX_ROWS, block_rows, finish_tile, first_chunk
from executor.triton_kernels import residual_norm_row

QUEUE, DONE_A, DONE_B, EXITED = 0, 1, 2, 3  # the sync buffer's counters


class MlpConfig(NamedTuple):
    """Output columns and K chunk of a gate/up tile and of a down tile, warps, pipeline stages of each loop and
    programs per SM."""

    bn_a: int = 32
    bk_a: int = 128
    bn_b: int = 16
    bk_b: int = 256
    num_warps: int = 4
    stages_a: int = 3
    stages_b: int = 4
    programs_per_sm: int = 1


def warps(cfg: MlpConfig, block_m: int) -> int:
    """``cfg``'s warps at 16 rows, more for a taller row tile (at most 8): with its own warps the kernel spilled at
    32 rows when compiled for sm_90 (the first weight chunk is held across the wait)."""
    return min(8, cfg.num_warps * block_m // 16)


_SYNC: dict[torch.device, torch.Tensor] = {}


def sync_buffer(device: torch.device) -> torch.Tensor:
    """The zeroed queue and counters every launch on ``device`` shares (each launch leaves them zero)."""
    if device not in _SYNC:
        _SYNC[device] = torch.zeros(4, device=device, dtype=torch.int32)
    return _SYNC[device]


@triton.jit
def _wait_count(COUNTER, target):
    """Spin until ``COUNTER`` reaches ``target``, then one acquire and a block barrier: every thread may read what
    the counted items wrote. The spin reads with volatile loads, not read-modify-writes, so a hundred waiting
    programs do not queue atomics on the address the producers count on."""
    seen = tl.load(COUNTER, volatile=True)
    while seen < target:
        seen = tl.load(COUNTER, volatile=True)
    seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
    while seen < target:  # never loops (the count only grows); it keeps the acquire, whose value is used here
        seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _count_done(COUNTER):
    """This item's stores are done (block barrier), then count it with a gpu-scope release."""
    tl.debug_barrier()
    tl.atomic_add(COUNTER, 1, sem="release", scope="gpu")


@triton.jit
def _mlp_kernel(Hin, X, WGU, WD, WP, WN, ACT, MO, XO, HO, SYNC, M, eps, INTER: tl.constexpr, N: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BN_A: tl.constexpr, BK_A: tl.constexpr,
                BN_B: tl.constexpr, BK_B: tl.constexpr, STAGES_A: tl.constexpr, STAGES_B: tl.constexpr,
                SANDWICH: tl.constexpr, HAS_NEXT: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr):
    """Work items from the queue ``SYNC[QUEUE]`` until it runs out (module notes); the last program out resets the
    sync buffer."""
    n_a = tl.cdiv(INTER, BN_A)
    n_b = tl.cdiv(N, BN_B)
    total = n_a + n_b + M
    # the queue is taken before the wait for the kernel before: the launch that last used it has finished (a
    # kernel is let launch only once the one before it has waited, so every launch two back is done)
    t = tl.atomic_add(SYNC + 0, 1, sem="relaxed", scope="gpu")
    while t < total:
        # a tile's first weight chunk is loaded before it waits for its inputs (executor.few_rows): under PDL the
        # first gate/up tile's streams under the kernel before; a down tile's under the last gate/up tiles
        if t < n_a:
            w, u, w_ptrs, x_ptrs, col_ok, row_ok = first_chunk(Hin, WGU, M, t, INTER, N, BLOCK_M, BN_A, BK_A, True)
            if PDL:
                gdc_wait()  # h comes from the kernel before (at once after a program's first item)
            finish_tile(ACT, M, t, w, u, w_ptrs, x_ptrs, col_ok, row_ok, INTER, N, BLOCK_M, BN_A, BK_A, STAGES_A,
                        True, IEEE, 0, "")
            _count_done(SYNC + 1)
        elif t < n_a + n_b:
            w, u, w_ptrs, x_ptrs, col_ok, row_ok = first_chunk(ACT, WD, M, t - n_a, N, INTER, BLOCK_M, BN_B, BK_B,
                                                               False)
            if PDL:
                gdc_wait()  # a program whose first item is a down tile (fewer programs than gate/up tiles: none)
            _wait_count(SYNC + 1, n_a)  # every gate/up tile has written its share of act
            finish_tile(MO, M, t - n_a, w, u, w_ptrs, x_ptrs, col_ok, row_ok, N, INTER, BLOCK_M, BN_B, BK_B,
                        STAGES_B, False, IEEE, 0, ".cg")
            _count_done(SYNC + 2)
        else:
            if PDL:
                gdc_wait()  # x comes from the kernel before
            _wait_count(SYNC + 2, n_b)
            residual_norm_row(MO, X, WP, WN, XO, HO, t - n_a - n_b, N, eps, SANDWICH, HAS_NEXT, BLOCK_N, ".cg")
        t = tl.atomic_add(SYNC + 0, 1, sem="relaxed", scope="gpu")
    let_successor_launch(PDL)
    tl.debug_barrier()
    if tl.atomic_add(SYNC + 3, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        for i in tl.static_range(4):  # every other program has left: nothing reads the buffer any more
            tl.atomic_xchg(SYNC + i, 0, sem="relaxed", scope="gpu")


def mlp(h: torch.Tensor, x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, w_post: torch.Tensor,
        w_next: torch.Tensor | None, eps: float, sandwich: bool, config: MlpConfig | None = None,
        programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``residual_norm(silu_mul(h @ w_gate_up.T) @ w_down.T, x, w_post, w_next, eps, sandwich)`` for up to
    :data:`executor.few_rows.MAX_ROWS` rows, as one launch: the new residual and ``w_next``'s norm of it (None
    without ``w_next``). ``programs`` overrides the grid (default: ``programs_per_sm`` per SM, at most one per work
    item)."""
    cfg = config or MlpConfig()
    h, x = h.contiguous(), x.contiguous()
    m, hidden = x.shape
    inter = w_gate_up.shape[0] // 2
    if not 1 <= m <= MAX_ROWS or h.shape != x.shape or w_gate_up.shape != (2 * inter, hidden) \
            or w_down.shape != (hidden, inter):
        raise ValueError(f"persistent MLP: rows {tuple(h.shape)} / {tuple(x.shape)} (1..{MAX_ROWS}) do not fit "
                         f"gate/up {tuple(w_gate_up.shape)} and down {tuple(w_down.shape)}")
    act = torch.empty((m, inter), device=x.device, dtype=x.dtype)
    branch = torch.empty_like(x)
    x_out = torch.empty_like(x)
    h_out = torch.empty_like(x) if w_next is not None else x_out
    items = triton.cdiv(inter, cfg.bn_a) + triton.cdiv(hidden, cfg.bn_b) + m
    grid = programs or min(items, cfg.programs_per_sm * sm_count(x.device))
    pdl = pdl_mode(x, "few_rows") and LATE
    _mlp_kernel[(grid,)](
        h, x, w_gate_up, w_down, w_post, w_next if w_next is not None else w_post, act, branch, x_out, h_out,
        sync_buffer(x.device), m, eps, INTER=inter, N=hidden, BLOCK_M=block_rows(m),
        BLOCK_N=triton.next_power_of_2(hidden), BN_A=cfg.bn_a, BK_A=cfg.bk_a, BN_B=cfg.bn_b, BK_B=cfg.bk_b,
        STAGES_A=cfg.stages_a, STAGES_B=cfg.stages_b, SANDWICH=sandwich, HAS_NEXT=w_next is not None,
        IEEE=x.dtype == torch.float32, PDL=pdl, num_warps=warps(cfg, block_rows(m)), **launch_options(bool(pdl)))
    return x_out, (h_out if w_next is not None else None)
