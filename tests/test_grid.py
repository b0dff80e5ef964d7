"""Sweep grids: the points they expand to, in order, and the one-line errors of a bad grid."""

from __future__ import annotations

import pytest

from cdbsim.errors import ConfigError
from cdbsim.planner.experiment import Experiment
from cdbsim.planner.grid import Grid
from cdbsim.serving.config import Policy


def test_points_times_grid_in_order() -> None:
    grid = Grid.of({"serve.width": [16, "64"], "serve.policy": ["cb", "refill"]},
                   [{"arch.name": "huginn-3.5b", "arch.split": "1-6-1"}, {"arch.name": "ouro-1.4b"}])
    assert len(grid) == 8
    assert grid.fields == ["arch.name", "arch.split", "serve.width", "serve.policy"]
    points = list(grid.assignments())
    assert points[0] == {"arch.name": "huginn-3.5b", "arch.split": "1-6-1", "serve.width": 16,
                         "serve.policy": Policy.CB}
    assert [p["serve.width"] for p in points[:4]] == [16, 16, 64, 64]  # values parsed to the field's type
    assert points[4] == {"arch.name": "ouro-1.4b", "serve.width": 16, "serve.policy": Policy.CB}
    experiments = list(grid.experiments(Experiment(serve={"coda_batch": 4})))
    assert experiments[5].arch.name == "ouro-1.4b" and experiments[5].arch.split is None
    assert (experiments[5].serve.width, experiments[5].serve.policy, experiments[5].serve.coda_batch) == \
        (16, Policy.REFILL, 4)


def test_grid_from_options_and_a_toml_table() -> None:
    table = {"serve": {"width": [16, 32]}, "exits.mean_depth": [2.0, 3.0], "latency": {"bandwidth": [3]}}
    grid = Grid.from_options(["serve.width=64, 128,256", "serve.policy=cb"], table,
                             [{"arch": {"name": "huginn-3.5b"}}])
    assert dict(grid.axes) == {"serve.width": (64, 128, 256), "exits.mean_depth": (2.0, 3.0),
                               "latency.bandwidth": (3.0,), "serve.policy": (Policy.CB,)}
    assert grid.points == ((("arch.name", "huginn-3.5b"),),) and len(grid) == 6


@pytest.mark.parametrize("grid,points,message", [
    ({}, None, "the grid is empty: give fields to sweep"),
    (None, [], "the grid is empty"),
    ({"serve.width": []}, None, "grid: serve.width has no values"),
    ({"serve.widht": [16]}, None,
     "grid: unknown key serve.widht; valid keys of [serve]: coda_batch, core_launch, kv_blocks"),
    ({"model.width": [16]}, None, "grid: unknown section [model]; valid sections: arch, serve"),
    ({"serve.width": [16, "wide"]}, None, "grid: serve.width: expected an integer, got 'wide'"),
    ({"serve.policy": ["cb", "fifo"]}, None, "grid: serve.policy: unknown policy 'fifo'; choose one of: adaptive, cb, "
                                             "norefill, refill"),
    ({"latency.bandwidth": ["fast"]}, None, "grid: latency.bandwidth: expected a number (or none), got 'fast'"),
    ({"serve.width": 16}, None, "grid: serve.width: expected a list of values, got 16"),
    ({"serve.width": [16, 16]}, None, "grid: serve.width lists 16 twice"),
    ({"serve.width": [16]}, [{"serve.width": 32}], "grid: serve.width is set both by the grid and by a point"),
    (None, [{"arch.r_max": "deep"}], "grid: point 1: arch.r_max: expected an integer (or none), got 'deep'"),
    (None, ["arch.r_max=8"], "grid: point 1 must be a table of section.field = value"),
])
def test_bad_grid_is_one_line(grid, points, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Grid.of(grid, points)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize("options,message", [
    (["serve.width"], "--grid: expected section.field=v1,v2,..., got 'serve.width'"),
    (["serve.width=16", "serve.width=32"], "--grid: serve.width is given twice"),
    (["serve.width="], "--grid: serve.width has no values"),
])
def test_bad_grid_option_is_one_line(options: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace(".", r"\.")):
        Grid.from_options(options)
