"""Exit-depth models: how many core loops each generated token asks for.

These are *synthetic* stand-ins for a real model's exit gate, for what-if studies. To replay a real
model's decisions, record them (``executor`` can, with live gates) or bring a trace file recorded
elsewhere (see :mod:`traces.io`).

* ``none``: every token runs ``r_max`` loops (no early exit).
* ``fixed``: every token asks for the same depth.
* ``synthetic``: depths on ``[r_min, r_max]`` from a beta-binomial distribution with an exact mean and a
  chosen dispersion (0 = binomial, towards 1 = mass at the two ends), correlated from token to token
  within a request through a Gaussian AR(1) copula with lag-one correlation ``correlation`` (hard
  prompts stay hard for a while, as real exit gates do).
"""

from __future__ import annotations

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
            require(-1.0 < self.correlation < 1.0,
                    f"correlation must be in (-1, 1), got {self.correlation}")

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
                from scipy import stats  # only the synthetic model needs it (a costly import)

                p[r_min - 1:] = stats.binom.pmf(np.arange(span + 1), span, frac)
            else:
                from scipy import stats

                scale = 1.0 / self.dispersion - 1.0
                p[r_min - 1:] = stats.betabinom.pmf(np.arange(span + 1), span, frac * scale,
                                                   (1.0 - frac) * scale)
        return p / p.sum()

    def depths(self, output_lens: np.ndarray, r_min: int, r_max: int,
               rng: np.random.Generator) -> list[np.ndarray]:
        """Per request, the requested depths of output tokens 1 .. output_len - 1 (views of one array).

        The requests' sequences are drawn and filtered together, as one stream of draws in request order:
        the same numbers a request-by-request loop would give, without a numpy call per request."""
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
        return [flat[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]

    def _latent(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Per request (``counts[i]`` values each, laid end to end), a stationary standard-normal AR(1)
        sequence with lag-one correlation ``correlation``."""
        eps = rng.standard_normal(int(counts.sum()))
        rho = self.correlation
        if rho == 0.0 or not len(eps):
            return eps
        from scipy.signal import lfilter  # a costly import: only correlated depths need it

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
            y, _ = lfilter([np.sqrt(1.0 - rho * rho)], [1.0, -rho], x, axis=1,
                           zi=(rho * eps[starts[rows]])[:, None])
            z[index[inside]] = y[inside]
        return z
