"""CUDA graphs per (stage, padded batch size; prefill: padded token count), sharing one memory pool.

A captured stage reads all its inputs from one static int32 buffer (:meth:`executor.engine.Engine.views`) as wide
as the longest request's block table, so a launch is one host-to-device copy and a replay. Warm-up and capture use
scratch metadata only, so they never change a request's state. On CPU nothing is captured: the stage re-runs on the
same static buffers (what the tests check); the torch backend's prefill, which loops on the host, is never captured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache, partial

import numpy as np
import torch

from cdbsim.serving.launch import Stage
from executor.engine import Engine, Prepared


@cache
def warmup_stream() -> torch.cuda.Stream:
    """The one side stream warm-ups run on: torch keeps a cuBLAS workspace for each stream that ran a matmul, for the
    life of the process, so a fresh stream per capture would hold one more workspace each time."""
    return torch.cuda.Stream()


def capture(fn: Callable[[], object], pool: object = None, warm: bool = True) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` warmed up on :func:`warmup_stream` (compiles kernels, picks cuBLAS algorithms; skipped unless ``warm``)
    and captured as a CUDA graph in ``pool`` (a private one if None): the graph and what the captured call returned."""
    if warm:
        side = warmup_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


class PinnedStaging:
    """Two pinned host buffers used in turn for one graph's metadata copies; a buffer is refilled only once the event
    recorded after its last copy (the caller's ``guard``, else one recorded here) has passed."""

    def __init__(self, numel: int) -> None:
        self.buffers = [torch.empty(numel, dtype=torch.int32).pin_memory() for _ in range(2)]
        self.arrays = [b.numpy() for b in self.buffers]
        self.events: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0

    def copy_to(self, target: torch.Tensor, array: np.ndarray, guard: torch.cuda.Event | None = None) -> float:
        """Queue the copy of ``array`` into ``target``; returns the seconds spent waiting for the device."""
        i = self.turn
        self.turn ^= 1
        waited = 0.0
        event = self.events[i]
        if event is not None:
            t = time.perf_counter()
            event.synchronize()
            waited = time.perf_counter() - t
        self.arrays[i][:] = array
        target.copy_(self.buffers[i], non_blocking=True)
        if guard is None:
            guard = torch.cuda.Event()
            guard.record()
        self.events[i] = guard
        return waited


@dataclass
class CapturedStage:
    graph: torch.cuda.CUDAGraph | None  # None on CPU: ``run`` re-executes the stage
    meta: torch.Tensor          # static input buffer
    logits: torch.Tensor | None  # static output (coda, decode)
    run: Callable[[], torch.Tensor | None]
    staging: PinnedStaging | None = None

    def replay(self) -> torch.Tensor | None:
        if self.graph is None:
            return self.run()
        self.graph.replay()
        return self.logits


class StageGraphs:
    """Lazily captured CUDA graphs of one engine's decode-type stages."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.width = engine.max_blocks
        self.capture = engine.device.type == "cuda"
        self.graph_prefill = self.capture and engine.model.ops.backend != "torch"
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.graphs: dict[tuple[Stage, int], CapturedStage] = {}
        self.waited_s = 0.0  # the host's time waiting for the device inside launches (pinned staging)
        self.stream = torch.cuda.current_stream() if self.capture else None

    def capture_all(self, stages: Iterable[Stage], sizes: Iterable[int]) -> None:
        for size in sorted(set(sizes), reverse=True):  # largest first: smaller ones reuse its pool memory
            for stage in stages:
                self.get(stage, size)

    def capture_prefill(self, sizes: Iterable[int]) -> None:
        """Prefill graphs of every padded token count, largest first; only the largest warms up (a full prefill)."""
        for i, size in enumerate(sorted(set(sizes), reverse=True)):
            self.get(Stage.PREFILL, size, warm=i == 0)

    def get(self, stage: Stage, rows: int, warm: bool = True) -> CapturedStage:
        key = (stage, rows)
        if key not in self.graphs:
            self.graphs[key] = self._capture(stage, rows, warm)
        return self.graphs[key]

    def _capture(self, stage: Stage, rows: int, warm: bool = True) -> CapturedStage:
        engine = self.engine
        meta = torch.from_numpy(engine.scratch(stage, rows, self.width)).to(engine.device)
        views = engine.views(stage, meta, rows, self.width)
        run = partial(engine.stage_fns[stage], views, engine.geo.max_fill if stage is Stage.CORE else 0)
        if not self.capture:
            return CapturedStage(None, meta, None, run)
        staging = PinnedStaging(meta.numel())
        if stage is Stage.PREFILL and not self.graph_prefill:
            return CapturedStage(None, meta, None, run, staging)
        graph, logits = capture(run, self.pool, warm)
        return CapturedStage(graph, meta, logits, run, staging)

    def launch(self, prepared: Prepared, done: torch.cuda.Event | None = None) -> torch.Tensor | None:
        """Copy the launch's metadata into the graph's input and replay it; ``done`` is recorded once the replay is
        queued (the launch's end, after which its metadata buffer may be refilled)."""
        launch = prepared.launch
        captured = self.get(launch.stage, launch.padded)
        if prepared.width != self.width:
            raise ValueError("graph launches need metadata as wide as the graph's block table")
        if captured.staging is not None:  # pinned: the copy neither blocks the host nor waits for the stream
            self.waited_s += captured.staging.copy_to(captured.meta, prepared.meta, done)
        else:
            captured.meta.copy_(torch.from_numpy(prepared.meta))
        logits = captured.replay()
        if done is not None:
            done.record(self.stream)
        return logits
