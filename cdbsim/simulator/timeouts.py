"""The simulator's host timeout, in a module of its own: it subclasses a SimPy event, so it stays interpreted
when the simulator's hot modules are compiled (:mod:`cdbsim.native`)."""

from __future__ import annotations

import math

import simpy

LATE = simpy.events.NORMAL + 1  # after SimPy's URGENT and NORMAL events of the same time


class Late(simpy.Timeout):
    """A timeout at the absolute time ``at`` that SimPy processes after every other event due then, so that
    the host, woken by one, has seen every request arriving at that time (SimPy orders the events of one
    time by priority, then by when they were scheduled)."""

    def __init__(self, env: simpy.Environment, at: float) -> None:
        now = env.now
        delay = at - now  # SimPy schedules at now + delay, which may miss ``at`` by a rounding step
        if now + delay != at:
            while now + delay < at:
                delay = math.nextafter(delay, math.inf)
            while now + delay > at:
                delay = math.nextafter(delay, -math.inf)
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        self.env = env
        self.callbacks = []
        self._value = None
        self._delay = delay
        self._ok = True
        env.schedule(self, LATE, delay)
