"""A prefill launch's time from its measured points: a curve in its tokens, plus its attention and chunks.

The curve is ``G(tokens) + alpha * pairs + kappa * chunks``: ``G`` is piecewise linear through one value per measured
token count (non-decreasing, flat below the smallest, the last slope beyond the largest), ``alpha`` prices the
(query, key) pairs of each chunk's causal triangle and cached prefix, ``kappa`` each chunk. All are fitted together
by relative least squares with every term >= 0 (:func:`cdbsim.latency.profile.nonnegative_lstsq`).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from cdbsim.latency.power import SustainedLoad
from cdbsim.latency.profile import nonnegative_lstsq


@dataclass(frozen=True)
class PrefillCurve:
    """``G(tokens) + alpha * pairs + kappa * chunks`` with ``G`` through ``values`` at ``knots``; component curves
    add (:func:`summed`)."""

    knots: tuple[float, ...]
    values: tuple[float, ...]
    alpha: float = 0.0
    kappa: float = 0.0

    def tokens_time(self, tokens: float) -> float:
        """``G(tokens)``: flat below the first knot, linear between knots, the last slope beyond."""
        k, v = self.knots, self.values
        if len(k) == 1 or tokens <= k[0]:
            return v[0]
        j = min(bisect.bisect_left(k, tokens), len(k) - 1)
        return v[j - 1] + (v[j] - v[j - 1]) * (tokens - k[j - 1]) / (k[j] - k[j - 1])

    def __call__(self, tokens: float, pairs: float = 0.0, chunks: float = 0.0) -> float:
        return self.tokens_time(tokens) + self.alpha * pairs + self.kappa * chunks


@dataclass(frozen=True)
class PrefillCost:
    """A prefill launch's seconds: its curve at (padded tokens, pairs, chunks), ``sample`` per extra sampled chunk,
    and with ``sustained`` stretched for the board's power limit (:mod:`cdbsim.latency.power`)."""

    curve: PrefillCurve
    sample: float = 0.0
    sustained: SustainedLoad | None = None

    def __call__(self, batch: float, context: float = 0.0, samples: int = 0, chunks: int = 0) -> float:
        t = self.curve(batch, context, chunks) + self.sample * samples
        return t if self.sustained is None else self.sustained.stretch(t)


def summed(terms: Iterable[tuple[int, PrefillCurve]]) -> PrefillCurve:
    """``sum(count * curve)`` as one curve over the union of the terms' knots."""
    terms = [(n, c) for n, c in terms if n]
    knots = tuple(sorted({x for _, c in terms for x in c.knots}))
    return PrefillCurve(knots=knots, values=tuple(sum(n * c.tokens_time(x) for n, c in terms) for x in knots),
                        alpha=sum(n * c.alpha for n, c in terms), kappa=sum(n * c.kappa for n, c in terms))


def fit_curve(points: Sequence[Sequence[float]]) -> PrefillCurve:
    """The curve through a component's measured points, rows ``[tokens, pairs, chunks, t]`` (prefill) or
    ``[rows, context, t]`` (a per-row component a prefill also runs, such as Huginn's adapter)."""
    return _fit(tuple(tuple(float(v) for v in p) for p in points))


@functools.lru_cache(maxsize=256)  # every LatencyModel of a profile refits the same few components
def _fit(points: tuple[tuple[float, ...], ...]) -> PrefillCurve:
    pts = np.asarray(points, dtype=float)
    if pts.shape[1] == 3:  # [rows, context, t]: no chunks
        pts = np.insert(pts, 2, 0.0, axis=1)
    tokens, pairs, chunks, t = pts.T
    knots, at = np.unique(tokens, return_inverse=True)  # every point sits on a knot: G there is its value
    # G at the knots as its first value plus non-negative rises, so every column's coefficient is >= 0
    rises = (np.arange(len(knots))[None, :] <= at[:, None]).astype(float)
    extra = [col for col in (pairs, chunks) if np.ptp(col) > 0]  # a column that does not vary stays out
    design = np.hstack([rises, *(c[:, None] for c in extra)])
    weights = 1.0 / np.maximum(t, 1e-12)
    coef = nonnegative_lstsq(design * weights[:, None], t * weights)
    values = np.cumsum(coef[:len(knots)])
    rest = iter(coef[len(knots):])
    alpha = float(next(rest)) if np.ptp(pairs) > 0 else 0.0
    kappa = float(next(rest)) if np.ptp(chunks) > 0 else 0.0
    return PrefillCurve(knots=tuple(map(float, knots)), values=tuple(map(float, values)), alpha=alpha, kappa=kappa)

