"""L2 prefetch of a few-row matmul's weights, issued before it waits for its predecessor, and where in its K loop it
lets its successor launch.

Why: under programmatic dependent launch (:mod:`executor.chain`) a kernel becomes resident while its predecessor
still runs and then waits (``griddepcontrol.wait``). Its weights never depend on the predecessor, so a
``prefetch.global.L2`` of them before the wait starts their DRAM reads under the predecessor's tail; after the wait
its loads find them in L2. A prefetch is a hint: nothing waits for it and it holds no registers. How long the
successor has for that depends on when the predecessor lets it launch: right after its wait (the early trigger),
after its K loop (the late one, the shipped few-row matmul's), or with a few of its K chunks left (``trigger_left``),
which overlaps the successor's start with the last of the predecessor's stream without having it resident beside
the whole of it.

Both are off by default and set by environment (a benchmark compares them): ``CDBSIM_PREFETCH=bytes`` of weights per
program (``all``: a program's whole slab), ``CDBSIM_FEW_TRIGGER_LEFT=chunks`` left in the loop when the late trigger
fires. Prefetch is inline PTX: off under Triton's interpreter and off CUDA. Measured on the H200:
docs/executor.md.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from cdbsim.errors import ConfigError

LINE_BYTES = 128  # one L2 line: what a prefetch brings in
ALL = 1 << 30  # a budget that covers any program's slab
STEP_LINES = tl.constexpr(256)  # addresses one loop step of prefetch_rows issues (a program's registers hold them)


def _env_int(name: str, words: dict[str, int]) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return 0
    if text in words:
        return words[text]
    if not text.isdigit():
        raise ConfigError(f"{name}: expected a non-negative integer or one of {sorted(words)}, got {text!r}")
    return int(text)


def budget(t: torch.Tensor) -> int:
    """Bytes of weights each few-row matmul program prefetches into L2 before its wait (0: none)."""
    if t.device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return 0
    return _env_int("CDBSIM_PREFETCH", {"all": ALL})


def trigger_left() -> int:
    """K chunks a late-triggering few-row matmul has left when it lets its successor launch (0: after the loop)."""
    return _env_int("CDBSIM_FEW_TRIGGER_LEFT", {})


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
