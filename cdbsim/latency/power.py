"""How long compute-bound work takes once the board reaches its power limit.

Kernel tables are timed in short bursts on a rested board; a long prefill reaches the power limit and its clock
drops. :class:`SustainedLoad` describes this by ``onset_s`` (rested seconds of work before the limit binds) and
``slowdown``: a launch priced at ``t`` takes ``t`` up to the onset and ``onset + (t - onset) * slowdown`` beyond.
Calibration measures both on a prefill replayed back to back (:func:`fit_sustained`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cdbsim.errors import ConfigError

ONSET_STEP_S = 0.0025  # resolution of the fitted onset
RESTED_REPLAYS = 3     # the first replays of a run, whose median is the rested board's pace


@dataclass(frozen=True)
class SustainedLoad:
    """Compute-bound work under the board's power limit (see the module docstring)."""

    onset_s: float
    slowdown: float

    def __post_init__(self) -> None:
        if not (self.onset_s >= 0.0 and self.slowdown >= 1.0):
            raise ValueError(f"a sustained load needs onset_s >= 0 and slowdown >= 1, got {self.onset_s}, "
                             f"{self.slowdown}")

    def stretch(self, seconds: float) -> float:
        """Seconds of a launch priced at ``seconds`` on the rested board's tables."""
        if seconds <= self.onset_s:
            return seconds
        return seconds + (seconds - self.onset_s) * (self.slowdown - 1.0)  # never below ``seconds`` when rounded

    @classmethod
    def from_record(cls, record: dict | None) -> SustainedLoad | None:
        """The ``sustained`` entry of a kernel profile's record (None if absent; a malformed one is a ConfigError)."""
        if not record or "onset_s" not in record or "slowdown" not in record:
            return None
        try:
            return cls(onset_s=float(record["onset_s"]), slowdown=float(record["slowdown"]))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"kernels.sustained: {exc}") from None


def fit_sustained(rested_s: Sequence[float], elapsed_s: Sequence[float]) -> SustainedLoad:
    """The onset and slowdown that best carry cumulative rested work ``rested_s`` to elapsed time ``elapsed_s``: per
    onset on a grid of :data:`ONSET_STEP_S`, the least-squares slope (at least 1) of the excess beyond it."""
    work = np.asarray(rested_s, dtype=float)
    elapsed = np.asarray(elapsed_s, dtype=float)
    if work.size < 3 or work.shape != elapsed.shape or not np.all(np.diff(work) > 0):
        raise ValueError("fit_sustained needs three or more increasing cumulative points of equal count")
    best = (np.inf, 0.0, 1.0)
    for onset in np.arange(0.0, work[-1], ONSET_STEP_S):
        beyond = np.maximum(work - onset, 0.0)
        excess = elapsed - np.minimum(work, onset)
        slowdown = max(1.0, float(beyond @ excess / (beyond @ beyond)))
        error = float(np.sum((np.minimum(work, onset) + beyond * slowdown - elapsed) ** 2))
        if error < best[0]:
            best = (error, float(onset), slowdown)
    return SustainedLoad(onset_s=round(best[1], 4), slowdown=round(best[2], 4))


def fit_replays(seconds: Sequence[float]) -> tuple[SustainedLoad, float]:
    """:func:`fit_sustained` of one launch's replays (seconds each, in order), the rested pace being the median of
    the first :data:`RESTED_REPLAYS`; returns the fit and that pace."""
    times = np.asarray(seconds, dtype=float)
    if times.size <= RESTED_REPLAYS or not np.all(times > 0):
        raise ValueError(f"a sustained run needs more than {RESTED_REPLAYS} replays of positive seconds")
    rested = float(np.median(times[:RESTED_REPLAYS]))
    return fit_sustained(rested * np.arange(1, times.size + 1), np.cumsum(times)), rested
