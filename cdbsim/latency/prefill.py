"""A prefill launch's time from its measured points: a curve in its tokens, plus its attention and chunks.

A prefill's time is mostly its GEMMs, a function of the launch's padded tokens that is flat while the
weight reads dominate (a few hundred tokens), then grows about linearly, and grows a little faster again
at thousands of tokens, where a compute-bound launch runs long enough for the board to reach its power
limit (``benchmarks/results/gemm-clock/``). On top of that comes the attention over each chunk's causal
triangle (and its cached prefix), about proportional to the (query, key) pairs, and a small cost per chunk.

One straight line in tokens, pairs and chunks (what :func:`cdbsim.latency.profile.fit_points` fits) cannot follow
that bend: fitted over 16 .. 8,192 tokens it put Alpaca's packed 128-350-token prefills 9-26% over their
measured times and ShareGPT's packed 8,192-token ones 4-15% under, and it let the pairs term soak up the
bend, so one long chunk and several shorter ones of the same tokens came out too far apart. The curve here
is ``G(tokens) + alpha * pairs + kappa * chunks``: ``G`` is piecewise linear through one value per token
count the points were measured at (non-decreasing; flat below the smallest, the last slope beyond the
largest), ``alpha`` and ``kappa`` are shared by all, and all are fitted together to the points by least
squares relative to each point's time, every term >= 0 (:func:`cdbsim.latency.profile.nonnegative_lstsq`, the same
curve on every CPU; ``scipy.optimize.nnls`` where a bound binds, which a whole model's points seldom need, so
predicting a shipped model does not import it). A point measured
alone at a token count then pins ``G`` there, and ``alpha`` comes from the points that share a token
count but differ in pairs (one chunk against several, with a prefix or without).
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
    """``G(tokens) + alpha * pairs + kappa * chunks`` with ``G`` through ``values`` at ``knots`` (see the
    module docstring). Curves of the components of a stage add (:func:`summed`)."""

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

    @property
    def smallest(self) -> float:
        """The time of the smallest launch (``G``'s flat start)."""
        return self.values[0]


@dataclass(frozen=True)
class PrefillCost:
    """A prefill launch's seconds: its curve at (padded tokens, pairs, chunks), and ``sample`` per sampled
    chunk beyond the one the curve's points sampled (a composed prefill's head rows); with ``sustained``,
    stretched for the power limit a long launch runs into (:mod:`cdbsim.latency.power`: a curve composed from
    kernels timed in short bursts prices the rested board)."""

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

