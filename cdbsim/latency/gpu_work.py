"""How the executor's paged decode attention divides its work, in plain Python for the latency model.

The kernel (``executor.triton_decode.decode_attention``) runs one program per (row, head, split). The split count
depends on rows x heads and the head width only, so a stage's CUDA graph runs the same kernel whatever its contexts:
:func:`decode_splits` gives it, :func:`split_positions` a row's positions per split (at least
``MIN_SPLIT_POSITIONS``, whole KV pages; splits past a row's context read nothing).
"""

from __future__ import annotations

import math

TARGET_PROGRAMS = 8192  # (row, head, split) programs per launch that keep HBM busy on an H200
TARGET_SPLITS = 16  # most splits the program target gives
MIN_PROGRAMS = 512  # fewest programs a launch starts, its splits raised up to MAX_SPLITS (decode_splits)
MAX_SPLITS = 32
MIN_SPLIT_POSITIONS = 64  # fewest positions a split covers (two of the many-row kernel's 32-position tiles)
PAGE = 16
CHAINED_MAX_HIDDEN = 2048  # widest model whose fewest rows run the chained kernels (executor.model.chained_rows)
CHAINED_BLOCK = 64  # positions per tile of the chained path's fused attention kernel (its BLOCK_N)


def head_parts(head_dim: int) -> tuple[int, int]:
    """Widths of the two power-of-two parts a ``head_dim``-wide head is loaded in (``(a, 0)``: one part); e.g. 96 is
    64 + 32, while 112 stays one 128-wide part."""
    padded = _next_power_of_2(head_dim)
    a = padded // 2
    if a >= 16 and head_dim > a and a + _next_power_of_2(head_dim - a) < padded:
        return a, _next_power_of_2(head_dim - a)
    return padded, 0


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def least_splits(head_dim: int) -> int:
    """The fewest splits a (row, head) gets: two for a head loaded in two parts (:func:`head_parts`), else one."""
    return 2 if head_parts(head_dim)[1] else 1


def decode_splits(rows: int, heads: int, head_dim: int) -> int:
    """Splits per (row, head) of a decode-attention launch: the most (up to ``TARGET_SPLITS``) that keep rows x heads
    x splits within ``TARGET_PROGRAMS``, at least :func:`least_splits`, and raised (up to ``MAX_SPLITS``) until
    the launch starts ``MIN_PROGRAMS`` programs."""
    return splits_at_least(rows, heads, least_splits(head_dim))


def splits_at_least(rows: int, heads: int, least: int) -> int:
    """:func:`decode_splits` with the head's fewest splits already known (worked out once per model)."""
    pairs = max(rows * heads, 1)
    return min(MAX_SPLITS, max(least, min(TARGET_SPLITS, TARGET_PROGRAMS // pairs), -(-MIN_PROGRAMS // pairs)))


def split_positions(context: int, splits: int) -> int:
    """Positions each split of a row with ``context`` positions covers (the last split may cover fewer)."""
    per = max(-(-context // splits), MIN_SPLIT_POSITIONS)
    return -(-per // PAGE) * PAGE


def critical_positions(context: int, splits: int) -> int:
    """Positions the longest program of a row with ``context`` positions walks (its first split's share)."""
    return min(context, split_positions(context, splits))


def first_context_reaching(positions: float, splits: int) -> int:
    """The shortest context whose critical path (:func:`critical_positions`) walks at least ``positions``."""
    if positions <= MIN_SPLIT_POSITIONS:
        return max(1, math.ceil(positions))
    pages_below = math.ceil(positions / PAGE) - 1
    return max(math.ceil(positions), splits * PAGE * pages_below + 1)


def chained_walk_length(context: float, heads: int, least: int) -> float:
    """The context at which one row on the chained path (models up to :data:`CHAINED_MAX_HIDDEN` wide) walks as many
    whole :data:`CHAINED_BLOCK`-position tiles per split as at ``context``; below two tiles, ``context`` itself."""
    if context <= 0:
        return context
    splits = splits_at_least(1, heads, least)
    per = split_positions(math.ceil(context), splits)
    if per <= CHAINED_BLOCK:
        return context
    return float(splits * CHAINED_BLOCK * -(-per // CHAINED_BLOCK))


def padded_mean(context: float, rows: int, padded: int) -> float:
    """Positions per row of a launch of ``rows`` rows attending ``context`` in all, in a graph of ``padded`` rows
    (each padded row attends one position)."""
    return (context + max(padded - rows, 0)) / max(padded, rows, 1)


def equivalent_length(mean: float, longest: int, rows: int, padded: int, heads: int, least: int, slots: float,
                      sharpness: float = math.inf) -> float:
    """The uniform context per padded row at which a launch's decode attention takes as long as with ``rows`` rows of
    mean ``mean`` and longest ``longest``.

    The time combines the spread work (heads x rows x mean over ``slots`` concurrent programs) and the critical path
    (the longest row's first split) as a p-norm with ``p = sharpness`` (infinite: the larger alone); ``slots`` and
    ``sharpness`` are fitted by calibration. The result lies between the mean and the longest.
    """
    if padded > rows > 0:  # padded_mean, written out in place
        mean, rows = (mean * rows + (padded - rows)) / padded, padded
    if rows <= 0 or longest <= mean * 1.0001:
        return float(mean)
    if sharpness != math.inf:
        return _blended_length(mean, longest, rows, padded, heads, least, slots, sharpness)
    # decode_splits and critical_positions written out in place (a hot path)
    pairs = max(padded * heads, 1)
    splits = TARGET_PROGRAMS // pairs
    splits = TARGET_SPLITS if splits > TARGET_SPLITS else splits
    floor = -(-MIN_PROGRAMS // pairs)
    splits = floor if splits < floor else splits
    splits = least if splits < least else MAX_SPLITS if splits > MAX_SPLITS else splits
    per_position = heads * rows / slots  # positions per program of one extra position in every row
    spread = per_position * mean
    per = -(-longest // splits)
    per = -(-(per if per > MIN_SPLIT_POSITIONS else MIN_SPLIT_POSITIONS) // PAGE) * PAGE
    critical = per if per < longest else longest
    target = critical if critical >= spread else spread
    if spread >= target:
        return float(mean)
    uniform = math.ceil(mean)
    per = -(-uniform // splits)
    per = -(-(per if per > MIN_SPLIT_POSITIONS else MIN_SPLIT_POSITIONS) // PAGE) * PAGE
    if (per if per < uniform else uniform) >= target:
        return float(mean)
    # the uniform length's time, max(critical path, per_position x L), first reaches the target where either does
    length = min(target / per_position, float(first_context_reaching(target, splits)))
    return min(max(length, float(mean)), float(longest))


def _power(x: float, p: float) -> float:
    """``x ** p``, without a general power for the sharpnesses calibration fits most (1, 1.5 and 2)."""
    return x if p == 1.0 else x * x if p == 2.0 else x * math.sqrt(x) if p == 1.5 else x ** p


def _root(x: float, p: float) -> float:
    """``x ** (1 / p)``, likewise."""
    return x if p == 1.0 else math.sqrt(x) if p == 2.0 else math.cbrt(x * x) if p == 1.5 else x ** (1.0 / p)


def _blended_length(mean: float, longest: int, rows: int, padded: int, heads: int, least: int, slots: float,
                    p: float) -> float:
    """:func:`equivalent_length` with a finite ``p``: the uniform length whose p-norm work equals the batch's,
    inverted piece by piece along the critical path's pieces (a page boundary where the work jumps)."""
    splits = splits_at_least(padded, heads, least)
    per_position = heads * rows / slots
    critical = float(critical_positions(longest, splits))
    spread_p, critical_p = _power(per_position * mean, p), _power(critical, p)
    work_p = spread_p + critical_p
    fewest = float(MIN_SPLIT_POSITIONS)  # one split's fewest positions, m
    length = _root(work_p / (_power(per_position, p) + 1.0), p)  # the whole row is one program's walk
    if length > fewest and splits > 1:  # (one split: the whole row is always one program's walk)
        # work less a uniform row's critical path, the spread kept out of the difference (rounding)
        rest = spread_p + (critical_p - _power(fewest, p))
        length = _root(max(rest, 0.0), p) / per_position  # every split walks m
        if length > splits * fewest:  # a split's share: first without its page rounding (an upper bound),
            unrounded = _root(work_p / (_power(per_position, p) + _power(1.0 / splits, p)), p)
            pages = math.ceil(unrounded / (splits * PAGE))  # then in the pages that bound holds
            rest = spread_p + (critical_p - _power(float(PAGE * pages), p))
            length = max(_root(rest, p) / per_position if rest > 0 else 0.0, float(splits * PAGE * (pages - 1)))
    return min(max(length, float(mean)), float(longest))


FEW_ROWS_MAX = 16  # most rows a launch runs on the few-row matmul (the kernel takes up to 64)
FEW_ROWS_MAX_HIDDEN = CHAINED_MAX_HIDDEN  # widest model whose few-row launches take it
CHAINED_ROWS = 2  # most rows a launch runs on the chained kernels


def chained_rows(hidden: int) -> int:
    """Rows up to which a model ``hidden`` wide runs a layer on the chained kernels."""
    return CHAINED_ROWS if hidden <= CHAINED_MAX_HIDDEN else 0


def few_rows(hidden: int) -> int:
    """Rows up to which a model ``hidden`` wide runs its projections on the few-row matmul (0: never)."""
    return FEW_ROWS_MAX if hidden <= FEW_ROWS_MAX_HIDDEN else 0
