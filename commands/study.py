"""The study commands: a run's launches (schedule), its requests (trace), an architecture's bounds (bound), and
the throughput and latency of one configuration or several side by side (predict, compare, rate-sweep)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from cdbsim.errors import ConfigError, require
from cdbsim.planner.experiment import Experiment
from cdbsim.report.outputs import atomic_file, check_dir, check_file
from cdbsim.report.progress import progress_display
from cdbsim.serving.config import ServeConfig
from commands.common import RATE_SEARCHED, STUDY, CommandGroup, CsvOut, JsonOut, console, emit, emit_data, json_text

group = CommandGroup()
DEFAULT_KV_TOKENS = 327_680  # the CDB paper's KV cache size


@group.command("schedule", "arch", "serve", "workload", "exits", exclude=("workload.rate", "workload.arrival"),
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
    spec, config = exp.arch.spec(), exp.serve.config()
    exp = exp.override({"workload.rate": None})  # the schedule of an offline run: every request at t = 0
    kv = exp.serve
    tokens = DEFAULT_KV_TOKENS if kv.kv_tokens is None and kv.kv_blocks is None else kv.kv_tokens
    blocks = capacity_blocks(tokens=tokens, blocks=kv.kv_blocks, block_size=config.block_size)
    with progress_display() as factory:
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
    require(bool(rows), f"--skip {skip}: this run has only {seen:,} launches to show")
    emit(rows, f"{spec.name} ({spec.split}, r_max {spec.r_max}) | {config.describe()} | {exp.workload.name}",
         as_json, as_csv, caption="Q_P waiting prompts, Q_R tokens queued for the core (norefill: the wave), "
                                  "Q_C tokens queued for the coda; loop steps r1.. are 1-indexed")


@group.command("trace", "arch", "serve.timing", "workload", "exits", exclude=("workload.trace",))
def trace(
    exp: Experiment,
    out: Annotated[Path, typer.Option("--out", help="Where to write the trace (.csv or .parquet).")],
) -> None:
    """Write a request + exit-depth trace of a workload preset (replay it with --trace)."""
    from traces import write_trace

    check_file(out, "--out", (".csv", ".parquet"))
    spec = exp.arch.spec()
    workload_spec = exp.workload_spec(spec)
    with progress_display() as factory:
        reqs = workload_spec.build(spec, exp.serve.config().r_min(spec), factory, simulated=False)
    with atomic_file(out) as staging:
        write_trace(reqs, staging)
    console.print(f"wrote {len(reqs):,} requests ({workload_spec.describe()}) to {out}", markup=False, highlight=False)


@group.command("bound", "arch", "workload.name", "exits.mean_depth", "latency")
def bound(
    exp: Experiment,
    prefill_share: Annotated[float, typer.Option("--prefill-share", min=0.0, max=1.0,
                                                 help="Share a of GPU time CB spends in prefill.")] = 0.0,
    f1: Annotated[float | None, typer.Option("--f1", min=0.0, max=1.0, help="Fraction of output tokens produced by "
                                                                         "prefill (default: from --workload).")] = None,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Print the FLOP bounds S_dec and S_e2e, the KV bytes per token of each layout, and B*(L) of the core
    step from the latency profile in use (no GPU needed)."""
    from cdbsim.model.arch import KVLayout
    from cdbsim.model.bounds import s_dec, s_e2e
    from cdbsim.serving.launch import Stage
    from cdbsim.simulator.workload import default_mean_depth
    from traces import length_model

    spec = exp.arch.spec()
    depth_decoded = exp.exits.mean_depth
    if depth_decoded is None:
        depth_decoded = default_mean_depth(spec.r_max, spec.r_min)
    if not 1 <= depth_decoded <= spec.r_max:
        raise ConfigError(f"mean depth must be in [1, r_max = {spec.r_max}], got {depth_decoded:g}")
    require(prefill_share < 1.0, "--prefill-share must be below 1 (CB would spend all its time in prefill)")
    frac = f1 if f1 is not None else 1.0 / length_model(exp.workload.name).mean_output
    require(frac < 1.0, "--f1 must be below 1 (at least one token must be decoded)")
    latency = exp.latency.model(spec)
    dbar = frac * spec.r_max + (1 - frac) * depth_decoded
    sdec = s_dec(spec, dbar)
    row = {"arch": spec.name, "split": spec.split, "r_max": spec.r_max, "F0/Fr": spec.f0 / spec.fr,
           "decoded depth": depth_decoded, "f1": frac, "d-bar": dbar, "S_dec": sdec,
           "a": prefill_share, "S_e2e": s_e2e(sdec, prefill_share, frac)}
    row.update({f"KV B/token {layout.value}": spec.kv_bytes_per_token(layout) for layout in KVLayout})
    profile = latency.profile
    if profile.memory_bytes > 0:  # what the device holds at W = 64 (its weights and run time off 90% of it)
        from cdbsim.serving.config import ServeConfig
        from cdbsim.serving.memory import MemoryPlan, RequestShape

        for layout in KVLayout:
            plan = MemoryPlan.of(spec, ServeConfig(layout=layout), 0, RequestShape.FEWEST,
                                 profile.device.get("name", "device"), profile.memory_bytes)
            row[f"KV tokens that fit, {layout.value}"] = plan.largest_blocks() * plan.block_size
    row.update({f"B*({length})": latency.saturation_batch(length) for length in (128, 512, 2048, 8192)})
    row["delta loop step, ms"] = 1e3 * latency.costs[Stage.CORE].delta
    row["delta CB step, ms"] = 1e3 * latency.costs[Stage.DECODE].delta
    row["profile"] = latency.profile.label()
    if emit_data(as_json, as_csv, [row], [row]):
        return
    emit([{"quantity": k, "value": v} for k, v in row.items()], f"Bounds for {spec.name}",
         caption="d-bar counts each request's first token (from prefill) at r_max; B*(L) = delta / (gamma + "
                 "alpha L) of the core step, the batch where it stops being bound by reading the weights; delta: "
                 "the floor of one core launch (a loop step) and of a CB step (every layer at r_max); KV tokens "
                 "that fit: in 90% of the profile's device memory beside weights and run time at W = 64")


SaveLogs = Annotated[Path | None, typer.Option(
    "--save-logs", metavar="DIR", help="Write each run's launch and request logs, meta.json and trace.json.gz "
                                       "(a Perfetto / chrome://tracing timeline) to DIR/<run>/, replacing a run "
                                       "saved there before; a DIR/<run>/ holding other files is refused.")]
LogFormatOpt = Annotated[str, typer.Option("--log-format", help="Format of --save-logs: parquet or csv.")]
PlotCdf = Annotated[Path | None, typer.Option("--plot-cdf", metavar="FILE.png",
                                              help="Plot the CDFs of TTFT, TPOT, ITL and normalized latency.")]
PercentilesOpt = Annotated[str | None, typer.Option(
    "--percentiles", metavar="P,P,...", help="Latency percentiles to show, e.g. 50,90,99.9 (with mean and std).")]
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
        from cdbsim.report.logs import LogFormat, RunLog
        from cdbsim.report.metrics import parse_percentiles

        for run in runs if save_logs is not None else ():
            foreign = RunLog.foreign_files(save_logs / run)
            require(not foreign, f"--save-logs {save_logs}: {save_logs / run} holds files a saved run does not "
                                 f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}), which saving "
                                 f"would delete; give a new or empty directory")

        return cls(check_dir(save_logs, "--save-logs", runs) if save_logs is not None else None,
                   LogFormat.parse(log_format),
                   check_file(plot_cdf, "--plot-cdf", (".png",)) if plot_cdf is not None else None,
                   parse_percentiles(percentiles) if percentiles is not None else None,
                   check_file(plot_k, "--plot-k", (".png",)) if plot_k is not None else None)

    def finish(self, runs: dict[str, tuple[Any, Any]], dirs: dict[str, str], title: str, as_json: bool,
               as_csv: bool, profile: Any = None) -> None:
        """Recompute the chosen percentiles of ``runs`` (``{label: (report, log)}``), write their logs (to
        ``--save-logs``/``dirs[label]``) and plots, each whole or not at all, and print the reports (the caption
        names the executor build that measured ``profile``)."""
        if self.percentiles is not None:
            for report, log in runs.values():
                report.with_percentiles(log, self.percentiles)
        saved = f" | {measured_by(profile)}" if measured_by(profile) else ""
        memory = next(iter(runs.values()))[1].meta.get("memory") if runs else None
        if memory:
            saved += (f" | memory: headroom is what is left of {memory['memory_fraction']:.0%} of the "
                      f"{memory['device']}'s memory ({memory['usable_gib']:,.1f} GiB)")
        if self.save_logs is not None:
            for label, (_, log) in runs.items():
                log.save(self.save_logs / dirs[label], self.log_format)
            saved += f" | logs in {self.save_logs}"
        if self.plot_cdf is not None:
            from cdbsim.report.metrics import latency_samples
            from cdbsim.report.plots import plot_latency_cdfs

            with atomic_file(self.plot_cdf) as staging:
                plot_latency_cdfs({label: latency_samples(log) for label, (_, log) in runs.items()}, staging, title)
            saved += f" | CDFs in {self.plot_cdf}"
        if self.plot_k is not None:  # the coda batch over time: the runs that launch codas
            from cdbsim.report.plots import plot_coda_batch

            with atomic_file(self.plot_k) as staging:
                plot_coda_batch({label: log.launches for label, (_, log) in runs.items()
                                 if log.meta.get("policy") != "cb"}, staging, title)
            saved += f" | coda batches in {self.plot_k}"
        reports = {label: report for label, (report, _) in runs.items()}
        if as_json:
            sys.stdout.write(json_text({name: r.to_dict() for name, r in reports.items()}, default=str))
        elif as_csv:
            emit([csv_row(name, r, self.percentiles) for name, r in reports.items()], title, as_csv=True)
        else:
            emit(metric_rows(reports, self.percentiles), title, caption="speed-up and S_e2e are against CB on the "
                 f"same requests; S_e2e uses CB's prefill share{saved}")


def measured_by(profile: Any) -> str:
    """``profile from build 3f2a9c1e, torch 2.11, NVIDIA H200`` (or ``build unknown``) for a measured or kernel-level
    profile; empty for a roofline or constant one, which no build measured."""
    from cdbsim.latency.profile import ProfileKind

    if profile is None or profile.kind not in (ProfileKind.MEASURED, ProfileKind.KERNELS):
        return ""
    return f"profile from {profile.build_label()}"


def run_label(config: ServeConfig) -> str:
    """``refill K=1``, ``norefill`` or ``cb``: what differs between the columns of one study."""
    policy = config.policy.value
    return f"{policy} K={config.coda_batch}" if policy == "refill" else policy


METRICS = [("output tok/s", "output_tps", 1.0), ("requests/s", "request_rate", 1.0),
           ("makespan s", "makespan_s", 1.0), ("input tokens", "input_tokens", 1.0),
           ("device idle %", "device_idle", 100.0), ("prefill share %", "prefill_share", 100.0),
           ("preemptions", "preemptions", 1.0), ("KV blocks in use, mean", "kv_blocks_mean", 1.0),
           ("KV blocks in use, peak", "kv_blocks_peak", 1.0), ("mean depth d-bar", "mean_depth", 1.0),
           ("S_dec", "s_dec", 1.0), ("S_e2e", "s_e2e", 1.0), ("speed-up vs CB", "speedup", 1.0),
           ("% of S_e2e realised", "bound_realised", 100.0)]  # the latency rows go after the first four
NOT_LOGGED_IN_EVERY_RUN = ("kv_blocks_mean", "kv_blocks_peak", "preemptions")
LATENCY_ROWS = [("TTFT", "ttft_s", "s", 1.0, ("p50", "p99")), ("TPOT", "tpot_s", "ms", 1e3, ("p50",)),
                ("ITL", "itl_s", "ms", 1e3, ("p99",)), ("E2E", "e2e_s", "s", 1.0, ("p50",)),
                ("norm. latency", "normalized_s", "ms", 1e3, ("p50", "p99")),
                ("sched. delay", "scheduling_s", "s", 1.0, ("p50",))]  # with the percentiles shown by default


def _metrics(percentiles: tuple[float, ...] | None) -> list[tuple[str, Any, float]]:
    """The table's metrics; with ``--percentiles`` each latency's mean, std and the chosen percentiles in place of
    the default ones."""
    from cdbsim.report.metrics import percentile_name

    chosen = ("mean", "std", *map(percentile_name, percentiles)) if percentiles is not None else None
    latency = [(f"{label} {stat} {unit}", (key, stat), scale) for label, key, unit, scale, default in LATENCY_ROWS
               for stat in chosen or default]
    return METRICS[:4] + latency + METRICS[4:]


def _metric(report: Any, key: Any) -> Any:
    if not isinstance(key, tuple):
        return getattr(report, key)
    dist = getattr(report, key[0])
    return getattr(dist, key[1]) if key[1] in ("mean", "std", "p50", "p90", "p99") else dist.percentiles[key[1]]


def metric_rows(reports: dict[str, Any], percentiles: tuple[float, ...] | None = None) -> list[dict]:
    """One row per metric, one column per run; a figure a run's log does not hold (KV blocks in use, preemptions
    of an old log) is "n/a", one that does not apply (a speed-up without a baseline) "-"."""
    rows = []
    for label, key, scale in _metrics(percentiles):
        values = {name: _metric(report, key) for name, report in reports.items()}
        absent = "n/a" if key in NOT_LOGGED_IN_EVERY_RUN else "-"
        rows.append({"metric": label, **{name: absent if v is None else float(v) * scale
                                         for name, v in values.items()}})
    from cdbsim.report.metrics import MEMORY_ROWS

    for key, label in MEMORY_ROWS:  # the device memory plan (a simulated run's)
        if all(r.meta.get("memory") for r in reports.values()):
            rows.append({"metric": f"memory: {label} GiB", **{name: float(r.meta["memory"][f"{key}_gib"])
                                                            for name, r in reports.items()}})
    for stage in sorted({s for r in reports.values() for s in r.launches}):
        rows.append({"metric": f"{stage}: launches / mean B",
                     **{name: f"{r.launches.get(stage, 0):,} / {r.mean_batch.get(stage, 0):.1f}"
                        for name, r in reports.items()}})
    return rows


def csv_row(name: str, report: Any, percentiles: tuple[float, ...] | None) -> dict:
    """A run's CSV row: the report's flat row, the chosen latency percentiles, and the profile used."""
    row = {"run": name, **report.row()}
    for label, key, unit, scale, _ in LATENCY_ROWS if percentiles else ():
        dist = getattr(report, key)
        row[f"{label} mean {unit}"], row[f"{label} std {unit}"] = dist.mean * scale, dist.std * scale
        row.update({f"{label} {q} {unit}": v * scale for q, v in dist.percentiles.items()})
    row["profile"] = report.meta.get("profile", "")
    return row


@group.command("predict", *STUDY)
def predict(
    exp: Experiment,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Also simulate CB on the same "
                                                                            "requests.")] = True,
    save_logs: SaveLogs = None, log_format: LogFormatOpt = "parquet", plot_cdf: PlotCdf = None,
    percentiles: PercentilesOpt = None, plot_k_png: PlotK = None, as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Predict throughput and latency of one configuration (and of CB on the same requests)."""
    from cdbsim.planner.study import predict as simulate_experiment
    from cdbsim.serving.config import Policy

    require(plot_k_png is None or exp.serve.policy is not Policy.CB,
            f"--plot-k {plot_k_png}: the coda batch K is a refill policy's; --policy cb launches no codas "
            f"(choose norefill, refill or adaptive)")
    outputs = RunOutputs.check(save_logs, log_format, plot_cdf, percentiles, ("run", "cb") if baseline else ("run",),
                               plot_k_png)
    with progress_display() as factory:
        setup = exp.build(factory)
        result = simulate_experiment(setup, baseline=baseline, progress=factory)
    label = run_label(setup.config)
    runs = {label: (result.report, result.log)}
    if result.baseline is not None:
        runs["cb"] = (result.baseline.report, result.baseline.log)
    outputs.finish(runs, {label: "run", "cb": "cb"}, setup.title(), as_json, as_csv, setup.latency.profile)


@group.command("compare", *STUDY, exclude=("serve.policy",))
def compare(exp: Experiment, save_logs: SaveLogs = None, log_format: LogFormatOpt = "parquet",
            plot_cdf: PlotCdf = None, percentiles: PercentilesOpt = None, plot_k_png: PlotK = None,
            as_json: JsonOut = False, as_csv: CsvOut = False) -> None:
    """CB, CDB no-refill, CDB refill and adaptive CDB side by side on the same requests, with the bounds."""
    from cdbsim.planner.study import compare_policies
    from cdbsim.serving.config import Policy

    outputs = RunOutputs.check(save_logs, log_format, plot_cdf, percentiles, tuple(p.value for p in Policy),
                               plot_k_png)
    with progress_display() as factory:
        setup = exp.build(factory)
        results = compare_policies(setup.arch, setup.config, setup.requests, setup.latency, setup.kv, factory)
    labels = [run_label(replace(setup.config, policy=r.log.meta["policy"])) for r in results]
    runs = {label: (r.report, r.log) for label, r in zip(labels, results, strict=True)}
    dirs = {label: r.log.meta["policy"] for label, r in zip(labels, results, strict=True)}
    outputs.finish(runs, dirs, setup.title(), as_json, as_csv, setup.latency.profile)


@group.command("rate-sweep", *STUDY, exclude=RATE_SEARCHED)
def rate_sweep(
    exp: Experiment,
    rates: Annotated[str | None, typer.Option("--rates", help="Comma-separated request rates (req/s); default: "
                                                              "fractions of refill's offline capacity.")] = None,
    plot: Annotated[Path, typer.Option("--plot", metavar="FILE.png",
                                       help="Where to write the PNG plot.")] = Path("rate-sweep.png"),
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Normalized latency and throughput against Poisson request rate for each policy, with the knee."""
    from cdbsim.planner.study import latency_knee, run_one
    from cdbsim.planner.study import rate_sweep as sweep
    from cdbsim.report.plots import plot_rate_sweep

    require(exp.workload.trace is None, "rate-sweep draws Poisson arrivals for a workload preset; it cannot sweep "
            f"the trace file {exp.workload.trace} (unset workload.trace)")
    check_file(plot, "--plot", (".png",))
    rate_list = None
    if rates is not None:
        try:
            rate_list = [float(x) for x in rates.split(",")]
        except ValueError:
            raise ConfigError(f"--rates must be comma-separated numbers, got {rates!r}") from None
        bad = [r for r in rate_list if not (math.isfinite(r) and r > 0)]
        if bad:
            raise ConfigError(f"--rates must be finite numbers > 0 req/s, got {bad[0]:g}")
    with progress_display() as factory:
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
    if emit_data(as_json, as_csv, [{**row, "profile": profile} for row in rows],
                 [{"points": rows, "knees": knees, "profile": profile, "plot": str(plot)}]):
        return
    emit(rows, setup.title(),
         caption="knee (mean normalized latency 2x its lowest-rate value): "
                 + ", ".join(f"{k} {v:.3g} req/s" if v else f"{k} none in range" for k, v in knees.items())
                 + f" | plot: {plot}")
