"""The ``cdbsim`` command line: parse, call the library, print. No logic a library user would need."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import math
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from cdbsim.errors import ConfigError
from cdbsim.model.arch import load_arch
from cdbsim.planner.experiment import Experiment, Setting, plain, read_toml, settings, unwrap_optional
from cdbsim.report.outputs import atomic_file, check_dir, check_file
from cdbsim.serving.config import ServeConfig

try:
    from typer import TyperException as UsageFailure  # typer >= 0.2x parses with its own copy of click
except ImportError:  # pragma: no cover - older typer: click's exceptions
    from click import ClickException as UsageFailure


def error_line(message: str) -> None:
    """Print ``error: message`` as one line on stderr (newlines in a message are folded)."""
    Console(stderr=True).print(f"error: {' '.join(str(message).split())}", markup=False, highlight=False,
                               soft_wrap=True)


def refuse_empty_values(argv: list[str]) -> None:
    """An option given an empty value (``--save-logs ''``, ``--out=``) is a slip, never a choice: a path
    would silently become the current directory. Refused before the command line is parsed."""
    for i, token in enumerate(argv):
        option, eq, value = token.partition("=")
        if token.startswith("--") and eq and not value:
            raise UsageFailure(f"{option}: empty value")
        if token == "" and i > 0 and argv[i - 1].startswith("--") and "=" not in argv[i - 1]:
            raise UsageFailure(f"{argv[i - 1]}: empty value")


class OneLineErrors(TyperGroup):
    """The command group, with click's own usage errors (an option that does not parse, a missing value,
    an unknown option) printed as the same one-line ``error: ...`` with exit code 2 as every other bad
    input, instead of click's usage block."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            refuse_empty_values(list(kwargs.get("args") or (args[0] if args else None) or sys.argv[1:]))
            code = super().main(*args, standalone_mode=False, **kwargs)
        except UsageFailure as exc:
            error_line(exc.format_message())
            sys.exit(2)
        except typer.Abort:
            error_line("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(cls=OneLineErrors, add_completion=False, rich_markup_mode=None,
                  help="Predict and measure serving throughput and latency of looped language models "
                       "under Continuous Depth Batching.")


@app.callback(invoke_without_command=True)
def _no_command(context: typer.Context) -> None:
    """``cdbsim`` alone prints its help (not a usage error: nothing was asked for)."""
    if context.invoked_subcommand is None:
        typer.echo(context.get_help())
        raise typer.Exit(0)


console = Console(width=None if sys.stdout.isatty() else 150)
DEFAULT_KV_TOKENS = 327_680  # the CDB paper's KV cache size


def comma_list(text: str, option: str) -> list[str]:
    """The names of a comma-separated option, blanks dropped; none at all (``--policies ,``) is an error,
    not a silent fall-back to a default or to nothing."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ConfigError(f"{option}: no names in {text!r}; give one or more, separated by commas")
    return names


def fail(message: str) -> None:
    """Print a one-line error and exit with code 2."""
    error_line(message)
    raise typer.Exit(2)


def friendly(command: Callable) -> Callable:
    """Turn bad-input exceptions into a one-line error with exit code 2, and refuse options that exclude
    each other (``--json`` with ``--csv``) before the command does any work."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            if kwargs.get("as_json") and kwargs.get("as_csv"):
                raise ConfigError("give --json or --csv, not both")
            return command(*args, **kwargs)
        except ConfigError as exc:
            fail(str(exc))
        except ImportError as exc:
            fail(f"{exc}; install the GPU extra: pip install 'cdbsim[gpu]'")
        except OSError as exc:  # a disk that fills or a path that vanishes mid-run: nothing half-written stays
            fail(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
        except MemoryError:
            fail("ran out of memory; use fewer requests (-n) or a smaller model")

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
    tables of the config file the command reads itself (``[grid]``): they are passed as ``tables``. A command
    with a ``given`` parameter gets the ``section.field`` keys the user set (flags, config file, ``--set``)."""
    chosen = [s for s in settings() if (s.section in selected or s.key in selected) and s.key not in exclude]
    defaults = dict(defaults or {})
    passed = ("exp", "tables", "given")

    def decorate(command: Callable) -> Callable:
        accepted = inspect.signature(command).parameters
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
            given = {*flags, *(f"{section}.{name}" for section, values in data.items()
                               if isinstance(values, Mapping) for name in values),
                     *(a.partition("=")[0].strip() for a in assignments or [])}
            exp.refuse_unused(given)
            if "given" in accepted:
                kwargs["given"] = frozenset(given)
            if tables:
                kwargs["tables"] = FileTables(str(config) if config is not None else None, own_tables)
            return command(exp=exp, **kwargs)

        parameters = [*generated, *extra, *own]
        wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper

    return decorate


# ----- outputs -----------------------------------------------------------------------------------
SaveLogs = Annotated[Path | None, typer.Option(
    "--save-logs", metavar="DIR", help="Write each run's launch and request logs, meta.json and trace.json.gz "
                                       "(a Perfetto / chrome://tracing timeline) to DIR/<run>/.")]
LogFormatOpt = Annotated[str, typer.Option("--log-format", help="Format of --save-logs: parquet or csv.")]
PlotCdf = Annotated[Path | None, typer.Option("--plot-cdf", metavar="FILE.png",
                                              help="Plot the CDFs of TTFT, TPOT, ITL and normalized latency.")]
PercentilesOpt = Annotated[str | None, typer.Option(
    "--percentiles", metavar="P,P,...", help="Latency percentiles to show, e.g. 50,90,99.9 (with mean and std).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
CsvOut = Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")]
PlotK = Annotated[Path | None, typer.Option("--plot-k", metavar="FILE.png",
                                            help="Plot the coda batch (effective K) of every coda launch over time.")]


@dataclass
class RunOutputs:
    """What a simulating command writes besides its table, checked before it simulates anything."""

    save_logs: Path | None
    log_format: Any  # cdbsim.report.logs.LogFormat (imported when used: it brings pandas)
    plot_cdf: Path | None
    percentiles: tuple[float, ...] | None
    plot_k: Path | None = None

    @classmethod
    def check(cls, save_logs: Path | None, log_format: str, plot_cdf: Path | None, percentiles: str | None,
              runs: tuple[str, ...], plot_k: Path | None = None) -> RunOutputs:
        """Parse and check the options (``runs``: the sub-directories ``--save-logs`` will hold)."""
        from cdbsim.report.logs import LogFormat
        from cdbsim.report.metrics import parse_percentiles

        return cls(check_dir(save_logs, "--save-logs", runs) if save_logs is not None else None,
                   LogFormat.parse(log_format),
                   check_file(plot_cdf, "--plot-cdf", (".png",)) if plot_cdf is not None else None,
                   parse_percentiles(percentiles) if percentiles is not None else None,
                   check_file(plot_k, "--plot-k", (".png",)) if plot_k is not None else None)

    def write(self, runs: dict[str, tuple[Any, Any]], dirs: dict[str, str], title: str) -> None:
        """The logs of ``runs`` (``{label: (report, log)}``) in ``--save-logs``/``dirs[label]`` and their CDF
        plot, each written whole or not at all."""
        if self.save_logs is not None:
            for label, (_, log) in runs.items():
                log.save(self.save_logs / dirs[label], self.log_format)
        if self.plot_cdf is not None:
            from cdbsim.report.metrics import latency_samples
            from cdbsim.report.plots import plot_latency_cdfs

            with atomic_file(self.plot_cdf) as staging:
                plot_latency_cdfs({label: latency_samples(log) for label, (_, log) in runs.items()}, staging, title)
        if self.plot_k is not None:  # the coda batch over time: the runs that launch codas
            from cdbsim.report.plots import plot_coda_batch

            with atomic_file(self.plot_k) as staging:
                plot_coda_batch({label: log.launches for label, (_, log) in runs.items()
                                 if log.meta.get("policy") != "cb"}, staging, title)

    def saved(self) -> str:
        """A caption naming what was written (empty when nothing)."""
        parts = [f"logs in {self.save_logs}" if self.save_logs is not None else "",
                 f"CDFs in {self.plot_cdf}" if self.plot_cdf is not None else "",
                 f"coda batches in {self.plot_k}" if self.plot_k is not None else ""]
        return " | ".join(p for p in parts if p)


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


@contextmanager
def progress() -> Iterator[Any]:
    """Progress of request generation and runs on stderr (bars on a terminal, plain lines elsewhere)."""
    from cdbsim.report.progress import progress_display

    with progress_display() as factory:
        yield factory


# ----- commands ----------------------------------------------------------------------------------
@app.command()
@friendly
@experiment_options("arch", "serve", "workload", "exits", exclude=("workload.rate", "workload.arrival"),
                    defaults={"workload.requests": 256})
def schedule(
    exp: Experiment,
    launches: Annotated[int, typer.Option("--launches", min=1, help="How many launches to show.")] = 20,
    skip: Annotated[int, typer.Option("--skip", min=0, help="Launches to skip before showing (after "
                                                            "--from-stage).")] = 0,
    from_stage: Annotated[str | None, typer.Option(
        "--from-stage", metavar="STAGE", help="Start the window at the first launch of this stage: prefill, "
                                              "prelude, core (the loop-step mix), coda or decode.")] = None,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Print a window of a run's launches as a table (stage, batch, loop-step mix, queues)."""
    from cdbsim.serving.launch import Stage
    from cdbsim.serving.memory import capacity_blocks
    from cdbsim.serving.pipeline import drive
    from cdbsim.serving.scheduler import Scheduler

    first = Stage.parse(from_stage) if from_stage is not None else None
    spec = exp.arch.spec()
    config = exp.serve.config()
    exp = exp.override({"workload.rate": None})  # the schedule of an offline run: every request at t = 0
    kv = exp.serve
    tokens = DEFAULT_KV_TOKENS if kv.kv_tokens is None and kv.kv_blocks is None else kv.kv_tokens
    blocks = capacity_blocks(spec, config.layout, tokens=tokens, blocks=kv.kv_blocks)
    with progress() as factory:
        reqs = exp.workload_spec(spec).build(spec, config.r_min(spec), factory, kv_blocks=blocks)
    rows: list[dict] = []
    seen = 0  # launches inside the window so far (counted from the first one of --from-stage)
    stages: set[str] = set()
    scheduler = Scheduler(spec, config, reqs, blocks)
    for launch in drive(scheduler):
        stages.add(launch.stage.value)
        if first is not None and seen == 0 and launch.stage is not first:
            continue
        seen += 1
        if seen <= skip:
            continue
        if len(rows) >= launches:
            break
        rows.append({"#": launch.index + 1, "stage": launch.stage.value, "B": launch.size,
                     "padded": launch.padded, "detail": launch.detail(),
                     "Q_P": scheduler.state.waiting, "Q_R": scheduler.state.core, "Q_C": scheduler.state.coda,
                     "active": scheduler.state.active})
    if first is not None and seen == 0:
        raise ConfigError(f"--from-stage {first.value}: this run has no {first.value} launch (its stages: "
                          f"{', '.join(sorted(stages))})")
    if not rows:
        raise ConfigError(f"--skip {skip}: this run has only {seen:,} launches to show")
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

    check_file(out, "--out", (".csv", ".parquet"))
    spec = exp.arch.spec()
    workload_spec = exp.workload_spec(spec)
    with progress() as factory:
        reqs = workload_spec.build(spec, exp.serve.config().r_min(spec), factory, simulated=False)
    with atomic_file(out) as staging:
        write_trace(reqs, staging)
    console.print(f"wrote {len(reqs):,} requests ({workload_spec.describe()}) to {out}", markup=False,
                  highlight=False)


CONTEXTS = (128, 512, 2048, 8192)  # context lengths B*(L) is shown at (README's calibration table)


@app.command()
@friendly
@experiment_options("arch", "workload.name", "exits.mean_depth", "latency")
def bound(
    exp: Experiment,
    prefill_share: Annotated[float, typer.Option("--prefill-share", min=0.0, max=1.0,
                                                 help="Share a of GPU time CB spends in prefill.")] = 0.0,
    f1: Annotated[float | None, typer.Option("--f1", min=0.0, max=1.0, help="Fraction of output tokens produced "
                                                                         "by prefill (default: from --workload).")]
        = None,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Print the FLOP bounds S_dec and S_e2e, the KV bytes per token of each layout, and B*(L) of the core
    step from the latency profile in use (no GPU needed)."""
    from cdbsim.model.arch import KVLayout
    from cdbsim.model.bounds import s_dec, s_e2e
    from cdbsim.simulator.workload import default_mean_depth
    from traces import length_model

    spec = exp.arch.spec()
    mean_depth = exp.exits.mean_depth
    depth_decoded = mean_depth if mean_depth is not None else default_mean_depth(spec.r_max)
    if not 1 <= depth_decoded <= spec.r_max:
        raise ConfigError(f"mean depth must be in [1, r_max = {spec.r_max}], got {depth_decoded:g}")
    if prefill_share >= 1.0:
        raise ConfigError("--prefill-share must be below 1 (CB would spend all its time in prefill)")
    frac = f1 if f1 is not None else 1.0 / length_model(exp.workload.name).mean_output
    if frac >= 1.0:
        raise ConfigError("--f1 must be below 1 (at least one token must be decoded)")
    latency = exp.latency.model(spec)
    dbar = frac * spec.r_max + (1 - frac) * depth_decoded
    sdec = s_dec(spec, dbar)
    row = {"arch": spec.name, "split": spec.split, "r_max": spec.r_max, "F0/Fr": spec.f0 / spec.fr,
           "decoded depth": depth_decoded, "f1": frac, "d-bar": dbar, "S_dec": sdec,
           "a": prefill_share, "S_e2e": s_e2e(sdec, prefill_share, frac)}
    for layout in KVLayout:
        row[f"KV B/token {layout.value}"] = spec.kv_bytes_per_token(layout)
    for length in CONTEXTS:
        row[f"B*({length})"] = latency.saturation_batch(length)
    row["profile"] = latency.profile.label()
    if as_json or as_csv:
        emit([row], "", as_json, as_csv)
        return
    emit([{"quantity": k, "value": v} for k, v in row.items()], f"Bounds for {spec.name}", False, False,
         caption="d-bar counts each request's first token (from prefill) at r_max; B*(L) = delta / (gamma + "
                 "alpha L) of the core step, the batch where it stops being bound by reading the weights")


def run_label(config: ServeConfig) -> str:
    """``refill K=1``, ``norefill`` or ``cb``: what differs between the columns of one study."""
    policy = config.policy.value
    return f"{policy} K={config.coda_batch}" if policy == "refill" else policy


METRICS = [("output tok/s", "output_tps", 1.0), ("requests/s", "request_rate", 1.0),
           ("makespan s", "makespan_s", 1.0), ("input tokens", "input_tokens", 1.0),
           ("TTFT p50 s", ("ttft_s", "p50"), 1.0),
           ("TTFT p99 s", ("ttft_s", "p99"), 1.0), ("TPOT p50 ms", ("tpot_s", "p50"), 1e3),
           ("ITL p99 ms", ("itl_s", "p99"), 1e3), ("E2E p50 s", ("e2e_s", "p50"), 1.0),
           ("norm. latency p50 ms", ("normalized_s", "p50"), 1e3),
           ("norm. latency p99 ms", ("normalized_s", "p99"), 1e3),
           ("sched. delay p50 s", ("scheduling_s", "p50"), 1.0), ("device idle %", "device_idle", 100.0),
           ("prefill share %", "prefill_share", 100.0), ("preemptions", "preemptions", 1.0),
           ("KV blocks in use, mean", "kv_blocks_mean", 1.0), ("KV blocks in use, peak", "kv_blocks_peak", 1.0),
           ("mean depth d-bar", "mean_depth", 1.0),
           ("S_dec", "s_dec", 1.0), ("S_e2e", "s_e2e", 1.0), ("speed-up vs CB", "speedup", 1.0),
           ("% of S_e2e realised", "bound_realised", 100.0)]
NOT_LOGGED_IN_EVERY_RUN = ("kv_blocks_mean", "kv_blocks_peak", "preemptions")
LATENCY_ROWS = [("TTFT", "ttft_s", "s", 1.0), ("TPOT", "tpot_s", "ms", 1e3), ("ITL", "itl_s", "ms", 1e3),
                ("E2E", "e2e_s", "s", 1.0), ("norm. latency", "normalized_s", "ms", 1e3),
                ("sched. delay", "scheduling_s", "s", 1.0)]


def _metrics(percentiles: tuple[float, ...] | None) -> list[tuple[str, Any, float]]:
    """The table's metrics: the summary above, or with ``--percentiles`` each latency's mean, std and
    the chosen percentiles in place of the fixed ones."""
    if percentiles is None:
        return METRICS
    from cdbsim.report.metrics import percentile_name

    latency = [(f"{label} {stat} {unit}", (key, stat), scale) for label, key, unit, scale in LATENCY_ROWS
               for stat in ("mean", "std", *map(percentile_name, percentiles))]
    fixed = [m for m in METRICS if not isinstance(m[1], tuple)]
    return fixed[:4] + latency + fixed[4:]


def _metric(report: Any, key: Any) -> Any:
    if not isinstance(key, tuple):
        return getattr(report, key)
    dist = getattr(report, key[0])
    return getattr(dist, key[1]) if key[1] in ("mean", "std", "p50", "p90", "p99") else dist.percentiles[key[1]]


def metric_rows(reports: dict[str, Any], percentiles: tuple[float, ...] | None = None) -> list[dict]:
    """One row per metric, one column per run (a vertical table reads best for a few runs); a figure a run's
    log does not hold (KV blocks in use without a ``kv_used`` column, preemptions of an old log) is "n/a",
    one that does not apply (a speed-up without a baseline) "-"."""
    rows = []
    for label, key, scale in _metrics(percentiles):
        values = {name: _metric(report, key) for name, report in reports.items()}
        absent = "n/a" if key in NOT_LOGGED_IN_EVERY_RUN else "-"
        rows.append({"metric": label, **{name: absent if v is None else float(v) * scale
                                         for name, v in values.items()}})
    stages = sorted({s for r in reports.values() for s in r.launches})
    for stage in stages:
        rows.append({"metric": f"{stage}: launches / mean B",
                     **{name: f"{r.launches.get(stage, 0):,} / {r.mean_batch.get(stage, 0):.1f}"
                        for name, r in reports.items()}})
    return rows


def csv_row(name: str, report: Any, percentiles: tuple[float, ...] | None) -> dict:
    """A run's CSV row: the report's flat row, the chosen latency percentiles, and the profile used."""
    row = {"run": name, **report.row()}
    for label, key, unit, scale in LATENCY_ROWS if percentiles else ():
        dist = getattr(report, key)
        row[f"{label} mean {unit}"], row[f"{label} std {unit}"] = dist.mean * scale, dist.std * scale
        row.update({f"{label} {q} {unit}": v * scale for q, v in dist.percentiles.items()})
    row["profile"] = report.meta.get("profile", "")
    return row


def emit_reports(reports: dict[str, Any], title: str, as_json: bool, as_csv: bool,
                 percentiles: tuple[float, ...] | None = None, saved: str = "") -> None:
    if as_json:
        sys.stdout.write(json.dumps({name: r.to_dict() for name, r in reports.items()}, indent=2,
                                    default=str) + "\n")
        return
    if as_csv:
        emit([csv_row(name, r, percentiles) for name, r in reports.items()], title, False, True)
        return
    caption = "speed-up and S_e2e are against CB on the same requests; S_e2e uses CB's prefill share"
    emit(metric_rows(reports, percentiles), title, False, False, caption=caption + (f" | {saved}" if saved else ""))


@app.command()
@friendly
@experiment_options("arch", "serve", "workload", "exits", "latency")
def predict(
    exp: Experiment,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Also simulate CB on the same "
                                                                            "requests.")] = True,
    save_logs: SaveLogs = None, log_format: LogFormatOpt = "parquet", plot_cdf: PlotCdf = None,
    percentiles: PercentilesOpt = None, plot_k_png: PlotK = None, as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Predict throughput and latency of one configuration (and of CB on the same requests)."""
    from cdbsim.planner.study import predict as simulate_experiment

    outputs = RunOutputs.check(save_logs, log_format, plot_cdf, percentiles, ("run", "cb") if baseline else ("run",),
                               plot_k_png)
    with progress() as factory:
        setup = exp.build(factory)
        result = simulate_experiment(setup, baseline=baseline, progress=factory)
    label = run_label(setup.config)
    runs = {label: (result.report, result.log)}
    if result.baseline is not None:
        runs["cb"] = (result.baseline.report, result.baseline.log)
    finish(runs, {label: "run", "cb": "cb"}, outputs, setup.title(), as_json, as_csv)


def finish(runs: dict[str, tuple[Any, Any]], dirs: dict[str, str], outputs: RunOutputs, title: str,
           as_json: bool, as_csv: bool) -> None:
    """Recompute the chosen percentiles, write the outputs of ``runs`` (``{label: (report, log)}``, logs
    in ``dirs[label]``) and print the reports."""
    if outputs.percentiles is not None:
        for report, log in runs.values():
            report.with_percentiles(log, outputs.percentiles)
    outputs.write(runs, dirs, title)
    emit_reports({label: report for label, (report, _) in runs.items()}, title, as_json, as_csv,
                 outputs.percentiles, outputs.saved())


@app.command()
@friendly
@experiment_options("arch", "serve", "workload", "exits", "latency", exclude=("serve.policy",))
def compare(exp: Experiment, save_logs: SaveLogs = None, log_format: LogFormatOpt = "parquet",
            plot_cdf: PlotCdf = None, percentiles: PercentilesOpt = None, plot_k_png: PlotK = None,
            as_json: JsonOut = False, as_csv: CsvOut = False) -> None:
    """CB, CDB no-refill, CDB refill and adaptive CDB side by side on the same requests, with the bounds."""
    from dataclasses import replace

    from cdbsim.planner.study import compare_policies
    from cdbsim.serving.config import Policy

    outputs = RunOutputs.check(save_logs, log_format, plot_cdf, percentiles, tuple(p.value for p in Policy),
                               plot_k_png)
    with progress() as factory:
        setup = exp.build(factory)
        results = compare_policies(setup.arch, setup.config, setup.requests, setup.latency, setup.kv, factory)
    labels = [run_label(replace(setup.config, policy=r.log.meta["policy"])) for r in results]
    runs = {label: (r.report, r.log) for label, r in zip(labels, results, strict=True)}
    dirs = {label: r.log.meta["policy"] for label, r in zip(labels, results, strict=True)}
    finish(runs, dirs, outputs, setup.title(), as_json, as_csv)


CHOSEN_BY_RATE_SEARCH = ("serve.policy", "workload.rate", "workload.trace")
"""Fields a command that searches Poisson rates over policies sets itself (rate-sweep, capacity)."""


def sweep_plot_path(plot: Path) -> Path:
    """Where ``--plot`` writes: an existing directory gets ``rate-sweep.png`` inside it; anything else
    must be a .png file name in a writable directory."""
    if plot.is_dir():
        plot = plot / "rate-sweep.png"
    return check_file(plot, "--plot", (".png",))


@app.command("rate-sweep")
@friendly
@experiment_options("arch", "serve", "workload", "exits", "latency", exclude=CHOSEN_BY_RATE_SEARCH)
def rate_sweep(
    exp: Experiment,
    rates: Annotated[str | None, typer.Option("--rates", help="Comma-separated request rates (req/s); default: "
                                                              "fractions of refill's offline capacity.")] = None,
    plot: Annotated[Path, typer.Option("--plot", metavar="FILE.png|DIR", help="Where to write the PNG plot (a "
                                       "directory gets rate-sweep.png inside it).")] = Path("rate-sweep.png"),
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Normalized latency and throughput against Poisson request rate for each policy, with the knee."""
    import math
    from dataclasses import replace

    from cdbsim.planner.study import latency_knee, run_one
    from cdbsim.planner.study import rate_sweep as sweep
    from cdbsim.report.plots import plot_rate_sweep

    if exp.workload.trace is not None:
        raise ConfigError("rate-sweep draws Poisson arrivals for a workload preset; it cannot sweep the trace "
                          f"file {exp.workload.trace} (unset workload.trace)")
    plot = sweep_plot_path(plot)
    rate_list = None
    if rates is not None:
        try:
            rate_list = [float(x) for x in rates.split(",")]
        except ValueError:
            raise ConfigError(f"--rates must be comma-separated numbers, got {rates!r}") from None
        bad = [r for r in rate_list if not (math.isfinite(r) and r > 0)]
        if bad:
            raise ConfigError(f"--rates must be finite numbers > 0 req/s, got {bad[0]:g}")
    with progress() as factory:
        setup = exp.override({"serve.policy": "refill", "workload.rate": None}).build(factory)
        if rate_list is None:
            capacity = run_one(setup.arch, setup.config, setup.requests, setup.latency, setup.kv, factory,
                               label="offline capacity").report.request_rate
            rate_list = [round(capacity * f, 4) for f in (0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25)]
        points = sweep(setup.arch, setup.config,
                       lambda r: replace(setup.workload, rate=r).build(setup.arch, setup.config.r_min(setup.arch),
                                                                       factory),
                       rate_list, setup.latency, setup.kv, progress=factory)
    profile = setup.latency.profile.label()
    rows = [{"policy": p.policy, "rate req/s": p.rate, "achieved req/s": p.report.request_rate,
             "output tok/s": p.report.output_tps, "norm lat p50 ms": p.report.normalized_s.p50 * 1e3,
             "norm lat mean ms": p.report.normalized_s.mean * 1e3,
             "norm lat p99 ms": p.report.normalized_s.p99 * 1e3, "TTFT p50 s": p.report.ttft_s.p50}
            for p in points]
    knees = {}
    for policy in dict.fromkeys(p.policy for p in points):
        mine = [p for p in points if p.policy == policy]
        knees[policy] = latency_knee([p.rate for p in mine], [p.report.normalized_s.mean for p in mine])
    with atomic_file(plot) as staging:
        plot_rate_sweep(points, knees, staging, setup.title())
    if as_json or as_csv:
        emit([{**row, "profile": profile} for row in rows] if as_csv else
             [{"points": rows, "knees": knees, "profile": profile, "plot": str(plot)}], "", as_json, as_csv)
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


@contextmanager
def steps_progress(label: str, total: int) -> Iterator[Callable[[int, int], None]]:
    """A progress callback told ``(done, total)`` (a sweep's points, capacity's searches) as one step of
    :func:`progress`."""
    with progress() as factory:
        advance = factory(label, total)
        done_before = 0

        def update(done: int, _total: int) -> None:
            nonlocal done_before
            advance(done - done_before)
            done_before = done

        yield update


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

    from cdbsim.planner.grid import Grid
    from cdbsim.planner.point_cache import default_cache_path
    from cdbsim.planner.sweep import SweepPlan, run_sweep
    from cdbsim.planner.sweep_summary import SweepSummary, summary_paths

    csv_out = out.with_suffix(".csv") if csv else None
    check_file(out, "--out", (".parquet",))  # the CSV and plots go beside it: checked as names there too
    for beside in [csv_out, *(summary_paths(out) if plots else [])]:
        if beside is not None:
            check_file(beside, "--out", (beside.suffix,))
    own = tables.tables
    plan = SweepPlan.make(exp, Grid.from_options(grid or [], own.get("grid"), own.get("points"), tables.source),
                          baseline)
    summary = SweepSummary(plan.fields)
    start = time.monotonic()
    with stopped_cleanly(), steps_progress("points", len(plan)) as bar:
        run_sweep(plan, jobs=jobs, dask=dask, cache=None if no_cache else cache or default_cache_path(), parquet=out,
                  csv=csv_out, progress=bar, each=summary.add)
    seconds = time.monotonic() - start
    title = f"sweep of {len(plan):,} points over {', '.join(plan.fields)}"
    files = [out, *([csv_out] if csv_out is not None else [])]
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
@experiment_options("arch", "serve", "workload", "exits", "latency", exclude=CHOSEN_BY_RATE_SEARCH)
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
    from cdbsim.planner.capacity import SLO, capacity, check_target_rate

    def seconds(ms: float | None) -> float | None:
        return None if ms is None else ms / 1e3

    slo = SLO(ttft_s=ttft_s, tpot_s=seconds(tpot_ms), normalized_s=seconds(norm_ms),
              normalized_mean_s=seconds(norm_mean_ms), attainment=attainment)
    if target_rate is not None:
        check_target_rate(target_rate)
    chosen = comma_list(policies, "--policies")
    with steps_progress("capacity searches (one per policy)", len(chosen)) as searched:
        results = capacity(exp, slo, chosen, jobs=jobs, dask=dask, progress=searched)
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
    given: frozenset[str],
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

    if matrix is None and only is not None:
        raise ConfigError("--only picks configurations of a --matrix file; give --matrix too")
    if matrix is not None and rate_of_capacity is not None:
        raise ConfigError("--rate-of-capacity sets the configuration given by options; a --matrix entry sets its "
                          "own (rate_of_capacity)")
    unused = [s.flags[0] for s in settings() if s.key in given and s.section != "latency"]
    if matrix is not None and unused:
        raise ConfigError(f"{', '.join(unused)}: a --matrix entry sets its own configuration; of the options only "
                          "--profile and --force apply to it")
    check_dir(out, "--out", ("measured",))
    unpacked = contextlib.ExitStack()
    if measured is not None:  # a committed archive of logs re-predicts as it is
        measured = unpacked.enter_context(val.unpacked_logs(measured))
    if measured is not None and not measured.is_dir():
        raise ConfigError(f"--measured {measured}: not a directory of saved executor logs (or a .tgz of one)")
    if matrix is not None:
        entries = val.load_matrix(matrix, only=comma_list(only, "--only") if only else None)
    else:
        entries = [val.Entry.from_experiment("config", exp, rate_of_capacity)]
    latency_for = functools.cache(exp.latency.model)
    created = not out.exists()
    try:
        with unpacked:
            result = val.run_validation(entries, out, latency_for, measured=measured,
                                        log=lambda msg: Console(stderr=True).print(msg, markup=False))
    finally:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a run that failed before writing anything leaves no empty directory either
    profiles = "; ".join(dict.fromkeys(val.profile_names(latency_for, entries).values()))
    if as_json or as_csv:
        emit([{**row, "profile": profiles} for row in result.summary] if as_csv else
             [{"summary": result.summary, "errors": result.errors, "profile": profiles}], "", as_json, as_csv)
    elif len(entries) == 1:
        emit(result.comparisons[0].rows, f"{entries[0].describe()} | errors are (predicted - measured) / measured",
             False, False, caption=f"predicted with profile {profiles} | files in {out}")
    else:
        emit(result.summary, f"validation: {len(entries)} configurations", False, False,
             caption=" | ".join(f"{k}: {v:.3g}" for k, v in result.errors.items())
             + f" | predicted with profile {profiles} | files in {out}")


def _saved_launches(path: Path) -> list:
    """The launch logs of every saved executor run under ``path`` (a directory of run directories, one run's
    directory, or a .tgz of them), read before the archive's temporary copy goes."""
    from calibration import validation as val
    from cdbsim.report.logs import RunLog

    if not path.exists():
        raise ConfigError(f"--launch-gap {path}: no such directory or archive")
    with val.unpacked_logs(path, "--launch-gap") as root:
        if not root.is_dir():
            raise ConfigError(f"--launch-gap {path}: not a directory of saved executor runs (or a .tgz of one)")
        runs = [root] if RunLog.saved_in(root) else sorted(d for d in root.iterdir() if RunLog.saved_in(d))
        if not runs:
            raise ConfigError(f"--launch-gap {path}: no saved executor runs in it")
        return [RunLog.load(run).launches for run in runs]


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
        "--update", help="Re-measure --families into this existing kernel profile; with --no-kernels, the "
                         "mixed-context core steps (family skew) into this --arch model's profile.")] = None,
    families: Annotated[str | None, typer.Option(
        "--families", help="Kernel-level: comma-separated families to measure (default: all).")] = None,
    launch_gap: Annotated[Path | None, typer.Option(
        "--launch-gap", help="With --refit: set the device's launch gap to the mean back-to-back gap over these "
                             "saved executor runs (a directory or .tgz, as validate --out saves them).")] = None,
) -> None:
    """Measure this GPU with the executor, fit the latency model, and write a profile per model and a
    kernel-level profile that predicts architectures nobody has built."""
    from calibration.fit import attention_rows, quality_rows, refit_profile, saturation_rows, with_launch_gap
    from calibration.run import calibrate as run_calibration
    from cdbsim.latency.profile import load_profile_file

    if launch_gap is not None and not refit:
        raise ConfigError("--launch-gap goes with --refit (it sets the gap of the profiles refitted)")
    if refit:  # every file checked, read and refitted before any is rewritten
        refitted = [(path, refit_profile(load_profile_file(check_file(path, "--refit", (".json",)))))
                    for path in refit]
        if launch_gap is not None:
            logs = _saved_launches(launch_gap)
            refitted = [(path, with_launch_gap(profile, logs)) for path, profile in refitted]
        for path, profile in refitted:
            profile.save(path)
            emit(quality_rows(profile), f"{profile.label()}: refitted fits", False, False,
                 caption=f"written to {path}")
            if profile.attention.get("points"):
                emit(attention_rows(profile), _mixed_context_title(profile.label(), profile), False, False)
        return
    check_dir(out, "--out")
    specs = [] if kernels else [load_arch(name) for name in comma_list(arch, "--arch")]
    if kernels is False and update is not None:
        _update_model_attention(specs, update, families, out, device)
        return
    if kernels is not False:
        base = load_profile_file(update) if update is not None else None
        from calibration.kernels import FAMILIES, calibrate_kernels, summary_rows

        chosen = tuple(comma_list(families, "--families")) if families else FAMILIES
        bad = [f for f in chosen if f not in FAMILIES]
        if bad:
            raise ConfigError(f"unknown kernel families {', '.join(bad)}; choose from: {', '.join(FAMILIES)}")
    from rich.status import Status

    with Status("calibrating", console=Console(stderr=True)) as status:
        profiles = run_calibration(specs, out, quick=quick, device=device, progress=status.update)
        if kernels is not False:
            kernel_profile = calibrate_kernels(out, device=device, quick=quick, progress=status.update,
                                               families=chosen, base=base)
    if kernels is not False:
        emit(summary_rows(kernel_profile), f"{kernel_profile.label()}: kernel tables", False, False,
             caption=f"written to {out / (kernel_profile.name + '.json')}")
    for spec, profile in zip(specs, profiles, strict=True):
        emit(quality_rows(profile), f"{profile.label()}: fits", False, False)
        if profile.attention:
            emit(attention_rows(profile), _mixed_context_title(spec.name, profile), False, False)
        emit(saturation_rows(profile, spec), f"{spec.name}: core stage and B*(L)", False, False,
             caption=f"written to {out / (profile.name + '.json')} and .png")


def _update_model_attention(specs: list, update: Path, families: str | None, out: Path, device: str) -> None:
    """``calibrate --no-kernels --update PROFILE``: the model's mixed-context core steps measured again into
    its profile (written to ``out``), every other fit kept."""
    from rich.status import Status

    from calibration.fit import attention_rows
    from calibration.measure import remeasure_attention
    from calibration.run import torch_device
    from cdbsim.latency.profile import ProfileKind, load_profile_file

    chosen = comma_list(families, "--families") if families else ["skew"]
    if chosen != ["skew"]:
        raise ConfigError(f"--update of a model profile re-measures the family skew only, not {', '.join(chosen)}")
    if len(specs) != 1:
        raise ConfigError(f"--update of a model profile takes one --arch, not {len(specs)}")
    profile = load_profile_file(check_file(update, "--update", (".json",)))
    if profile.kind is not ProfileKind.MEASURED:
        raise ConfigError(f"--update {update}: {profile.name} is a {profile.kind} profile, not a measured one")
    with Status("calibrating", console=Console(stderr=True)) as status:
        updated = remeasure_attention(specs[0], profile, torch_device(device), progress=status.update)
    path = out / update.name
    updated.save(path)
    emit(attention_rows(updated), _mixed_context_title(specs[0].name, updated), False, False,
         caption=f"written to {path}")


def _mixed_context_title(name: str, profile) -> str:
    """The title of a profile's mixed-context table: the attention width and sharpness it fitted."""
    slots = profile.attention_slots
    return (f"{name}: core steps with mixed context lengths (attention width "
            f"{f'{slots:,.0f}' if slots else 'not fitted'}, sharpness {profile.attention_sharpness:g})")


def main() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
