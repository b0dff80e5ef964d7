"""``cdbsim validate``: run configurations on the GPU executor (serving a looped model as the CDB paper's engine
does: Schwethelm et al., arXiv 2608.09444) and in the simulator, on identical requests and exit depths; compare logs.

A validation matrix (``docs/validating.md``) is a JSON file of named experiments in the ``--set`` syntax
(:data:`SHAPE`), each an :class:`~cdbsim.planner.experiment.Experiment`: the defaults, then the matrix's ``set``, then
the entry's. ``rate_of_capacity`` makes an online run with Poisson arrivals at that fraction of the simulator's
offline request rate. ``--profile`` prices the whole matrix, not each entry. Executor logs are saved and found by
entry name, so the comparison can be redone from them without a GPU (``--measured``). Each measured profile's
executor build is checked against the build of the runs (:func:`check_builds`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from cdbsim.errors import ConfigError, read_json, require
from cdbsim.latency.build import Build, describe
from cdbsim.latency.model import LatencyModel
from cdbsim.latency.profile import ProfileKind
from cdbsim.model.arch import ArchSpec
from cdbsim.planner.experiment import Experiment, parse_value
from cdbsim.report.logs import RunLog
from cdbsim.report.metrics import summarize
from cdbsim.report.outputs import atomic_file
from cdbsim.report.validate import Comparison, error_summary, plot_scatter, plot_timelines, run_host, stage_errors
from cdbsim.serving.config import ServeConfig
from cdbsim.serving.launch import table_width
from cdbsim.serving.memory import KVCapacity, MemoryPlan, RequestShape, capacity_blocks
from cdbsim.simulator.sim import simulate
from cdbsim.simulator.workload import WorkloadSpec
from traces import Request, length_model

if TYPE_CHECKING:  # torch: imported where a run needs it
    from executor.live_gates import LiveGateSpec
    from executor.model import LoopedLM

MATRIX_KEYS = ("name", "notes", "set", "configs")
ENTRY_KEYS = ("name", "set", "rate_of_capacity")
SHAPE = '{"set": [...], "configs": [{"name": ..., "set": ["section.field=value", ...]}, ...]}'


@dataclass(frozen=True)
class Entry:
    """One configuration of a validation matrix: a named experiment and, for an online run at a share of the simulated
    capacity, that share (its rate is saved with the measured log); what the executor cannot run is refused here."""

    name: str
    experiment: Experiment
    rate_of_capacity: float | None = None

    def __post_init__(self) -> None:
        exp, share = self.experiment, self.rate_of_capacity
        require(share is None or (math.isfinite(share) and share > 0), f"rate_of_capacity must be > 0, got {share}")
        arrivals = [key for key, value in (("workload.trace", exp.workload.trace), ("workload.rate", exp.workload.rate),
                                           ("rate_of_capacity", share)) if value is not None]
        require(len(arrivals) <= 1, f"give one of {' and '.join(arrivals)}: each sets the arrivals")
        if exp.workload.trace is None:
            length_model(exp.workload.name)  # an unknown workload, with the valid ones
        self.workload(self.spec())  # the exit model fits the architecture
        self.config()  # the serving settings
        self.capacity()  # the memory share
        if exp.serve.kv_tokens is not None or exp.serve.kv_blocks is not None:
            self.given_blocks()  # the KV capacity given

    @classmethod
    def from_experiment(cls, name: str, exp: Experiment, rate_of_capacity: float | None = None) -> Entry:
        """``exp`` as an entry named ``name`` (its latency section prices the simulated run only)."""
        return cls(name, exp, rate_of_capacity)

    @property
    def online(self) -> bool:
        """Requests arrive over time: at a share of capacity, at a given rate, or as a trace file says."""
        workload = self.experiment.workload
        return self.rate_of_capacity is not None or workload.rate is not None or workload.trace is not None

    def spec(self) -> ArchSpec:
        return self.experiment.arch.spec()

    def config(self) -> ServeConfig:
        return self.experiment.serve.config()

    def capacity(self) -> KVCapacity:
        return self.experiment.serve.kv_capacity()

    def given_blocks(self) -> int | None:
        """The KV capacity the entry gives (None: sized from the GPU's memory when it runs)."""
        serve, config = self.experiment.serve, self.config()
        if serve.kv_tokens is None and serve.kv_blocks is None:
            return None
        return capacity_blocks(tokens=serve.kv_tokens, blocks=serve.kv_blocks, block_size=config.block_size)

    def plan(self, device: str, device_bytes: float) -> MemoryPlan:
        """The entry's memory on a GPU: its KV size checked, or sized from the memory (one-line refusal)."""
        try:
            return self.capacity().plan(self.spec(), self.config(), RequestShape.of(self.build_requests()), device,
                                        device_bytes)
        except ConfigError as exc:
            raise ConfigError(f"{self.name}: {exc}") from None

    def workload(self, arch: ArchSpec, rate: float | None = None) -> WorkloadSpec:
        """The workload with its exit model for ``arch``, with Poisson arrivals at ``rate`` if given."""
        spec = self.experiment.workload_spec(arch)
        return spec if rate is None else replace(spec, rate=rate)

    def build_requests(self, rate: float | None = None) -> list[Request]:
        """The requests, with Poisson arrivals at ``rate`` req/s if given (else the experiment's own)."""
        arch = self.spec()
        return self.workload(arch, rate).build(arch, self.config().r_min(arch))

    def describe(self) -> str:
        arch, config, workload = self.spec(), self.config(), self.experiment.workload
        head = f"{arch.name} {arch.split} {config.describe()}"
        if workload.trace is not None:
            return f"{head} trace {workload.trace}"
        rate = (f", {self.rate_of_capacity:g} x capacity" if self.rate_of_capacity is not None else
                f", {workload.rate:g} req/s" if workload.rate is not None else ", offline")
        return (f"{head} {workload.name} x{self.workload(arch).count} exits {self.experiment.exits.model}{rate}")


def _override(exp: Experiment, items: object, where: str) -> Experiment:
    """``exp`` with a matrix's list of ``section.field=value`` texts applied; a bad one names ``where``."""
    require(isinstance(items, list), f"{where}: set must be a list of \"section.field=value\" texts, got {items!r:.40}")
    for item in items:
        require(isinstance(item, str) and "=" in item,
                f"{where}: set: expected \"section.field=value\", got {item!r:.40}")
        require(not item.startswith("latency."), f"{where}: set: {item.partition('=')[0]} is chosen for the whole "
                                                 f"matrix (--profile, --force), not per entry")
    try:
        return exp.override(items, source=None)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_matrix(path: str | Path, only: Iterable[str] | None = None) -> list[Entry]:
    """The entries of a matrix file (or those named in ``only``); a bad file is one line naming file and entry."""
    data = read_json(path, "validation matrix")
    require(isinstance(data, dict), f"{path}: not a validation matrix ({SHAPE} expected)")
    extra = sorted(set(data) - set(MATRIX_KEYS))
    require(not extra, f"{path}: unknown key(s) {', '.join(extra)}; a validation matrix is {SHAPE}")
    configs = data.get("configs")
    require(isinstance(configs, list) and configs, f"{path}: no configs ({SHAPE} expected)")
    base = _override(Experiment(), data.get("set", []), str(path))
    entries: dict[str, Entry] = {}
    for i, raw in enumerate(configs):
        where = f"{path}: config {i}"
        require(isinstance(raw, dict), f"{where} must be an object {{\"name\": ..., \"set\": [...]}}, got {raw!r:.40}")
        name = raw.get("name")
        require(isinstance(name, str) and name.strip() and "/" not in name and name not in (".", ".."),
                f"{where}: name must be a text that names a directory (its logs), got {name!r:.40}")
        where = f"{where} ({name})"
        extra = sorted(set(raw) - set(ENTRY_KEYS))
        require(not extra, f"{where}: unknown key(s) {', '.join(extra)}; an entry has {', '.join(ENTRY_KEYS)} "
                           f"(settings go in set as \"section.field=value\")")
        require(name not in entries, f"{where}: a second config of this name (logs are kept by name)")
        exp = _override(base, raw.get("set", []), where)
        try:
            share = parse_value(raw.get("rate_of_capacity"), float | None)
            entries[name] = Entry(name, exp, share)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if only is None:
        return list(entries.values())
    wanted = set(only)
    missing = wanted - set(entries)
    require(not missing, f"{path}: no config named {', '.join(sorted(missing))}")
    return [e for e in entries.values() if e.name in wanted]


def requests_for(entry: Entry, latency: LatencyModel, kv_blocks: int) -> tuple[list[Request], float | None]:
    """The requests of ``entry`` and their Poisson rate (None: offline or a trace's own arrivals); a share of capacity
    is of the simulator's offline request rate on ``kv_blocks``."""
    if entry.rate_of_capacity is None:
        return entry.build_requests(), entry.experiment.workload.rate
    arch, config = entry.spec(), entry.config()
    offline = replace(entry.workload(arch), rate=None).build(arch, config.r_min(arch))
    log = simulate(arch, config, offline, latency, kv_blocks)
    rate = entry.rate_of_capacity * summarize(log, arch, offline, config.r_min(arch)).request_rate
    return entry.build_requests(rate), rate


def gpu_memory() -> tuple[str, float]:
    """The name and memory in bytes of the GPU the executor runs on (needs torch and CUDA)."""
    import torch

    _require_gpu()
    props = torch.cuda.get_device_properties(0)
    return props.name, float(props.total_memory)


def plan_entries(entries: list[Entry], device: str, device_bytes: float) -> dict[str, MemoryPlan]:
    """Every entry's memory plan on the GPU, before any model loads: a KV size that cannot fit is refused in one
    line, a missing one is sized from the memory."""
    return {entry.name: entry.plan(device, device_bytes) for entry in entries}


@dataclass(frozen=True)
class CheckpointRun:
    """How validate runs a checkpoint folder: where Huginn's loop starts (:class:`executor.model.ModelConfig`), the
    threshold of the live exit gates (None: none) and their rule (None: the model's own), and the prompts a recorded
    trace was recorded on (None: synthetic prompts of the trace's lengths; prompt i is request i, as ``cdbsim
    record`` numbers them)."""

    folder: Path
    state_init: str = "zeros"
    state_seed: int = 0
    live_q: float | None = None
    criterion: str | None = None
    prompts: list[list[int]] | None = None

    def prompts_for(self, requests: list[Request]) -> list[list[int]] | None:
        """Each request's prompt ids, checked against the lengths the trace gives (None without prompts)."""
        if self.prompts is None:
            return None
        out = []
        for r in requests:
            require(0 <= r.request_id < len(self.prompts), f"--prompts: the trace's request {r.request_id} has no "
                                                           f"prompt (the file holds {len(self.prompts)})")
            ids = self.prompts[r.request_id]
            require(len(ids) == r.prompt_len, f"--prompts: request {r.request_id} has {r.prompt_len} prompt tokens "
                                              f"in the trace, {len(ids)} in the prompts file")
            out.append(ids)
        return out

    def live_gates(self, model: LoopedLM) -> LiveGateSpec | None:
        """The live exit gates of a run of ``model`` (:class:`executor.live_gates.LiveGateSpec`), None without."""
        if self.live_q is None:
            return None
        from executor.gates import default_criterion
        from executor.live_gates import LiveGateSpec

        return LiveGateSpec(self.criterion or default_criterion(model), self.live_q)


class OneModel:
    """The model of the architecture asked for last, on ``device``: random weights (seed 0), or the weights of the
    ``checkpoint`` folder (its loop starting as it says); the previous model is freed first."""

    def __init__(self, checkpoint: CheckpointRun | None = None, device: str = "cuda") -> None:
        self.run, self.device = checkpoint, device
        self.checkpoint = checkpoint.folder if checkpoint is not None else None
        self.key: tuple[str, str] | None = None
        self.model: object = None

    @property
    def weights(self) -> str:
        """What the runs' logs record as their weights."""
        return f"checkpoint {self.checkpoint}" if self.checkpoint is not None else "random (seed 0)"

    def __call__(self, arch: ArchSpec) -> object:
        import torch

        from executor.driver import build_model
        from executor.loader import load_model

        if (arch.name, arch.split) != self.key:
            self.model = None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.model = (load_model(arch, self.checkpoint, device=self.device, state_init=self.run.state_init,
                                     state_seed=self.run.state_seed) if self.run is not None
                          else build_model(arch, device=self.device, seed=0))
            self.key = (arch.name, arch.split)
        return self.model


def measure(entries: list[Entry], out: Path, latency_for: Callable[[ArchSpec], LatencyModel],
            log: Callable[[str], None] = print, checkpoint: CheckpointRun | None = None) -> dict[str, RunLog]:
    """Run every entry on the GPU executor (random weights, or ``checkpoint``'s, with its live gates and prompts),
    each with the KV cache its memory plan gives; logs go to ``out/<name>/`` (needs torch and CUDA)."""
    plans = plan_entries(entries, *gpu_memory())
    import torch

    from executor.driver import execute

    results: dict[str, RunLog] = {}
    model_for = OneModel(checkpoint)
    for entry in entries:
        arch = entry.spec()
        plan = plans[entry.name]
        requests, rate = requests_for(entry, latency_for(arch), plan.kv_blocks)
        prompts = checkpoint.prompts_for(requests) if checkpoint is not None else None
        model = model_for(arch)
        run = execute(arch, entry.config(), requests, plan.kv_blocks, device="cuda", model=model,
                      seed=entry.experiment.workload.seed, memory_fraction=plan.fraction, prompts=prompts,
                      live_gates=checkpoint.live_gates(model) if checkpoint is not None else None)
        run.log.meta.update({"validation_entry": entry.name, "rate": rate, "weights": model_for.weights})
        run.log.save(out / entry.name)
        results[entry.name] = run.log
        log(f"{entry.name}: {sum(len(t) for t in run.log.token_times)} tokens in "
            f"{run.log.meta.get('wall_s', float('nan')):.1f} s")
        del run
        gc.collect()  # the engine's stage table refers back to it: free its KV cache before the next run
        torch.cuda.empty_cache()
    return results


def _require_gpu() -> None:
    import torch

    require(torch.cuda.is_available(), "cdbsim validate needs a CUDA GPU to run the executor "
                                       "(or pass --measured DIR with saved executor logs)")


def this_build() -> Build:
    """The executor build this machine's GPU runs (needs torch and CUDA)."""
    from executor.build import current_build

    _require_gpu()
    return current_build("cuda")


@dataclass(frozen=True)
class BuildChecks:
    """A validation's profiles against the executor builds of its runs: one-line warnings for a profile measured by
    another build (naming what differs), one-line notes where either side records no build."""

    mismatches: list[str]
    notes: list[str]


def check_builds(entries: list[Entry], latency_for: Callable[[ArchSpec], LatencyModel],
                 run_builds: dict[str, Build | None], runs: str) -> BuildChecks:
    """Each measured (or kernel-level) profile's build against ``run_builds`` (by entry name; ``runs`` names them,
    e.g. "the saved runs"); roofline and constant profiles were measured by no build and are not checked."""
    mismatches: dict[str, None] = {}
    unknown_profiles: dict[str, None] = {}
    unknown_runs: dict[str, None] = {}
    for entry in entries:
        profile = latency_for(entry.spec()).profile
        if profile.kind not in (ProfileKind.MEASURED, ProfileKind.KERNELS):
            continue
        mine, theirs = profile.executor_build(), run_builds.get(entry.name)
        if mine is None:
            unknown_profiles[profile.name] = None
        elif theirs is None:
            unknown_runs[entry.name] = None
        elif differ := mine.differences(theirs):
            mismatches[f"profile {profile.name} ({describe(mine)}) was measured by another executor build than "
                       f"{runs} ({describe(theirs)}): {', '.join(differ)} differ"] = None
    notes = []
    if unknown_profiles:
        several = len(unknown_profiles) > 1
        notes.append(f"note: profile{'s' if several else ''} {', '.join(unknown_profiles)} record"
                     f"{'' if several else 's'} no executor build (build unknown): not checked against {runs}")
    if unknown_runs:
        notes.append(f"note: {runs} of {', '.join(unknown_runs)} record no executor build: not checked against "
                     f"the profile")
    return BuildChecks(list(mismatches), notes)


def _report_builds(checks: BuildChecks, strict: bool, log: Callable[[str], None]) -> None:
    """Warn of each mismatch (with ``strict``: refuse the first, one line) and note what could not be checked."""
    if strict and checks.mismatches:
        raise ConfigError(f"{checks.mismatches[0]} (--strict)")
    for line in checks.notes + [f"warning: {m}" for m in checks.mismatches]:
        log(line)


def measured_gpu(directory: Path) -> str | None:
    """The GPU the saved executor logs under ``directory`` ran on, as torch names it (None if none says)."""
    for meta in sorted(directory.glob("*/meta.json")):
        with contextlib.suppress(ValueError, OSError, AttributeError):
            device = json.loads(meta.read_text()).get("device")
            if isinstance(device, str) and device:
                return device
    return None


def replayed_blocks(entry: Entry, real: RunLog) -> int:
    """The KV capacity a run used (its log's), else the entry's."""
    blocks = real.meta.get("kv_blocks") or entry.given_blocks()
    require(blocks is not None, f"{entry.name}: the saved log records no KV capacity and the entry gives none "
                                f"(serve.kv_tokens)")
    return int(blocks)


def compare(entries: list[Entry], measured: dict[str, RunLog],
            latency_for: Callable[[ArchSpec], LatencyModel]) -> list[Comparison]:
    """Simulate each entry on the requests the executor served (same arrivals and depths, same KV capacity) and
    compare."""
    comparisons = []
    for entry in entries:
        arch, config = entry.spec(), entry.config()
        real = measured[entry.name]
        blocks = replayed_blocks(entry, real)
        requests = entry.build_requests(real.meta.get("rate") if entry.online else None)
        latency = latency_for(arch)
        predicted = simulate(arch, config, requests, latency, blocks)
        r_min = config.r_min(arch)
        comparison = Comparison.of(entry.name, summarize(real, arch, requests, r_min),
                                   summarize(predicted, arch, requests, r_min), entry.online,
                                   measured_log=real, predicted_log=predicted)
        found = run_host(real)
        if found is not None:  # the same prediction with the host as fast as it was in this run
            comparison.host_us = 1e6 * found.median_s
            own = simulate(arch, config, requests, latency.with_host(found.pooled, found.stages),
                           blocks)
            comparison.own_host = summarize(own, arch, requests, r_min)
        if not entry.online:  # offline, the simulation plans the run's launches in its order: replay its host
            replayed = simulate(arch, config, requests, latency.with_host_times(real.launches["host_s"].tolist()),
                                blocks)
            if replayed.launches["stage"].tolist() == real.launches["stage"].tolist():
                comparison.own_host_times = summarize(replayed, arch, requests, r_min)
        comparison.stages = stage_errors(real, functools.partial(latency.launch_time,
                                                                 table_width=table_width(requests, config.block_size)))
        comparisons.append(comparison)
    return comparisons


def profile_names(latency_for: Callable[[ArchSpec], LatencyModel], entries: list[Entry]) -> dict[str, str]:
    """Each architecture's profile label, by the name the entries give it."""
    return {str(e.experiment.arch.hf_config or e.experiment.arch.name): latency_for(e.spec()).profile.label()
            for e in entries}


@dataclass
class Validation:
    """What ``cdbsim validate`` shows: each configuration's comparison, the summary rows, the errors and, of runs
    with live exit gates, how the live gates differ from the replayed depths (by configuration)."""

    comparisons: list[Comparison]
    summary: list[dict]
    errors: dict
    live_gates: dict[str, dict] = field(default_factory=dict)


def live_gate_rows(live_gates: dict[str, dict]) -> list[dict]:
    """One row per configuration run with live exit gates (:class:`executor.live_gates.LiveComparison` as its log
    records it): decoded tokens compared, the shares whose live gate agrees with the replayed depth, would have
    exited earlier, or had not fired by it, and the mean live minus replayed depth where the live one is known."""

    def percent(share: float | None) -> float | None:
        return None if share is None else 100 * share

    return [{"config": name, "rule": f"{g['criterion']} q={g['q']:g}", "tokens": g["tokens"],
             "agree %": percent(g["agree_share"]), "live earlier %": percent(g["earlier_share"]),
             "not fired by replayed depth %": percent(g["not_fired_share"]),
             "mean depth diff (live - replayed)": g["mean_depth_diff"]} for name, g in live_gates.items()]


def run_validation(entries: list[Entry], out: Path, latency_for: Callable[[ArchSpec], LatencyModel],
                   measured: Path | None = None, log: Callable[[str], None] = print,
                   strict: bool = False, checkpoint: CheckpointRun | None = None) -> Validation:
    """Measure ``entries`` on the executor (or load logs saved in ``measured``), simulate, compare and write
    ``summary.json`` (summary, errors, profiles, configs, per-metric and per-stage rows), ``summary.csv``,
    ``stages.csv``, ``scatter.png`` and, for the first configuration, ``timeline.png``. Each profile's executor
    build is checked against the runs' first (:func:`check_builds`; with ``strict`` a mismatch is an error)."""
    import pandas as pd

    if measured is None:
        build = this_build()
        _report_builds(check_builds(entries, latency_for, dict.fromkeys((e.name for e in entries), build),
                                    "this executor"), strict, log)
        out.mkdir(parents=True, exist_ok=True)
        logs = measure(entries, out / "measured", latency_for, log=log, checkpoint=checkpoint)
    else:  # saved executor logs, one per entry in ``measured/<name>/``
        missing = [e.name for e in entries if not RunLog.saved_in(measured / e.name)]
        require(not missing, f"{measured}: no saved executor log for {', '.join(missing[:4])}")
        logs = {e.name: RunLog.load(measured / e.name) for e in entries}
        builds = {name: Build.from_record(run.meta.get("build"), f"{measured / name / 'meta.json'}: build")
                  for name, run in logs.items()}
        _report_builds(check_builds(entries, latency_for, builds, "the saved runs"), strict, log)
        out.mkdir(parents=True, exist_ok=True)
    comparisons = compare(entries, logs, latency_for)
    summary = [{**c.summary(), "profile build": latency_for(e.spec()).profile.build_label()}
               for c, e in zip(comparisons, entries, strict=True)]
    errors = error_summary(comparisons)
    live = {e.name: logs[e.name].meta["live_gates"] for e in entries if logs[e.name].meta.get("live_gates")}
    with atomic_file(out / "summary.json") as path:  # each file whole or not at all
        path.write_text(json.dumps(
            {"summary": summary, "errors": errors, "profiles": profile_names(latency_for, entries),
             "configs": {e.name: e.describe() for e in entries},
             "details": {c.name: c.rows for c in comparisons},
             "stages": {c.name: c.stages for c in comparisons},
             **({"live_gates": live} if live else {})}, indent=2, default=float))
    with atomic_file(out / "summary.csv") as path:
        pd.DataFrame(summary).to_csv(path, index=False)
    with atomic_file(out / "stages.csv") as path:
        pd.DataFrame([{"config": c.name, **row} for c in comparisons for row in c.stages]).to_csv(path, index=False)
    with atomic_file(out / "scatter.png") as path:
        plot_scatter(comparisons, path)
    first = comparisons[0]
    if first.measured_log is not None and first.predicted_log is not None:
        with atomic_file(out / "timeline.png") as path:
            plot_timelines(first.measured_log, first.predicted_log, path, title=first.name)
    return Validation(comparisons, summary, errors, live)


@contextlib.contextmanager
def unpacked_logs(path: Path, option: str = "--measured") -> Iterator[Path]:
    """A directory of saved run logs (one directory per configuration): ``path`` itself, or a tar of them
    unpacked into a temporary directory that is removed afterwards; paths outside it and links are refused."""
    if not (path.is_file() and tarfile.is_tarfile(path)):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="cdbsim-measured-") as tmp:
        try:
            with tarfile.open(path) as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:  # EOFError: a truncated archive
            raise ConfigError(f"{option} {path}: cannot unpack ({exc})") from None
        root = Path(tmp)
        entries = list(root.iterdir())
        if len(entries) == 1 and entries[0].is_dir() and not RunLog.saved_in(entries[0]):
            root = entries[0]  # packed with one wrapping directory (``tar czf x.tgz measured/``)
        try:
            yield root
        except ConfigError as exc:  # name the archive, not the temporary directory it was unpacked into
            message = str(exc).replace(f"{root}{os.sep}", f"{path}:").replace(str(root), str(path))
            raise ConfigError(message) from None
