"""How far the host may plan ahead of the device: the one rule both drivers (simulator, executor) follow.

The scheduler moves its state when it plans, and a backend runs launches in order on one stream, so the
host could in principle plan any number of launches ahead. What limits it is when it *learns* the exit
decisions a core launch needs:

* ``sync``: the host reads everything back after each launch, so it plans only when nothing is in flight
  (the device idles while the host plans).
* ``async``: the host plans the next launch while one runs, but after a core launch it must read that
  launch's exit gate before planning anything else.
* ``lookahead``: the gate computed at loop step r decides step r + 2, so a core launch may be planned once
  every launch *before* the newest core launch in flight has completed; prelude and coda launches need no
  gate and can be queued behind it. The host thus prepares coda, prelude and the next core step while a
  core step runs. ``max_ahead`` bounds the launches in flight.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdbsim.config import Timing
from cdbsim.launch import Launch, Stage

MAX_AHEAD = 4


def must_wait(timing: Timing, in_flight: Sequence[Launch], max_ahead: int = MAX_AHEAD) -> bool:
    """True if the host has to wait for the oldest launch in flight before planning the next one."""
    if not in_flight:
        return False
    if timing is Timing.SYNC:
        return True
    if timing is Timing.ASYNC:
        return len(in_flight) >= 2 or in_flight[-1].stage is Stage.CORE
    if len(in_flight) >= max_ahead:
        return True
    for launch in reversed(in_flight):
        if launch.stage is Stage.CORE:
            return launch is not in_flight[0]
    return False
