"""Measure a GPU with the executor's own stage runners and CUDA graphs, for a measured profile.

Unit models of each layer shape (one- and four-layer cores, r_max 2) give its components, e.g. ``layer`` =
(4-layer - 1-layer core) / 3 and ``prefill_layer`` = (4-layer - 1-layer prefill) / 6; each model's own stages, the
host and the metadata copy are measured too, every stage as its CUDA graph replayed on random KV and loop states.
"""

from __future__ import annotations

import datetime as dt
import functools
import gc
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from calibration.fit import attention_skew_name, fit_attention_slots
from cdbsim.latency.profile import Profile
from cdbsim.latency.recipes import Component, model_stage_name
from cdbsim.model.arch import ArchSpec, KVLayout
from cdbsim.report.validate import host_points
from cdbsim.serving.config import ServeConfig, padding_table, prefill_graph_sizes
from cdbsim.serving.launch import Stage, causal_pairs, decode_launch, prefill_launch
from executor.build import current_build
from executor.driver import build_model, execute
from executor.engine import Engine, Prepared
from executor.graphs import PinnedStaging, StageGraphs
from traces import ExitModel, Request, build_trace

Points = dict[str, list[list[float]]]
# core steps with a few long rows among short ones (rows, short, long, long rows), for the attention width
SKEW_POINTS = ((2, 256, 4096, 1), (4, 256, 4096, 1), (8, 128, 4096, 1), (16, 128, 4096, 1), (16, 512, 4096, 4),
               (32, 128, 2048, 1), (48, 32, 1024, 2), (64, 32, 512, 8))


def spread_contexts(rows: int, shortest: int, longest: int) -> list[int]:
    """Contexts of ``rows`` rows spread evenly in log length from ``longest`` down to ``shortest``."""
    if rows == 1:
        return [longest]
    return [round(longest / (longest / shortest) ** (i / (rows - 1))) for i in range(rows)]


@dataclass(frozen=True)
class Plan:
    """What to sweep (``quick``: a few points per component); ``prefill_points``: (tokens per chunk, chunks, prefix)."""

    # powers of two and the sizes halfway between (a kernel can switch its work split between them)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    contexts: tuple[int, ...] = (32, 128, 512, 2048, 8192)
    max_positions: int = 131072  # cap on batch x context, so the unit models' KV fits easily
    prefill_points: tuple[tuple[int, int, int], ...] = (
        (16, 1, 0), (64, 1, 0), (256, 1, 0), (512, 1, 0), (1024, 1, 0), (2048, 1, 0), (4096, 1, 0),
        (8192, 1, 0), (64, 1, 1024), (512, 1, 1024), (16, 8, 0), (16, 32, 0), (16, 64, 0), (64, 16, 0),
        (256, 8, 0), (1024, 2, 0), (4096, 2, 0), (2048, 4, 0), (1024, 8, 0))
    model_contexts: tuple[int, ...] = (32, 128, 512, 2048, 4096)
    skew_points: tuple[tuple[int, int, int, int], ...] = SKEW_POINTS
    # and rows whose contexts spread from the shortest to the longest (rows, shortest, longest)
    spread_points: tuple[tuple[int, int, int], ...] = (
        (2, 600, 4096), (4, 400, 4096), (8, 300, 4096), (9, 300, 4096), (16, 300, 4096), (17, 300, 4096),
        (32, 200, 4096), (13, 2500, 2500), (17, 2500, 2500))
    decode_contexts: tuple[int, ...] = (32, 128, 1024, 4096)
    model_max_positions: int = 65536  # the whole model's KV (shared slots) for batch x context
    # long prompts packed as serving packs them (2-8 to a launch), which set the attention's cost per pair
    model_prefill_points: tuple[tuple[int, int, int], ...] = (
        (16, 1, 0), (32, 1, 0), (64, 1, 0), (256, 1, 0), (512, 1, 0), (2048, 1, 0), (8192, 1, 0), (512, 1, 1024),
        (16, 8, 0), (16, 32, 0), (16, 64, 0), (64, 16, 0), (256, 8, 0), (1024, 2, 0), (4096, 2, 0),
        (2048, 4, 0), (1024, 8, 0))
    repeats: int = 20
    warmup: int = 3

    @classmethod
    def quick(cls) -> Plan:
        return cls(batches=(1, 8, 64, 256), contexts=(128, 2048), model_contexts=(128, 1024),
                   skew_points=((8, 128, 1024, 1),), spread_points=((3, 128, 1024),),
                   prefill_points=((64, 1, 0), (1024, 1, 0), (4096, 1, 0), (16, 16, 0)),
                   model_prefill_points=((512, 1, 0), (16, 16, 0)), decode_contexts=(256,), repeats=8)

    def grid(self, contexts: tuple[int, ...], max_positions: int) -> list[tuple[int, int]]:
        return [(b, c) for c in contexts for b in self.batches if b * c <= max_positions]

    @property
    def longest_prompt(self) -> int:
        return max(n + p for n, _, p in (*self.prefill_points, *self.model_prefill_points))


class Timer:
    """Median time of a callable: CUDA events on a GPU, each call behind a spin kernel of ``spin_s`` (the device's time
    alone; 0: with launch latency), or perf counter on a CPU; ``busy_s`` of calls first times under sustained load."""

    CLOCK_HZ = 2.0e9  # spin cycles per second: an H200's top SM clock (a slower clock only spins longer)

    def __init__(self, device: torch.device, repeats: int, warmup: int, busy_s: float = 0.0,
                 spin_s: float = 2e-4) -> None:
        self.cuda = device.type == "cuda"
        self.repeats, self.warmup, self.busy_s, self.spin_s = repeats, warmup, busy_s, spin_s

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        if self.busy_s > 0:
            until = time.perf_counter() + self.busy_s
            while time.perf_counter() < until:
                fn()
                if self.cuda:
                    torch.cuda.synchronize()
        if self.cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(self.repeats):
            if not self.cuda:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if self.spin_s > 0:
                torch.cuda._sleep(int(self.spin_s * self.CLOCK_HZ))
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)


def back_to_back(fn: Callable[[], object], seconds: float, device: torch.device, min_calls: int = 1
                 ) -> list[tuple[float, float]]:
    """``(seconds since the first call began, seconds of the call)`` of calls of ``fn`` back to back for ``seconds``
    (at least ``min_calls``); on a GPU at most four calls are queued ahead, timed by CUDA events."""
    cuda = device.type == "cuda"
    calls: list = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or len(calls) < min_calls:
        if not cuda:
            t0 = time.perf_counter()
            fn()
            calls.append((t0 - started, time.perf_counter() - t0))
            continue
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        calls.append((begin, end))
        if len(calls) > 4:
            calls[-5][1].synchronize()
    if not cuda:
        return calls
    torch.cuda.synchronize()
    first = calls[0][0]
    return [(first.elapsed_time(b) / 1e3, b.elapsed_time(e) / 1e3) for b, e in calls]


class UnitBench:
    """A model's engine with synthetic requests, so any stage can be timed at any (batch, context): random KV and
    loop states (``zeros``: the fresh zeros), consecutive block ids (``scatter``: a seeded permutation),
    ``kv_blocks`` for another cache size."""

    def __init__(self, arch: ArchSpec, max_batch: int, max_context: int, max_positions: int,
                 layout: KVLayout, device: torch.device, timer: Timer, seed: int = 0, *, zeros: bool = False,
                 scatter: bool = False, kv_blocks: int | None = None) -> None:
        self.arch, self.device, self.timer = arch, device, timer
        # a long prefill replay is slow to repeat and steady: fewer repeats suffice
        self.prefill_timer = Timer(device, max(3, timer.repeats // 4), 1)
        self.bs = 16
        self.model = build_model(arch, device=device, seed=seed)
        requests = [Request(i, max_context, 2, 0.0, np.full(1, arch.r_max, dtype=np.int16))
                    for i in range(max_batch)]
        self.kv_blocks = kv_blocks or max_positions // self.bs + max_batch + 64
        self.block_order = (np.random.default_rng(seed).permutation(self.kv_blocks) if scatter
                            else np.arange(self.kv_blocks))
        config = ServeConfig(width=max_batch, prefill_budget=max(8192, max_batch), layout=layout)
        self.engine = Engine(self.model, config, requests, self.kv_blocks)
        if not zeros:
            self.engine.fill_random(seed)
        self.engine.admit(range(max_batch))  # every synthetic request holds a bank row, as if prefilled
        self.graphs = StageGraphs(self.engine)
        self.pad = padding_table(config.decode_sizes(), max_batch)

    def blocks_for(self, lengths: list[int]) -> list[list[int]]:
        """Block ids for requests holding ``lengths[i] + 1`` positions each, in the bench's block order."""
        per = [-(-(n + 1) // self.bs) for n in lengths]
        if sum(per) > self.kv_blocks:
            raise ValueError(f"calibration point needs {sum(per)} KV blocks, the bench has {self.kv_blocks}")
        starts = np.concatenate(([0], np.cumsum(per)))
        return [self.block_order[a:a + n].tolist() for a, n in zip(starts[:-1], per, strict=True)]

    def stage(self, stage: Stage, batch: int, context: int, exiting: bool = False,
              mixed_steps: bool = False, contexts: list[int] | None = None) -> float:
        """Seconds of one graph replay of decode-type ``stage`` over ``batch`` tokens at ``context``
        (``mixed_steps``: rows at loop steps 0, 1, .. in turn; ``contexts``: one per row)."""
        return self.timer(self.graph(stage, batch, context, exiting, mixed_steps, contexts))

    def graph(self, stage: Stage, batch: int, context: int, exiting: bool = False,
              mixed_steps: bool = False, contexts: list[int] | None = None,
              with_copy: bool = False) -> Callable[[], object]:
        """The graph replay of :meth:`stage`'s launch (captured on first use); ``with_copy``: metadata copy first."""
        return self._launcher(self.prepared(stage, batch, context, exiting, mixed_steps, contexts), with_copy)

    def prepared(self, stage: Stage, batch: int, context: int, exiting: bool = False,
                 mixed_steps: bool = False, contexts: list[int] | None = None) -> Prepared:
        """:meth:`graph`'s launch, prepared by the engine (what a profiler runs eagerly)."""
        lengths = contexts or [context] * batch
        steps = [i % self.arch.r_max for i in range(batch)] if mixed_steps else [0] * batch
        launch = decode_launch(stage, list(range(batch)), [n - 1 for n in lengths], self.blocks_for(lengths),
                               self.pad[batch], steps=steps, exits=[exiting] * batch)
        return self.engine.prepare(launch, self.graphs.width)

    def _launcher(self, prepared: Prepared, with_copy: bool = False) -> Callable[[], object]:
        def launch() -> None:
            with torch.inference_mode():
                self.graphs.launch(prepared)

        launch()  # captures the graph on first use
        return launch if with_copy else self.graphs.get(prepared.launch.stage, prepared.launch.padded).replay

    def prefill(self, tokens: int, chunks: int = 1, prefix: int = 0) -> float:
        """Seconds of one graph replay of ``chunks`` prompts of ``tokens`` after ``prefix`` cached, padded as served."""
        return self.prefill_timer(self.prefill_graph(tokens, chunks, prefix))

    def prefill_graph(self, tokens: int, chunks: int = 1, prefix: int = 0) -> Callable[[], object]:
        """The graph replay of :meth:`prefill`'s launch, its metadata in place."""
        launch = prefill_launch(list(range(chunks)), [prefix] * chunks, [tokens] * chunks,
                                self.blocks_for([prefix + tokens] * chunks), padded_prefill(tokens * chunks))
        return self._launcher(self.engine.prepare(launch, self.graphs.width))

    def close(self) -> None:
        del self.graphs, self.engine, self.model
        gc.collect()  # the engine and its captured graphs refer to each other: free the KV cache now
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


META_COPY_BYTES = tuple(int(4 * 2 ** k) for k in range(10, 21))  # 4 KB .. 4 MB, the fit carried below
META_SPIN_S = 2e-3  # the host fills the pinned buffer before it queues the copy: up to ~1 ms at 4 MB


def measure_meta_copy(device: torch.device, timer: Timer,
                      sizes: tuple[int, ...] = META_COPY_BYTES) -> Points:
    """``[bytes, 0, t]``: a launch's metadata copy (:class:`executor.graphs.PinnedStaging`; on a CPU a plain copy)."""
    rows = []
    for size in sizes:
        numel = size // 4
        array = np.arange(numel, dtype=np.int32)
        target = torch.empty(numel, dtype=torch.int32, device=device)
        copy = (functools.partial(PinnedStaging(numel).copy_to, target, array) if device.type == "cuda"
                else functools.partial(target.copy_, torch.from_numpy(array)))
        rows.append([size, 0, timer(copy)])
    return {Component.META_COPY.value: rows}


def _unit(arch: ArchSpec, core: int) -> ArchSpec:
    return replace(arch, name=f"{arch.layer.key}-unit{core}", prelude=0, core=core, coda=0, r_max=2, r_min=1)


def measure_shape(arch: ArchSpec, plan: Plan, device: torch.device,
                  progress: Callable[[str], None] = lambda _: None) -> Points:
    """Points of every shape-level component of ``arch`` (its layer shape, hidden size and vocabulary)."""
    timer = Timer(device, plan.repeats, plan.warmup)
    max_batch = max(plan.batches)
    max_context = max(max(plan.contexts), plan.longest_prompt)
    layer, core1, prelude0, coda0, prefill_layer, prefill1 = (
        c.key(arch) for c in (Component.LAYER, Component.CORE1, Component.PRELUDE0, Component.CODA0,
                              Component.PREFILL_LAYER, Component.PREFILL1))
    points: Points = {name: [] for name in (layer, core1, prelude0, coda0, prefill_layer, prefill1)}
    raw: dict[int, dict] = {}
    for core in (1, 4):
        bench = UnitBench(_unit(arch, core), max_batch, max_context, plan.max_positions, KVLayout.DEPTH, device,
                          timer)
        raw[core] = got = {"core": {}, "prefill": {}}
        for b, c in plan.grid(plan.contexts, plan.max_positions):
            progress(f"{arch.layer.key}: {core}-layer core B={b} L={c}")
            got["core"][b, c] = bench.stage(Stage.CORE, b, c)
        for n, k, p in plan.prefill_points:
            progress(f"{arch.layer.key}: {core}-layer prefill {k} x {n} tokens, prefix {p}")
            got["prefill"][n, k, p] = bench.prefill(n, k, p)
        if core == 1:
            for b in plan.batches:
                progress(f"{arch.layer.key}: prelude and coda B={b}")
                points[prelude0].append([b, 0, bench.stage(Stage.PRELUDE, b, plan.contexts[0])])
                points[coda0].append([b, 0, bench.stage(Stage.CODA, b, plan.contexts[0])])
        bench.close()
    for (b, c), t1 in raw[1]["core"].items():
        points[core1].append([b, b * c, t1])
        points[layer].append([b, b * c, max((raw[4]["core"][b, c] - t1) / 3, 1e-9)])
    adapter = measure_adapter(arch, plan, device, timer) if arch.has_adapter else {}
    points.update(adapter)
    rows = adapter.get(Component.ADAPTER.key(arch), [])  # the adapter's line is taken off the one-layer prefill
    slope, intercept = np.polyfit([r[0] for r in rows], [r[2] for r in rows], 1) if len(rows) >= 2 else (0.0, 0.0)
    for (n, k, p), t1 in raw[1]["prefill"].items():
        tokens, pairs = padded_prefill(n * k), k * causal_pairs(n, p)
        per_layer = max((raw[4]["prefill"][n, k, p] - t1) / 6, 1e-9)
        points[prefill_layer].append([tokens, pairs, k, per_layer])
        single = t1 - per_layer - (intercept + slope * tokens)
        points[prefill1].append([tokens, pairs, k, max(single, 1e-9)])
    points[Component.KV_COPY.key(arch)] = measure_kv_fill(arch, plan, device, timer, progress)
    return points


FILL_LOOPS = 8  # r_max of the KV-fill bench: a token exiting at step 0 copies its K/V into 7 deeper slots


def measure_kv_fill(arch: ArchSpec, plan: Plan, device: torch.device, timer: Timer,
                    progress: Callable[[str], None] = lambda _: None) -> list[list[float]]:
    """``[copies, 0, t]``: what the last-exited fill adds to a 4-layer core step per (token, slot, layer) copy (every
    token exiting at step 0 of ``FILL_LOOPS``, less the same step without exits)."""
    context = min(plan.contexts)
    batches = [b for b in plan.batches if b * context <= plan.max_positions]
    unit = replace(_unit(arch, 4), r_max=FILL_LOOPS)
    bench = UnitBench(unit, max(batches), context + 1, max(batches) * (context + 1), KVLayout.DEPTH, device,
                      timer)
    rows = []
    for b in batches:
        progress(f"{arch.layer.key}: KV fill B={b}")
        with_fill, without = bench.stage(Stage.CORE, b, context, exiting=True), bench.stage(Stage.CORE, b, context)
        rows.append([b * (FILL_LOOPS - 1) * unit.core, 0, with_fill - without])  # may be negative: noise, kept
    bench.close()
    return rows


def measure_adapter(arch: ArchSpec, plan: Plan, device: torch.device, timer: Timer) -> Points:
    """Huginn's adapter (a [B, 2h] x [2h, h] matmul) on its own, as a CUDA graph where possible."""
    h = arch.layer.hidden
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    weight = torch.randn(h, 2 * h, device=device, dtype=dtype) * 0.02
    rows = []
    for b in plan.batches:
        s, e = (torch.randn(b, h, device=device, dtype=dtype) for _ in range(2))

        def op(s: torch.Tensor = s, e: torch.Tensor = e) -> torch.Tensor:
            return F.linear(torch.cat((s, e), dim=-1), weight)

        if device.type == "cuda":
            op()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                op()
            rows.append([b, 0, timer(graph.replay)])
        else:
            rows.append([b, 0, timer(op)])
    return {Component.ADAPTER.key(arch): rows}


def padded_prefill(tokens: int) -> int:
    """The token count a prefill launch of ``tokens`` runs at (its graph's bucket; the default budget)."""
    return _prefill_padding(max(8192, tokens))[tokens]


@functools.cache
def _prefill_padding(budget: int) -> list[int]:
    return padding_table(prefill_graph_sizes(budget), budget)


def measure_model(arch: ArchSpec, plan: Plan, device: torch.device,
                  progress: Callable[[str], None] = lambda _: None) -> Points:
    """Every stage of the whole model as served (shared-slot KV): the model's own stage fits."""
    timer = Timer(device, plan.repeats, plan.warmup)
    max_batch = max(plan.batches)
    max_context = max(max(plan.model_contexts), max(plan.decode_contexts), plan.longest_prompt)
    bench = UnitBench(arch, max_batch, max_context, plan.model_max_positions, KVLayout.SHARED, device, timer)
    points: Points = {model_stage_name(arch, s): [] for s in Stage}
    for stage in (Stage.PRELUDE, Stage.CORE, Stage.CODA):
        for b, c in plan.grid(plan.model_contexts, plan.model_max_positions):
            progress(f"{arch.name}: {stage.value} B={b} L={c}")
            points[model_stage_name(arch, stage)].append([b, b * c, bench.stage(stage, b, c)])
    points[attention_skew_name(arch)] = measure_model_skew(arch, plan, bench, progress)
    for b, c in plan.grid(plan.decode_contexts, plan.model_max_positions):
        if b <= 256:
            progress(f"{arch.name}: CB decode B={b} L={c}")
            points[model_stage_name(arch, Stage.DECODE)].append([b, b * c, bench.stage(Stage.DECODE, b, c)])
    for n, k, p in plan.model_prefill_points:
        progress(f"{arch.name}: prefill {k} x {n} tokens, prefix {p}")
        points[model_stage_name(arch, Stage.PREFILL)].append([padded_prefill(n * k), k * causal_pairs(n, p), k,
                                                              bench.prefill(n, k, p)])
    bench.close()
    return points


def mixed_contexts(plan: Plan) -> list[list[int]]:
    """Each real row's context in the mixed-context core steps (``skew_points``, then ``spread_points``)."""
    points = [[long] * n_long + [short] * (b - n_long) for b, short, long, n_long in plan.skew_points]
    points += [spread_contexts(b, shortest, longest) for b, shortest, longest in plan.spread_points]
    return [c for c in points if sum(c) <= plan.model_max_positions]


def measure_model_skew(arch: ArchSpec, plan: Plan, bench: UnitBench,
                       progress: Callable[[str], None] = lambda _: None) -> list[list[float]]:
    """``[padded rows, context of each real row..., t]``: core steps of mixed contexts (:func:`mixed_contexts`)."""
    rows = []
    for contexts in mixed_contexts(plan):
        b = len(contexts)
        progress(f"{arch.name}: core B={b}, contexts {min(contexts)}-{max(contexts)}")
        rows.append([bench.pad[b], *contexts, bench.stage(Stage.CORE, b, max(contexts), contexts=contexts)])
    return rows


def remeasure_attention(arch: ArchSpec, profile: Profile, device: torch.device, plan: Plan | None = None,
                        progress: Callable[[str], None] = lambda _: None) -> Profile:
    """``profile`` with its mixed-context core steps re-measured and its attention width and sharpness refitted."""
    plan = plan or Plan()
    contexts = mixed_contexts(plan)
    longest = max(max(c) for c in contexts)
    bench = UnitBench(arch, max(len(c) for c in contexts), longest + 1, plan.model_max_positions, KVLayout.SHARED,
                      device, Timer(device, plan.repeats, plan.warmup))
    rows = measure_model_skew(arch, plan, bench, progress)
    bench.close()
    core = profile.components[model_stage_name(arch, Stage.CORE)]
    return replace(profile, attention=fit_attention_slots(arch, core, rows), build=current_build(device).to_dict(),
                   notes=f"{profile.notes}; mixed-context core steps re-measured {dt.date.today().isoformat()}")


def measure_host(arch: ArchSpec, device: torch.device, repeats: int, warmup: int, requests: int = 128, seed: int = 0,
                 progress: Callable[[str], None] = lambda _: None) -> Points:
    """Host seconds per launch against items (medians per item count) from a short executor serving run (lookahead,
    64 slots, refill at K = 1, Alpaca requests), then :func:`measure_meta_copy` behind a :data:`META_SPIN_S` spin."""
    progress(f"{arch.name}: host time from a {requests}-request serving run")
    trace = build_trace("alpaca", requests, arch.r_max, 2, ExitModel(mean=(arch.r_max + 2) / 2), seed=seed)
    config = ServeConfig(width=64, layout=KVLayout.SHARED)
    kv_blocks = sum(-(-(r.prompt_len + r.output_len) // 16) for r in trace) + 64  # never preempts
    run = execute(arch, config, trace, kv_blocks, device=device, mode="lookahead", seed=seed)
    return {Component.HOST.key(arch): host_points(run.log.launches),
            **measure_meta_copy(device, Timer(device, repeats, warmup, spin_s=META_SPIN_S))}


def environment(device: torch.device) -> tuple[dict, dict]:
    """Device facts and software versions recorded in a profile (its build: :func:`executor.build.current_build`)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info = {"name": props.name, "memory_bytes": float(props.total_memory),
                "multiprocessors": props.multi_processor_count}
    else:
        info = {"name": platform.processor() or "cpu", "memory_bytes": 0.0}
    versions = {"torch": torch.__version__, "python": platform.python_version(),
                "cuda": torch.version.cuda or "", "date": dt.date.today().isoformat()}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    return info, versions
