"""Where independent simulations run: in this process, in local worker processes (``--jobs N``), or on a Dask cluster
(``--dask ADDRESS`` or ``local``), results handed back in the order given.

A task is a picklable function and argument; the worker rebuilds everything else (a latency model does not pickle).
At most a window of tasks is in flight.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from cdbsim.errors import ConfigError, require

DASK_CONNECT_TIMEOUT_S = 3
T = TypeVar("T")


class Handle(Protocol):
    """A submitted task: a :class:`concurrent.futures.Future` or a Dask future."""

    def result(self) -> Any: ...

    def done(self) -> bool: ...

    def exception(self, timeout: float | None = None) -> BaseException | None: ...


class Runner(Protocol):
    """Runs tasks somewhere; ``slots`` tasks in flight keep every worker busy."""

    slots: int

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Handle: ...


class InProcess:
    """No parallelism: each task runs as it is submitted."""

    slots = 1

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Handle:
        future: Future = Future()
        try:
            future.set_result(fn(arg))
        except Exception as exc:
            future.set_exception(exc)
        return future


class Processes:
    """Local worker processes, started fresh (spawn: nothing of this process's state is inherited)."""

    def __init__(self, jobs: int) -> None:
        self.slots = 2 * jobs
        self.pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Handle:
        return self.pool.submit(fn, arg)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class Dask:
    """A Dask distributed cluster: a scheduler's address, or ``local`` for a LocalCluster of ``jobs``
    single-threaded worker processes on this machine."""

    def __init__(self, address: str, jobs: int) -> None:
        try:
            import dask
            from distributed import Client, LocalCluster
        except ImportError:
            raise ConfigError("--dask needs the dask extra: pip install 'cdbsim[dask]'") from None
        self.cluster = None
        if address == "local":
            # no statistical profiler: it samples every task's stack 100 times a second
            with dask.config.set({"distributed.worker.profile.enabled": False}):
                self.cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                                            dashboard_address=None, silence_logs=logging.ERROR)
            self.client = Client(self.cluster)
        else:
            try:
                self.client = Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                raise ConfigError(f"no Dask scheduler answered at {address} within {DASK_CONNECT_TIMEOUT_S} s "
                                  f"({type(exc).__name__})") from None
            except ValueError as exc:
                raise ConfigError(f"--dask {address!r} is not a scheduler address ({exc})") from None
        threads = sum(self.client.nthreads().values())
        self.slots = 2 * max(threads, 1)

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Handle:
        return self.client.submit(fn, arg, pure=False)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


@contextmanager
def runner(jobs: int = 1, dask: str | None = None) -> Iterator[Runner]:
    """The runner for ``--jobs`` and ``--dask``, closed (its workers stopped) on the way out."""
    require(jobs >= 1, f"--jobs must be >= 1, got {jobs}")
    chosen: Runner = Dask(dask, jobs) if dask else Processes(jobs) if jobs > 1 else InProcess()
    try:
        yield chosen
    finally:
        close = getattr(chosen, "close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class Job(Generic[T]):
    """One entry of an ordered stream: a result already known (``ready``), or an argument to run."""

    tag: T
    value: Any = None
    arg: Any = None
    ready: bool = True


def in_order(jobs: Iterable[Job[T]], fn: Callable[[Any], Any], run: Runner,
             on_result: Callable[[T, Any], None] | None = None, window: int | None = None) -> Iterator[tuple[T, Any]]:
    """``(tag, result)`` per job in the order given: ready ones as they are, the others run on ``run`` with at most
    ``window`` held; ``on_result`` sees each computed result, even if the stream stops early."""
    window = window or 4 * run.slots + 64
    held: deque[tuple[Job[T], Handle | None]] = deque()

    def oldest() -> tuple[T, Any]:
        job, handle = held.popleft()
        if handle is None:
            return job.tag, job.value
        value = handle.result()
        if on_result is not None:
            on_result(job.tag, value)
        return job.tag, value

    def in_flight() -> int:
        return sum(handle is not None for _, handle in held)

    try:
        for job in jobs:
            held.append((job, None if job.ready else run.submit(fn, job.arg)))
            while held and (held[0][1] is None or len(held) >= window or in_flight() >= run.slots):
                yield oldest()
        while held:
            yield oldest()
    finally:
        if on_result is not None:
            for job, handle in held:
                if handle is not None and handle.done() and _succeeded(handle):
                    on_result(job.tag, handle.result())


def _succeeded(handle: Handle) -> bool:
    try:
        return handle.exception(timeout=0) is None
    except Exception:
        return False
