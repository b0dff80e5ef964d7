"""Drive a scheduler without a clock: every launch takes zero time.

Used by ``cdbsim schedule``, the tests and offline analyses. The host follows the same pipeline rule as
the timed drivers (:class:`cdbsim.pipeline.HostPipeline`), completing a launch only when the rule makes
it wait or when nothing else can be planned; for an offline run that gives the launch sequence the
timed drivers produce.
"""

from __future__ import annotations

from collections.abc import Iterator

from cdbsim.config import Timing
from cdbsim.launch import Launch
from cdbsim.pipeline import MAX_AHEAD, HostPipeline
from cdbsim.scheduler import Scheduler


def drive(scheduler: Scheduler, timing: Timing | None = None, max_ahead: int = MAX_AHEAD) -> Iterator[Launch]:
    """Yield every launch of an offline run (all requests present at the start); ``timing`` defaults to
    the scheduler's configuration."""
    for i in sorted(range(len(scheduler.requests)), key=lambda i: scheduler.requests[i].arrival):
        scheduler.arrive(i)
    pipeline: HostPipeline[None] = HostPipeline(scheduler, timing or scheduler.config.timing, max_ahead)
    while not scheduler.done:
        while pipeline.must_wait():
            pipeline.complete_oldest()
        if scheduler.done:
            break
        launch = scheduler.plan()
        if launch is None:
            if not len(pipeline):
                raise RuntimeError("the scheduler can plan nothing although requests remain")
            pipeline.complete_oldest()
            continue
        yield launch
        pipeline.add(launch, None)
