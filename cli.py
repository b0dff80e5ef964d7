"""The ``cdbsim`` command line: parse, call the library, print. No logic a library user would need."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cdbsim.arch import ArchSpec, load_arch
from cdbsim.config import ServeConfig
from cdbsim.errors import ConfigError
from traces import ExitModel

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


# ----- shared options ----------------------------------------------------------------------------
Arch = Annotated[str, typer.Option("--arch", help="Preset (ouro-1.4b, ouro-2.6b, huginn-3.5b) or an "
                                                  "architecture JSON file.")]
Split = Annotated[str | None, typer.Option("--split", help="Re-split the layers as prelude-core-coda, "
                                                           "e.g. 1-4-1.")]
RMax = Annotated[int | None, typer.Option("--r-max", help="Maximum loops per token (default: the model's).")]
RMin = Annotated[int | None, typer.Option("--r-min", help="Minimum exit depth of the model (default 1; the "
                                                          "lookahead gate raises it to 2).")]
PolicyOpt = Annotated[str, typer.Option("--policy", help="cb, norefill or refill.")]
Width = Annotated[int, typer.Option("--W", "--width", help="Resident requests and tokens per decode launch.")]
CodaK = Annotated[int, typer.Option("--K", "--coda-batch", help="Coda batch refill waits for (1 <= K <= W).")]
Budget = Annotated[int, typer.Option("--M", "--prefill-budget", help="Prompt tokens per prefill launch.")]
TimingOpt = Annotated[str, typer.Option("--timing", help="sync, async or lookahead (lookahead: r_min = 2).")]
Layout = Annotated[str, typer.Option("--kv-layout", help="depth (with last-exited fill), shared or "
                                                         "first-shared.")]
Workload = Annotated[str, typer.Option("--workload", help="alpaca, sharegpt or arxiv.")]
TraceOpt = Annotated[Path | None, typer.Option("--trace", help="Replay a request+exit trace (.csv/.parquet) "
                                                              "instead of a workload preset.")]
Requests = Annotated[int | None, typer.Option("--requests", "-n", help="Number of requests (default per "
                                                                       "workload).")]
Rate = Annotated[float | None, typer.Option("--rate", help="Poisson arrivals at this many requests/s "
                                                           "(default: offline, all at t = 0).")]
Exits = Annotated[str, typer.Option("--exits", help="Exit model: none, fixed or synthetic.")]
Depth = Annotated[int | None, typer.Option("--depth", help="Depth for --exits fixed.")]
MeanDepth = Annotated[float | None, typer.Option("--mean-depth", help="Mean requested depth of the "
                                                                      "synthetic model (default: "
                                                                      "(r_max + 1) / 2).")]
Dispersion = Annotated[float, typer.Option("--dispersion", help="Synthetic depth dispersion in [0, 1).")]
Correlation = Annotated[float, typer.Option("--correlation", help="Token-to-token depth correlation.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed for lengths, arrivals and depths.")]
KVTokens = Annotated[int | None, typer.Option("--kv-tokens", help="KV capacity in tokens.")]
KVBlocks = Annotated[int | None, typer.Option("--kv-blocks", help="KV capacity in blocks of 16 tokens.")]
ProfileOpt = Annotated[str, typer.Option("--profile", help="auto (a shipped measured profile of this shape, else "
                                                            "the H200 roofline), roofline, a shipped name, or "
                                                            "a profile JSON file.")]
Force = Annotated[bool, typer.Option("--force", help="Use a profile made for another shape, filling gaps "
                                                     "from the roofline.")]
Bandwidth = Annotated[float | None, typer.Option("--bandwidth", help="Roofline: memory bandwidth in TB/s.")]
Matmul = Annotated[float | None, typer.Option("--matmul-tflops", help="Roofline: matmul rate in TFLOP/s.")]
LaunchUs = Annotated[float | None, typer.Option("--launch-us", help="Roofline: per-kernel launch cost in us.")]
MemoryGb = Annotated[float | None, typer.Option("--memory-gb", help="Roofline: device memory in GB.")]
HostUs = Annotated[float | None, typer.Option("--host-us", help="Roofline: host time per launch in us.")]
SaveLogs = Annotated[Path | None, typer.Option("--save-logs", help="Write launch and request logs here.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
CsvOut = Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")]


def build_arch(arch: str, split: str | None, r_max: int | None, r_min: int | None = None) -> ArchSpec:
    return load_arch(arch, split=split, r_max=r_max, r_min=r_min)


def build_exits(arch: ArchSpec, exits: str, depth: int | None, mean_depth: float | None,
                dispersion: float, correlation: float) -> ExitModel:
    from cdbsim.workload import default_mean_depth

    mean = mean_depth if mean_depth is not None else default_mean_depth(arch.r_max)
    return ExitModel(exits, depth=depth, mean=mean, dispersion=dispersion, correlation=correlation)


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


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# ----- commands ----------------------------------------------------------------------------------
@app.command()
@friendly
def schedule(
    arch: Arch = "ouro-1.4b", split: Split = None, r_max: RMax = None, r_min: RMin = None,
    policy: PolicyOpt = "refill",
    width: Width = 64, coda_batch: CodaK = 1, prefill_budget: Budget = 8192, timing: TimingOpt = "lookahead",
    kv_layout: Layout = "depth", workload: Workload = "sharegpt", trace: TraceOpt = None,
    requests: Requests = 256, exits: Exits = "synthetic", depth: Depth = None,
    mean_depth: MeanDepth = None, dispersion: Dispersion = 0.3, correlation: Correlation = 0.5,
    seed: Seed = 0, kv_tokens: KVTokens = None, kv_blocks: KVBlocks = None,
    launches: Annotated[int, typer.Option("--launches", help="How many launches to show.")] = 20,
    skip: Annotated[int, typer.Option("--skip", help="Launches to skip before showing.")] = 0,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Print the first launches of a run as a table (stage, batch, loop-step mix, queues)."""
    from cdbsim.kv import capacity_blocks
    from cdbsim.replay import drive
    from cdbsim.scheduler import Scheduler
    from cdbsim.workload import WorkloadSpec

    spec = build_arch(arch, split, r_max, r_min)
    config = ServeConfig(policy=policy, width=width, coda_batch=coda_batch, prefill_budget=prefill_budget,
                         timing=timing, layout=kv_layout)
    exit_model = build_exits(spec, exits, depth, mean_depth, dispersion, correlation)
    reqs = WorkloadSpec(workload, requests, None, exit_model, seed, str(trace) if trace else None).build(
        spec, config.r_min(spec))
    if kv_tokens is None and kv_blocks is None:
        kv_tokens = DEFAULT_KV_TOKENS
    blocks = capacity_blocks(spec, config.layout, tokens=kv_tokens, blocks=kv_blocks)
    rows = []
    for launch in drive(Scheduler(spec, config, reqs, blocks)):
        if launch.index < skip:
            continue
        if len(rows) >= launches:
            break
        rows.append({"#": launch.index + 1, "stage": launch.stage.value, "B": launch.size,
                     "padded": launch.padded, "detail": describe_launch(launch),
                     "Q_P": launch.queue_waiting, "Q_R": launch.queue_core, "Q_C": launch.queue_coda,
                     "active": launch.active})
    emit(rows, f"{spec.name} ({spec.split}, r_max {spec.r_max}) | {config.describe()} | {workload}",
         as_json, as_csv, caption="Q_P waiting prompts, Q_R tokens queued for the core (norefill: the wave), "
                                  "Q_C tokens queued for the coda; loop steps r1.. are 1-indexed")


def describe_launch(launch: Any) -> str:
    """``r1:30 r2:12, 5 exit`` for core launches, ``1,024 tok, 3 chunk(s), 2 done`` for prefill."""
    if launch.stage.value == "prefill":
        done = sum(launch.finishes)
        return f"{launch.size:,} tok, {len(launch.chunk_lens)} chunk(s), {done} done"
    if launch.stage.value == "core":
        mix = " ".join(f"r{s + 1}:{c}" for s, c in launch.step_mix().items())
        return f"{mix}, {sum(launch.exits)} exit"
    return f"{launch.size} token(s)"


@app.command()
@friendly
def trace(
    out: Annotated[Path, typer.Option("--out", help="Where to write the trace (.csv or .parquet).")],
    arch: Arch = "ouro-1.4b", split: Split = None, r_max: RMax = None, r_min: RMin = None,
    timing: TimingOpt = "lookahead", workload: Workload = "sharegpt", requests: Requests = None, rate: Rate = None,
    exits: Exits = "synthetic", depth: Depth = None, mean_depth: MeanDepth = None, dispersion: Dispersion = 0.3,
    correlation: Correlation = 0.5, seed: Seed = 0,
) -> None:
    """Write a request + exit-depth trace of a workload preset (replay it with --trace)."""
    from cdbsim.workload import WorkloadSpec
    from traces import write_trace

    spec = build_arch(arch, split, r_max, r_min)
    exit_model = build_exits(spec, exits, depth, mean_depth, dispersion, correlation)
    workload_spec = WorkloadSpec(workload, requests, rate, exit_model, seed)
    reqs = workload_spec.build(spec, ServeConfig(timing=timing).r_min(spec))
    write_trace(reqs, out)
    console.print(f"wrote {len(reqs):,} requests ({workload_spec.describe()}) to {out}", markup=False,
                  highlight=False)


@app.command()
@friendly
def bound(
    arch: Arch = "ouro-1.4b", split: Split = None, r_max: RMax = None,
    mean_depth: Annotated[float | None, typer.Option("--mean-depth", help="Mean requested depth d-bar of "
                                                                          "decoded tokens.")] = None,
    prefill_share: Annotated[float, typer.Option("--prefill-share", help="Share a of GPU time CB spends in "
                                                                         "prefill.")] = 0.0,
    f1: Annotated[float | None, typer.Option("--f1", help="Fraction of output tokens produced by prefill "
                                                          "(default: from --workload).")] = None,
    workload: Workload = "sharegpt",
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Print the FLOP bounds S_dec and S_e2e and the KV bytes per token of each layout."""
    from cdbsim.bounds import s_dec, s_e2e
    from cdbsim.kvlayout import KVLayout
    from cdbsim.workload import default_mean_depth
    from traces import length_model

    spec = build_arch(arch, split, r_max)
    depth_decoded = mean_depth if mean_depth is not None else default_mean_depth(spec.r_max)
    frac = f1 if f1 is not None else 1.0 / length_model(workload).mean_output
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


def build_latency(spec: ArchSpec, profile: str, force: bool, bandwidth: float | None, matmul: float | None,
                  launch_us: float | None, memory_gb: float | None, host_us: float | None) -> Any:
    """The latency model: a named/shipped profile, or the roofline with the device figures given."""
    from dataclasses import replace

    from calibration.shipped import resolve_profile
    from cdbsim.latency import H200, LatencyModel

    overrides = {k: v for k, v in {"bandwidth": bandwidth and bandwidth * 1e12,
                                   "matmul_flops": matmul and matmul * 1e12,
                                   "launch_s": launch_us and launch_us * 1e-6,
                                   "memory_bytes": memory_gb and memory_gb * 1e9,
                                   "host_launch_s": host_us and host_us * 1e-6}.items() if v}
    device = replace(H200, name="custom device", **overrides) if overrides else H200
    if overrides and profile == "auto":
        profile = "roofline"
    return LatencyModel(spec, resolve_profile(profile, spec, device), force=force)


def progress_bars() -> tuple[Any, Callable[[str, int], Callable[[int], None]]]:
    """A rich progress display (on stderr) and a factory giving each run its own bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)

    def factory(label: str, total: int) -> Callable[[int], None]:
        task = bars.add_task(label, total=total)
        return lambda n: bars.advance(task, n)

    return bars, factory


class Setup:
    """Everything a simulated run needs, built from the shared command-line options."""

    def __init__(self, arch: str, split: str | None, r_max: int | None, r_min: int | None, policy: str,
                 width: int, coda_batch: int, prefill_budget: int, timing: str, kv_layout: str, workload: str,
                 trace: Path | None, requests: int | None, rate: float | None, exits: str, depth: int | None,
                 mean_depth: float | None, dispersion: float, correlation: float, seed: int,
                 kv_tokens: int | None, kv_blocks: int | None, latency: tuple) -> None:
        from cdbsim.study import KVCapacity
        from cdbsim.workload import WorkloadSpec

        self.arch = build_arch(arch, split, r_max, r_min)
        self.config = ServeConfig(policy=policy, width=width, coda_batch=coda_batch,
                                  prefill_budget=prefill_budget, timing=timing, layout=kv_layout)
        exit_model = build_exits(self.arch, exits, depth, mean_depth, dispersion, correlation)
        self.workload = WorkloadSpec(workload, requests, rate, exit_model, seed, str(trace) if trace else None)
        self.latency = build_latency(self.arch, *latency)
        self.kv = KVCapacity(tokens=kv_tokens, blocks=kv_blocks)
        self.requests = self.workload.build(self.arch, self.config.r_min(self.arch))

    def title(self) -> str:
        c = self.config
        return (f"{self.arch.name} ({self.arch.split}, r_max {self.arch.r_max}) | W={c.width} M={c.prefill_budget} "
                f"{c.timing.value} {c.layout.value}-KV | {self.workload.describe()} | "
                f"profile {self.latency.profile.label()}")


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
def predict(
    arch: Arch = "ouro-1.4b", split: Split = None, r_max: RMax = None, r_min: RMin = None,
    policy: PolicyOpt = "refill", width: Width = 64, coda_batch: CodaK = 1, prefill_budget: Budget = 8192,
    timing: TimingOpt = "lookahead", kv_layout: Layout = "depth", workload: Workload = "sharegpt",
    trace: TraceOpt = None, requests: Requests = None, rate: Rate = None, exits: Exits = "synthetic",
    depth: Depth = None, mean_depth: MeanDepth = None, dispersion: Dispersion = 0.3,
    correlation: Correlation = 0.5, seed: Seed = 0, kv_tokens: KVTokens = None, kv_blocks: KVBlocks = None,
    profile: ProfileOpt = "auto", force: Force = False, bandwidth: Bandwidth = None, matmul_tflops: Matmul = None,
    launch_us: LaunchUs = None, memory_gb: MemoryGb = None, host_us: HostUs = None,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Also simulate CB on the same "
                                                                            "requests.")] = True,
    save_logs: SaveLogs = None, as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Predict throughput and latency of one configuration (and of CB on the same requests)."""

    from cdbsim.study import run_one, with_baseline

    setup = Setup(arch, split, r_max, r_min, policy, width, coda_batch, prefill_budget, timing, kv_layout,
                  workload, trace, requests, rate, exits, depth, mean_depth, dispersion, correlation, seed,
                  kv_tokens, kv_blocks, (profile, force, bandwidth, matmul_tflops, launch_us, memory_gb, host_us))
    bars, factory = progress_bars()
    with bars:
        if baseline:
            result, base = with_baseline(setup.arch, setup.config, setup.requests, setup.latency, setup.kv,
                                         factory)
        else:
            result, base = run_one(setup.arch, setup.config, setup.requests, setup.latency, setup.kv,
                                   factory), None
    reports = {run_label(setup.config): result.report}
    if base is not None:
        reports["cb"] = base.report
    if save_logs:
        result.log.save(save_logs / "run")
        if base is not None:
            base.log.save(save_logs / "cb")
    emit_reports(reports, setup.title(), as_json, as_csv)


@app.command()
@friendly
def compare(
    arch: Arch = "ouro-1.4b", split: Split = None, r_max: RMax = None, r_min: RMin = None,
    width: Width = 64, coda_batch: CodaK = 1, prefill_budget: Budget = 8192, timing: TimingOpt = "lookahead",
    kv_layout: Layout = "depth", workload: Workload = "sharegpt", trace: TraceOpt = None,
    requests: Requests = None, rate: Rate = None, exits: Exits = "synthetic", depth: Depth = None,
    mean_depth: MeanDepth = None, dispersion: Dispersion = 0.3, correlation: Correlation = 0.5, seed: Seed = 0,
    kv_tokens: KVTokens = None, kv_blocks: KVBlocks = None, profile: ProfileOpt = "auto", force: Force = False,
    bandwidth: Bandwidth = None, matmul_tflops: Matmul = None, launch_us: LaunchUs = None,
    memory_gb: MemoryGb = None, host_us: HostUs = None, save_logs: SaveLogs = None,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """CB, CDB no-refill and CDB refill side by side on the same requests, with the bounds."""
    from dataclasses import replace

    from cdbsim.study import compare_policies

    setup = Setup(arch, split, r_max, r_min, "refill", width, coda_batch, prefill_budget, timing, kv_layout,
                  workload, trace, requests, rate, exits, depth, mean_depth, dispersion, correlation, seed,
                  kv_tokens, kv_blocks, (profile, force, bandwidth, matmul_tflops, launch_us, memory_gb, host_us))
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
def rate_sweep(
    arch: Arch = "ouro-1.4b", split: Split = None, r_max: RMax = None, r_min: RMin = None,
    width: Width = 64, coda_batch: CodaK = 1, prefill_budget: Budget = 8192, timing: TimingOpt = "lookahead",
    kv_layout: Layout = "depth", workload: Workload = "sharegpt", requests: Requests = None,
    exits: Exits = "synthetic", depth: Depth = None, mean_depth: MeanDepth = None, dispersion: Dispersion = 0.3,
    correlation: Correlation = 0.5, seed: Seed = 0, kv_tokens: KVTokens = None, kv_blocks: KVBlocks = None,
    profile: ProfileOpt = "auto", force: Force = False, bandwidth: Bandwidth = None,
    matmul_tflops: Matmul = None, launch_us: LaunchUs = None, memory_gb: MemoryGb = None, host_us: HostUs = None,
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

    setup = Setup(arch, split, r_max, r_min, "refill", width, coda_batch, prefill_budget, timing, kv_layout,
                  workload, None, requests, None, exits, depth, mean_depth, dispersion, correlation, seed,
                  kv_tokens, kv_blocks, (profile, force, bandwidth, matmul_tflops, launch_us, memory_gb, host_us))
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


@app.command()
@friendly
def validate(
    matrix: Annotated[Path | None, typer.Option("--matrix", help="A validation matrix JSON file (default: one "
                                                                 "configuration from the options below).")] = None,
    only: Annotated[str | None, typer.Option("--only", help="Comma-separated config names of the matrix.")] = None,
    measured: Annotated[Path | None, typer.Option("--measured", help="Compare against executor logs saved in "
                                                                     "this directory instead of running the "
                                                                     "GPU.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Where logs, tables and plots go.")] = Path("validation"),
    arch: Arch = "ouro-1.4b", split: Split = None, policy: PolicyOpt = "refill", width: Width = 64,
    coda_batch: CodaK = 1, timing: TimingOpt = "lookahead", kv_layout: Layout = "depth",
    workload: Workload = "alpaca", requests: Requests = 128, exits: Exits = "synthetic",
    mean_depth: MeanDepth = None, seed: Seed = 1, kv_tokens: Annotated[int, typer.Option(
        "--kv-tokens", help="KV capacity in tokens (executor and simulator).")] = 65536,
    rate_of_capacity: Annotated[float | None, typer.Option("--rate-of-capacity", help="Online run: Poisson "
                                                           "arrivals at this fraction of the simulated "
                                                           "offline capacity.")] = None,
    profile: ProfileOpt = "auto", force: Force = False, as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Run configurations on the GPU executor and in the simulator on identical requests; show the errors."""
    from calibration import validation as val
    from calibration.shipped import resolve_profile
    from cdbsim.latency import LatencyModel
    from cdbsim.validate import error_summary, plot_scatter, plot_timelines

    if matrix is not None:
        entries = val.load_matrix(matrix)
        if only:
            wanted = set(only.split(","))
            unknown_names = wanted - {e.name for e in entries}
            if unknown_names:
                raise ConfigError(f"{matrix}: no config named {', '.join(sorted(unknown_names))}")
            entries = [e for e in entries if e.name in wanted]
    else:
        entries = [val.Entry(name="config", arch=arch, split=split, policy=policy, coda_batch=coda_batch,
                             width=width, layout=kv_layout, timing=timing, workload=workload,
                             requests=requests or 128, exits=exits, mean_depth=mean_depth, seed=seed,
                             kv_tokens=kv_tokens, rate_of_capacity=rate_of_capacity)]
        entries[0].config()  # refuse impossible settings before any work
    cache: dict[str, Any] = {}

    def latency_for(spec: ArchSpec) -> Any:
        if spec.name not in cache:
            cache[spec.name] = LatencyModel(spec, resolve_profile(profile, spec), force=force)
        return cache[spec.name]

    out.mkdir(parents=True, exist_ok=True)
    if measured is not None:
        logs = val.load_measured(entries, measured)
    else:
        logs = val.measure(entries, out / "measured", latency_for,
                           log=lambda msg: Console(stderr=True).print(msg, markup=False))
    comparisons = val.compare(entries, logs, latency_for)
    summary = [c.summary() for c in comparisons]
    errors = error_summary(comparisons)
    (out / "summary.json").write_text(json.dumps(
        {"summary": summary, "errors": errors, "profiles": val.profile_names(latency_for, entries),
         "configs": {e.name: e.describe() for e in entries},
         "details": {c.name: c.rows for c in comparisons},
         "stages": {c.name: c.stages for c in comparisons}}, indent=2, default=float))
    import pandas as pd

    pd.DataFrame(summary).to_csv(out / "summary.csv", index=False)
    pd.DataFrame([{"config": c.name, **row} for c in comparisons for row in c.stages]).to_csv(
        out / "stages.csv", index=False)
    plot_scatter(comparisons, out / "scatter.png")
    first = comparisons[0]
    if first.measured_log is not None and first.predicted_log is not None:
        plot_timelines(first.measured_log, first.predicted_log, out / "timeline.png", title=first.name)
    if as_json or as_csv:
        emit(summary if as_csv else [{"summary": summary, "errors": errors}], "", as_json, as_csv)
        return
    if len(comparisons) == 1:
        emit(first.rows, f"{entries[0].describe()} | errors are (predicted - measured) / measured", False, False)
    else:
        emit(summary, f"validation: {len(comparisons)} configurations", False, False,
             caption=" | ".join(f"{k}: {v:.3g}" for k, v in errors.items()) + f" | files in {out}")


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
) -> None:
    """Measure this GPU with the executor, fit the latency model, and write a profile per model."""
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
    specs = [load_arch(name.strip()) for name in arch.split(",") if name.strip()]
    from rich.status import Status

    with Status("calibrating", console=Console(stderr=True)) as status:
        profiles = run_calibration(specs, out, quick=quick, device=device, progress=status.update)
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
