"""``cdbsim.sweep``: simulate every point of a grid of experiments and get one row per point.

Any field of an :class:`~cdbsim.planner.experiment.Experiment` can be swept (:mod:`cdbsim.planner.grid`). Points run
anywhere (:mod:`cdbsim.planner.parallel`), are cached by content (:mod:`cdbsim.planner.point_cache`) and come back in
grid order, bit for bit the same. A point that cannot run is a row with status ``skipped`` and the reason.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdbsim.errors import ConfigError, require
from cdbsim.planner.experiment import ArchSection, BuiltExperiment, Experiment, LatencySection, settings
from cdbsim.planner.grid import Grid
from cdbsim.planner.options import plain, unwrap_optional
from cdbsim.planner.parallel import Job, in_order, runner
from cdbsim.planner.point_cache import PointCache, point_key
from cdbsim.report.metrics import Distribution, Report
from cdbsim.serving.launch import STAGES
from cdbsim.serving.memory import RequestShape
from traces.choice import Choice

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from cdbsim.latency.model import LatencyModel

SweepProgress = Callable[[int, int], None]  # called with (points done, points in all) as each row is ready


class Status(Choice):
    """Whether a point ran."""

    OK = "ok"
    SKIPPED = "skipped"


# columns every row has before its metrics; layers_per_token = prelude + d-bar x core + coda (comparable across models)
DESCRIPTION: dict[str, type] = {"status": str, "reason": str, "arch": str, "split": str, "r_max": int,
                                "params": int, "layers_per_token": float, "profile": str}


def describe(setup: BuiltExperiment, report: Report) -> dict[str, Any]:
    """The resolved model and latency profile of a point (what its swept fields amounted to)."""
    arch = setup.arch
    return {"status": Status.OK.value, "reason": "", "arch": arch.name, "split": arch.split, "r_max": arch.r_max,
            "params": arch.total_params, "layers_per_token": arch.prelude + report.mean_depth * arch.core + arch.coda,
            "profile": setup.latency.profile.label()}


def skipped_row(reason: str) -> dict[str, Any]:
    return {"status": Status.SKIPPED.value, "reason": reason}


@dataclass(frozen=True)
class PointTask:
    """What a worker gets for one point: the experiment and whether to run CB on the same requests too."""

    experiment: Experiment
    baseline: bool = False


def run_point(task: PointTask) -> dict[str, Any]:
    """Simulate one point: its description and metrics, or why it was skipped (the latency model is built here)."""
    from cdbsim.planner.study import predict

    try:
        setup = task.experiment.build()
        result = predict(setup, baseline=task.baseline)
    except ConfigError as exc:
        return skipped_row(str(exc))
    return {**describe(setup, result.report), **flatten(result.report)}


@lru_cache(maxsize=64)
def _latency(arch: ArchSection, latency: LatencySection) -> LatencyModel:
    return latency.model(arch.spec())


def impossible(exp: Experiment) -> str | None:
    """Why ``exp`` cannot run, as far as can be told without building its requests; None if it can."""
    try:
        arch = exp.arch.spec()
        config = exp.serve.config()
        exp.exits.exit_model(arch, config.r_min(arch)).pmf(config.r_min(arch), arch.r_max)
        exp.serve.kv_capacity().blocks_for(arch, config, _latency(exp.arch, exp.latency), RequestShape.FEWEST)
    except ConfigError as exc:
        return str(exc)
    return None


def arrow_type(hint: Any) -> pa.DataType:
    """The Arrow type of a column holding values of ``hint`` (a field's or a metric's)."""
    import pyarrow as pa

    types = {bool: pa.bool_(), int: pa.int64(), float: pa.float64()}
    return types.get(unwrap_optional(hint)[0], pa.string())  # text, paths and enums are written as text


@dataclass
class SweepCounts:
    """How the points of a sweep were answered."""

    simulated: int = 0
    cached: int = 0
    skipped: int = 0


@dataclass
class SweepPlan:
    """A checked sweep: the base experiment, the grid, and the points known impossible before running."""

    base: Experiment
    grid: Grid
    baseline: bool = False
    impossible: dict[int, str] = field(default_factory=dict)
    counts: SweepCounts = field(default_factory=SweepCounts)

    @classmethod
    def make(cls, base: Experiment, grid: Grid, baseline: bool = False) -> SweepPlan:
        """Check every point up front. A grid none of whose points can run, or a value with which no point can
        run (``serve.width=-16``, refused as a flag too), is a one-line error; a point that cannot run only in
        combination (K above that point's W) is skipped."""
        reasons: dict[int, str] = {}
        runs: set[tuple[str, Any]] = set()
        fails: dict[tuple[str, Any], str] = {}  # a value of a point that cannot run: the first reason
        for i, (assignment, exp) in enumerate(zip(grid.assignments(), grid.experiments(base), strict=True)):
            values = [(key, plain(value)) for key, value in assignment.items()]
            if (reason := impossible(exp)) is None:
                runs.update(values)
                continue
            reasons[i] = reason
            for value in values:
                fails.setdefault(value, reason)
        if len(reasons) == len(grid):
            first = next(iter(grid.assignments()))
            where = " ".join(f"{k}={plain(v)}" for k, v in first.items())
            raise ConfigError(f"no point of the grid can run; the first ({where}): {reasons[0]}")
        for (key, value), reason in fails.items():
            require((key, value) in runs, f"grid value {key}={value}: {reason}")
        return cls(base, grid, baseline, reasons)

    def __len__(self) -> int:
        return len(self.grid)

    @property
    def fields(self) -> list[str]:
        return self.grid.fields

    def columns(self) -> dict[str, Any]:
        """Every column of a row and its type: index, swept fields, description, metrics."""
        hints = {s.key: s.hint for s in settings()}
        return {"point": int, **{key: hints[key] for key in self.fields}, **DESCRIPTION, **metric_columns()}

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        return pa.schema([(name, arrow_type(hint)) for name, hint in self.columns().items()])

    def rows(self, jobs: int = 1, dask: str | None = None, cache: PointCache | None = None,
             progress: SweepProgress | None = None) -> Iterator[dict[str, Any]]:
        """One row per point in grid order, run on ``jobs`` processes or Dask, read from and written to ``cache``."""
        self.counts = counts = SweepCounts()
        ran, first_reason = 0, ""
        store = None if cache is None else lambda tag, row: cache.put(point_key(tag[1], self.baseline), row)
        with runner(jobs, dask) as run:
            for (index, exp), result in in_order(self._jobs(cache), run_point, run, store):
                row = {"point": index, **{key: plain(exp.get(key)) for key in self.fields}, **result}
                if row["status"] == Status.OK.value:
                    ran += 1
                else:
                    counts.skipped += 1
                    first_reason = first_reason or row["reason"]
                if progress is not None:
                    progress(ran + counts.skipped, len(self))
                yield row
        require(ran > 0, f"no point of the grid could run; the first: {first_reason}")

    def _jobs(self, cache: PointCache | None) -> Iterator[Job]:
        for index, exp in enumerate(self.grid.experiments(self.base)):
            tag = (index, exp)
            if index in self.impossible:
                yield Job(tag, skipped_row(self.impossible[index]))
                continue
            found = cache.get(point_key(exp, self.baseline)) if cache is not None else None
            if found is not None:
                self.counts.cached += 1
                yield Job(tag, found)
            else:
                self.counts.simulated += 1
                yield Job(tag, arg=PointTask(exp, self.baseline), ready=False)


def to_frame(rows: Sequence[Mapping[str, Any]], plan: SweepPlan) -> pd.DataFrame:
    """Rows as a DataFrame with the sweep's column types (as the Parquet file reads back)."""
    import pyarrow as pa

    return pa.Table.from_pylist(list(rows), schema=plan.schema()).to_pandas()


def sweep(experiment: Experiment, grid: Mapping[str, Sequence[Any]] | None = None,
          points: Sequence[Mapping[str, Any]] | None = None, *, baseline: bool = False, jobs: int = 1,
          dask: str | None = None, cache: str | Path | None = None, out: str | Path | None = None,
          progress: SweepProgress | None = None) -> pd.DataFrame:
    """Simulate ``experiment`` at every combination of ``grid`` applied to each of ``points``: one row per point with
    its swept fields, ``status``, ``reason``, model, profile and every report metric. ``jobs`` > 1 runs in local
    processes, ``dask`` on a Dask cluster; ``cache`` (SQLite) keeps results by content; ``out`` writes Parquet;
    ``baseline`` also runs CB (speed-up and S_e2e columns)."""
    plan = SweepPlan.make(experiment, Grid.of(grid, points), baseline)
    rows: list[dict[str, Any]] = []
    run_sweep(plan, jobs=jobs, dask=dask, cache=cache, parquet=out, progress=progress, each=rows.append)
    return to_frame(rows, plan)


def run_sweep(plan: SweepPlan, *, jobs: int = 1, dask: str | None = None, cache: str | Path | None = None,
              parquet: str | Path | None = None, csv: str | Path | None = None,
              progress: SweepProgress | None = None, each: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Run ``plan``'s points and hand each row, in order, to the Parquet and CSV files, the cache and ``each``."""
    from cdbsim.report.outputs import row_writer

    with (closing(PointCache(cache)) if cache is not None else nullcontext() as store,
          row_writer(plan.schema(), parquet=parquet, csv=csv) as add):
        for row in plan.rows(jobs, dask, store, progress):
            add(row)
            if each is not None:
                each(row)


META_COLUMNS: dict[str, type] = {"kv_tokens": int}  # columns taken from the report's meta (the run's log)


@cache
def distribution_stats() -> tuple[str, ...]:
    """The numbers of a :class:`Distribution` that become columns (mean, fixed percentiles, std)."""
    hints = typing.get_type_hints(Distribution)
    return tuple(f.name for f in fields(Distribution) if hints[f.name] is float)


@cache
def metric_columns() -> dict[str, type]:
    """Every metric column and its Python type (int or float), in the report's field order."""
    hints = typing.get_type_hints(Report)
    columns: dict[str, type] = {}
    stats = distribution_stats()
    for f in fields(Report):
        if f.name == "meta":
            continue
        hint, _ = unwrap_optional(hints[f.name])
        if hint is Distribution:
            columns.update({f"{f.name}_{stat}": float for stat in stats})
        elif is_dataclass(hint):  # a record of numbers, e.g. where the device time went
            inner = typing.get_type_hints(hint)
            columns.update({f"{f.name}_{g.name}": inner[g.name] for g in fields(hint)})
        elif typing.get_origin(hint) is dict:
            value = typing.get_args(hint)[1]
            columns.update({f"{f.name}_{stage.value}": value for stage in STAGES})
        else:
            columns[f.name] = hint
    columns.update(META_COLUMNS)
    return columns


def flatten(report: Report) -> dict[str, Any]:
    """``report`` as ``{column: value}`` over :func:`metric_columns` (a stage never launched: 0 launches, NaN batch;
    a metric the run lacks: None)."""
    row: dict[str, Any] = {}
    for f in fields(Report):
        if f.name == "meta":
            continue
        value = getattr(report, f.name)
        if isinstance(value, Distribution):
            row.update({f"{f.name}_{stat}": float(getattr(value, stat)) for stat in distribution_stats()})
        elif is_dataclass(value):
            row.update({f"{f.name}_{k.name}": getattr(value, k.name) for k in fields(value)})
        elif isinstance(value, dict):
            default = 0 if metric_columns()[f"{f.name}_{STAGES[0].value}"] is int else math.nan
            row.update({f"{f.name}_{stage.value}": value.get(stage.value, default) for stage in STAGES})
        else:
            row[f.name] = value
    row.update({key: report.meta.get(key) for key in META_COLUMNS})
    return row
