"""The discrete-event simulator: the shared scheduler driven by SimPy with latencies from a profile.

Three processes share one SimPy environment:

* ``arrivals`` releases each request into the scheduler at its arrival time;
* ``host`` plans a launch (``Scheduler.plan``), spends the profile's host time on it, and hands it to
  the device; how far it may run ahead of the device is :class:`cdbsim.pipeline.HostPipeline`'s rule
  (``sync``: never, so the device idles while the host works; ``lookahead``: coda, prelude and the next
  core step are prepared while a core step runs);
* ``device`` runs launches in order, each for the time the latency model gives.

Every launch is logged through :class:`~cdbsim.logs.RunRecorder`, the same recorder the GPU executor uses.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import simpy

from cdbsim.arch import ArchSpec
from cdbsim.config import ServeConfig
from cdbsim.latency import LatencyModel
from cdbsim.launch import Launch
from cdbsim.logs import RunLog, RunRecorder, run_meta
from cdbsim.metadata import table_width
from cdbsim.pipeline import HostPipeline
from cdbsim.quiet_gc import paused_gc
from cdbsim.scheduler import Scheduler
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
        self._device_queue: deque[tuple[Launch, float, float, simpy.Event]] = deque()
        self._wake_device = self.env.event()

    def run(self) -> RunLog:
        env = self.env
        env.process(self._arrivals())
        env.process(self._device())
        host = env.process(self._host())
        with paused_gc():  # millions of short-lived objects: collector passes cost several percent
            env.run(until=host)
        return self.recorder.finish(run_meta(self.scheduler, profile=self.latency.profile.label(),
                                             clock="simulated"))

    # ----- processes -----------------------------------------------------------------------------
    def _arrivals(self):
        env, s = self.env, self.scheduler
        order = sorted(range(len(self.requests)), key=lambda i: self.requests[i].arrival)
        for i in order:
            delay = self.requests[i].arrival - env.now
            if delay > 0:
                yield env.timeout(delay)
            s.arrive(i)
            self._poke_host()

    def _poke_host(self) -> None:
        if not self._wake_host.triggered:
            self._wake_host.succeed()

    def _host(self):
        """Wait as the pipeline rule says, plan, hand over. A launch planned at ``t`` is ready on the
        device at ``t + host time``, and the host is busy until then."""
        env, s, latency = self.env, self.scheduler, self.latency
        pipeline: HostPipeline[simpy.Event] = HostPipeline(s, self.config.timing, seconds=lambda done: done.value)
        busy_until = 0.0
        finished_before = 0
        while not s.done:
            while pipeline.must_wait():
                yield pipeline.oldest
                pipeline.complete_oldest()
            if s.done:
                break
            if env.now < busy_until:
                yield env.timeout(busy_until - env.now)
            launch = s.plan()
            if launch is None:
                if len(pipeline):
                    oldest = pipeline.oldest
                    yield oldest | self._wake_host
                    if oldest.processed:
                        pipeline.complete_oldest()
                else:
                    self._wake_host = env.event()
                    yield self._wake_host
                if self._wake_host.triggered:
                    self._wake_host = env.event()
                continue
            host_s = latency.host_time(launch)
            busy_until = env.now + host_s
            finished = env.event()
            self._device_queue.append((launch, busy_until, host_s, finished))
            if not self._wake_device.triggered:
                self._wake_device.succeed()
            pipeline.add(launch, finished)
            if self.progress is not None and s.finished != finished_before:
                self.progress(s.finished - finished_before)
                finished_before = s.finished
        while len(pipeline):
            yield pipeline.oldest
            pipeline.complete_oldest()

    def _device(self):
        """Run launches in order; a launch starts when the device is free and the host has handed it over."""
        env, queue, latency, record = self.env, self._device_queue, self.latency, self.recorder.record
        while True:
            if not queue:
                self._wake_device = env.event()
                yield self._wake_device
                continue
            launch, ready_at, host_s, finished = queue.popleft()
            start = max(env.now + latency.launch_gap, ready_at)
            yield env.timeout(start - env.now + latency.launch_time(launch, self.table_width))
            record(launch, start, env.now, host_s)
            finished.succeed(env.now - start)  # the launch's device time, which the host observes


def simulate(arch: ArchSpec, config: ServeConfig, requests: Sequence[Request], latency: LatencyModel,
             kv_blocks: int, progress: Callable[[int], None] | None = None) -> RunLog:
    """Simulate serving ``requests``; returns the launch and request logs."""
    return Simulation(arch, config, requests, latency, kv_blocks, progress).run()
