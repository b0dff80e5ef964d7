"""Progress of long steps on stderr: a rich bar with ETA on a terminal; elsewhere plain lines, only after
:data:`QUIET_S` seconds and then every :data:`EVERY_S` seconds, plus one when done."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TextIO

ProgressFactory = Callable[[str, int], Callable[[int], None]]
"""Given a step's label and its number of items, a callback advanced by the items done."""

QUIET_S = 3.0   # a plain-text step stays silent this long
EVERY_S = 10.0  # then reports at most this often


def _duration(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


@dataclass
class PlainStep:
    """One step's progress as plain lines on ``stream``."""

    label: str
    total: int
    stream: TextIO
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    started: float = field(default=0.0)
    reported: float | None = None

    def __post_init__(self) -> None:
        self.started = self.clock()

    def advance(self, n: int) -> None:
        self.done += n
        now = self.clock()
        elapsed = now - self.started
        if self.done >= self.total:
            self.close()
        elif elapsed >= QUIET_S and (self.reported is None or now - self.reported >= EVERY_S):
            left = elapsed * (self.total - self.done) / self.done if self.done else float("nan")
            eta = f"about {_duration(left)} left" if self.done else "time left unknown"
            self._write(f"{self.label}: {self.done:,}/{self.total:,} ({100 * self.done / self.total:.0f}%), "
                        f"{_duration(elapsed)} elapsed, {eta}")
            self.reported = now

    def close(self) -> None:
        """The step is over (all items done, or the next step began): one last line if it reported."""
        if self.reported is not None:
            self._write(f"{self.label}: {self.done:,}/{self.total:,} done in {_duration(self.clock() - self.started)}")
            self.reported = None

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


@contextmanager
def progress_display(stream: TextIO | None = None) -> Iterator[ProgressFactory]:
    """A :data:`ProgressFactory` for the duration of the block: rich bars on a terminal, plain lines elsewhere."""
    stream = stream if stream is not None else sys.stderr
    if not stream.isatty():
        steps: list[PlainStep] = []

        def plain(label: str, total: int) -> Callable[[int], None]:
            if steps:
                steps[-1].close()  # steps run one after another: a new one ends the last
            steps.append(PlainStep(label, max(total, 1), stream))
            return steps[-1].advance

        try:
            yield plain
        finally:
            if steps:
                steps[-1].close()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=Console(file=stream), transient=True)

    def factory(label: str, total: int) -> Callable[[int], None]:
        task = bars.add_task(label, total=total)
        return lambda n: bars.advance(task, n)

    with bars:
        yield factory
