"""cdbsim.sweep: one row per point with every metric, skipped points, the content-keyed cache, files that
are whole or absent, and identical results whichever way the points ran."""

from __future__ import annotations

import json
import pickle
import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest

import cdbsim
from cdbsim.errors import ConfigError
from cdbsim.latency.shipped import profile_dir
from cdbsim.planner.experiment import Experiment, LatencySection
from cdbsim.planner.grid import Grid
from cdbsim.planner.point_cache import PointCache, default_cache_path, point_key
from cdbsim.planner.sweep import PointTask, SweepPlan, metric_columns, run_point
from cdbsim.report.metrics import Report

BASE = Experiment(workload={"name": "alpaca", "requests": 40})
GRID = {"serve.width": [16, 64], "serve.policy": ["cb", "refill"], "serve.coda_batch": [1, 32]}


@pytest.fixture(scope="module")
def serial() -> pd.DataFrame:
    return cdbsim.sweep(BASE, GRID)


def test_one_row_per_point_with_every_metric(serial: pd.DataFrame) -> None:
    assert list(serial["point"]) == list(range(8))
    assert list(serial.columns[:4]) == ["point", "serve.width", "serve.policy", "serve.coda_batch"]
    assert set(metric_columns()) <= set(serial.columns)
    assert {"status", "reason", "arch", "split", "r_max", "params", "profile"} <= set(serial.columns)
    row = serial.iloc[6]  # W = 64, refill, K = 1
    assert (row["serve.width"], row["serve.policy"], row["serve.coda_batch"]) == (64, "refill", 1)
    alone = cdbsim.predict(BASE.override({"serve.width": 64, "serve.policy": "refill"}))
    assert row["output_tps"] == alone.report.output_tps and row["tpot_s_p99"] == alone.report.tpot_s.p99
    assert row["launches_core"] == alone.report.launches["core"] and row["profile"].startswith("h200-ouro-1.4b")
    cb = serial.iloc[4]
    assert cb["launches_core"] == 0 and cb["launches_decode"] > 0 and cb["mean_depth"] == 4


def test_every_report_field_is_a_column() -> None:
    names = {f for f in Report.__dataclass_fields__ if f != "meta"}
    columns = metric_columns()
    for name in names:
        assert name in columns or any(c.startswith(name + "_") for c in columns), name


def test_impossible_points_are_skipped_with_their_reason(serial: pd.DataFrame) -> None:
    skipped = serial[serial["status"] == "skipped"]
    assert list(skipped["point"]) == [1, 3]  # W = 16 with K = 32
    assert set(skipped["reason"]) == {"K (32) must not exceed W (16)"}
    assert skipped["output_tps"].isna().all()
    assert (serial.loc[serial["status"] == "ok", "reason"] == "").all()


def test_a_grid_with_nothing_to_run_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match=r"^no point of the grid can run; the first \(serve.width=16 "
                                          r"serve.coda_batch=32\): K \(32\) must not exceed W \(16\)$"):
        cdbsim.sweep(BASE, {"serve.width": [16, 24], "serve.coda_batch": [32]})


def test_a_value_no_point_can_run_with_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match=r"^grid value serve.width=-16: W must be >= 1, got -16$"):
        SweepPlan.make(BASE, Grid.of({"serve.width": [-16, 64], "serve.coda_batch": [1, 32]}))
    plan = SweepPlan.make(BASE, Grid.of({"serve.width": [16, 64], "serve.coda_batch": [1, 32]}))
    assert plan.impossible == {1: "K (32) must not exceed W (16)"}  # only in combination: skipped


def test_points_that_all_fail_at_run_time_leave_no_file(tmp_path) -> None:
    out = tmp_path / "rows.parquet"
    with pytest.raises(ConfigError, match=r"^no point of the grid could run; the first: KV capacity"):
        cdbsim.sweep(BASE.override({"serve.kv_tokens": 64}), {"serve.width": [16, 32]}, out=out)
    assert list(tmp_path.iterdir()) == []


def test_architecture_fields_and_device_figures_can_be_swept() -> None:
    frame = cdbsim.sweep(BASE.override({"arch.name": "huginn-3.5b", "exits.mean_depth": 6}),
                         {"arch.split": ["2-4-2", "0-4-0"], "latency.bandwidth": ["none", 4.3, 2.0]})
    assert list(frame["split"]) == ["2-4-2"] * 3 + ["0-4-0"] * 3
    assert frame["params"].iloc[0] > frame["params"].iloc[3]
    assert frame["profile"].iloc[0].startswith("h200-huginn-3.5b (measured")
    # a what-if device carries the kernel-level profile to its figures
    assert "kernels" in frame["profile"].iloc[1] and frame["latency.bandwidth"].iloc[1] == 4.3
    assert frame["latency.bandwidth"].isna().iloc[0]
    assert frame["output_tps"].iloc[2] < frame["output_tps"].iloc[1]  # half the bandwidth


def test_device_presets_can_be_swept() -> None:
    if "device" not in LatencySection.__dataclass_fields__:
        pytest.skip("this build has no latency.device presets (the what-if figures are swept above)")
    frame = cdbsim.sweep(BASE, {"latency.device": ["h200", "h100-sxm"]})
    assert (frame["status"] == "ok").all() and frame["profile"].iloc[0] != frame["profile"].iloc[1]
    assert frame["output_tps"].iloc[1] < frame["output_tps"].iloc[0]


def test_rows_stream_to_parquet_and_match_the_frame(tmp_path, serial: pd.DataFrame) -> None:
    out = tmp_path / "rows.parquet"
    frame = cdbsim.sweep(BASE, GRID, out=out)
    pd.testing.assert_frame_equal(frame, serial, check_exact=True)
    table = pq.read_table(out)
    assert table.num_rows == 8 and table.column_names == list(serial.columns)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.parquet"]


def test_cache_answers_repeated_and_extended_sweeps(tmp_path, serial: pd.DataFrame) -> None:
    cache = tmp_path / "points.sqlite"
    first = cdbsim.sweep(BASE, GRID, cache=cache)
    pd.testing.assert_frame_equal(first, serial, check_exact=True)
    assert len(PointCache(cache)) == 6  # skipped points were never simulated
    extended = {**GRID, "serve.width": [16, 64, 128]}
    plan = SweepPlan.make(BASE, Grid.of(extended))
    rows = list(plan.rows(cache=PointCache(cache)))
    assert (plan.counts.cached, plan.counts.simulated, plan.counts.skipped) == (6, 4, 2)
    again = pd.DataFrame(rows).set_index("point")
    assert again.loc[6, "output_tps"] == serial.loc[6, "output_tps"]


def test_an_interrupted_sweep_resumes_without_recomputing(tmp_path) -> None:
    cache, out = tmp_path / "points.sqlite", tmp_path / "rows.parquet"

    def stop_after_three(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cdbsim.sweep(BASE, {"serve.width": [16, 32, 48, 64, 96]}, cache=cache, out=out, progress=stop_after_three)
    assert sorted(p.name for p in tmp_path.iterdir() if "sqlite" not in p.name) == []  # no rows file, no temporary
    plan = SweepPlan.make(BASE, Grid.of({"serve.width": [16, 32, 48, 64, 96]}))
    list(plan.rows(cache=PointCache(cache)))
    assert (plan.counts.cached, plan.counts.simulated) == (3, 2)


def test_cache_key_follows_content(tmp_path) -> None:
    profile = tmp_path / "profile.json"
    shutil.copy(profile_dir() / "h200-ouro-1.4b.json", profile)
    exp = BASE.override({"latency.profile": str(profile)})
    key = point_key(exp, baseline=False)
    assert key == point_key(BASE.override({"latency.profile": str(profile)}), baseline=False)
    assert key != point_key(exp, baseline=True) and key != point_key(exp.override({"serve.width": 32}), False)
    data = json.loads(profile.read_text())
    data["notes"] = "edited"
    profile.write_text(json.dumps(data))
    assert point_key(exp, baseline=False) != key


def test_a_point_travels_as_its_experiment() -> None:
    """A task carries the experiment (small, whatever the profile), and the worker rebuilds the model from
    the profile it names."""
    task = pickle.loads(pickle.dumps(PointTask(BASE.override({"serve.width": 32}))))
    row = run_point(task)
    assert row["status"] == "ok" and row["output_tps"] == cdbsim.predict(task.experiment).report.output_tps


def test_local_processes_give_the_same_rows_bit_for_bit(serial: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(cdbsim.sweep(BASE, GRID, jobs=2), serial, check_exact=True)


def test_a_dask_cluster_gives_the_same_rows_bit_for_bit(serial: pd.DataFrame) -> None:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            assert len(client.nthreads()) == 2
        frame = cdbsim.sweep(BASE, GRID, dask=cluster.scheduler_address)
    pd.testing.assert_frame_equal(frame, serial, check_exact=True)


def test_baseline_adds_the_speedup_columns() -> None:
    frame = cdbsim.sweep(BASE, {"serve.width": [32]}, baseline=True)
    alone = cdbsim.predict(BASE.override({"serve.width": 32}), baseline=True)
    assert frame["speedup"].iloc[0] == alone.report.speedup and frame["s_e2e"].iloc[0] == alone.report.s_e2e


def test_cache_key_follows_the_folder_profile_names_resolve_from(tmp_path, monkeypatch) -> None:
    """A point predicted with one folder of profiles ($CDBSIM_PROFILES) is not returned for another."""
    key = point_key(BASE, baseline=False)
    for path in profile_dir().glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setenv("CDBSIM_PROFILES", str(tmp_path))
    assert point_key(BASE, baseline=False) == key  # the same profiles in another folder
    edited = tmp_path / "h200-kernels.json"
    data = json.loads(edited.read_text())
    data["notes"] = "edited"
    edited.write_text(json.dumps(data))
    assert point_key(BASE, baseline=False) != key


def test_the_default_cache_lives_under_the_xdg_cache_folder(tmp_path, monkeypatch) -> None:
    """Only ``--cache`` chooses another file: the environment names the cache folder, not the file."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CDBSIM_CACHE", str(tmp_path / "elsewhere.sqlite"))
    assert default_cache_path() == tmp_path / "cdbsim" / "points.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_path() == tmp_path / ".cache" / "cdbsim" / "points.sqlite"
