"""L2 prefetch of what a kernel will read, issued before it waits for its predecessor.

Why: under programmatic dependent launch (:mod:`executor.chain`) a kernel becomes resident while its predecessor
still runs and then waits (``griddepcontrol.wait``). Its weights and the KV cache never depend on the predecessor,
so a ``prefetch.global.L2`` of them before the wait starts their DRAM reads under the predecessor's tail; after the
wait its loads find them in L2. A prefetch is a hint: it returns nothing and nothing waits for it, so it adds bytes
in flight without holding registers, which a small launch's one or two programs per SM cannot otherwise do.

How much each kind of kernel prefetches (its *budget*) is :data:`BUDGETS`: bytes of weights per program for the
matmuls (``few_rows``, ``chain``), positions of K and V per program for decode attention (``attention``); 0 turns
it off. ``CDBSIM_PREFETCH=kind=value,...`` overrides them (a benchmark compares). Prefetch is inline PTX: it is
off under Triton's interpreter and off CUDA.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LINE_BYTES = 128  # one L2 line: what a prefetch brings in
BUDGETS = {"few_rows": 0, "chain": 0, "attention": 0}
STEP_LINES = tl.constexpr(256)  # addresses one loop step of prefetch_rows issues (a program's registers hold them)


def _parse(text: str) -> dict[str, int]:
    budgets = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, value = item.partition("=")
        if kind not in BUDGETS or not value.strip().isdigit():
            raise ValueError(f"CDBSIM_PREFETCH: expected kind=integer with kind in {sorted(BUDGETS)}, got {item!r}")
        budgets[kind] = int(value)
    return budgets


def budget(t: torch.Tensor, kind: str) -> int:
    """The prefetch budget of a kernel of ``kind`` on ``t``'s device (0: none; see the module notes)."""
    if t.device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return 0
    return _parse(os.environ.get("CDBSIM_PREFETCH", "")).get(kind, BUDGETS[kind])


def line_elements(t: torch.Tensor) -> int:
    """Elements of ``t``'s dtype in one L2 line."""
    return LINE_BYTES // t.element_size()


def weight_columns(k: int, rows: int, line: int, budget_bytes: int) -> int:
    """Columns of each of a program's ``rows`` weight rows (``k`` long) to prefetch within ``budget_bytes``: a
    power of two of lines (``line`` elements each), at most the whole row; 0 when not even one line each fits."""
    fit = budget_bytes // (rows * LINE_BYTES)  # lines per row within the budget
    if fit < 1:
        return 0
    return min(triton.next_power_of_2(triton.cdiv(k, line)), 1 << (fit.bit_length() - 1)) * line


@triton.jit
def prefetch_l2(ptrs, valid):
    """``prefetch.global.L2`` of every address of ``ptrs`` where ``valid``."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, valid.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_rows(W, first, last, ROWS: tl.constexpr, K: tl.constexpr, COLS: tl.constexpr, LINE: tl.constexpr):
    """Prefetch the first ``COLS`` columns of the ``K``-long rows ``first .. first + ROWS`` of ``W`` (those past
    ``last`` not at all), at most :data:`STEP_LINES` addresses at a time so the addresses never crowd the
    registers. ``COLS == 0``: nothing."""
    if COLS > 0:
        r = first + tl.arange(0, ROWS)
        row_ok = (r <= last)[:, None]
        rows = W + r.to(tl.int64)[:, None] * K
        STEP: tl.constexpr = max(1, min(COLS // LINE, STEP_LINES // ROWS)) * LINE
        for c0 in tl.range(0, COLS, STEP):
            c = c0 + tl.arange(0, STEP // LINE) * LINE
            prefetch_l2(rows + tl.minimum(c, K - 1)[None, :], row_ok & (c < K)[None, :])
