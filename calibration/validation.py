"""``cdbsim validate``: run configurations on the GPU executor and in the simulator, on identical requests
and exit depths, and compare the two logs.

A validation matrix is a JSON file (``calibration/matrices/validation-h200.json``): ``defaults`` plus a
list of ``configs``, each naming ``arch`` (and optionally ``split``), ``policy``, ``coda_batch``, ``width``,
``layout``, ``timing``, ``workload``, ``requests``, ``exits`` (``synthetic`` or ``none``), ``mean_depth``,
``seed``, ``kv_tokens``, ``core_launch`` (``mixed`` or ``per-step``) and, for an online run,
``rate_of_capacity`` (Poisson arrivals at that fraction of the simulator's offline request rate for the same
configuration) or ``trace``, a trace file (path from the repository root) whose requests, arrivals and exit
depths replace the workload's.

The executor part needs torch and a GPU; measured logs are saved per configuration, so the comparison can
be redone anywhere from them (``--measured DIR``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import tarfile
import tempfile
import typing
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

from cdbsim.errors import ConfigError, read_json, require, unknown
from cdbsim.latency.model import LatencyModel
from cdbsim.latency.profile import Profile
from cdbsim.model.arch import ArchSpec, load_arch
from cdbsim.planner.experiment import Experiment, parse_value, plain, settings
from cdbsim.report.logs import RunLog
from cdbsim.report.metrics import summarize
from cdbsim.report.outputs import atomic_file
from cdbsim.report.validate import Comparison, error_summary, plot_scatter, plot_timelines, run_host, stage_errors
from cdbsim.serving.config import ServeConfig
from cdbsim.serving.launch import table_width
from cdbsim.serving.memory import capacity_blocks
from cdbsim.simulator.sim import simulate
from cdbsim.simulator.workload import DEFAULT_REQUESTS, WorkloadSpec, default_mean_depth
from traces import ExitModel, Request, length_model

ENTRY_EXITS = ("synthetic", "none")  # an entry carries no fixed depth
ENTRY_KEYS = {  # experiment field -> the Entry field that carries it to the executor and the simulator
    "arch.name": "arch", "arch.split": "split", "serve.policy": "policy", "serve.coda_batch": "coda_batch",
    "serve.width": "width", "serve.kv_layout": "layout", "serve.timing": "timing", "workload.name": "workload",
    "workload.requests": "requests", "exits.model": "exits", "exits.mean_depth": "mean_depth",
    "workload.seed": "seed", "serve.kv_tokens": "kv_tokens", "workload.trace": "trace",
    "serve.core_launch": "core_launch",
}


@dataclass(frozen=True)
class Entry:
    """One configuration of a validation matrix."""

    name: str
    arch: str = "ouro-1.4b"
    split: str | None = None
    policy: str = "refill"
    coda_batch: int = 1
    width: int = 64
    layout: str = "depth"
    timing: str = "lookahead"
    workload: str = "alpaca"
    requests: int = 256
    exits: str = "synthetic"
    mean_depth: float | None = None
    seed: int = 1
    kv_tokens: int = 65536
    rate_of_capacity: float | None = None
    trace: str | None = None
    core_launch: str = "mixed"

    def __post_init__(self) -> None:
        """Each field of its declared type and range (a matrix file's ``"width": "abc"`` or ``"seed": -1``
        is refused when the file is read, not with a traceback mid-run)."""
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            try:
                object.__setattr__(self, f.name, parse_value(getattr(self, f.name), hints[f.name]))
            except ConfigError as exc:
                raise ConfigError(f"{f.name}: {exc}") from None
        for key, low in (("requests", 1), ("seed", 0), ("kv_tokens", 1)):
            require(getattr(self, key) >= low, f"{key} must be >= {low}, got {getattr(self, key)}")
        require(self.rate_of_capacity is None or self.rate_of_capacity > 0,
                f"rate_of_capacity must be > 0, got {self.rate_of_capacity}")
        if self.exits not in ENTRY_EXITS:
            raise unknown("exit model", self.exits, ENTRY_EXITS)
        require(self.mean_depth is None or self.exits == "synthetic", "mean_depth goes with exits synthetic")
        require(self.trace is None or self.rate_of_capacity is None,
                f"{self.name}: a trace carries its own arrivals; give trace or rate_of_capacity, not both")
        if self.trace is None:
            length_model(self.workload)  # an unknown workload, with the valid ones

    @classmethod
    def from_experiment(cls, name: str, exp: Experiment, rate_of_capacity: float | None = None) -> Entry:
        """The configuration ``exp`` describes. Settings an entry cannot carry to the executor are refused
        rather than ignored (the latency section is not among them: it only prices the simulated run)."""
        carried = {}
        for setting in settings():
            if setting.section == "latency":
                continue
            value = plain(getattr(getattr(exp, setting.section), setting.name))
            if setting.key in ENTRY_KEYS:
                carried[ENTRY_KEYS[setting.key]] = value
            else:
                require(value == plain(setting.default), f"validate cannot run {setting.key} = {value!r} on the "
                        f"executor; it takes {', '.join(ENTRY_KEYS)} and the latency section")
        require(carried["kv_tokens"] is not None, "validate needs the KV capacity in tokens (serve.kv_tokens)")
        exp.serve.config()  # refuses a K given with the adaptive policy
        carried["coda_batch"] = carried["coda_batch"] or 1
        carried["requests"] = carried["requests"] or DEFAULT_REQUESTS.get(carried["workload"], 1000)
        if carried.get("trace") is not None:
            carried["trace"] = str(carried["trace"])
        entry = cls(name=name, rate_of_capacity=rate_of_capacity, **carried)
        entry.config()  # refuse impossible settings before any work
        return entry

    @property
    def online(self) -> bool:
        """Requests arrive over time: at a share of capacity, or as a trace file says."""
        return self.rate_of_capacity is not None or self.trace is not None

    def spec(self) -> ArchSpec:
        return load_arch(self.arch, split=self.split)

    def config(self) -> ServeConfig:
        return ServeConfig(policy=self.policy, width=self.width, coda_batch=self.coda_batch, timing=self.timing,
                           layout=self.layout, core_launch=self.core_launch)

    def kv_blocks(self) -> int:
        config = self.config()
        return capacity_blocks(self.spec(), config.layout, tokens=self.kv_tokens, block_size=config.block_size)

    def build_requests(self, rate: float | None = None) -> list[Request]:
        arch, config = self.spec(), self.config()
        mean = self.mean_depth if self.mean_depth is not None else default_mean_depth(arch.r_max)
        exits = ExitModel(self.exits, mean=mean) if self.exits == "synthetic" else ExitModel(self.exits)
        spec = WorkloadSpec(self.workload, self.requests, rate, exits, self.seed, self.trace)
        return spec.build(arch, config.r_min(arch))

    def describe(self) -> str:
        arch = self.spec()
        if self.trace is not None:
            return f"{arch.name} {arch.split} {self.config().describe()} trace {self.trace}"
        rate = f", {self.rate_of_capacity:g} x capacity" if self.online else ", offline"
        return (f"{arch.name} {arch.split} {self.config().describe()} {self.workload} x{self.requests} "
                f"exits {self.exits}{rate}")


def load_matrix(path: str | Path, only: Iterable[str] | None = None) -> list[Entry]:
    """The entries of a matrix file (defaults applied), or those named in ``only``; unknown keys and names
    are refused with the file's name."""
    data = read_json(path, "validation matrix")
    shape = '{"defaults": {...}, "configs": [{...}, ...]} expected'
    require(isinstance(data, dict), f"{path}: not a validation matrix ({shape})")
    defaults, configs = data.get("defaults", {}), data.get("configs", [])
    require(isinstance(defaults, dict) and isinstance(configs, list), f"{path}: not a validation matrix ({shape})")
    valid = {f.name for f in fields(Entry)}
    entries = []
    for i, raw in enumerate(configs):
        require(isinstance(raw, dict), f"{path}: config {i} must be an object of settings, got {raw!r:.40}")
        merged = {**defaults, **raw}
        extra = sorted(set(merged) - valid)
        require(not extra, f"{path}: config {i} ({raw.get('name', '?')}) has unknown key(s) {', '.join(extra)}")
        require("name" in merged, f"{path}: config {i} has no name")
        try:
            entry = Entry(**merged)
            entry.kv_blocks()  # its architecture, serving settings and KV capacity, before any run
        except ConfigError as exc:
            raise ConfigError(f"{path}: config {i} ({merged['name']}): {exc}") from None
        entries.append(entry)
    require(entries, f"{path}: no configs")
    if only is None:
        return entries
    wanted = set(only)
    missing = wanted - {e.name for e in entries}
    require(not missing, f"{path}: no config named {', '.join(sorted(missing))}")
    return [e for e in entries if e.name in wanted]


def offline_capacity(entry: Entry, latency: LatencyModel) -> float:
    """The simulator's offline request rate for ``entry`` (sets the rate of its online runs)."""
    arch, config = entry.spec(), entry.config()
    offline = replace(entry, rate_of_capacity=None)
    requests = offline.build_requests()
    log = simulate(arch, config, requests, latency, entry.kv_blocks())
    return summarize(log, arch, requests, config.r_min(arch)).request_rate


def requests_for(entry: Entry, latency: LatencyModel) -> tuple[list[Request], float | None]:
    """The requests of ``entry``, with Poisson arrivals for online runs, and the rate used."""
    if entry.rate_of_capacity is None:
        return entry.build_requests(), None
    rate = entry.rate_of_capacity * offline_capacity(entry, latency)
    return entry.build_requests(rate), rate


def measure(entries: list[Entry], out: Path, latency_for: Callable[[ArchSpec], LatencyModel],
            log: Callable[[str], None] = print) -> dict[str, RunLog]:
    """Run every entry on the GPU executor; logs go to ``out/<name>/`` (needs torch and CUDA)."""
    import torch

    from executor.driver import build_model, execute

    require(torch.cuda.is_available(), "cdbsim validate needs a CUDA GPU to run the executor "
                                       "(or pass --measured DIR with saved executor logs)")
    results: dict[str, RunLog] = {}
    models: dict[tuple[str, str], object] = {}
    for entry in entries:
        arch = entry.spec()
        key = (arch.name, arch.split)
        if key not in models:
            models.clear()
            gc.collect()
            torch.cuda.empty_cache()
            models[key] = build_model(arch, device="cuda", seed=0)
        requests, rate = requests_for(entry, latency_for(arch))
        run = execute(arch, entry.config(), requests, entry.kv_blocks(), device="cuda", model=models[key],
                      seed=entry.seed)
        run.log.meta.update({"validation_entry": entry.name, "rate": rate})
        run.log.save(out / entry.name)
        results[entry.name] = run.log
        log(f"{entry.name}: {sum(len(t) for t in run.log.token_times)} tokens in "
            f"{run.log.meta.get('wall_s', float('nan')):.1f} s")
        del run
        gc.collect()  # the engine's stage table refers back to it: free its KV cache before the next run
        torch.cuda.empty_cache()
    return results


def load_measured(entries: list[Entry], directory: Path) -> dict[str, RunLog]:
    """Saved executor logs, ``directory/<name>/``, one per entry."""
    missing = [e.name for e in entries if not RunLog.saved_in(directory / e.name)]
    require(not missing, f"{directory}: no saved executor log for {', '.join(missing[:4])}")
    return {e.name: RunLog.load(directory / e.name) for e in entries}


def compare(entries: list[Entry], measured: dict[str, RunLog],
            latency_for: Callable[[ArchSpec], LatencyModel]) -> list[Comparison]:
    """Simulate each entry on the requests the executor served (same arrivals and depths) and compare."""
    comparisons = []
    for entry in entries:
        arch, config = entry.spec(), entry.config()
        real = measured[entry.name]
        rate = real.meta.get("rate")
        requests = entry.build_requests(rate if entry.online else None)
        latency = latency_for(arch)
        predicted = simulate(arch, config, requests, latency, entry.kv_blocks())
        r_min = config.r_min(arch)
        comparison = Comparison.of(entry.name, summarize(real, arch, requests, r_min),
                                   summarize(predicted, arch, requests, r_min), entry.online,
                                   measured_log=real, predicted_log=predicted)
        found = run_host(real)
        if found is not None:  # the same prediction with the host as fast as it was in this run
            comparison.host_us = 1e6 * found.median_s
            own = simulate(arch, config, requests, latency.with_host(found.pooled, found.stages),
                           entry.kv_blocks())
            comparison.own_host = summarize(own, arch, requests, r_min)
        if not entry.online:  # offline, the simulation plans the run's launches in its order: replay its host
            replayed = simulate(arch, config, requests, latency.with_host_times(real.launches["host_s"].tolist()),
                                entry.kv_blocks())
            if replayed.launches["stage"].tolist() == real.launches["stage"].tolist():
                comparison.own_host_times = summarize(replayed, arch, requests, r_min)
        width = table_width(requests, config.block_size)
        comparison.stages = stage_errors(real, functools.partial(latency.launch_time, table_width=width))
        comparisons.append(comparison)
    return comparisons


def profile_names(latency_for: Callable[[ArchSpec], LatencyModel], entries: list[Entry]) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in entries:
        profile: Profile = latency_for(entry.spec()).profile
        out[entry.arch] = profile.label()
    return out


@dataclass
class Validation:
    """What ``cdbsim validate`` shows: each configuration's comparison, the summary rows and the errors."""

    comparisons: list[Comparison]
    summary: list[dict]
    errors: dict


def run_validation(entries: list[Entry], out: Path, latency_for: Callable[[ArchSpec], LatencyModel],
                   measured: Path | None = None, log: Callable[[str], None] = print) -> Validation:
    """Measure ``entries`` on the executor (or load their logs saved in ``measured``), simulate the same
    requests, compare, and write the results to ``out`` (see :func:`write_results`)."""
    out.mkdir(parents=True, exist_ok=True)
    logs = load_measured(entries, measured) if measured is not None else measure(entries, out / "measured",
                                                                                  latency_for, log=log)
    comparisons = compare(entries, logs, latency_for)
    return write_results(entries, comparisons, out, latency_for)


def write_results(entries: list[Entry], comparisons: list[Comparison], out: Path,
                  latency_for: Callable[[ArchSpec], LatencyModel]) -> Validation:
    """``summary.json`` (summary, errors, profiles, configs, per-metric and per-stage rows), ``summary.csv``,
    ``stages.csv``, ``scatter.png`` and, for the first configuration, ``timeline.png``."""
    import pandas as pd

    summary = [c.summary() for c in comparisons]
    errors = error_summary(comparisons)
    with atomic_file(out / "summary.json") as path:  # each file whole or not at all
        path.write_text(json.dumps(
            {"summary": summary, "errors": errors, "profiles": profile_names(latency_for, entries),
             "configs": {e.name: e.describe() for e in entries},
             "details": {c.name: c.rows for c in comparisons},
             "stages": {c.name: c.stages for c in comparisons}}, indent=2, default=float))
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
    return Validation(comparisons, summary, errors)


@contextlib.contextmanager
def unpacked_logs(path: Path, option: str = "--measured") -> Iterator[Path]:
    """A directory of saved run logs (one directory per configuration): ``path`` itself, or a tar of them
    (as committed under ``benchmarks/results/``) unpacked into a temporary directory that is removed
    afterwards; paths outside it and links are refused."""
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
