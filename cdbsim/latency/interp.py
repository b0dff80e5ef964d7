"""Piecewise-linear latency surfaces through measured points, never negative and never decreasing.

A GPU kernel's time is not one straight line in the batch size: matrix kernels switch algorithms as B
grows, attention splits its work differently at different lengths. A measured profile therefore predicts
by interpolating its own points: piecewise-linearly in the batch size B at each measured context length L,
and linearly in L between those lengths. The linear fit ``delta + gamma B + alpha B L`` stays the summary a
person reads (B*(L), the roofline comparison).

Calibration measures long contexts at small batches only (the KV cache of B x L tokens must fit), so the
grid is ragged: at L = 2,048 a stage may be measured up to B = 32 and at L = 128 up to B = 512. Continuing
a length's last segment past its largest batch goes wrong when that segment falls (Ouro-1.4B's prelude
drops from 16.6 to 10.7 us between B = 16 and 32, a kernel switch, and the continued line reached -72 us
at B = 256). So every surface is built on one batch grid, the union of the measured batches, and obeys
three rules:

* **past a length's largest measured batch** its time grows as the next shorter length's does over the
  same batches, plus the extra cost per row that the longer context showed on its last measured segment
  (its slope less the shorter length's over the same batches, if positive); past every measured batch
  the shortest length continues its last segment, never downwards;
* **monotone by least squares**: the tabulated times are replaced by the closest grid (in squared
  error) that never decreases in B or in L, the bivariate isotonic regression, so a larger launch is
  never predicted faster than a smaller one. Where the points already rise (nearly everywhere) nothing
  changes. Where a point lies below a smaller launch's time -- measurement noise of a few percent, or the
  prelude's kernel switch just mentioned (up to 5.9 us on a 11-17 us launch) -- the two are averaged,
  as the kernel model averages a slow GEMM point with its neighbours (:mod:`cdbsim.latency.kernels`). The
  running maximum used before raised every later point to a single slow one: a Huginn-3.5B core step
  measured 2.5% slow at B = 1, L = 128 priced every step up to L = 512 and B = 4 at that time, and the
  validation matrix came out 1.50% / 1.84% (median / worst offline throughput error) on its own board
  and 1.39% / 1.91% on another, against 1.13% / 1.99% and 1.14% / 1.80% now; the build before's
  matrix 0.68% / 2.19% against 0.63% / 2.32%;
* **outside the measured lengths**: below the shortest, linear towards a zero-context time that follows
  the first segment's slope but stays at least the smallest time measured; above the longest, the last
  segment's slope, at least the fit's ``alpha`` per (row, token) since attention keeps growing with L.

Every time is then finite, positive, and non-decreasing in B and in L (``tests/test_interp.py`` checks
it over every shipped profile and stage). Beyond :data:`FAR_BATCH` rows time grows in proportion to B.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence

import numpy as np

from cdbsim.latency.profile import Fit

FAR_BATCH = float(1 << 20)  # the batch grid's last knot: far past any width a run can have


class Surface:
    """``t(B, L)`` through a component's ``[B, B*L, t]`` points (L = 0 for components without context)."""

    def __init__(self, fit: Fit) -> None:
        pts = np.asarray(fit.points, dtype=float)
        self.alpha = max(fit.alpha, 0.0)
        batch, context, t = pts[:, 0], pts[:, 1], pts[:, -1]
        batch = np.maximum(batch, 1.0)
        lengths = np.rint(context / batch)
        measured = sorted(set(lengths.tolist()))
        curves = []
        for length in measured:
            sel = lengths == length
            order = np.argsort(batch[sel])
            curves.append((batch[sel][order], t[sel][order]))
        self.floor = max(float(t.min()), 1e-9)  # a zero or negative point would not make a time positive
        knots = np.array(sorted(set(batch.tolist()) | {FAR_BATCH}))
        rows = _extend_along_batch(curves, knots)
        grid = monotone_grid(np.maximum(rows, self.floor))
        if measured[0] > 0:  # a zero-context row below the shortest measured length
            grid = np.vstack([self._zero_context(grid, measured, knots), grid])
            measured = [0.0, *measured]
        self.lengths: list[float] = measured
        self.knots = knots
        self.grid = grid
        self.slope_above = self._slope_above(grid, measured, knots)

    def _zero_context(self, grid: np.ndarray, lengths: list[float], knots: np.ndarray) -> np.ndarray:
        """The time at L = 0: the first segment (or alpha) continued down, kept between the smallest
        measured time and the shortest length's time, and non-decreasing in B."""
        first = (grid[1] - grid[0]) / (lengths[1] - lengths[0]) if len(lengths) > 1 else self.alpha * knots
        zero = np.maximum.accumulate(grid[0] - first * lengths[0])
        return np.minimum(np.maximum(zero, self.floor), grid[0])

    def _slope_above(self, grid: np.ndarray, lengths: list[float], knots: np.ndarray) -> np.ndarray:
        """d t / d L above the longest measured length: the last segment's, at least alpha B; 0 for a
        component measured without context."""
        if lengths[-1] <= 0:
            return np.zeros(len(knots))
        last = (grid[-1] - grid[-2]) / (lengths[-1] - lengths[-2]) if len(lengths) > 1 else 0.0
        return np.maximum.accumulate(np.maximum(last, self.alpha * knots))

    def row(self, batch: float) -> tuple[np.ndarray, float]:
        """Times at :attr:`lengths` and the slope above the longest, at ``batch`` rows."""
        knots = self.knots
        if batch >= knots[-1]:
            scale = batch / knots[-1]
            return self.grid[:, -1] * scale, float(self.slope_above[-1]) * scale
        j = int(np.searchsorted(knots, batch, side="right"))
        if j == 0:
            return self.grid[:, 0], float(self.slope_above[0])
        w = (batch - knots[j - 1]) / (knots[j] - knots[j - 1])
        values = self.grid[:, j - 1] + w * (self.grid[:, j] - self.grid[:, j - 1])
        return values, float(self.slope_above[j - 1] + w * (self.slope_above[j] - self.slope_above[j - 1]))

    def __call__(self, batch: float, length: float = 0.0) -> float:
        values, slope = self.row(batch)
        return along_length(self.lengths, values, length, slope)


def isotonic(values: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in squared error (pool adjacent violators, equal
    weights): what ``scipy.optimize.isotonic_regression`` returns, written out because importing
    ``scipy.optimize`` takes 0.3 s, more than a whole ``cdbsim predict`` spends on its tables. The measured
    tables (:func:`monotone_grid`) and the kernel model's composed stages (:mod:`cdbsim.latency.kernels`) share it."""
    means: list[float] = []
    sizes: list[int] = []
    for v in values.tolist():
        means.append(v)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            n = sizes[-2] + sizes[-1]
            means[-2] = (means[-2] * sizes[-2] + means[-1] * sizes[-1]) / n
            sizes[-2] = n
            means.pop()
            sizes.pop()
    return np.repeat(np.asarray(means), sizes)


def monotone_grid(values: np.ndarray, tolerance: float = 1e-12, sweeps: int = 500) -> np.ndarray:
    """The grid closest to ``values`` in squared error that is non-decreasing along both axes.

    Dykstra's alternating projections between the two convex cones (rows non-decreasing, columns
    non-decreasing), each a one-dimensional isotonic regression (:func:`isotonic`); they converge to the
    projection onto the intersection (on the shipped profiles in 1-19 sweeps). A last running maximum
    removes what rounding leaves."""
    x = np.asarray(values, dtype=float)
    if x.size == 0 or ((np.diff(x, axis=0) >= 0).all() and (np.diff(x, axis=1) >= 0).all()):
        return x.copy()
    along_rows, along_columns = np.zeros_like(x), np.zeros_like(x)
    for _ in range(sweeps):
        y = x + along_rows
        rows = np.vstack([isotonic(r) for r in y])
        along_rows = y - rows
        z = rows + along_columns
        nxt = np.vstack([isotonic(c) for c in z.T]).T
        along_columns = z - nxt
        done = np.allclose(nxt, x, rtol=tolerance, atol=0.0)
        x = nxt
        if done:
            break
    return np.maximum.accumulate(np.maximum.accumulate(x, axis=1), axis=0)


def _extend_along_batch(curves: list[tuple[np.ndarray, np.ndarray]], knots: np.ndarray) -> np.ndarray:
    """Each length's times on the common batch grid ``knots`` (rows in the order of ``curves``, shortest
    length first).

    Inside a length's measured batches: its points, linearly between them (and its smallest batch's time
    below them). Past its largest, from its slowest time so far (where the envelope stands there): the
    next shorter length's growth over the same batches (made non-decreasing first) plus, per extra row,
    how much steeper this length's last measured segment was than the shorter length over the same
    batches (never negative). The shortest length continues its last segment, or stays level where that
    segment falls.
    """
    rows = np.empty((len(curves), len(knots)))
    for i, (b, v) in enumerate(curves):
        row = np.interp(knots, b, v)
        above = knots > b[-1]
        if above.any():
            extra = knots[above] - b[-1]
            own = (v[-1] - v[-2]) / (b[-1] - b[-2]) if len(b) > 1 else 0.0
            top = float(v.max())  # the envelope's time at the largest batch
            if i == 0:
                row[above] = top + max(own, 0.0) * extra
            else:
                shorter = rows[i - 1]
                if len(b) > 1:
                    own -= (np.interp(b[-1], knots, shorter) - np.interp(b[-2], knots, shorter)) / (b[-1] - b[-2])
                growth = np.maximum.accumulate(shorter)
                row[above] = top + (growth[above] - np.interp(b[-1], knots, growth)) + max(own, 0.0) * extra
        rows[i] = row
    return rows


def along_length(lengths: Sequence[float], values: Sequence[float] | np.ndarray, length: float,
                 slope_above: float) -> float:
    """Linear in L between ``lengths`` (ascending); ``slope_above`` past the last; the first value below the
    first (lengths start at 0, so only a negative length is below)."""
    j = bisect_right(lengths, length)
    if j == len(lengths):
        return float(values[-1] + slope_above * (length - lengths[-1]))
    if j == 0:
        return float(values[0])
    l0, l1 = lengths[j - 1], lengths[j]
    return float(values[j - 1] + (values[j] - values[j - 1]) * (length - l0) / (l1 - l0))


class StageTable:
    """A decode-type stage's time per padded batch size, tabulated over context lengths on first use.

    ``stage_time(B, L)`` is a sum of :class:`Surface` terms with non-negative counts, each piecewise-linear
    in L with knots among ``lengths`` and 0 and linear above its longest length; the table therefore
    reproduces it exactly by tabulating at 0, ``lengths`` and twice the longest (the slope beyond), and
    inherits its monotonicity.
    """

    def __init__(self, stage_time: Callable[[float, float], float], lengths: Sequence[float]) -> None:
        self.stage_time = stage_time
        top = max(lengths, default=0.0)
        self.lengths = sorted({0.0, *lengths, *((2.0 * top,) if top > 0 else ())})
        self._rows: dict[int, tuple[list[float], float]] = {}

    def __call__(self, padded: int, mean_length: float) -> float:
        entry = self._rows.get(padded)
        if entry is None:
            row = [self.stage_time(padded, length) for length in self.lengths]
            lengths = self.lengths
            slope = (row[-1] - row[-2]) / (lengths[-1] - lengths[-2]) if len(row) > 1 else 0.0
            entry = self._rows[padded] = (row, slope)
        row, slope = entry
        if len(row) == 1:
            return row[0]
        return along_length(self.lengths, row, mean_length, slope)
