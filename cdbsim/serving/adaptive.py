"""The adaptive CDB policy's rule: when a coda (with the prelude after it) is due, and when arrivals are.

Two launches pay their weight reads however few tokens they carry, and tokens gather for them: the coda (and
the prelude after it), which exited tokens wait for, and the full-depth prefill, which arrived requests wait
for. Each is an order quantity: with an order cost ``F`` per launch, demand ``e`` per period and a holding cost
``h`` per waiting unit and period, launching whenever ``Q`` have gathered costs ``F e / Q`` in orders plus
holding. Lots are whole units, so the lot grows while the order cost it saves exceeds the holding it adds;
with units arriving ``a`` at a time, one more period is worth waiting while ``n (n + a) h < 2 F e``:

    launch the coda now      if  n (n + e) * h >= 2 * F * e        (or nothing else can run)
    prefill the arrivals now if  m (m + 1)     >= 2 * F_p * lam * (b * w + m)  (or they fill the free slots)

**The coda.** The period is one core step; exits come in bulk, ``e`` per step (``a = e``).

* ``F = fixed(coda) + fixed(prelude)``: each token that leaves the loop pays both launches before it can
  loop again, and the prelude runs right after each coda, so one launch fewer saves both stages' time at one
  token (their weight reads and launch overhead).
* ``e``: the exits the next core step is expected to bring, the sum over the tokens waiting for it of the
  exit rate observed so far at each one's loop step. If no token is going to exit, waiting gains nothing
  and the coda runs at once; a wave of tokens just past their prelude does not hold the codas back.
* ``h``, what a token costs for each core step it sits out. While requests wait for a resident slot the run
  is bound by its slots: the core step's weight reads, ``delta_core``, are shared by the ``b`` tokens in it,
  and a token missing from it loses its share, ``delta_core / b`` (its own ``gamma_core`` is not lost, it
  is paid when it runs). When every request has a slot, latency is what waiting loses: the token's
  request is a whole core step later, ``t_core(b)``, against a launch that delays every one of the ``b + n``
  tokens in the loop, so per token of the launch ``h = t_core(b) / (b + n)``. Every token here is a
  resident request's, so weighting each by its latency per output token (as the prefill does) changes
  nothing in this trade.

**The prefill.** The period is a second of device time; requests arrive one at a time (``a = 1``), ``lam``
per second. Counted in what the online figure of merit sums, latency per output token, in units of a waiting
arrival's (a second of its wait adds ``1 / L`` for its output length ``L``, ``mean(1/L)`` expected):

* ``F_p (b * w + m)``: a prefill launch's one-token time ``F_p = fixed(prefill)`` (its full-depth weight
  reads) delays each of the ``b`` resident requests and the ``m`` waiting ones; one launch fewer saves that.
* ``w = 1 / (mean(L) * mean(1/L))``: what a resident request's delay weighs against an arrival's. Residents
  are not drawn like arrivals: a request stays resident in proportion to its output, so residents are a
  length-biased draw whose mean ``1/L`` is ``1 / mean(L)``. ``L`` are the output lengths of the requests
  finished so far (``w = 1``, every request alike, until one has finished); ``w < 1`` whenever the lengths
  differ, most where outputs are mostly short and a few long: the saved prefill time then goes to long
  requests, for which it is little per token, while the wait falls on short ones.
* ``h = 1``: a waiting arrival's latency grows by its wait.
* ``lam``: requests arriving per second of device time, observed over the recent arrivals.
* Slots: a held request keeps a resident slot empty. The lot can only gather while every arrival finds a
  free slot, so the arrivals are prefilled at once when the ``m`` waiting fill the free slots (or more wait
  than fit: the run is bound by its slots). The gate is also passed when nothing else can run (no token is
  ready for a core step) and while a prompt is part way through its chunks.
* Cold start: ``F_p`` is the prefill line's fixed part, which one padded size cannot separate from the
  per-token part (a first 5,000-token prompt would count whole as fixed cost, hundreds of ms where the line
  later finds a fraction of one). The coda can price a single size as all fixed, since its tokens are few and
  its weight reads dominate; a prefill's are not. So arrivals are prefilled at once until prefills of two
  padded sizes have been seen.

Every term is a cost or a rate of this run: nothing is tuned to an evaluation grid. The step costs come
from :class:`OnlineCosts`, a least-squares line ``t = delta + gamma * B`` per stage fitted to the launches
this run has completed, the exit rates from the core steps it has completed, the arrival rate from the
device time between arrivals and ``w`` from the requests finished, all weighted down with age (so they follow
contexts growing and a load that shifts). The same rule therefore runs in the simulator and on a GPU nobody
calibrated. Until a stage has been observed, its launches are due at once (refill with K = 1).
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
        f = FORGET
        self.n, self.x, self.y = f * self.n + 1, f * self.x + batch, f * self.y + seconds
        self.xx, self.xy = f * self.xx + batch * batch, f * self.xy + batch * seconds

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
        """``(delta, gamma)``, both >= 0; while a single padded size has been seen (a CUDA graph pads a core step
        of 9-16 tokens to 16), the whole time counts as fixed: at small batches a launch is bound by its weight
        reads."""
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
        f = FORGET
        self.all_seen, self.all_left = f * self.all_seen + len(exits), f * self.all_left + sum(exits)

    def expected_exits(self, steps: Sequence[int]) -> float:
        """Tokens expected to leave the loop after one core step over tokens at ``steps`` (a step not seen yet
        counts at the rate over all steps)."""
        if not self.all_seen:
            return 0.0
        seen, left, overall = self.seen, self.left, self.all_left / self.all_seen
        return sum(left[s] / seen[s] if s in seen else overall for s in steps)


class _ArrivalRate:
    """Requests arriving per second of device time: the gaps between arrivals, in the seconds of the launches
    that ran between them, weighted down with age per arrival (about the last 200 count). A gap that ends at
    an idle device is left out (the idle time is not seen); the gap still open counts, so the rate falls
    when arrivals stop."""

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
    """What a resident request's delay weighs in normalized latency against a waiting arrival's, from the output
    lengths ``L`` of the requests finished so far, weighted down with age per finished request (about the last
    200 count): ``1 / (mean(L) * mean(1/L))``, 1 until a request has finished (see the module docstring)."""

    def __init__(self) -> None:
        self.count = self.tokens = self.inverse = 0.0

    def finish(self, output_len: int) -> None:
        f = FORGET
        self.count, self.tokens = f * self.count + 1, f * self.tokens + output_len
        self.inverse = f * self.inverse + 1 / output_len

    def __call__(self) -> float:
        return self.count * self.count / (self.tokens * self.inverse) if self.count else 1.0


class OnlineCosts:
    """Per-stage step costs, per-step exit rates, the arrival rate and the resident requests' output weight
    learnt from this run (see the module docstring)."""

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
        """Whether ``waiting`` arrived requests should be prefilled now, rather than after another core step
        over the ``resident`` requests' tokens, with ``free_slots`` resident slots free. The rule of the module
        docstring; True until the prefill's fixed cost is identified."""
        prefill = self.lines[Stage.PREFILL]
        if waiting >= free_slots or not prefill.identified:
            return True
        delayed = resident * self.resident_weight() + waiting
        return waiting * (waiting + 1) >= 2 * prefill(1) * self.arrival_rate() * delayed

    def coda_due(self, waiting: int, core_steps: Sequence[int], slots_wanted: bool) -> bool:
        """Whether the coda (and after it the prelude) should run now for ``waiting`` exited tokens, rather than
        after another core step over tokens at ``core_steps``; ``slots_wanted``: requests wait for a resident
        slot. The rule of the module docstring; True while the costs are unknown or nothing else can run."""
        coda, prelude, core = self.lines[Stage.CODA], self.lines[Stage.PRELUDE], self.lines[Stage.CORE]
        batch = len(core_steps)
        if waiting <= 0 or batch == 0 or not (coda.ready and core.ready):
            return True
        exits = self.hazard.expected_exits(core_steps)
        order = coda(1) + (prelude(1) if prelude.ready else 0.0)
        delta, gamma = core.coefficients()
        hold = delta / batch if slots_wanted else (delta + gamma * batch) / (batch + waiting)
        return waiting * (waiting + exits) * hold >= 2 * order * exits

