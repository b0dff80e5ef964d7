"""The discrete-event simulator: the shared scheduler driven by SimPy with latencies from a profile.

Two processes and the device's events share one SimPy environment:

* ``arrivals`` releases each request into the scheduler at its arrival time;
* ``host`` plans a launch (``Scheduler.plan``), spends the profile's host time on it, and hands it to
  the device; how far it may run ahead of the device is :class:`cdbsim.serving.pipeline.HostPipeline`'s rule
  (``sync``: never, so the device idles while the host works; ``lookahead``: coda, prelude and the next
  core step are prepared while a core step runs);
* the device runs launches in order, each for the time the latency model gives: in order means a
  launch's start and end are known when it is handed over; when the host has to wait for a launch (the
  pipeline rule), the launch's end is a SimPy timeout it waits on.

Every launch is logged through :class:`~cdbsim.report.logs.RunRecorder`, the same recorder the GPU executor uses.
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
from cdbsim.serving.launch import table_width
from cdbsim.serving.pipeline import HostPipeline, paused_gc
from cdbsim.serving.scheduler import Scheduler
from cdbsim.simulator.timeouts import Late
from traces.request import Request


class Simulation:
    """One simulated run of ``requests`` on ``kv_blocks`` KV blocks."""

    def __init__(self, arch: ArchSpec, config: ServeConfig, requests: Sequence[Request],
                 latency: LatencyModel, kv_blocks: int,
                 progress: Callable[[int], None] | None = None) -> None:
        self.arch = arch
        self.config = config
        self.requests = list(requests)
        self.latency = latency
        self.table_width = table_width(self.requests, config.block_size)  # as the executor sizes its graphs
        self.scheduler = Scheduler(arch, config, self.requests, kv_blocks)
        self.recorder = RunRecorder(self.requests)
        self.progress = progress
        self.env = simpy.Environment()
        self._wake_host = self.env.event()
        self._next_arrival = 0.0  # when the next request not yet released arrives (inf: none left)

    def run(self) -> RunLog:
        env = self.env
        env.process(self._arrivals())
        host = env.process(self._host())
        with paused_gc(collect=False):  # millions of short-lived objects: collector passes cost several percent
            env.run(until=host)
        return self.recorder.finish(run_meta(self.scheduler, profile=self.latency.profile.label(),
                                             clock="simulated"))

    # ----- processes -----------------------------------------------------------------------------
    def _arrivals(self) -> Generator[simpy.Event, object, None]:
        env, s = self.env, self.scheduler
        order = sorted(range(len(self.requests)), key=lambda i: self.requests[i].arrival)
        for i in order:
            self._next_arrival = self.requests[i].arrival
            delay = self._next_arrival - env.now
            if delay > 0:
                yield env.timeout(delay)
            s.arrive(i)
            self._poke_host()
        self._next_arrival = math.inf

    def _poke_host(self) -> None:
        if not self._wake_host.triggered:
            self._wake_host.succeed()

    def _host(self) -> Generator[simpy.Event, object, None]:
        """Wait as the pipeline rule says, plan, hand over. A launch planned at ``t`` is ready on the
        device at ``t + host time``, and the host is busy until then.

        The device runs launches in order, so when a launch runs is known as it is handed over: the device
        takes it when it finishes the previous one (at once, if idle) and starts it once the launch gap
        (:attr:`LatencyModel.launch_gap`) has passed since taking it and the idle start
        (:attr:`LatencyModel.idle_start`) since the host handed it over, and runs it for the latency
        model's time. The launch is logged then, and the host keeps its end; when the pipeline
        rule makes the host wait for it, that end is a SimPy timeout.

        ``now`` is the host's clock. Nothing but an arrival can change what the host plans next, so while
        no request arrives before the host is done being busy, the host moves its clock on without a SimPy
        timeout, and SimPy's clock catches up when the host next waits for an event."""
        # methods are called on their objects, not through local aliases: compiled, those are native calls
        env, s, latency, recorder = self.env, self.scheduler, self.latency, self.recorder
        width, gap, wake = self.table_width, latency.launch_gap, latency.idle_start
        # handle: the launch's end; an adaptive scheduler also observes each launch's device time (the
        # pipeline completes launches oldest first, so their times queue in that order)
        durations: deque[float] | None = deque() if s.costs is not None else None
        pipeline: HostPipeline[float] = HostPipeline(
            s, self.config.timing, seconds=None if durations is None else lambda _end: durations.popleft())
        must_wait = pipeline.must_wait
        now = env.now
        busy_until = 0.0
        device_free = -math.inf  # when the device finishes the last launch handed to it
        finished_before = 0
        while not s.done:
            while must_wait():
                end = pipeline.oldest
                if end > now:
                    if self._next_arrival <= end:  # else nothing can happen before it: no SimPy round trip
                        yield Late(env, end)
                    now = end
                pipeline.complete_oldest()
            if s.done:
                break
            if now < busy_until:
                now = now + (busy_until - now)  # where a timeout of the remaining busy time would end
                if self._next_arrival <= now:
                    yield Late(env, now)
            launch = s.plan()
            if launch is None:
                if len(pipeline) and self._next_arrival > max(now, pipeline.oldest) \
                        and not self._wake_host.triggered:  # only the oldest launch's end can come next
                    now = max(now, pipeline.oldest)
                    pipeline.complete_oldest()
                    continue
                if env.now < now:
                    yield Late(env, now)
                if len(pipeline):
                    end = pipeline.oldest
                    if end > now:
                        yield Late(env, end) | self._wake_host
                        now = env.now
                    if end <= now:
                        pipeline.complete_oldest()
                else:
                    self._wake_host = env.event()
                    yield self._wake_host
                    now = env.now
                if self._wake_host.triggered:
                    self._wake_host = env.event()
                continue
            host_s = latency.host_time(launch)
            busy_until = now + host_s
            taken = now if device_free <= now else device_free
            start = max(taken + gap, busy_until + wake)
            end = taken + (start - taken + latency.launch_time(launch, width))
            recorder.record(launch, start, end, host_s)
            if durations is not None:
                durations.append(end - start)
            device_free = end
            pipeline.add(launch, end)
            if self.progress is not None and s.finished != finished_before:
                self.progress(s.finished - finished_before)
                finished_before = s.finished
        while len(pipeline):
            end = pipeline.oldest
            if end > now:
                yield Late(env, end)
                now = end
            pipeline.complete_oldest()


def simulate(arch: ArchSpec, config: ServeConfig, requests: Sequence[Request], latency: LatencyModel,
             kv_blocks: int, progress: Callable[[int], None] | None = None) -> RunLog:
    """Simulate serving ``requests``; returns the launch and request logs."""
    return Simulation(arch, config, requests, latency, kv_blocks, progress).run()
