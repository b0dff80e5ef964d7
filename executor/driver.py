"""Drive the shared scheduler with the real engine and log every launch with device timestamps.

Timing modes: :class:`cdbsim.serving.config.Timing`, through :class:`cdbsim.serving.pipeline.HostPipeline`. Launch
start and end come from CUDA events (on CPU the wall clock) relative to the run's start. ``host_s`` is the host's
work since it handed over the previous launch (completions, arrivals, planning, preparing, enqueueing), less its
waits for the device or for arrivals: the per-launch host cost the simulator charges. Logs use the simulator's
schema (:class:`cdbsim.report.logs.RunRecorder`).
"""

from __future__ import annotations

import platform
import time
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from cdbsim.errors import ConfigError
from cdbsim.model.arch import ArchSpec
from cdbsim.report.logs import RunLog, RunRecorder, run_meta
from cdbsim.serving.config import Policy, ServeConfig, Timing, prefill_graph_sizes
from cdbsim.serving.launch import Launch, SchedulerState, Stage
from cdbsim.serving.memory import MEMORY_FRACTION, MemoryPlan, RequestShape
from cdbsim.serving.pipeline import HostPipeline, paused_gc, serve
from cdbsim.serving.scheduler import Scheduler
from executor.build import current_build
from executor.engine import Engine, Prepared
from executor.graphs import StageGraphs
from executor.live_gates import LiveComparison, LiveGateSpec
from executor.model import LoopedLM, ModelConfig, default_ops
from executor.ops import default_backend
from executor.reference import Episode
from traces.request import Request


@dataclass
class ExecutorRun:
    """What a run produced: the log, every request's output tokens, and what tests compare."""

    log: RunLog
    tokens: list[np.ndarray]
    episodes: list[list[Episode]]
    scheduler: Scheduler
    logits: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    live: LiveComparison | None = None  # the live exit gates against the replayed depths (``live_gates``)


@dataclass
class _InFlight:
    """A launch in flight: its prepared inputs, clock marks and logits; once completed, its start and end (s)."""

    prepared: Prepared
    state: SchedulerState
    start: object
    end: object
    host_s: float
    logits: torch.Tensor | None
    start_s: float = 0.0
    end_s: float = 0.0


class _CudaClock:
    """CUDA events on the current stream (looked up once), read relative to one recorded at the run's start."""

    def __init__(self) -> None:
        self.stream = torch.cuda.current_stream()
        self.base = self.mark()

    def mark(self) -> torch.cuda.Event:
        event = self.event()
        event.record(self.stream)
        return event

    @staticmethod
    def event() -> torch.cuda.Event:
        """An event for a mark that someone else records (:meth:`executor.graphs.StageGraphs.launch`)."""
        return torch.cuda.Event(enable_timing=True)

    @staticmethod
    def wait(event: torch.cuda.Event) -> None:
        event.synchronize()

    def seconds(self, event: torch.cuda.Event) -> float:
        return self.base.elapsed_time(event) / 1e3


class _WallClock:
    def __init__(self) -> None:
        self.base = time.perf_counter()

    mark = staticmethod(time.perf_counter)

    @staticmethod
    def wait(_: float) -> None:
        return None

    def seconds(self, t: float) -> float:
        return t - self.base


def gpu_plan(arch: ArchSpec, config: ServeConfig, requests: list[Request], kv_blocks: int, device: torch.device,
             fraction: float = MEMORY_FRACTION) -> MemoryPlan | None:
    """On a GPU, the run's memory plan, refused in one line if it cannot fit (before the KV cache is allocated);
    resets the allocator's peak, so the run's meta reports its own. None on the CPU."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    plan = MemoryPlan.of(arch, config, kv_blocks, RequestShape.of(requests), props.name, props.total_memory,
                         fraction)
    if not plan.fits:
        raise ConfigError(plan.explain())
    torch.cuda.reset_peak_memory_stats(device)
    return plan


def build_model(arch: ArchSpec, *, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                seed: int = 0, backend: str | None = None, **config_overrides: object) -> LoopedLM:
    """A randomly initialised model of ``arch``'s exact shapes."""
    backend = backend or default_backend(device)
    config = ModelConfig.from_arch(arch, **config_overrides)
    return LoopedLM.random(config, seed=seed, device=device, dtype=dtype, ops=default_ops(config, backend))


class Executor:
    """One serving run of ``requests`` on a model: scheduler + engine + clock + recorder."""

    def __init__(self, arch: ArchSpec, config: ServeConfig, requests: list[Request], kv_blocks: int, *,
                 model: LoopedLM, mode: Timing | str | None = None, graphs: bool | None = None,
                 keep_logits: bool = False, prompt_seed: int = 0, memory_fraction: float = MEMORY_FRACTION,
                 prompts: Sequence[Sequence[int]] | None = None, live_gates: LiveGateSpec | None = None) -> None:
        mode = Timing.parse(mode) if mode is not None else config.timing
        if model.config.r_max != arch.r_max:
            raise ValueError(f"model r_max {model.config.r_max} differs from the architecture's {arch.r_max}")
        self.config, self.requests, self.mode, self.model, self.arch = config, requests, mode, model, arch
        self.cuda = model.device.type == "cuda"
        self.memory = gpu_plan(arch, config, requests, kv_blocks, model.device, memory_fraction)
        self.scheduler = Scheduler(arch, config, requests, kv_blocks, share_blocks=True)
        self.engine = Engine(model, config, requests, kv_blocks, prompt_seed=prompt_seed, prompts=prompts,
                             live=live_gates)
        use_graphs = self.cuda if graphs is None else graphs  # on CPU: static buffers without capture (tests)
        self.graphs = StageGraphs(self.engine) if use_graphs else None
        self.keep_logits = keep_logits
        self.engine.track_rows = keep_logits

    def warmup(self) -> None:
        """Capture every graph this run can use and run a scratch prefill, so no capture or compilation is timed."""
        with torch.inference_mode():
            if self.graphs is not None:  # every decode-type stage the policy launches
                stages = (Stage.DECODE,) if self.config.policy is Policy.CB else (Stage.PRELUDE, Stage.CORE, Stage.CODA)
                self.graphs.capture_all(stages, self.config.decode_sizes())
                if self.graphs.graph_prefill:
                    self.graphs.capture_prefill(prefill_graph_sizes(self.config.prefill_budget))
            if self.cuda:
                self.engine.warmup_prefill()
                torch.cuda.synchronize()

    def run(self) -> ExecutorRun:
        """Serve every request; the log holds serving time only (the clock starts after ``paused_gc``'s pass)."""
        with torch.inference_mode(), paused_gc():
            serving = _Serving(self)
            for _ in serve(serving.pipeline, serving):
                pass  # the executor's steps wait on the GPU themselves: they yield nothing
            wall = time.perf_counter() - serving.run_start
            live = self._live()
            log = serving.recorder.finish(self._meta(wall, live))
            episodes = [[Episode(g, list(chunks)) for g, chunks in sorted(e.items())] for e in self.engine.episodes]
            return ExecutorRun(log, self.engine.output_tokens(), episodes, self.scheduler, serving.logits_out, live)

    def _live(self) -> LiveComparison | None:
        """The run's live exit gates against the depths it served (None without live gates)."""
        engine = self.engine
        if engine.live is None:
            return None
        return engine.live.compare(self.requests, engine.stride, self.config.r_min(self.arch))

    def _meta(self, wall: float, live: LiveComparison | None = None) -> dict:
        model = self.model
        device = (torch.cuda.get_device_name(model.device) if self.cuda else platform.processor() or "cpu")
        return run_meta(
            self.scheduler, backend="executor", device=device, torch=torch.__version__,
            dtype=str(model.dtype).replace("torch.", ""), mode=self.mode.value, ops=model.ops.backend,
            chained_rows=model.ops.fuse_rows,  # launches of at most this many rows take executor.chain
            few_rows=model.ops.few_rows,  # other launches of at most this many rows take executor.few_rows
            cuda_graphs=self.graphs is not None and self.graphs.capture,
            launch_path=("eager" if self.graphs is None else
                         "cuda-graphs" if self.graphs.capture else "static-buffers"),
            clock="cuda-events" if self.cuda else "wall", wall_s=wall,
            build=current_build(model.device).to_dict(),  # the executor build, checked against profiles
            memory=self._memory(), state_init=model.config.start_state,
            **({"live_gates": live.to_dict()} if live is not None else {}))

    def _memory(self) -> dict | None:
        """The memory plan of this run and, on the GPU, the peaks torch's allocator saw (GiB)."""
        if self.memory is None:
            return None
        return {**self.memory.summary(), "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}


class _Serving:
    """The executor's backend of the host loop: launches go to the GPU (or run on the CPU) and are logged
    when they complete, with CUDA-event times and the host's own time since the previous hand-over."""

    def __init__(self, executor: Executor) -> None:
        self.executor, self.engine, self.requests = executor, executor.engine, executor.requests
        self.clock = _CudaClock() if executor.cuda else _WallClock()
        self.recorder = RunRecorder(self.requests)
        self.logits_out: dict[tuple[int, int], torch.Tensor] = {}
        self.arrivals = deque(sorted(range(len(self.requests)), key=lambda i: self.requests[i].arrival))
        self.pipeline: HostPipeline[_InFlight] = HostPipeline(executor.scheduler, executor.mode,
                                                              seconds=lambda item: item.end_s - item.start_s)
        graphs = executor.graphs
        self.width = self.engine.max_blocks if graphs is not None else None
        self.captured = graphs is not None and graphs.capture
        self.run_start = time.perf_counter()
        self.busy_since = self.run_start  # the host's work since the last hand-over counts from here ...
        self.waited = 0.0                 # ... less its waits for the device and for arrivals

    def finish_oldest(self, last: bool) -> Iterator[None]:
        yield from ()
        t = time.perf_counter()
        oldest = self.pipeline.oldest
        self.clock.wait(oldest.end)
        self.waited += time.perf_counter() - t
        oldest.start_s, oldest.end_s = self.clock.seconds(oldest.start), self.clock.seconds(oldest.end)
        launch, item, done = self.pipeline.complete_oldest()
        self.engine.release(done)
        self.recorder.record(launch, item.state, item.start_s, item.end_s, item.host_s)
        if item.logits is not None and item.prepared.rows:
            for row, key in enumerate(item.prepared.rows):
                self.logits_out[key] = item.logits[row].float().cpu()

    def before_plan(self) -> Iterator[None]:
        yield from ()
        now = time.perf_counter() - self.run_start
        while self.arrivals and self.requests[self.arrivals[0]].arrival <= now:
            self.executor.scheduler.arrive(self.arrivals.popleft())

    def stalled(self) -> Iterator[None]:
        if len(self.pipeline):
            yield from self.finish_oldest(False)
        elif self.arrivals:
            t = time.perf_counter()
            time.sleep(max(0.0, self.requests[self.arrivals[0]].arrival - (t - self.run_start)))
            self.waited += time.perf_counter() - t
        else:
            raise RuntimeError("the scheduler can plan nothing although requests remain")

    def hand_over(self, launch: Launch, state: SchedulerState) -> Generator[None, None, _InFlight]:
        yield from ()
        executor, clock, graphs = self.executor, self.clock, self.executor.graphs
        prepared = self.engine.prepare(launch, self.width)
        staged = graphs.waited_s if graphs is not None else 0.0
        start = clock.mark()
        # a graph launch records its end event itself, which also guards its metadata buffer (two events a
        # launch, not three); eager launches and the wall clock are marked once they return
        end = clock.event() if self.captured else None
        logits = graphs.launch(prepared, end) if graphs is not None else self.engine.run_eager(prepared)
        if end is None:
            end = clock.mark()
        if executor.keep_logits and logits is not None:
            logits = logits.clone()
        handed_over = time.perf_counter()
        if not executor.cuda:  # on CPU the launch ran inside the enqueue: device time, not the host's
            self.waited += clock.seconds(end) - clock.seconds(start)
        elif graphs is not None:  # a metadata buffer still being read by a queued copy
            self.waited += graphs.waited_s - staged
        host_s = handed_over - self.busy_since - self.waited
        self.busy_since, self.waited = handed_over, 0.0
        return _InFlight(prepared, state, start, end, host_s, logits)


def execute(arch: ArchSpec, config: ServeConfig, requests: list[Request], kv_blocks: int, *,
            device: torch.device | str = "cpu", dtype: torch.dtype | None = None, mode: Timing | str | None = None,
            seed: int = 0, model: LoopedLM | None = None, graphs: bool | None = None, backend: str | None = None,
            keep_logits: bool = False, warmup: bool = True, memory_fraction: float = MEMORY_FRACTION,
            prompts: Sequence[Sequence[int]] | None = None, live_gates: LiveGateSpec | None = None) -> ExecutorRun:
    """Serve ``requests`` on a (random-init unless ``model`` is given) model; everything the run produced; with
    ``live_gates`` each decoded token's own exit gate is run too and set beside its replayed depth."""
    if model is None:
        model = build_model(arch, device=device, dtype=dtype, seed=seed, backend=backend)
    executor = Executor(arch, config, requests, kv_blocks, model=model, mode=mode, graphs=graphs,
                        keep_logits=keep_logits, prompt_seed=seed, memory_fraction=memory_fraction, prompts=prompts,
                        live_gates=live_gates)
    if warmup:
        executor.warmup()
    return executor.run()


def run_executor(arch: ArchSpec, config: ServeConfig, requests: list[Request], kv_blocks: int, *,
                 device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 mode: Timing | str | None = "sync", seed: int = 0, **options: object) -> RunLog:
    """Serve ``requests`` with :func:`execute` (``mode`` None: ``config.timing``) and return the run's log."""
    return execute(arch, config, requests, kv_blocks, device=device, dtype=dtype, mode=mode, seed=seed,
                   **options).log
