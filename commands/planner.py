"""The planning commands: a grid of configurations simulated point by point (sweep), and the highest request
rate that meets latency SLOs (capacity). Both spread their simulations over processes or a Dask cluster."""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from cdbsim.planner.experiment import Experiment
from cdbsim.report.outputs import check_file
from cdbsim.report.progress import progress_display
from commands.common import RATE_SEARCHED, STUDY, CommandGroup, CsvOut, FileTables, JsonOut, comma_list, emit, emit_data

group = CommandGroup()
MAX_SKIPPED_SHOWN = 20  # skipped points listed after the tables; the rest are in the results file
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", help="Run simulations in this many local processes.")]
DaskOpt = Annotated[str | None, typer.Option(
    "--dask", metavar="ADDRESS", help="Run simulations on a Dask cluster: a scheduler address (tcp://host:8786) or "
                                      "'local' for a LocalCluster of --jobs workers (pip install 'cdbsim[dask]').")]


@contextmanager
def stopped_cleanly() -> Iterator[None]:
    """Let SIGTERM (a job scheduler's stop, ``kill``) unwind like Ctrl-C, so partial files are removed."""
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@group.command("sweep", *STUDY, tables=("grid", "points"))
def sweep(
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
        "--cache", help="The results cache (SQLite); default ~/.cache/cdbsim/points.sqlite (under "
                        "$XDG_CACHE_HOME if set).")] = None,
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
    with stopped_cleanly(), progress_display() as factory:
        advance = factory("points", len(plan))  # progress is told (done, total) once per point
        run_sweep(plan, jobs=jobs, dask=dask, cache=None if no_cache else cache or default_cache_path(), parquet=out,
                  csv=csv_out, progress=lambda _done, _total: advance(1), each=summary.add)
    seconds = time.monotonic() - start
    title = f"sweep of {len(plan):,} points over {', '.join(plan.fields)}"
    files = [out, *([csv_out] if csv_out is not None else [])]
    if plots:
        files += summary.plot(out.with_suffix(""), title)
    counts = plan.counts
    if as_json:
        emit({"points": len(plan), "simulated": counts.simulated, "cached": counts.cached, "skipped": counts.skipped,
              "seconds": seconds, "best": summary.best_rows(), "front_tpot": summary.front_rows(0),
              "front_depth": summary.front_rows(1), "skipped_points": summary.skipped,
              "files": [str(f) for f in files]}, "", as_json=True)
        return
    emit(summary.best_rows(), f"Best points of the {title}",
         caption=f"{len(plan):,} points: {counts.simulated:,} simulated, {counts.cached:,} from the cache, "
                 f"{counts.skipped:,} skipped, in {seconds:.1f} s | wrote {', '.join(map(str, files))}")
    emit(summary.front_rows(0), "Pareto front: throughput per GPU against p99 TPOT")
    for skipped in summary.skipped[:MAX_SKIPPED_SHOWN]:
        typer.echo(f"skipped point {skipped['point']} ({skipped['settings']}): {skipped['reason']}")
    if len(summary.skipped) > MAX_SKIPPED_SHOWN:
        typer.echo(f"... and {len(summary.skipped) - MAX_SKIPPED_SHOWN:,} more skipped points (status and reason "
                   f"columns of {out})")


@group.command("capacity", *STUDY, exclude=RATE_SEARCHED)
def capacity(
    exp: Experiment,
    ttft_s: Annotated[float | None, typer.Option("--ttft-s", help="TTFT limit in seconds.")] = None,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", help="TPOT limit in milliseconds.")] = None,
    norm_ms: Annotated[float | None, typer.Option("--norm-latency-ms", help="Normalized latency (E2E / output "
                                                                            "tokens) limit in ms.")] = None,
    norm_mean_ms: Annotated[float | None, typer.Option(
        "--norm-latency-mean-ms", help="Limit on the run's mean normalized latency, ms.")] = None,
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
    from cdbsim.planner.capacity import SLO, check_target_rate
    from cdbsim.planner.capacity import capacity as search

    tpot_s, norm_s, norm_mean_s = (None if ms is None else ms / 1e3 for ms in (tpot_ms, norm_ms, norm_mean_ms))
    slo = SLO(ttft_s=ttft_s, tpot_s=tpot_s, normalized_s=norm_s, normalized_mean_s=norm_mean_s, attainment=attainment)
    if target_rate is not None:
        check_target_rate(target_rate)
    chosen = comma_list(policies, "--policies")
    with progress_display() as factory:
        advance = factory("capacity searches (one per policy)", len(chosen))
        results = search(exp, slo, chosen, jobs=jobs, dask=dask, progress=lambda _done, _total: advance(1))
    rows = [r.row(target_rate) for r in results]
    if emit_data(as_json, as_csv, rows, [{"slo": slo.describe(), "results": rows}]):
        return
    notes = " | ".join(f"{row['policy']}: {row.pop('note')}" for row in rows if "note" in row)

    def shown(value: Any) -> Any:
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else value

    emit([{"": key, **{row["policy"]: shown(row[key]) for row in rows}} for key in rows[0] if key != "policy"],
         f"Capacity under {slo.describe()} | {exp.arch.spec().name} W={exp.serve.width} | {exp.workload.name} "
         f"({exp.workload.requests or 'default'} requests, Poisson)",
         caption="req/s per GPU: the highest Poisson rate found to meet the SLOs (one simulated GPU); search within "
                 "%: how far above it the lowest failing rate was" + (f" | {notes}" if notes else ""))
