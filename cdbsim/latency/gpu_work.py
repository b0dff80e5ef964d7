"""How the executor's paged decode attention divides its work, shared with the latency model.

The decode-attention kernel (``executor.triton_kernels.decode_attention``) runs one program per (row, head,
split). The number of splits is part of the launch shape, so it may depend on rows x heads and the head's width
only: a stage's CUDA graph must run the same kernel whatever contexts its requests have. Two rules follow, kept
here in plain Python so the simulator can reason about the same kernel without torch:

* ``decode_splits``: the largest split count (at most ``TARGET_SPLITS``) that keeps rows x heads x splits
  within ``TARGET_PROGRAMS``, but never fewer than the head's shape needs (``least_splits``: two for a head
  loaded in two parts, :func:`head_parts`), nor so few that the launch starts fewer than ``MIN_PROGRAMS``
  programs (up to ``MAX_SPLITS``).
  Rounding the count *down* matters: rounding up to a power of two (the old rule) let a launch of 248 rows start
  twice the programs of one of 256 rows, and on an H200 Ouro-1.4B's core step took 4.75 ms at B = 248 against
  3.50 ms at B = 256 (``benchmarks/results/validation-graphed-prefill``).
* ``split_positions``: a row's positions per split, at least ``MIN_SPLIT_POSITIONS`` (one tile) and a
  whole number of KV pages; splits past the row's context read nothing. A 40-token context therefore
  reads its keys in one program per head however many splits the graph has, while a 4,096-token one
  spreads over all of them. On the H200 this took Ouro-1.4B's core step at B = 64, L = 32 from 2.96 to
  1.79 ms (``benchmarks/results/attention-split``).
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
    """Column widths of the two power-of-two parts a ``head_dim``-wide head is loaded in (``(a, 0)``: one part).

    A 96-wide head in one 128-lane tile leaves a quarter of every load idle: on the H200 at B = 64, L = 4,096
    such heads read KV at 60-72% of copy bandwidth against 89-94% for 128-wide ones
    (``benchmarks/results/attention-sweep/``). Two parts, 64 + 32, keep every lane busy; a width that two
    parts cannot cover with fewer lanes than one padded tile (e.g. 112 = 64 + 64) stays one part."""
    padded = _next_power_of_2(head_dim)
    a = padded // 2
    if a >= 16 and head_dim > a and a + _next_power_of_2(head_dim - a) < padded:
        return a, _next_power_of_2(head_dim - a)
    return padded, 0


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def least_splits(head_dim: int) -> int:
    """The fewest splits a (row, head) of ``head_dim``-wide heads gets, however many rows a launch has.

    A head loaded in two parts issues more, narrower loads per position, and one program per (row, head)
    does not keep enough of them in flight: on the H200 Huginn-3.5B's 55 x 96 heads read KV at 81-86% of copy
    bandwidth with one split at 128-512 rows and L = 512, and at 90-92% with two; its core step took 5-7% less
    at 128-256 rows (``benchmarks/results/attention-rule/``). Heads in one part (Ouro's 16 x 128) got slower
    with a second split (+1.9% at 512 rows), so they keep one. The price is at short contexts: a 32-position row
    fills one split, yet the second split's programs and the merge still run (the kernel profile's 96-wide
    attention at 8,192 rows x heads and more took 40-60% longer at L = 32, 1-5% less at L = 512)."""
    return 2 if head_parts(head_dim)[1] else 1


def decode_splits(rows: int, heads: int, head_dim: int) -> int:
    """Splits per (row, head) of a decode-attention launch of ``rows`` x ``heads`` heads ``head_dim`` wide.

    On the H200 at B = 64, L = 4,096 one split reads KV at 49% of copy bandwidth and eight at 88%
    (``benchmarks/results/executor``); the rule gives eight there.

    At the other end a launch of fewer than ``MIN_PROGRAMS`` (row, head, split) programs gets more splits: one
    Ouro-1.4B row (16 heads) took 16 splits, 256 programs of up to 256 positions each (four of the fused kernel's
    tiles, one in flight a program); with 32 its core step at L = 4,096 took 11% less on the H200 and the same at
    L = 512, where the extra splits are empty and store nothing. More programs than that did not pay: 64 splits
    for one row, or 32 for two rows (1,024 programs), were 7-21% slower at L = 4,096 (the last split merges the
    others one after another) (``benchmarks/results/split-cap/``).
    """
    return splits_at_least(rows, heads, least_splits(head_dim))


def splits_at_least(rows: int, heads: int, least: int) -> int:
    """:func:`decode_splits` with the head's fewest splits (:func:`least_splits`) already known: the
    simulator works it out once per model, not once per launch."""
    pairs = max(rows * heads, 1)
    return min(MAX_SPLITS, max(least, min(TARGET_SPLITS, TARGET_PROGRAMS // pairs), -(-MIN_PROGRAMS // pairs)))


def split_positions(context: int, splits: int, min_positions: int = MIN_SPLIT_POSITIONS) -> int:
    """Positions each split of a row with ``context`` positions covers (the last split may cover fewer)."""
    per = max(-(-context // splits), min_positions)
    return -(-per // PAGE) * PAGE


def active_splits(context: int, splits: int, min_positions: int = MIN_SPLIT_POSITIONS) -> int:
    """How many of a row's ``splits`` hold at least one position."""
    if context <= 0:
        return 1  # split 0 always runs (and writes the row's output)
    return -(-context // split_positions(context, splits, min_positions))


def critical_positions(context: int, splits: int) -> int:
    """Positions the longest program of a row with ``context`` positions walks (its first split's share)."""
    return min(context, split_positions(context, splits))


def chained_walk_length(context: float, heads: int, least: int) -> float:
    """The context at which one row on the chained path (models up to :data:`CHAINED_MAX_HIDDEN` wide) walks
    as many whole tiles as it does at ``context``.

    With one row every (head, split) program runs at once, so the step lasts as long as the longest split's
    walk, in whole tiles of :data:`CHAINED_BLOCK` positions: the kernel costs the same from 2,049 to 3,072
    positions (three tiles per split) and jumps at the tile boundaries between. On an H200 the fused attention
    of ouro-1536 (24 heads of 64, 12 layers, ``CDBSIM_PDL=0``) took 102 µs at 2,048 positions, 134 at 2,560 and
    138 at 3,072 (``benchmarks/results/decode-profile/single-row.csv``). Stage tables measured at tile-aligned
    lengths and read at this length follow the steps; read at ``context`` they ran 10% short at 2,560. Below
    two tiles a split's fewest positions set the walk, and ``context`` is returned unchanged."""
    if context <= 0:
        return context
    splits = splits_at_least(1, heads, least)
    per = split_positions(math.ceil(context), splits)
    if per <= CHAINED_BLOCK:
        return context
    return float(splits * CHAINED_BLOCK * -(-per // CHAINED_BLOCK))


def padded_mean(context: float, rows: int, padded: int) -> float:
    """Positions per row of a launch of ``rows`` rows attending ``context`` positions in all, in a graph of
    ``padded`` rows: each padded row attends one position (the engine's scratch row).

    A stage table is measured with every row of the graph real, so looking it up at the real rows' mean
    charged a graph's padding as real rows: a core step of 17 real rows at 2,500 positions in a graph of
    24 replayed at 0.84-0.88 of that on an H200, and at 1.01-1.07 of the table at this mean
    (``benchmarks/results/decode-profile/served-shapes.csv``)."""
    return (context + max(padded - rows, 0)) / max(padded, rows, 1)


def equivalent_length(mean: float, longest: int, rows: int, padded: int, heads: int, least: int, slots: float,
                      sharpness: float = math.inf) -> float:
    """The context length every row would need for a launch's decode attention to take as long as it
    does when its ``rows`` rows (in a ``padded``-row graph, ``heads`` heads each) attend ``mean`` tokens on
    average and ``longest`` at most (``least``: the heads' fewest splits, :func:`least_splits`).

    Calibration measures each stage with every row at one length L, where the mean and the longest row
    agree. A served batch mixes lengths. Its attention is bound by two things: the total work spread over
    the ``slots`` programs the device runs at once (H x rows x mean / slots, in positions per program),
    and the critical path, the one program that walks the most positions (the longest row's first split).
    With many rows and many waves the first dominates and the mean length is right; with few rows one long
    context sets the time, which the mean under-predicts (two ShareGPT rows at 571 and 6,400 tokens run
    like two at 6,400, not 3,486). Where the two are close neither alone is the time: the long programs
    still run while the device streams the others. The two combine as a p-norm, ``(spread^p +
    critical^p)^(1/p)``, with ``p = sharpness`` (infinite: the larger one alone); the uniform length
    with the same combined work is returned, between the mean and the longest. ``slots`` and ``sharpness``
    are fitted by calibration on batches with a few long rows (``calibration.fit.fit_slots``): on the
    H200 the p-norm (p = 1-2) fits those points better than the larger term alone for every shipped model,
    and it takes the validation matrix's worst offline error from 6.1% to 1.2% (docs/latency-model.md).
    Padded rows count as rows of one position (:func:`padded_mean`): the result is a length per padded row.
    """
    if padded > rows > 0:  # padded_mean, written out in place
        mean, rows = (mean * rows + (padded - rows)) / padded, padded
    if rows <= 0 or longest <= mean * 1.0001:
        return float(mean)
    if sharpness != math.inf:
        return _blended_length(mean, longest, rows, padded, heads, least, slots, sharpness)
    # the helpers below (decode_splits, critical_positions, first_context_reaching) written out in place:
    # the simulator calls this once per mixed launch, and the calls cost more than the arithmetic
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
    # the uniform length's time, max(critical path, per_position x L), first reaches the target where
    # either term does: closed forms of both
    if target <= MIN_SPLIT_POSITIONS:
        reaching = max(1, math.ceil(target))
    else:
        reaching = max(math.ceil(target), splits * PAGE * (math.ceil(target / PAGE) - 1) + 1)
    length = min(target / per_position, float(reaching))
    return min(max(length, float(mean)), float(longest))


def _power(x: float, p: float) -> float:
    """``x ** p``, without a general power for the sharpnesses calibration fits most (1, 1.5 and 2)."""
    return x if p == 1.0 else x * x if p == 2.0 else x * math.sqrt(x) if p == 1.5 else x ** p


def _root(x: float, p: float) -> float:
    """``x ** (1 / p)``, likewise."""
    return x if p == 1.0 else math.sqrt(x) if p == 2.0 else math.cbrt(x * x) if p == 1.5 else x ** (1.0 / p)


def _blended_length(mean: float, longest: int, rows: int, padded: int, heads: int, least: int, slots: float,
                    p: float) -> float:
    """:func:`equivalent_length` with a finite ``p``: the uniform length ``L`` whose work ``((a L)^p +
    critical(L)^p)^(1/p)`` (``a`` positions per program for one position in every row) equals the
    batch's. A uniform row's critical path is ``L`` up to one split's fewest positions ``m``, then ``m``
    until every split holds ``m``, then its split's share rounded up to whole pages, ``page * k`` for ``L``
    in ``(splits * page * (k - 1), splits * page * k]``; the work never decreases in ``L``, so it is
    inverted piece by piece (where it jumps at a page boundary, the boundary is the length)."""
    splits = splits_at_least(padded, heads, least)
    per_position = heads * rows / slots
    critical = float(critical_positions(longest, splits))
    spread_p, critical_p = _power(per_position * mean, p), _power(critical, p)
    work_p = spread_p + critical_p
    fewest = float(MIN_SPLIT_POSITIONS)  # one split's fewest positions, m
    length = _root(work_p / (_power(per_position, p) + 1.0), p)  # the whole row is one program's walk
    if length > fewest and splits > 1:  # (one split: the whole row is always one program's walk)
        # work less a uniform row's critical path, the spread kept out of the difference: a spread many
        # orders below the path would otherwise vanish in the rounding of the sum and move the length
        rest = spread_p + (critical_p - _power(fewest, p))
        length = _root(max(rest, 0.0), p) / per_position  # every split walks m
        if length > splits * fewest:  # a split's share: first without its page rounding (an upper bound),
            unrounded = _root(work_p / (_power(per_position, p) + _power(1.0 / splits, p)), p)
            pages = math.ceil(unrounded / (splits * PAGE))  # then in the pages that bound holds
            rest = spread_p + (critical_p - _power(float(PAGE * pages), p))
            length = max(_root(rest, p) / per_position if rest > 0 else 0.0, float(splits * PAGE * (pages - 1)))
    return min(max(length, float(mean)), float(longest))


def first_context_reaching(positions: float, splits: int) -> int:
    """The shortest context whose critical path (:func:`critical_positions`) walks at least ``positions``.

    Up to one tile a row's whole context is one program's walk. Beyond it the walk is the first split's
    share rounded up to whole pages, ``page * ceil(ceil(n / splits) / page)``, which reaches ``positions``
    once ``ceil(n / splits)`` passes the last page boundary below it."""
    if positions <= MIN_SPLIT_POSITIONS:
        return max(1, math.ceil(positions))
    pages_below = math.ceil(positions / PAGE) - 1
    return max(math.ceil(positions), splits * PAGE * pages_below + 1)


FEW_ROWS_MAX = 16  # most rows a launch runs on the few-row matmul (measured; the kernel takes up to 64)
FEW_ROWS_MAX_HIDDEN = CHAINED_MAX_HIDDEN  # widest model whose few-row launches take it (2,048 wins; 5,280 not)


CHAINED_ROWS = 2  # most rows a launch runs on the chained kernels (measured: at 4 the few-row matmul wins)


def chained_rows(hidden: int) -> int:
    """Rows up to which a model ``hidden`` wide runs a layer on the chained kernels."""
    return CHAINED_ROWS if hidden <= CHAINED_MAX_HIDDEN else 0


def few_rows(hidden: int) -> int:
    """Rows up to which a model ``hidden`` wide runs its projections on the few-row matmul (0: never)."""
    return FEW_ROWS_MAX if hidden <= FEW_ROWS_MAX_HIDDEN else 0
