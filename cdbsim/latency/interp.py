"""Piecewise-linear latency surfaces through measured points, never negative and never decreasing.

A measured profile predicts by interpolating its points: piecewise-linearly in the batch B at each measured context
length L, linearly in L between lengths. Every surface lies on one batch grid (the union of the measured batches),
made non-decreasing in B and L by bivariate isotonic regression.
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
        batch, context, t = np.maximum(pts[:, 0], 1.0), pts[:, 1], pts[:, -1]
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
        """The time at L = 0: the first segment (or alpha) continued down, between the smallest measured time and the
        shortest length's, non-decreasing in B."""
        first = (grid[1] - grid[0]) / (lengths[1] - lengths[0]) if len(lengths) > 1 else self.alpha * knots
        zero = np.maximum.accumulate(grid[0] - first * lengths[0])
        return np.minimum(np.maximum(zero, self.floor), grid[0])

    def _slope_above(self, grid: np.ndarray, lengths: list[float], knots: np.ndarray) -> np.ndarray:
        """d t / d L above the longest measured length: the last segment's, at least alpha B (0 without context)."""
        if lengths[-1] <= 0:
            return np.zeros(len(knots))
        last = (grid[-1] - grid[-2]) / (lengths[-1] - lengths[-2]) if len(lengths) > 1 else 0.0
        return np.maximum.accumulate(np.maximum(last, self.alpha * knots))

    def row(self, batch: float) -> tuple[np.ndarray, float]:
        """Times at :attr:`lengths` and the slope above the longest, at ``batch`` rows (proportional past the grid)."""
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
    """The non-decreasing sequence closest to ``values`` in squared error (pool adjacent violators), as
    ``scipy.optimize.isotonic_regression`` without its import cost."""
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
    """The grid closest to ``values`` in squared error that is non-decreasing along both axes (Dykstra's alternating
    projections of :func:`isotonic`, then a running maximum for rounding)."""
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
    """Each length's times on the common batch grid ``knots`` (shortest length first): its points inside its measured
    batches; past them, the next shorter length's growth plus this length's extra slope per row (never negative)."""
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
    """Linear in L between ``lengths`` (ascending); ``slope_above`` past the last, the first value below the first."""
    j = bisect_right(lengths, length)
    if j == len(lengths):
        return float(values[-1] + slope_above * (length - lengths[-1]))
    if j == 0:
        return float(values[0])
    l0, l1 = lengths[j - 1], lengths[j]
    return float(values[j - 1] + (values[j] - values[j - 1]) * (length - l0) / (l1 - l0))


class StageTable:
    """A decode-type stage's time per padded batch, tabulated over context lengths on first use; exact for sums of
    :class:`Surface` terms (tabulated at 0, ``lengths`` and twice the longest)."""

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
