"""Drive a scheduler without a clock: every launch takes zero time.

Used by ``cdbsim schedule`` and by the tests. The order of calls is the one the timed drivers use, so
the launch sequence is the same as theirs for an offline run: with ``pipelined`` the next launch is
planned before the previous one completes (lookahead and async drivers), else after (synchronous).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from cdbsim.launch import Launch
from cdbsim.scheduler import Scheduler


def drive(scheduler: Scheduler, pipelined: bool = True) -> Iterator[Launch]:
    """Yield every launch of an offline run (all requests present at the start)."""
    for i in sorted(range(len(scheduler.requests)), key=lambda i: scheduler.requests[i].arrival):
        scheduler.arrive(i)
    depth = 1 if pipelined else 0
    pending: deque[Launch] = deque()
    while not scheduler.done:
        launch = scheduler.plan()
        if launch is None:
            if not pending:
                raise RuntimeError("the scheduler can plan nothing although requests remain")
            scheduler.complete(pending.popleft())
            continue
        yield launch
        pending.append(launch)
        while len(pending) > depth:
            scheduler.complete(pending.popleft())
