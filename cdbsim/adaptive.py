"""The adaptive CDB policy's rule: when a boundary stage (coda, prelude) is worth launching.

Refill's fixed coda batch K trades two costs. A coda launch pays its weight reads (the head; Huginn's coda
layers too) however few tokens it carries, so waiting for more exits amortises that fixed cost; but a token
waiting for its coda (or, after it, for its prelude) is missing from the core steps that run meanwhile, and
while a core step is bound by its weight reads (batch below B*), a missing token is lost work at no saving.
The best K therefore moves with the model (how expensive a boundary stage is next to a core step), the
exit rate and the load; the paper found K = 1 best for Ouro and K = W/4 for Huginn 2-4-2.

The rule, for a boundary stage with ``n`` tokens waiting while ``b`` tokens wait for a core step:

    launch now  if  fixed(stage) <= n * t_core(b + n) / (b + n)      (or nothing else can run)

``fixed(stage)`` is the stage's time at one token (its weight reads and launch), ``t_core(b + n) / (b + n)``
what one token's share of a core step costs at the batch the core would run with them. The left side is
what waiting would save (one launch of the stage), the right side what the waiting tokens cost per core
step they sit out. Prelude launches follow the same rule, so a model with an expensive prelude (Huginn's
two prelude layers) lets freed slots fill in larger groups, towards no-refill's one prelude per wave,
while Ouro's cheap embedding refills every slot at once. The constants are the latency of the stages
themselves: nothing is tuned to an evaluation grid.

The step costs come from :class:`OnlineCosts`, a least-squares line ``t = delta + gamma * B`` per stage fitted
to the launches this run has completed (with forgetting, so it follows contexts growing), so the same rule
runs in the simulator and on a GPU nobody calibrated. Until a stage has been seen at two batch sizes, its
boundary stages launch at once (refill with K = 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdbsim.launch import Launch, Stage

FORGET = 0.995  # weight of an older launch each time a newer one is observed (about the last 200 count)


@dataclass
class _Line:
    """Exponentially weighted least squares of seconds against padded batch."""

    n: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    sizes: set[int] = field(default_factory=set)

    def add(self, batch: float, seconds: float) -> None:
        f = FORGET
        self.n, self.x, self.y = f * self.n + 1, f * self.x + batch, f * self.y + seconds
        self.xx, self.xy = f * self.xx + batch * batch, f * self.xy + batch * seconds
        if len(self.sizes) < 2:
            self.sizes.add(int(batch))

    @property
    def ready(self) -> bool:
        return len(self.sizes) >= 2

    def coefficients(self) -> tuple[float, float]:
        """``(delta, gamma)``, both >= 0."""
        var = self.n * self.xx - self.x * self.x
        gamma = max((self.n * self.xy - self.x * self.y) / var, 0.0) if var > 0 else 0.0
        delta = max((self.y - gamma * self.x) / self.n, 0.0)
        return delta, gamma

    def __call__(self, batch: float) -> float:
        delta, gamma = self.coefficients()
        return delta + gamma * batch


class OnlineCosts:
    """Per-stage step costs learnt from the launches of this run (see the module docstring)."""

    def __init__(self) -> None:
        self.lines = {stage: _Line() for stage in (Stage.PRELUDE, Stage.CORE, Stage.CODA)}

    def observe(self, launch: Launch, seconds: float) -> None:
        line = self.lines.get(launch.stage)
        if line is not None and seconds > 0:
            line.add(launch.padded, seconds)

    def worth_launching(self, stage: Stage, waiting: int, core_waiting: int) -> bool:
        """Whether a boundary stage with ``waiting`` tokens should run now rather than after more core steps
        (the rule of the module docstring); always True until the costs are known."""
        line, core = self.lines[stage], self.lines[Stage.CORE]
        if waiting <= 0 or core_waiting <= 0 or not (line.ready and core.ready):
            return True
        fixed = line(1)
        batch = core_waiting + waiting
        return fixed <= waiting * core(batch) / batch

    def effective_k(self, stage: Stage, core_waiting: int, width: int) -> int:
        """The smallest number of waiting tokens the rule launches ``stage`` for (for reports and plots)."""
        for n in range(1, width + 1):
            if self.worth_launching(stage, n, core_waiting):
                return n
        return width
