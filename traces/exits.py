"""Synthetic exit-depth models (how many core loops each generated token asks for), for what-if studies.

* ``none``: every token runs ``r_max`` loops; ``fixed``: every token asks for the same depth.
* ``synthetic``: depths on ``[r_min, r_max]`` from a beta-binomial with an exact mean and a dispersion (0 = binomial,
  towards 1 = mass at the ends), correlated along a request through a Gaussian AR(1) copula with lag-one correlation
  ``correlation``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from traces.errors import require, unknown

EXIT_MODELS = ("none", "fixed", "synthetic")


@dataclass(frozen=True)
class ExitModel:
    """A recipe for per-token exit depths; see the module docstring for the kinds."""

    kind: str = "synthetic"
    depth: int | None = None
    mean: float = 2.5
    dispersion: float = 0.3
    correlation: float = 0.5
    source: str = ""  # where the parameters come from, when not the user (e.g. the paper's q = 0.2)

    def __post_init__(self) -> None:
        if self.kind not in EXIT_MODELS:
            raise unknown("exit model", self.kind, EXIT_MODELS)
        if self.kind == "fixed":
            require(self.depth is not None and self.depth >= 1, "the fixed exit model needs a depth >= 1")
        if self.kind == "synthetic":
            require(0.0 <= self.dispersion < 1.0, f"dispersion must be in [0, 1), got {self.dispersion}")
            require(-1.0 < self.correlation < 1.0, f"correlation must be in (-1, 1), got {self.correlation}")

    def describe(self) -> str:
        if self.kind == "none":
            return "no exits (r_max)"
        if self.kind == "fixed":
            return f"fixed depth {self.depth}"
        origin = f" ({self.source})" if self.source else ""
        return (f"synthetic mean {self.mean:g}, dispersion {self.dispersion:g}, "
                f"correlation {self.correlation:g}{origin}")

    def pmf(self, r_min: int, r_max: int) -> np.ndarray:
        """P(depth = d) for d = 1 .. r_max (index d - 1)."""
        require(1 <= r_min <= r_max, f"r_min ({r_min}) must be in [1, r_max ({r_max})]")
        p = np.zeros(r_max)
        if self.kind == "none":
            p[r_max - 1] = 1.0
        elif self.kind == "fixed":
            require(r_min <= self.depth <= r_max,
                    f"fixed depth {self.depth} is outside [r_min, r_max] = [{r_min}, {r_max}]")
            p[self.depth - 1] = 1.0
        else:
            require(r_min <= self.mean <= r_max,
                    f"mean depth {self.mean} is outside [r_min, r_max] = [{r_min}, {r_max}]")
            span = r_max - r_min
            frac = 0.0 if span == 0 else (self.mean - r_min) / span
            if span == 0 or frac in (0.0, 1.0):
                p[round(self.mean) - 1] = 1.0
            elif self.dispersion == 0.0:
                p[r_min - 1:] = binomial_pmf(span, frac)
            else:
                scale = 1.0 / self.dispersion - 1.0
                p[r_min - 1:] = beta_binomial_pmf(span, frac * scale, (1.0 - frac) * scale)
        return p / p.sum()

    def depths(self, output_lens: np.ndarray, r_min: int, r_max: int, rng: np.random.Generator,
               progress: Callable[[int], None] | None = None) -> list[np.ndarray]:
        """Per request, the requested depths of output tokens 1 .. output_len - 1 (views of one array), drawn as one
        stream in request order; ``progress`` is told the number of requests."""
        cdf = np.cumsum(self.pmf(r_min, r_max))
        cdf[-1] = 1.0
        counts = np.maximum(np.asarray(output_lens, dtype=np.int64) - 1, 0)
        if self.kind != "synthetic":
            flat = np.full(int(counts.sum()), int(np.searchsorted(cdf, 0.5) + 1), dtype=np.int16)
        else:
            from scipy.special import ndtr  # scipy is imported where it is used: importing it costs

            u = ndtr(self._latent(counts, rng))  # the standard normal CDF (scipy.stats' norm.cdf is this, slower)
            flat = (np.searchsorted(cdf, u, side="right") + 1).clip(1, r_max).astype(np.int16)
        ends = np.cumsum(counts).tolist()
        if progress is not None and len(counts):
            progress(len(counts))
        return [flat[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]

    def _latent(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Per request (``counts[i]`` values each, end to end), a stationary standard-normal AR(1) sequence."""
        eps = rng.standard_normal(int(counts.sum()))
        rho = self.correlation
        if rho == 0.0 or not len(eps):
            return eps
        z = eps.copy()  # each sequence starts at its first draw, then z[t] = rho z[t - 1] + sqrt(1 - rho^2) eps[t]
        starts = np.cumsum(counts) - counts
        longer = np.flatnonzero(counts > 1)
        # filter the sequences as rows of a few 2-D arrays, rows of similar length together (lengths within a
        # factor of two), so that padding at most doubles the work; each row is filtered as it would be alone
        band = np.floor(np.log2(counts[longer] - 1)).astype(np.int64)
        for b in np.unique(band):
            rows = longer[band == b]
            tail = counts[rows] - 1
            cols = np.arange(int(tail.max()))
            inside = cols[None, :] < tail[:, None]
            index = (starts[rows] + 1)[:, None] + cols[None, :]
            x = np.zeros(inside.shape)
            x[inside] = eps[index[inside]]
            y = ar1_filter(x, np.sqrt(1.0 - rho * rho), rho, rho * eps[starts[rows]])
            z[index[inside]] = y[inside]
        return z


# scipy.stats' binomial and beta-binomial pmf over k = 0 .. n, bit for bit (the same special functions on the same
# broadcast arrays) from scipy.special alone: importing scipy.stats would dominate a short simulation's start-up.
def binomial_pmf(n: int, p: float) -> np.ndarray:
    """``scipy.stats.binom.pmf(np.arange(n + 1), n, p)``."""
    from scipy.special import _ufuncs

    k = np.arange(n + 1)
    return _ufuncs._binom_pmf(k, np.full(k.shape, n), np.full(k.shape, p, dtype=float))


def beta_binomial_pmf(n: int, a: float, b: float) -> np.ndarray:
    """``scipy.stats.betabinom.pmf(np.arange(n + 1), n, a, b)``."""
    from scipy.special import betaln

    k = np.floor(np.arange(n + 1))
    ns, a_s, b_s = np.full(k.shape, n), np.full(k.shape, a, dtype=float), np.full(k.shape, b, dtype=float)
    combiln = -np.log(ns + 1) - betaln(ns - k + 1, k + 1)
    return np.exp(combiln + betaln(k + a_s, ns - k + b_s) - betaln(a_s, b_s))


def ar1_filter(x: np.ndarray, gain: float, rho: float, state: np.ndarray) -> np.ndarray:
    """Each row of ``x`` filtered by ``y[t] = state + gain x[t]``, ``state = rho y[t]``: bit for bit
    ``scipy.signal.lfilter([gain], [1, -rho], x, axis=1, zi=state[:, None])[0]``, without importing scipy.signal."""
    xt = np.ascontiguousarray(x.T)
    y = np.empty_like(xt)
    z = np.array(state, dtype=float)
    for t in range(len(xt)):
        yt = y[t]
        np.multiply(xt[t], gain, out=yt)
        np.add(z, yt, out=yt)
        np.multiply(yt, rho, out=z)
    return y.T
