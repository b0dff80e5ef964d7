"""Piecewise-linear latency surfaces through measured points.

A GPU kernel's time is not one straight line in the batch size: matrix kernels switch algorithms as B
grows, attention splits its work differently at different lengths. A measured profile therefore predicts
by interpolating its own points, piecewise-linearly in the batch size B at each measured context length L
and linearly in L between them; outside the measured range it continues with the nearest segment (in B)
or the linear fit's attention slope (in L). The linear fit ``delta + gamma B + alpha B L`` stays the
summary a person reads (B*(L), the roofline comparison).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

import numpy as np

from cdbsim.profile import Fit


class Surface:
    """``t(B, L)`` through a component's ``[B, B*L, t]`` points (L = 0 for components without context)."""

    def __init__(self, fit: Fit) -> None:
        pts = np.asarray(fit.points, dtype=float)
        self.alpha = fit.alpha
        batch, context, t = pts[:, 0], pts[:, 1], pts[:, -1]
        lengths = np.where(batch > 0, np.rint(context / np.maximum(batch, 1)), 0)
        self.lengths: list[float] = sorted(set(lengths.tolist()))
        self.curves: list[tuple[np.ndarray, np.ndarray]] = []
        for length in self.lengths:
            sel = lengths == length
            order = np.argsort(batch[sel])
            b, v = batch[sel][order], t[sel][order]
            self.curves.append((b, v))

    @staticmethod
    def _along_batch(curve: tuple[np.ndarray, np.ndarray], batch: float) -> float:
        b, v = curve
        if len(b) == 1:
            return float(v[0])
        if batch <= b[-1]:
            return float(np.interp(batch, b, v))
        slope = (v[-1] - v[-2]) / (b[-1] - b[-2])
        return float(v[-1] + slope * (batch - b[-1]))

    def __call__(self, batch: float, length: float = 0.0) -> float:
        values = [self._along_batch(curve, batch) for curve in self.curves]
        ls = self.lengths
        if len(ls) == 1:
            return values[0] + self.alpha * batch * (length - ls[0]) if ls[0] > 0 else values[0]
        return _along_length(ls, values, length, self.alpha * batch)


def _along_length(lengths: list[float], values: list[float], length: float, edge_slope: float) -> float:
    """Linear in L between grid points; beyond the grid, the edge segment's slope (at least ``edge_slope``
    above the top, since attention time keeps growing with L)."""
    j = bisect_right(lengths, length)
    if j == 0:
        slope = (values[1] - values[0]) / (lengths[1] - lengths[0])
        return max(values[0] + slope * (length - lengths[0]), 0.0)
    if j == len(lengths):
        slope = max((values[-1] - values[-2]) / (lengths[-1] - lengths[-2]), edge_slope)
        return values[-1] + slope * (length - lengths[-1])
    l0, l1 = lengths[j - 1], lengths[j]
    return values[j - 1] + (values[j] - values[j - 1]) * (length - l0) / (l1 - l0)


class StageTable:
    """A decode-type stage's time per padded batch size, tabulated over context lengths on first use."""

    def __init__(self, stage_time: Callable[[float, float], float], lengths: list[float],
                 edge_slope: Callable[[float], float]) -> None:
        self.stage_time = stage_time
        self.lengths = lengths or [0.0]
        self.edge_slope = edge_slope
        self._rows: dict[int, list[float]] = {}

    def __call__(self, padded: int, mean_length: float) -> float:
        row = self._rows.get(padded)
        if row is None:
            row = self._rows[padded] = [self.stage_time(padded, length) for length in self.lengths]
        if len(row) == 1:
            return row[0]
        return _along_length(self.lengths, row, mean_length, self.edge_slope(padded))
