"""The simulator's host timeout; it subclasses a SimPy event, so it stays interpreted when the hot modules compile."""

from __future__ import annotations

import math

import simpy

LATE = simpy.events.NORMAL + 1  # after SimPy's URGENT and NORMAL events of the same time


class Late(simpy.Timeout):
    """A timeout at absolute time ``at``, processed after every other event due then (every arrival at that time)."""

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
