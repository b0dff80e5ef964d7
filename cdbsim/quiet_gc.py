"""Keep Python's cyclic garbage collector out of a timed run.

Both drivers create many short-lived objects; a collection pass in the middle of a run costs tens of
milliseconds (on the GPU host it stalls whatever launch the host is enqueuing at that moment) and frees
nothing that reference counting would not. Long-running serving engines freeze their startup objects and
collect between runs for the same reason.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc(collect: bool = True) -> Iterator[None]:
    """Collect once (unless ``collect`` is False), then run the block with the collector off (restored
    afterwards). A full pass over a large heap takes tens of milliseconds, as long as a short simulated
    run; the simulator skips it, since what it leaves is collected after the run."""
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
