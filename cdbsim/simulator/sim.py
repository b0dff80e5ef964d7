"""The discrete-event simulator: the shared scheduler driven by SimPy with latencies from a profile.

An ``arrivals`` process releases each request at its arrival time; the ``host`` process plans launches, spends
the profile's host time on each and hands it to the device, as far ahead as
:class:`cdbsim.serving.pipeline.HostPipeline`'s rule allows. The device runs launches in order, each for the
latency model's time, so a launch's start and end are known when it is handed over. Every launch is logged
through :class:`~cdbsim.report.logs.RunRecorder`, the same recorder the GPU executor uses.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Sequence

import simpy

from cdbsim.latency.model import LatencyModel
from cdbsim.model.arch import ArchSpec
from cdbsim.report.logs import RunLog, RunRecorder, run_meta
from cdbsim.serving.config import ServeConfig
from cdbsim.serving.launch import Launch, SchedulerState, table_width
from cdbsim.serving.pipeline import HostPipeline, paused_gc, serve
from cdbsim.serving.scheduler import Scheduler
from cdbsim.simulator.timeouts import Late
from traces.request import Request


class Simulation:
    """One simulated run of ``requests`` on ``kv_blocks`` KV blocks."""

    def __init__(self, arch: ArchSpec, config: ServeConfig, requests: Sequence[Request],
                 latency: LatencyModel, kv_blocks: int,
                 progress: Callable[[int], None] | None = None) -> None:
        self.requests = list(requests)
        self.latency = latency
        self.table_width = table_width(self.requests, config.block_size)  # as the executor sizes its graphs
        self.scheduler = Scheduler(arch, config, self.requests, kv_blocks)
        self.recorder = RunRecorder(self.requests)
        self.progress = progress
        self.env = simpy.Environment()
        self._wake_host = self.env.event()
        self._next_arrival = 0.0  # when the next request not yet released arrives (inf: none left)
        # an adaptive scheduler observes each launch's device time, queued in completion order (oldest first)
        durations: deque[float] | None = deque() if self.scheduler.costs is not None else None
        self._durations = durations
        self._pipeline: HostPipeline[float] = HostPipeline(
            self.scheduler, config.timing, seconds=None if durations is None else lambda _end: durations.popleft())
        self._now = 0.0            # the host's clock: it runs ahead of SimPy's while nothing else can happen
        self._busy_until = 0.0     # the host is busy with its last hand-over until then
        self._device_free = -math.inf  # when the device finishes the last launch handed to it
        self._finished_before = 0

    def run(self) -> RunLog:
        env = self.env
        env.process(self._arrivals())
        host = env.process(serve(self._pipeline, self))  # the shared host loop, with this simulation as backend
        with paused_gc(collect=False):  # millions of short-lived objects: collector passes cost several percent
            env.run(until=host)
        return self.recorder.finish(run_meta(self.scheduler, profile=self.latency.profile.label(),
                                             clock="simulated"))

    def _arrivals(self) -> Generator[simpy.Event, object, None]:
        env, s = self.env, self.scheduler
        for i in sorted(range(len(self.requests)), key=lambda i: self.requests[i].arrival):
            self._next_arrival = self.requests[i].arrival
            delay = self._next_arrival - env.now
            if delay > 0:
                yield env.timeout(delay)
            s.arrive(i)
            if not self._wake_host.triggered:
                self._wake_host.succeed()
        self._next_arrival = math.inf

    # The backend of the host loop. The device takes a launch when the previous ends (at once if idle) and starts it
    # once the launch gap has passed since then and the idle start since the hand-over; its end is its handle. Only an
    # arrival changes what the host plans next, so until one comes the host moves its clock on without a SimPy event.
    def finish_oldest(self, last: bool) -> Generator[simpy.Event, object, None]:
        end = self._pipeline.oldest
        if end > self._now:
            if last or self._next_arrival <= end:  # else nothing can happen before it: no SimPy round trip
                yield Late(self.env, end)
            self._now = end
        self._pipeline.complete_oldest()

    def before_plan(self) -> Generator[simpy.Event, object, None]:
        now = self._now
        if now < self._busy_until:
            now = now + (self._busy_until - now)  # where a timeout of the remaining busy time would end
            self._now = now
            if self._next_arrival <= now:
                yield Late(self.env, now)

    def stalled(self) -> Generator[simpy.Event, object, None]:
        env, pipeline = self.env, self._pipeline
        if len(pipeline) and self._next_arrival > max(self._now, pipeline.oldest) \
                and not self._wake_host.triggered:  # only the oldest launch's end can come next
            self._now = max(self._now, pipeline.oldest)
            pipeline.complete_oldest()
            return
        if env.now < self._now:
            yield Late(env, self._now)
        if len(pipeline):
            end = pipeline.oldest
            if end > self._now:
                yield Late(env, end) | self._wake_host
                self._now = env.now
            if end <= self._now:
                pipeline.complete_oldest()
        else:
            self._wake_host = env.event()
            yield self._wake_host
            self._now = env.now
        if self._wake_host.triggered:
            self._wake_host = env.event()

    def hand_over(self, launch: Launch, state: SchedulerState) -> Generator[simpy.Event, object, float]:
        yield from ()
        latency, now = self.latency, self._now
        host_s = latency.host_time(launch)
        self._busy_until = now + host_s
        taken = now if self._device_free <= now else self._device_free
        start = max(taken + latency.launch_gap, self._busy_until + latency.idle_start)
        end = taken + (start - taken + latency.launch_time(launch, self.table_width))
        self.recorder.record(launch, state, start, end, host_s)
        if self._durations is not None:
            self._durations.append(end - start)
        self._device_free = end
        s = self.scheduler
        if self.progress is not None and s.finished != self._finished_before:
            self.progress(s.finished - self._finished_before)
            self._finished_before = s.finished
        return end


def simulate(arch: ArchSpec, config: ServeConfig, requests: Sequence[Request], latency: LatencyModel,
             kv_blocks: int, progress: Callable[[int], None] | None = None) -> RunLog:
    """Simulate serving ``requests``; returns the launch and request logs."""
    return Simulation(arch, config, requests, latency, kv_blocks, progress).run()
