"""The host's loop, written once: plan, hand over, complete, under the one rule for how far the host may
plan ahead of the device. The simulator, the executor and the clock-less replay plug in a :class:`Backend`.

What limits planning ahead is when the host learns the exit decisions a core launch needs:

* ``sync``: the host plans only when nothing is in flight (the device idles while the host plans).
* ``async``: the host plans while a launch runs, but after a core launch it must read its exit gate first.
* ``lookahead``: the gate at loop step r decides step r + 2, so a core launch may be planned once every launch
  before the newest core launch in flight has completed; prelude and coda need no gate and queue behind it.
  :data:`MAX_AHEAD` bounds the launches in flight.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar

from cdbsim.serving.config import Timing
from cdbsim.serving.launch import Launch, SchedulerState, Stage
from cdbsim.serving.scheduler import Scheduler

MAX_AHEAD = 4
Handle = TypeVar("Handle")
Handle_co = TypeVar("Handle_co", covariant=True)


class HostPipeline(Generic[Handle]):
    """The launches in flight, oldest first, with the backend's handles; when the host must wait
    (:meth:`must_wait`); and completion. ``seconds(handle)``, where a driver knows it, is a completed launch's device
    time, which the scheduler observes before it learns the completion."""

    def __init__(self, scheduler, timing: Timing, seconds: Callable[[Handle], float] | None = None) -> None:
        self.scheduler = scheduler
        self.seconds = seconds
        self._launches: deque[Launch] = deque()
        self._handles: deque[Handle] = deque()
        self._added = 0          # launches added so far; the oldest in flight is number ``_completed``
        self._completed = 0
        self._newest_core = -1   # number of the newest core launch added
        self.must_wait: Callable[[], bool] = {Timing.SYNC: self._sync_waits, Timing.ASYNC: self._async_waits,
                                              Timing.LOOKAHEAD: self._lookahead_waits}[timing]

    def __len__(self) -> int:
        return len(self._launches)

    def add(self, launch: Launch, handle: Handle) -> None:
        """``launch`` was handed to the device; ``handle`` tells the backend when it is done."""
        if launch.stage is Stage.CORE:
            self._newest_core = self._added
        self._added += 1
        self._launches.append(launch)
        self._handles.append(handle)

    @property
    def oldest(self) -> Handle:
        return self._handles[0]

    def _sync_waits(self) -> bool:
        return bool(self._launches)

    def _async_waits(self) -> bool:
        n = len(self._launches)
        return n != 0 and (n >= 2 or self._newest_core == self._added - 1)

    def _lookahead_waits(self) -> bool:
        # wait while the newest core launch in flight is not the oldest one
        n = len(self._launches)
        return n != 0 and (n >= MAX_AHEAD or self._newest_core > self._completed)

    def complete_oldest(self) -> tuple[Launch, Handle, list[int]]:
        """The oldest launch finished: the scheduler learns it; returns it, its handle and the requests it finished."""
        launch = self._launches.popleft()
        handle = self._handles.popleft()
        self._completed += 1
        if self.seconds is not None:
            self.scheduler.observe(launch, self.seconds(handle))
        return launch, handle, self.scheduler.complete(launch)


Steps = Generator[Any, Any, Handle]
"""What a backend step yields to whoever runs the loop (SimPy events for the simulator, launches for replay,
nothing for the executor) and, for :meth:`Backend.hand_over`, returns: the launch's handle."""


class Backend(Protocol[Handle_co]):
    """What a driver plugs into :func:`serve`: how it hands a launch to its device and how it waits."""

    def before_plan(self) -> Steps[None]:
        """Bring the host's clock up to date (its own busy time, arrivals) before the scheduler plans."""

    def hand_over(self, launch: Launch, state: SchedulerState) -> Steps[Handle_co]:
        """Give ``launch`` to the device; ``state`` is the scheduler as the launch left it, for the log."""

    def finish_oldest(self, last: bool) -> Steps[None]:
        """Wait for the oldest launch in flight and complete it (``last``: the run's final drain)."""

    def stalled(self) -> Steps[None]:
        """The scheduler could plan nothing: wait for a launch to finish or a request to arrive."""


def serve(pipeline: HostPipeline[Handle], backend: Backend[Handle]) -> Generator[Any, Any, None]:
    """Serve until every request is done, yielding whatever the backend's steps yield."""
    s = pipeline.scheduler
    while not s.done:
        while pipeline.must_wait():
            yield from backend.finish_oldest(False)
        if s.done:
            break
        yield from backend.before_plan()
        launch = s.plan()
        if launch is None:
            yield from backend.stalled()
            continue
        handle = yield from backend.hand_over(launch, s.state)
        pipeline.add(launch, handle)
    while len(pipeline):
        yield from backend.finish_oldest(True)


class _Replay:
    """The clock-less backend: every launch takes zero time, and is yielded to the caller."""

    def __init__(self, pipeline: HostPipeline[None]) -> None:
        self.pipeline = pipeline

    def before_plan(self) -> Steps[None]:
        yield from ()

    def hand_over(self, launch: Launch, state: SchedulerState) -> Steps[None]:
        yield launch

    def finish_oldest(self, last: bool) -> Steps[None]:
        self.pipeline.complete_oldest()
        yield from ()

    def stalled(self) -> Steps[None]:
        if not len(self.pipeline):
            raise RuntimeError("the scheduler can plan nothing although requests remain")
        self.pipeline.complete_oldest()
        yield from ()


def drive(scheduler: Scheduler) -> Iterator[Launch]:
    """Yield every launch of an offline run (all requests present at the start) with zero-time launches under the
    scheduler's timing; ``scheduler.state`` is each launch's state."""
    for i in sorted(range(len(scheduler.requests)), key=lambda i: scheduler.requests[i].arrival):
        scheduler.arrive(i)
    pipeline: HostPipeline[None] = HostPipeline(scheduler, scheduler.config.timing)
    yield from serve(pipeline, _Replay(pipeline))


@contextmanager
def paused_gc(collect: bool = True) -> Iterator[None]:
    """Collect once (unless ``collect`` is False), then run the block with the collector off."""
    was_enabled = gc.isenabled()
    if collect:
        gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
