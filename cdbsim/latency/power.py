"""How long compute-bound work takes once the board reaches its power limit.

The kernel profile times every kernel in bursts of a few milliseconds, at the clock of a rested board. A long
prefill is hundreds of milliseconds of compute-bound GEMMs and attention back to back: within about a tenth
of a second an H200 reaches its 700 W limit, its SM clock drops from 1,980 MHz to 1,100-1,500 MHz and the
same kernels take 15-20% longer (``benchmarks/results/gemm-clock/``). Memory-bound decode steps draw as much
power but their time does not move, so only prefills are stretched.

:class:`SustainedLoad` is the two numbers that describe it: ``onset_s``, the rested seconds of compute-bound
work a launch gets before the limit binds, and ``slowdown``, how much longer each further rested second
takes. A launch the tables price at ``t`` seconds takes ``t`` up to the onset and ``onset + (t - onset) *
slowdown`` beyond it. Calibration measures both on a real prefill replayed back to back after decode-type
load (``calibrate --kernels``, family ``sustained``), and :func:`fit_sustained` fits them to the cumulative
(rested work, elapsed time) of that run.
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
        """The ``sustained`` entry of a kernel profile's record; None where calibration did not measure it.
        An entry that is not two numbers of the right range is a :class:`ConfigError` (a one-line message)."""
        if not record or "onset_s" not in record or "slowdown" not in record:
            return None
        try:
            return cls(onset_s=float(record["onset_s"]), slowdown=float(record["slowdown"]))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"kernels.sustained: {exc}") from None


def fit_sustained(rested_s: Sequence[float], elapsed_s: Sequence[float]) -> SustainedLoad:
    """The onset and slowdown that best carry cumulative rested work to cumulative elapsed time.

    ``rested_s[i]`` is the work done by the end of the i-th launch of a back-to-back run, in seconds at the
    rested clock, and ``elapsed_s[i]`` the time that had passed by then. For each onset on a grid of
    :data:`ONSET_STEP_S` the slowdown is the least-squares slope of the excess beyond it (at least 1);
    the pair with the smallest squared error is kept.
    """
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
    """:func:`fit_sustained` of one launch replayed back to back (each replay's seconds, in order), with the
    median of the first :data:`RESTED_REPLAYS` as the rested pace; returns the fit and that pace."""
    times = np.asarray(seconds, dtype=float)
    if times.size <= RESTED_REPLAYS or not np.all(times > 0):
        raise ValueError(f"a sustained run needs more than {RESTED_REPLAYS} replays of positive seconds")
    rested = float(np.median(times[:RESTED_REPLAYS]))
    return fit_sustained(rested * np.arange(1, times.size + 1), np.cumsum(times)), rested
