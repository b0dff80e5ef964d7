"""A run's :class:`~cdbsim.report.Report` as one flat row of typed columns, for tables of many runs.

A sweep writes one such row per point to Parquet as the points finish, so every row must have the same
columns with the same types whatever the run was (a CB run has no core launches, a skipped point no
metrics at all). The columns are derived from the Report's own fields, so a metric added to the report
becomes a column here without an edit: a distribution gives ``<name>_mean/_p50/_p90/_p99``, another record
of numbers ``<name>_<field>``, a per-stage dict ``<name>_<stage>`` for every stage, a number one column.
"""

from __future__ import annotations

import math
import typing
from dataclasses import fields, is_dataclass
from functools import cache
from typing import Any

from cdbsim.experiment import unwrap_optional
from cdbsim.launch import STAGES
from cdbsim.report import Distribution, Report

META_COLUMNS: dict[str, type] = {"kv_tokens": int}  # facts of the run's log worth a column
"""Columns taken from the report's ``meta`` (the run's log), with their types."""


@cache
def distribution_stats() -> tuple[str, ...]:
    """The numbers of a :class:`Distribution` that become columns (mean, fixed percentiles, std); the
    percentiles a user asked for on the command line vary from run to run, so they are not columns."""
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
    """``report`` as ``{column: value}`` over :func:`metric_columns` (a stage the run never launched:
    0 launches and a NaN mean batch; a metric the run lacks, such as a speed-up without a baseline: None)."""
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
