"""Interpolated latency surfaces: every stage time of every shipped profile is finite, positive and
non-decreasing in the batch and the context, inside and outside the measured grid; the grid is the closest
non-decreasing one to the measured points (a slow point is averaged with the launches it outran)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdbsim.latency.interp import Surface, isotonic, monotone_grid
from cdbsim.latency.model import LatencyModel
from cdbsim.latency.profile import Fit
from cdbsim.latency.recipes import interpolated
from cdbsim.latency.shipped import covers, shipped_profiles
from cdbsim.model.arch import PRESETS, load_arch
from cdbsim.serving.launch import Stage
from cli import app

PROFILES = shipped_profiles()
# every preset a profile covers, as shipped and re-split (re-splits are priced from the components)
ARCHS = [PRESETS[name] for name in PRESETS] + [load_arch("huginn-3.5b", split="0-4-0"),
                                               load_arch("huginn-3.5b", split="1-4-1"),
                                               load_arch("ouro-1.4b", split="2-20-2")]
MODELS = [LatencyModel(arch, profile) for profile in PROFILES.values() for arch in ARCHS if covers(profile, arch)]
STAGE_TIMES = [(model, stage) for model in MODELS for stage in model.tables]
SURFACES = [(f"{p.name}:{name}", Surface(fit)) for p in PROFILES.values()
            for name, fit in sorted(p.components.items()) if interpolated(name) and len(fit.points) >= 2]

batches = st.integers(1, 1024)
lengths = st.floats(1.0, 32768.0)


def test_every_shipped_model_has_tabulated_stages() -> None:
    assert len(PROFILES) >= 3 and len(MODELS) >= 6
    assert all(set(model.tables) == {Stage.PRELUDE, Stage.CORE, Stage.CODA, Stage.DECODE} for model in MODELS)


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(STAGE_TIMES), batches, batches, lengths, lengths)
def test_stage_times_are_positive_and_non_decreasing(case, b1: int, b2: int, l1: float, l2: float) -> None:
    model, stage = case
    table = model.tables[stage]
    (b1, b2), (l1, l2) = sorted((b1, b2)), sorted((l1, l2))
    small, wider, longer = table(b1, l1), table(b2, l1), table(b1, l2)
    what = f"{model.profile.name} {model.arch.name} {model.arch.split} {stage.value}"
    assert math.isfinite(small) and small > 0, f"{what}: t({b1}, {l1}) = {small}"
    assert wider >= small, f"{what}: t({b2}, {l1}) = {wider} < t({b1}, {l1}) = {small}"
    assert longer >= small, f"{what}: t({b1}, {l2}) = {longer} < t({b1}, {l1}) = {small}"


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(SURFACES), st.floats(1.0, 4096.0), st.floats(1.0, 4096.0), lengths, lengths)
def test_component_surfaces_are_positive_and_non_decreasing(case, b1: float, b2: float, l1: float,
                                                            l2: float) -> None:
    name, surface = case
    (b1, b2), (l1, l2) = sorted((b1, b2)), sorted((l1, l2))
    small = surface(b1, l1)
    assert math.isfinite(small) and small > 0, name
    assert surface(b2, l1) >= small and surface(b1, l2) >= small, name


grids = st.integers(1, 6).flatmap(lambda rows: st.integers(1, 8).flatmap(
    lambda cols: st.lists(st.lists(st.floats(0.1, 100.0), min_size=cols, max_size=cols), min_size=rows,
                          max_size=rows)))


@settings(max_examples=300, deadline=None)
@given(grids)
def test_the_monotone_grid_is_the_closest_one_that_never_decreases(values: list[list[float]]) -> None:
    """Non-decreasing along both axes; unchanged where the input already is; and no farther from the input
    (squared error) than either monotone envelope, the running maximum from below or minimum from above."""
    x = np.asarray(values)
    fitted = monotone_grid(x)
    assert (np.diff(fitted, axis=0) >= 0).all() and (np.diff(fitted, axis=1) >= 0).all()
    upper = np.maximum.accumulate(np.maximum.accumulate(x, axis=1), axis=0)
    lower = np.minimum.accumulate(np.minimum.accumulate(x[::-1, ::-1], axis=1), axis=0)[::-1, ::-1]
    distance = float(((fitted - x) ** 2).sum())
    assert distance <= float(((upper - x) ** 2).sum()) * (1 + 1e-9) + 1e-12
    assert distance <= float(((lower - x) ** 2).sum()) * (1 + 1e-9) + 1e-12
    assert np.allclose(monotone_grid(upper), upper, rtol=1e-12, atol=0)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40))
def test_isotonic_agrees_with_scipy(values: list[float]) -> None:
    from scipy.optimize import isotonic_regression

    got = isotonic(np.asarray(values))
    assert got == pytest.approx(isotonic_regression(values).x, rel=1e-9, abs=1e-9)


def test_a_slow_point_is_averaged_with_the_larger_launches_it_outran() -> None:
    """One slow point (B = 1, L = 128 above B = 2 at that length) and the point it outran share their mean;
    the rest, already rising, are kept exactly."""
    points = [[b, b * n, t] for n, row in ((32, (10.0, 11.0, 12.0)), (128, (13.0, 12.0, 13.5)))
              for b, t in zip((1, 2, 4), row, strict=True)]
    surface = Surface(Fit(delta=10.0, points=points))
    assert surface(1, 128) == pytest.approx(12.5) and surface(2, 128) == pytest.approx(12.5)
    assert surface(4, 128) == pytest.approx(13.5)
    assert [surface(b, 32) for b in (1, 2, 4)] == pytest.approx([10.0, 11.0, 12.0])


@pytest.mark.parametrize("name, surface", SURFACES, ids=[name for name, _ in SURFACES])
def test_measured_points_are_kept_where_they_already_rise(name: str, surface: Surface) -> None:
    """The projection moves only the points it pools: every shipped surface reproduces some of its measured
    points exactly."""
    profile, component = name.split(":", 1)
    points = np.asarray(PROFILES[profile].components[component].points)
    batch, length, t = points[:, 0], np.rint(points[:, 1] / points[:, 0]), points[:, -1]
    kept = sum(surface(b, n) == pytest.approx(m, rel=1e-9) for b, n, m in zip(batch, length, t, strict=True))
    assert kept >= 1


def test_a_ragged_grid_continues_with_the_shorter_context_growth() -> None:
    """A length measured to B = 4 only, ending on a falling segment, grows past it as the shorter length
    does plus nothing extra (its last segment was not steeper); no time is negative."""
    short = [[b, b * 32, t] for b, t in ((1, 10.0), (2, 11.0), (4, 12.0), (8, 14.0), (16, 18.0))]
    long = [[b, b * 2048, t] for b, t in ((1, 10.5), (2, 13.0), (4, 11.5))]
    surface = Surface(Fit(delta=10.0, points=short + long))
    assert surface(16, 2048) == pytest.approx(13.0 + (18.0 - 12.0))
    assert surface(8, 32) == pytest.approx(14.0)
    assert surface(3, 2048) == pytest.approx(12.25)  # B = 2 and 4 (13.0 > 11.5) share their mean
    assert all(surface(b, 2048) >= surface(b, 32) > 0 for b in (1, 2, 4, 8, 16, 64, 1024))


def test_below_the_shortest_length_times_stay_above_the_smallest_measured() -> None:
    steep = [[b, b * n, t] for n, row in ((100, (5.0, 9.0)), (200, (20.0, 40.0))) for b, t in zip((1, 2), row,
                                                                                                 strict=True)]
    surface = Surface(Fit(delta=1.0, points=steep))
    assert surface(1, 1) == pytest.approx(5.0)  # the first segment would reach -9.85 at L = 1
    assert surface(2, 50) == pytest.approx(5.0 + (9.0 - 5.0) * 0.5)


def test_a_cb_step_below_its_shortest_context_saves_what_its_stages_save() -> None:
    """A CB step measured from 128 positions, made of a core (run twice) measured from 32: at 32 positions it
    takes its 128-position time less twice what the core saves there; where its parts were measured no
    shorter, the step's own fit stands."""
    from cdbsim.latency.model import below_shortest_context

    core = Surface(Fit(delta=1.0, points=[[b, b * n, t] for n, row in ((32, (1.0, 1.2)), (128, (1.5, 2.0)))
                                          for b, t in zip((1, 4), row, strict=True)]))
    step = Fit(delta=3.0, points=[[b, b * n, t] for n, row in ((128, (4.0, 5.0)), (1024, (8.0, 12.0)))
                                  for b, t in zip((1, 4), row, strict=True)])
    extended = Surface(below_shortest_context(step, [(core, 2)]))
    assert extended(1, 32) == pytest.approx(4.0 - 2 * 0.5)
    assert extended(4, 32) == pytest.approx(5.0 - 2 * 0.8)
    assert extended(4, 80) == pytest.approx(3.4 + (5.0 - 3.4) * 0.5)  # linear between the knots
    assert extended(1, 500) == Surface(step)(1, 500)
    assert below_shortest_context(step, [(Surface(step), 1)]) is step


SHAREGPT_1000 = ["--workload", "sharegpt", "-n", "1000", "--mean-depth", "2.5"]
RAGGED_RUNS = [  # runs that used to meet Ouro's prelude below zero (ValueError: Negative delay)
    pytest.param(["predict", "--policy", "norefill", "--W", "128", "--kv-layout", "shared", *SHAREGPT_1000,
                  "--no-baseline"], id="norefill-W128-shared"),
    pytest.param(["compare", "--W", "256", "--kv-layout", "first-shared", *SHAREGPT_1000], id="compare-W256",
                 marks=pytest.mark.slow),
    pytest.param(["predict", "--policy", "norefill", "--W", "256", "--kv-layout", "shared", "--workload", "arxiv",
                  "-n", "1000", "--mean-depth", "2.5", "--no-baseline"], id="arxiv-W256", marks=pytest.mark.slow),
    pytest.param(["predict", "--arch", "ouro-2.6b", "--policy", "norefill", "--W", "128", "--kv-layout", "shared",
                  *SHAREGPT_1000, "--no-baseline"], id="ouro-2.6b", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("args", RAGGED_RUNS)
def test_runs_on_the_ragged_grid_complete(args: list[str]) -> None:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output[-2000:]
    assert all(report["output_tps"] > 0 for report in json.loads(result.stdout).values())
