"""The ``cdbsim`` command line: parse, call the library, print. No logic a library user would need."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import math
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cdbsim.arch import load_arch
from cdbsim.config import ServeConfig
from cdbsim.errors import ConfigError
from cdbsim.experiment import Experiment, Setting, plain, read_toml, settings, unwrap_optional

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Predict and measure serving throughput and latency of looped language models "
                       "under Continuous Depth Batching.")
console = Console(width=None if sys.stdout.isatty() else 150)
DEFAULT_KV_TOKENS = 327_680  # the CDB paper's KV cache size


def fail(message: str) -> None:
    """Print a one-line error and exit with code 2."""
    Console(stderr=True).print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def friendly(command: Callable) -> Callable:
    """Turn bad-input exceptions into a one-line error with exit code 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except ConfigError as exc:
            fail(str(exc))
        except ImportError as exc:
            fail(f"{exc}; install the GPU extra: pip install 'cdbsim[gpu]'")

    return wrapper


# ----- experiment options ------------------------------------------------------------------------
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", metavar="FILE.toml",
    help="An experiment TOML file ([arch], [serve], [workload], [exits], [latency]); flags override it.")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", metavar="SECTION.FIELD=VALUE",
    help="Set any experiment field, e.g. serve.width=128 (repeatable; overrides --config and flags).")]
EXPLICIT = ("COMMANDLINE", "ENVIRONMENT")  # where a value the user gave comes from (click's ParameterSource)


def _parameter(setting: Setting, default: Any) -> inspect.Parameter:
    """A command parameter for one experiment field: its flags, help and the command's default. Enum
    fields take text (the experiment parses it, with aliases and a one-line error listing the choices)."""
    hint = setting.hint
    base, optional = unwrap_optional(hint)
    if isinstance(base, type) and issubclass(base, Enum):
        hint, default = (str | None) if optional else str, plain(default)
    option = typer.Option(*setting.flags, help=setting.help)
    return inspect.Parameter(setting.param, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[hint, option])


@dataclass(frozen=True)
class FileTables:
    """Tables of an experiment file that a command reads itself (``[grid]``), and the file's name."""

    source: str | None
    tables: dict[str, Any]


def experiment_options(*selected: str, exclude: tuple[str, ...] = (),
                       defaults: Mapping[str, Any] | None = None,
                       tables: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Give a command the options of the experiment fields ``selected`` (a section, ``"serve"``, or one
    field, ``"serve.width"``, minus ``exclude``) plus ``--config`` and ``--set``, and call it with the
    assembled :class:`Experiment` as ``exp``. ``defaults`` are this command's own (``{"workload.requests":
    256}``). Precedence: defaults < config file < flags given on the command line < --set. ``tables`` are
    tables of the config file the command reads itself (``[grid]``): they are passed as ``tables``."""
    chosen = [s for s in settings() if (s.section in selected or s.key in selected) and s.key not in exclude]
    defaults = dict(defaults or {})
    passed = ("exp", "tables")

    def decorate(command: Callable) -> Callable:
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in inspect.signature(command, eval_str=True).parameters.values() if p.name not in passed]
        generated = [_parameter(s, defaults.get(s.key, s.default)) for s in chosen]
        extra = [inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ConfigOpt),
                 inspect.Parameter("assignments", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=SetOpt),
                 inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            config, assignments, context = kwargs.pop("config"), kwargs.pop("assignments"), kwargs.pop("context")
            flags: dict[str, Any] = {}
            for s in chosen:
                value, source = kwargs.pop(s.param), context.get_parameter_source(s.param)
                if source is not None and source.name in EXPLICIT:
                    flags[s.key] = value
            exp = Experiment().override(defaults)
            data = read_toml(config) if config is not None else {}
            own_tables = {name: data.pop(name) for name in tables if name in data}
            if config is not None:
                exp = exp.merge(data, source=str(config))
            exp = exp.override(flags, source=None).override(assignments or [])
            if tables:
                kwargs["tables"] = FileTables(str(config) if config is not None else None, own_tables)
            return command(exp=exp, **kwargs)

        parameters = [*generated, *extra, *own]
        wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper

    return decorate


SaveLogs = Annotated[Path | None, typer.Option("--save-logs", help="Write launch and request logs here.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
CsvOut = Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")]


def emit(rows: list[dict], title: str, as_json: bool, as_csv: bool, caption: str | None = None) -> None:
    """Print ``rows`` as a rich table, JSON or CSV."""
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, default=float) + "\n")
        return
    if as_csv:
        import pandas as pd

        sys.stdout.write(pd.DataFrame(rows).to_csv(index=False))
        return
    table = Table(title=title, caption=caption)
    for key in rows[0] if rows else []:
        table.add_column(key, justify="right" if isinstance(rows[0][key], int | float) else "left")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    console.print(table)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# ----- commands ----------------------------------------------------------------------------------
@app.command()
@friendly
@experiment_options("arch", "serve", "workload", "exits", exclude=("workload.rate", "workload.arrival"),
                    defaults={"workload.requests": 256})
def schedule(
    exp: Experiment,
    launches: Annotated[int, typer.Option("--launches", help="How many launches to show.")] = 20,
    skip: Annotated[int, typer.Option("--skip", help="Launches to skip before showing.")] = 0,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Print the first launches of a run as a table (stage, batch, loop-step mix, queues)."""
    from cdbsim.kv import capacity_blocks
    from cdbsim.replay import drive
    from cdbsim.scheduler import Scheduler

    spec = exp.arch.spec()
    config = exp.serve.config()
    exp = exp.override({"workload.rate": None})  # the schedule of an offline run: every request at t = 0
    reqs = exp.workload_spec(spec).build(spec, config.r_min(spec))
    kv = exp.serve
    tokens = DEFAULT_KV_TOKENS if kv.kv_tokens is None and kv.kv_blocks is None else kv.kv_tokens
    blocks = capacity_blocks(spec, config.layout, tokens=tokens, blocks=kv.kv_blocks)
    rows = []
    for launch in drive(Scheduler(spec, config, reqs, blocks)):
        if launch.index < skip:
            continue
        if len(rows) >= launches:
            break
        rows.append({"#": launch.index + 1, "stage": launch.stage.value, "B": launch.size,
                     "padded": launch.padded, "detail": launch.detail(),
                     "Q_P": launch.queue_waiting, "Q_R": launch.queue_core, "Q_C": launch.queue_coda,
                     "active": launch.active})
    emit(rows, f"{spec.name} ({spec.split}, r_max {spec.r_max}) | {config.describe()} | {exp.workload.name}",
         as_json, as_csv, caption="Q_P waiting prompts, Q_R tokens queued for the core (norefill: the wave), "
                                  "Q_C tokens queued for the coda; loop steps r1.. are 1-indexed")


@app.command()
@friendly
@experiment_options("arch", "serve.timing", "workload", "exits", exclude=("workload.trace",))
def trace(
    exp: Experiment,
    out: Annotated[Path, typer.Option("--out", help="Where to write the trace (.csv or .parquet).")],
) -> None:
    """Write a request + exit-depth trace of a workload preset (replay it with --trace)."""
    from traces import write_trace

    spec = exp.arch.spec()
    workload_spec = exp.workload_spec(spec)
    reqs = workload_spec.build(spec, exp.serve.config().r_min(spec))
    write_trace(reqs, out)
    console.print(f"wrote {len(reqs):,} requests ({workload_spec.describe()}) to {out}", markup=False,
                  highlight=False)


@app.command()
@friendly
@experiment_options("arch", "workload.name", "exits.mean_depth")
def bound(
    exp: Experiment,
    prefill_share: Annotated[float, typer.Option("--prefill-share", help="Share a of GPU time CB spends in "
                                                                         "prefill.")] = 0.0,
    f1: Annotated[float | None, typer.Option("--f1", help="Fraction of output tokens produced by prefill "
                                                          "(default: from --workload).")] = None,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Print the FLOP bounds S_dec and S_e2e and the KV bytes per token of each layout."""
    from cdbsim.bounds import s_dec, s_e2e
    from cdbsim.kvlayout import KVLayout
    from cdbsim.workload import default_mean_depth
    from traces import length_model

    spec = exp.arch.spec()
    mean_depth = exp.exits.mean_depth
    depth_decoded = mean_depth if mean_depth is not None else default_mean_depth(spec.r_max)
    frac = f1 if f1 is not None else 1.0 / length_model(exp.workload.name).mean_output
    dbar = frac * spec.r_max + (1 - frac) * depth_decoded
    sdec = s_dec(spec, dbar)
    row = {"arch": spec.name, "split": spec.split, "r_max": spec.r_max, "F0/Fr": spec.f0 / spec.fr,
           "decoded depth": depth_decoded, "f1": frac, "d-bar": dbar, "S_dec": sdec,
           "a": prefill_share, "S_e2e": s_e2e(sdec, prefill_share, frac)}
    for layout in KVLayout:
        row[f"KV B/token {layout.value}"] = spec.kv_bytes_per_token(layout)
    if as_json or as_csv:
        emit([row], "", as_json, as_csv)
        return
    emit([{"quantity": k, "value": v} for k, v in row.items()], f"Bounds for {spec.name}", False, False,
         caption="d-bar counts each request's first token (from prefill) at r_max")


def progress_bars() -> tuple[Any, Callable[[str, int], Callable[[int], None]]]:
    """A rich progress display (on stderr) and a factory giving each run its own bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)

    def factory(label: str, total: int) -> Callable[[int], None]:
        task = bars.add_task(label, total=total)
        return lambda n: bars.advance(task, n)

    return bars, factory


def run_label(config: ServeConfig) -> str:
    """``refill K=1``, ``norefill`` or ``cb``: what differs between the columns of one study."""
    policy = config.policy.value
    return f"{policy} K={config.coda_batch}" if policy == "refill" else policy


METRICS = [("output tok/s", "output_tps", 1.0), ("requests/s", "request_rate", 1.0),
           ("makespan s", "makespan_s", 1.0), ("TTFT p50 s", ("ttft_s", "p50"), 1.0),
           ("TTFT p99 s", ("ttft_s", "p99"), 1.0), ("TPOT p50 ms", ("tpot_s", "p50"), 1e3),
           ("ITL p99 ms", ("itl_s", "p99"), 1e3), ("E2E p50 s", ("e2e_s", "p50"), 1.0),
           ("norm. latency p50 ms", ("normalized_s", "p50"), 1e3),
           ("norm. latency p99 ms", ("normalized_s", "p99"), 1e3), ("device idle %", "device_idle", 100.0),
           ("prefill share %", "prefill_share", 100.0), ("mean depth d-bar", "mean_depth", 1.0),
           ("S_dec", "s_dec", 1.0), ("S_e2e", "s_e2e", 1.0), ("speed-up vs CB", "speedup", 1.0),
           ("% of S_e2e realised", "bound_realised", 100.0)]


def metric_rows(reports: dict[str, Any]) -> list[dict]:
    """One row per metric, one column per run (a vertical table reads best for a few runs)."""
    rows = []
    for label, key, scale in METRICS:
        row: dict[str, Any] = {"metric": label}
        for name, report in reports.items():
            value = getattr(getattr(report, key[0]), key[1]) if isinstance(key, tuple) else getattr(report, key)
            row[name] = "-" if value is None else float(value) * scale
        rows.append(row)
    stages = sorted({s for r in reports.values() for s in r.launches})
    for stage in stages:
        rows.append({"metric": f"{stage}: launches / mean B",
                     **{name: f"{r.launches.get(stage, 0):,} / {r.mean_batch.get(stage, 0):.1f}"
                        for name, r in reports.items()}})
    return rows


def emit_reports(reports: dict[str, Any], title: str, as_json: bool, as_csv: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps({name: r.to_dict() for name, r in reports.items()}, indent=2,
                                    default=str) + "\n")
        return
    if as_csv:
        emit([{"run": name, **r.row()} for name, r in reports.items()], title, False, True)
        return
    emit(metric_rows(reports), title, False, False,
         caption="speed-up and S_e2e are against CB on the same requests; S_e2e uses CB's prefill share")


@app.command()
@friendly
@experiment_options("arch", "serve", "workload", "exits", "latency")
def predict(
    exp: Experiment,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Also simulate CB on the same "
                                                                            "requests.")] = True,
    save_logs: SaveLogs = None, as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Predict throughput and latency of one configuration (and of CB on the same requests)."""
    from cdbsim.prediction import predict as simulate_experiment

    setup = exp.build()
    bars, factory = progress_bars()
    with bars:
        result = simulate_experiment(setup, baseline=baseline, progress=factory)
    reports = {run_label(setup.config): result.report}
    if result.baseline is not None:
        reports["cb"] = result.baseline.report
    if save_logs:
        result.log.save(save_logs / "run")
        if result.baseline is not None:
            result.baseline.log.save(save_logs / "cb")
    emit_reports(reports, setup.title(), as_json, as_csv)


@app.command()
@friendly
@experiment_options("arch", "serve", "workload", "exits", "latency", exclude=("serve.policy",))
def compare(exp: Experiment, save_logs: SaveLogs = None, as_json: JsonOut = False, as_csv: CsvOut = False) -> None:
    """CB, CDB no-refill and CDB refill side by side on the same requests, with the bounds."""
    from dataclasses import replace

    from cdbsim.study import compare_policies

    setup = exp.build()
    bars, factory = progress_bars()
    with bars:
        results = compare_policies(setup.arch, setup.config, setup.requests, setup.latency, setup.kv, factory)
    reports = {run_label(replace(setup.config, policy=r.log.meta["policy"])): r.report for r in results}
    if save_logs:
        for r in results:
            r.log.save(save_logs / r.log.meta["policy"])
    emit_reports(reports, setup.title(), as_json, as_csv)


@app.command("rate-sweep")
@friendly
@experiment_options("arch", "serve", "workload", "exits", "latency",
                    exclude=("serve.policy", "workload.trace", "workload.rate"))
def rate_sweep(
    exp: Experiment,
    rates: Annotated[str | None, typer.Option("--rates", help="Comma-separated request rates (req/s); default: "
                                                              "fractions of refill's offline capacity.")] = None,
    plot: Annotated[Path, typer.Option("--plot", help="Where to write the PNG plot.")] = Path("rate-sweep.png"),
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Normalized latency and throughput against Poisson request rate for each policy, with the knee."""
    from dataclasses import replace

    from cdbsim.plots import plot_rate_sweep
    from cdbsim.study import latency_knee, run_one
    from cdbsim.study import rate_sweep as sweep

    if exp.workload.trace is not None:
        raise ConfigError("rate-sweep draws Poisson arrivals for a workload preset; it cannot sweep the trace "
                          f"file {exp.workload.trace} (unset workload.trace)")
    setup = exp.override({"serve.policy": "refill", "workload.rate": None}).build()
    bars, factory = progress_bars()
    with bars:
        if rates:
            try:
                rate_list = [float(x) for x in rates.split(",")]
            except ValueError:
                raise ConfigError(f"--rates must be comma-separated numbers, got {rates!r}") from None
        else:
            capacity = run_one(setup.arch, setup.config, setup.requests, setup.latency, setup.kv, factory,
                               label="offline capacity").report.request_rate
            rate_list = [round(capacity * f, 4) for f in (0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25)]
        points = sweep(setup.arch, setup.config,
                       lambda r: replace(setup.workload, rate=r).build(setup.arch, setup.config.r_min(setup.arch)),
                       rate_list, setup.latency, setup.kv, progress=factory)
    rows = [{"policy": p.policy, "rate req/s": p.rate, "achieved req/s": p.report.request_rate,
             "output tok/s": p.report.output_tps, "norm lat p50 ms": p.report.normalized_s.p50 * 1e3,
             "norm lat mean ms": p.report.normalized_s.mean * 1e3,
             "norm lat p99 ms": p.report.normalized_s.p99 * 1e3, "TTFT p50 s": p.report.ttft_s.p50}
            for p in points]
    knees = {}
    for policy in dict.fromkeys(p.policy for p in points):
        mine = [p for p in points if p.policy == policy]
        knees[policy] = latency_knee([p.rate for p in mine], [p.report.normalized_s.mean for p in mine])
    plot_rate_sweep(points, knees, plot, setup.title())
    if as_json or as_csv:
        emit(rows if as_csv else [{"points": rows, "knees": knees}], "", as_json, as_csv)
        return
    emit(rows, setup.title(), False, False,
         caption="knee (mean normalized latency 2x its lowest-rate value): "
                 + ", ".join(f"{k} {v:.3g} req/s" if v else f"{k} none in range" for k, v in knees.items())
                 + f" | plot: {plot}")


JobsOpt = Annotated[int, typer.Option("--jobs", "-j", help="Run simulations in this many local processes.")]
DaskOpt = Annotated[str | None, typer.Option(
    "--dask", metavar="ADDRESS", help="Run simulations on a Dask cluster: a scheduler address (tcp://host:8786) "
                                      "or 'local' for a LocalCluster of --jobs workers (pip install "
                                      "'cdbsim[dask]').")]


class SweepBar:
    """Progress of a sweep on stderr: a rich bar with ETA on a terminal, else a plain line every 10 s."""

    PLAIN_EVERY_S = 10.0

    def __init__(self, total: int) -> None:
        import time

        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.clock, self.total = time.monotonic, total
        self.console = Console(stderr=True)
        self.start = self.last = self.clock()
        self.bar = None
        if self.console.is_terminal:
            self.bar = Progress(TextColumn("points"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("ETA"), TimeRemainingColumn(), console=self.console, transient=True)
            self.task = self.bar.add_task("points", total=total)

    def __enter__(self) -> SweepBar:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done)
            return
        now = self.clock()
        if now - self.last >= self.PLAIN_EVERY_S and done < total:
            self.last = now
            elapsed = now - self.start
            left = elapsed / done * (total - done)
            self.console.print(f"sweep: {done:,}/{total:,} points ({done / total:.0%}), {elapsed:.0f} s elapsed, "
                               f"about {left:.0f} s left", markup=False, highlight=False)


@contextlib.contextmanager
def stopped_cleanly() -> Any:
    """Let SIGTERM (a job scheduler's stop, ``kill``) unwind like Ctrl-C, so partial files are removed."""
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@app.command("sweep")
@friendly
@experiment_options("arch", "serve", "workload", "exits", "latency", tables=("grid", "points"))
def sweep_command(
    exp: Experiment,
    tables: FileTables,
    grid: Annotated[list[str] | None, typer.Option(
        "--grid", metavar="SECTION.FIELD=V1,V2,...",
        help="Sweep a field over these values (repeatable: every combination runs); also a [grid] table and "
             "[[points]] tables in --config.")] = None,
    out: Annotated[Path, typer.Option("--out", help="The Parquet file of results (one row per point); plots go "
                                                    "beside it.")] = Path("sweep.parquet"),
    csv: Annotated[bool, typer.Option("--csv", help="Also write the rows as CSV beside --out.")] = False,
    jobs: JobsOpt = 1, dask: DaskOpt = None,
    cache: Annotated[Path | None, typer.Option(
        "--cache", help="The results cache (SQLite; default $CDBSIM_CACHE or ~/.cache/cdbsim/points.sqlite).")]
        = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Simulate every point; read and write no cache.")]
        = False,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Also simulate CB on each point's "
                                                                            "requests (speed-up columns).")] = False,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the Pareto and per-field PNGs.")] = True,
    as_json: JsonOut = False,
) -> None:
    """Simulate every point of a grid of experiment fields; write a row per point, the best points per
    objective, and Pareto plots of throughput per GPU against p99 TPOT and mean depth."""
    import time

    from cdbsim.grid import Grid
    from cdbsim.grid_sweep import SweepPlan, run_sweep
    from cdbsim.point_cache import default_cache_path
    from cdbsim.sweep_summary import SweepSummary

    own = tables.tables
    plan = SweepPlan.make(exp, Grid.from_options(grid or [], own.get("grid"), own.get("points"), tables.source),
                          baseline)
    summary = SweepSummary(plan.fields)
    start = time.monotonic()
    with stopped_cleanly(), SweepBar(len(plan)) as bar:
        run_sweep(plan, jobs=jobs, dask=dask, cache=None if no_cache else cache or default_cache_path(), parquet=out,
                  csv=out.with_suffix(".csv") if csv else None, progress=bar, each=summary.add)
    seconds = time.monotonic() - start
    title = f"sweep of {len(plan):,} points over {', '.join(plan.fields)}"
    files = [out, *([out.with_suffix(".csv")] if csv else [])]
    if plots:
        files += summary.plot(out.with_suffix(""), title)
    counts = plan.counts
    done = (f"{len(plan):,} points: {counts.simulated:,} simulated, {counts.cached:,} from the cache, "
            f"{counts.skipped:,} skipped, in {seconds:.1f} s | wrote {', '.join(map(str, files))}")
    if as_json:
        sys.stdout.write(json.dumps({"points": len(plan), "simulated": counts.simulated, "cached": counts.cached,
                                     "skipped": counts.skipped, "seconds": seconds, "best": summary.best_rows(),
                                     "front_tpot": summary.front_rows(0), "front_depth": summary.front_rows(1),
                                     "files": [str(f) for f in files]}, indent=2, default=float) + "\n")
        return
    emit(summary.best_rows(), f"Best points of the {title}", False, False, caption=done)
    emit(summary.front_rows(0), "Pareto front: throughput per GPU against p99 TPOT", False, False)


@app.command("capacity")
@friendly
@experiment_options("arch", "serve", "workload", "exits", "latency",
                    exclude=("serve.policy", "workload.rate", "workload.trace"))
def capacity_command(
    exp: Experiment,
    ttft_s: Annotated[float | None, typer.Option("--ttft-s", help="TTFT limit in seconds.")] = None,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", help="TPOT limit in milliseconds.")] = None,
    norm_ms: Annotated[float | None, typer.Option("--norm-latency-ms", help="Normalized latency (E2E / output "
                                                                            "tokens) limit in ms.")] = None,
    norm_mean_ms: Annotated[float | None, typer.Option("--norm-latency-mean-ms", help="Limit on the run's mean "
                                                                                      "normalized latency, ms.")]
        = None,
    attainment: Annotated[float, typer.Option("--attainment", help="Share of requests that must meet every "
                                                                   "per-request limit (0.99: p99 SLOs).")] = 0.99,
    policies: Annotated[str, typer.Option("--policies", help="Comma-separated policies to search.")] =
        "cb,norefill,refill",
    target_rate: Annotated[float | None, typer.Option("--target-rate", help="Also print the GPUs needed for this "
                                                                            "many requests/s.")] = None,
    jobs: JobsOpt = 1, dask: DaskOpt = None, as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """The highest Poisson request rate per GPU at which the SLOs hold (goodput: a request counts only if it
    meets every limit), per policy, by bisection; and the GPUs a target rate needs."""
    from cdbsim.capacity_search import SLO, capacity

    def seconds(ms: float | None) -> float | None:
        return None if ms is None else ms / 1e3

    slo = SLO(ttft_s=ttft_s, tpot_s=seconds(tpot_ms), normalized_s=seconds(norm_ms),
              normalized_mean_s=seconds(norm_mean_ms), attainment=attainment)
    if target_rate is not None and target_rate <= 0:
        raise ConfigError(f"--target-rate must be > 0, got {target_rate:g}")
    chosen = [p.strip() for p in policies.split(",") if p.strip()]
    results = capacity(exp, slo, chosen, jobs=jobs, dask=dask)
    rows = [r.row(target_rate) for r in results]
    if as_json:
        emit([{"slo": slo.describe(), "results": rows}], "", True, False)
        return
    if as_csv:
        emit(rows, "", False, True)
        return
    notes = " | ".join(f"{row['policy']}: {row.pop('note')}" for row in rows if "note" in row)
    keys = [key for key in rows[0] if key != "policy"]
    emit([{"": key, **{row["policy"]: "-" if _missing(row[key]) else row[key] for row in rows}} for key in keys],
         f"Capacity under {slo.describe()} | {exp.arch.spec().name} W={exp.serve.width} | {exp.workload.name} "
         f"({exp.workload.requests or 'default'} requests, Poisson)", False, False,
         caption="req/s per GPU: the highest Poisson rate found to meet the SLOs (one simulated GPU); search within "
                 "%: how far above it the lowest failing rate was" + (f" | {notes}" if notes else ""))


@app.command()
@friendly
@experiment_options("arch.name", "arch.split", "serve.policy", "serve.width", "serve.coda_batch", "serve.timing",
                    "serve.kv_layout", "workload.name", "workload.requests", "exits.model", "exits.mean_depth",
                    "workload.seed", "serve.kv_tokens", "serve.core_launch", "latency.profile", "latency.force",
                    defaults={"workload.name": "alpaca", "workload.requests": 128, "workload.seed": 1,
                              "serve.kv_tokens": 65536})
def validate(
    exp: Experiment,
    matrix: Annotated[Path | None, typer.Option("--matrix", help="A validation matrix JSON file (default: one "
                                                                 "configuration from the options below).")] = None,
    only: Annotated[str | None, typer.Option("--only", help="Comma-separated config names of the matrix.")] = None,
    measured: Annotated[Path | None, typer.Option("--measured", help="Compare against executor logs saved in "
                                                                     "this directory instead of running the "
                                                                     "GPU.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Where logs, tables and plots go.")] = Path("validation"),
    rate_of_capacity: Annotated[float | None, typer.Option("--rate-of-capacity", help="Online run: Poisson "
                                                           "arrivals at this fraction of the simulated "
                                                           "offline capacity.")] = None,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Run configurations on the GPU executor and in the simulator on identical requests; show the errors."""
    from calibration import validation as val

    if matrix is not None:
        entries = val.load_matrix(matrix, only=only.split(",") if only else None)
    else:
        entries = [val.Entry.from_experiment("config", exp, rate_of_capacity)]
    result = val.run_validation(entries, out, functools.cache(exp.latency.model), measured=measured,
                                log=lambda msg: Console(stderr=True).print(msg, markup=False))
    if as_json or as_csv:
        emit(result.summary if as_csv else [{"summary": result.summary, "errors": result.errors}], "", as_json,
             as_csv)
    elif len(entries) == 1:
        emit(result.comparisons[0].rows, f"{entries[0].describe()} | errors are (predicted - measured) / measured",
             False, False)
    else:
        emit(result.summary, f"validation: {len(entries)} configurations", False, False,
             caption=" | ".join(f"{k}: {v:.3g}" for k, v in result.errors.items()) + f" | files in {out}")


@app.command()
@friendly
def calibrate(
    arch: Annotated[str, typer.Option("--arch", help="Comma-separated presets or architecture files.")] =
        "ouro-1.4b,ouro-2.6b,huginn-3.5b",
    out: Annotated[Path, typer.Option("--out", help="Where the profiles (JSON + PNG) go.")] = Path("profiles"),
    quick: Annotated[bool, typer.Option("--quick", help="A few points per component (minutes less).")] = False,
    device: Annotated[str, typer.Option("--device", help="cuda (default) or cpu (for a tiny test model).")] =
        "cuda",
    refit: Annotated[list[Path] | None, typer.Option(
        "--refit", help="Refit this profile JSON from its raw points, in place, and measure nothing "
                        "(no GPU needed; repeat for several).")] = None,
    kernels: Annotated[bool | None, typer.Option(
        "--kernels/--no-kernels", help="Only the kernel-level profile (any architecture) / only the --arch "
                                       "models' profiles (default: both).")] = None,
    update: Annotated[Path | None, typer.Option(
        "--update", help="Kernel-level: re-measure --families into this existing kernel profile.")] = None,
    families: Annotated[str | None, typer.Option(
        "--families", help="Kernel-level: comma-separated families to measure (default: all).")] = None,
) -> None:
    """Measure this GPU with the executor, fit the latency model, and write a profile per model and a
    kernel-level profile that predicts architectures nobody has built."""
    from calibration.fit import attention_rows, quality_rows, refit_profile, saturation_rows
    from calibration.run import calibrate as run_calibration
    from cdbsim.profile import load_profile_file

    for path in refit or []:
        profile = refit_profile(load_profile_file(path))
        profile.save(path)
        emit(quality_rows(profile), f"{profile.label()}: refitted fits", False, False,
             caption=f"written to {path}")
    if refit:
        return
    specs = [] if kernels else [load_arch(name.strip()) for name in arch.split(",") if name.strip()]
    from rich.status import Status

    with Status("calibrating", console=Console(stderr=True)) as status:
        profiles = run_calibration(specs, out, quick=quick, device=device, progress=status.update)
        if kernels is not False:
            from calibration.kernels import FAMILIES, calibrate_kernels, summary_rows

            chosen = tuple(f.strip() for f in families.split(",")) if families else FAMILIES
            bad = [f for f in chosen if f not in FAMILIES]
            if bad:
                raise ConfigError(f"unknown kernel families {', '.join(bad)}; choose from: {', '.join(FAMILIES)}")
            base = load_profile_file(update) if update is not None else None
            kernel_profile = calibrate_kernels(out, device=device, quick=quick, progress=status.update,
                                               families=chosen, base=base)
    if kernels is not False:
        emit(summary_rows(kernel_profile), f"{kernel_profile.label()}: kernel tables", False, False,
             caption=f"written to {out / (kernel_profile.name + '.json')}")
    for spec, profile in zip(specs, profiles, strict=True):
        emit(quality_rows(profile), f"{profile.label()}: fits", False, False)
        if profile.attention:
            emit(attention_rows(profile), f"{spec.name}: core steps with mixed context lengths "
                 f"(attention width {profile.attention_slots or 'not fitted'})", False, False)
        emit(saturation_rows(profile, spec), f"{spec.name}: core stage and B*(L)", False, False,
             caption=f"written to {out / (profile.name + '.json')} and .png")


def main() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
