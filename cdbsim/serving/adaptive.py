"""The adaptive CDB policy's rule: when a coda (with the prelude after it) is due, and when arrivals are.

Both are order quantities: a launch with order cost ``F``, demand ``e`` per period and holding cost ``h`` per waiting
unit and period is worth delaying one more period while ``n (n + a) h < 2 F e`` (units arriving ``a`` at a time). The
coda runs now if ``n (n + e) h >= 2 F e``, with ``F`` the one-token time of coda plus prelude, ``e`` the exits the
next core step is expected to bring and ``h = delta_core / b`` while requests wait for a slot, else
``t_core(b) / (b + n)``. Arrivals are prefilled now if ``m (m + 1) >= 2 F_p lam (b w + m)``, with ``F_p`` the
prefill's fixed cost, ``lam`` the arrival rate per device second and ``w = 1 / (mean(L) mean(1/L))`` over finished
output lengths; also when they fill the free slots, when nothing else can run, or before ``F_p`` is identified. Every
term is learnt from this run (:class:`OnlineCosts`, weighted down with age): nothing is tuned offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cdbsim.serving.launch import Launch, Stage

FORGET = 0.995  # weight of an older launch each time a newer one is observed (about the last 200 count)


@dataclass
class _Line:
    """Exponentially weighted least squares of seconds against padded batch."""

    n: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, batch: float, seconds: float) -> None:
        self.n, self.x, self.y = FORGET * self.n + 1, FORGET * self.x + batch, FORGET * self.y + seconds
        self.xx, self.xy = FORGET * self.xx + batch * batch, FORGET * self.xy + batch * seconds

    @property
    def ready(self) -> bool:
        return self.n > 0

    def _spread(self) -> float:
        """``n`` times the weighted variance of the padded sizes seen: 0 while only one size has been."""
        return self.n * self.xx - self.x * self.x

    @property
    def identified(self) -> bool:
        """Whether two padded sizes have been seen, so the line's fixed part is measured, not assumed."""
        return self._spread() > 1e-9 * self.n * self.xx

    def coefficients(self) -> tuple[float, float]:
        """``(delta, gamma)``, both >= 0; while one padded size has been seen, the whole time counts as fixed."""
        var = self._spread()
        gamma = max((self.n * self.xy - self.x * self.y) / var, 0.0) if var > 0 else 0.0
        delta = max((self.y - gamma * self.x) / self.n, 0.0)
        return delta, gamma

    def __call__(self, batch: float) -> float:
        delta, gamma = self.coefficients()
        return delta + gamma * batch


class _Hazard:
    """Per loop step, the exponentially weighted share of tokens at that step that left the loop after it."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.left: dict[int, float] = {}
        self.stamp: dict[int, int] = {}
        self.launches = 0
        self.all_seen = self.all_left = 0.0

    def add(self, steps: Sequence[int], exits: Sequence[bool]) -> None:
        self.launches += 1
        now, seen, left, stamp = self.launches, self.seen, self.left, self.stamp
        for s, out in zip(steps, exits, strict=True):
            if s in seen:
                fade = FORGET ** (now - stamp[s])
                seen[s], left[s] = fade * seen[s] + 1, fade * left[s] + out
            else:
                seen[s], left[s] = 1.0, float(out)
            stamp[s] = now
        self.all_seen, self.all_left = FORGET * self.all_seen + len(exits), FORGET * self.all_left + sum(exits)

    def expected_exits(self, steps: Sequence[int]) -> float:
        """Tokens expected to leave the loop after one core step over tokens at ``steps`` (a step not seen yet
        counts at the rate over all steps)."""
        if not self.all_seen:
            return 0.0
        seen, left, overall = self.seen, self.left, self.all_left / self.all_seen
        return sum(left[s] / seen[s] if s in seen else overall for s in steps)


class _ArrivalRate:
    """Requests arriving per second of device time, weighted down with age; a gap ending at an idle device is left
    out, and the open gap counts, so the rate falls when arrivals stop."""

    def __init__(self) -> None:
        self.arrivals = 0.0
        self.gaps = 0.0
        self.open = 0.0  # device seconds since the last arrival

    def arrive(self, busy: bool) -> None:
        if busy:
            self.arrivals, self.gaps = FORGET * self.arrivals + 1, FORGET * self.gaps + self.open
        self.open = 0.0

    def add(self, seconds: float) -> None:
        self.open += seconds

    def __call__(self) -> float:
        seconds = self.gaps + self.open
        return self.arrivals / seconds if seconds > 0 else 0.0


class _OutputWeight:
    """A resident request's delay weight against a waiting arrival's, ``1 / (mean(L) mean(1/L))`` over finished
    requests' output lengths (1 until one has finished)."""

    def __init__(self) -> None:
        self.count = self.tokens = self.inverse = 0.0

    def finish(self, output_len: int) -> None:
        self.count, self.tokens = FORGET * self.count + 1, FORGET * self.tokens + output_len
        self.inverse = FORGET * self.inverse + 1 / output_len

    def __call__(self) -> float:
        return self.count * self.count / (self.tokens * self.inverse) if self.count else 1.0


class OnlineCosts:
    """Per-stage step costs, per-step exit rates, the arrival rate and the resident output weight of this run."""

    def __init__(self) -> None:
        self.lines = {stage: _Line() for stage in (Stage.PREFILL, Stage.PRELUDE, Stage.CORE, Stage.CODA)}
        self.hazard = _Hazard()
        self.arrival_rate = _ArrivalRate()
        self.resident_weight = _OutputWeight()

    def observe(self, launch: Launch, seconds: float) -> None:
        if launch.stage is Stage.CORE:
            self.hazard.add(launch.steps, launch.exits)
        line = self.lines.get(launch.stage)
        if seconds > 0:
            self.arrival_rate.add(seconds)
            if line is not None:
                line.add(launch.padded, seconds)

    def prefill_due(self, waiting: int, resident: int, free_slots: int) -> bool:
        """Whether ``waiting`` arrivals should be prefilled now rather than after another core step (module
        docstring's rule; True until the prefill's fixed cost is identified)."""
        prefill = self.lines[Stage.PREFILL]
        if waiting >= free_slots or not prefill.identified:
            return True
        delayed = resident * self.resident_weight() + waiting
        return waiting * (waiting + 1) >= 2 * prefill(1) * self.arrival_rate() * delayed

    def coda_due(self, waiting: int, core_steps: Sequence[int], slots_wanted: bool) -> bool:
        """Whether the coda (then the prelude) should run now for ``waiting`` exited tokens rather than after another
        core step over tokens at ``core_steps``; ``slots_wanted``: requests wait for a resident slot."""
        coda, prelude, core = self.lines[Stage.CODA], self.lines[Stage.PRELUDE], self.lines[Stage.CORE]
        batch = len(core_steps)
        if waiting <= 0 or batch == 0 or not (coda.ready and core.ready):
            return True
        exits = self.hazard.expected_exits(core_steps)
        order = coda(1) + (prelude(1) if prelude.ready else 0.0)
        delta, gamma = core.coefficients()
        hold = delta / batch if slots_wanted else (delta + gamma * batch) / (batch + waiting)
        return waiting * (waiting + exits) * hold >= 2 * order * exits

