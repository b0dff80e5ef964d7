"""``cdbsim validate`` plumbing without a GPU: saved logs in, side-by-side errors and plots out."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from calibration.validation import Entry, compare, load_matrix, requests_for
from cdbsim.latency.model import LatencyModel, roofline_profile
from cdbsim.simulator.sim import simulate
from cli import app


def latency_for(arch):
    return LatencyModel(arch, roofline_profile(arch))


def test_shipped_matrix_covers_what_validation_needs() -> None:
    entries = load_matrix("calibration/matrices/validation-h200.json")
    assert len(entries) >= 16
    assert {e.arch for e in entries} >= {"ouro-1.4b", "huginn-3.5b"}
    assert {e.policy for e in entries} == {"cb", "norefill", "refill"}
    assert {e.workload for e in entries} >= {"alpaca", "sharegpt"}
    assert sum(e.online for e in entries) >= 2
    assert any(e.split for e in entries)
    assert any(e.exits == "none" for e in entries) and any(e.exits == "synthetic" for e in entries)
    assert len({e.width for e in entries if e.arch == "ouro-1.4b"}) >= 2
    for e in entries:
        e.config()  # every configuration is valid


def test_paper_matrix_runs_huginn_w64_under_per_step_core_launches() -> None:
    entries = load_matrix("calibration/matrices/paper-huginn-h200.json")
    launch = {(e.policy, e.coda_batch, e.config().core_launch.value) for e in entries}
    assert launch == {("norefill", 1, "per-step"), ("refill", 16, "per-step"), ("cb", 1, "per-step"),
                      ("refill", 16, "mixed")}
    assert {(e.arch, e.width, e.workload) for e in entries} == {("huginn-3.5b", 64, "alpaca")}


def test_wide_matrix_runs_huginn_at_w256_on_the_same_requests() -> None:
    entries = load_matrix("calibration/matrices/wide-huginn-h200.json")
    assert {(e.policy, e.coda_batch) for e in entries} == {("cb", 1), ("refill", 16)}
    assert {(e.arch, e.width, e.workload, e.requests, e.seed) for e in entries} == {
        ("huginn-3.5b", 256, "alpaca", 1024, 1)}
    for e in entries:
        e.config()  # a valid configuration
        assert e.kv_tokens >= 256 * 128  # every resident row has room for an Alpaca request (~90 tokens)


def test_entry_carries_the_core_launch_to_the_executor() -> None:
    from cdbsim.planner.experiment import Experiment

    exp = Experiment(serve={"core_launch": "per-step", "kv_tokens": 65536})
    assert Entry.from_experiment("x", exp).config().core_launch.value == "per-step"


def test_matrix_with_unknown_key_is_refused(tmp_path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"configs": [{"name": "a", "widht": 8}]}))
    with pytest.raises(ValueError, match="unknown key"):
        load_matrix(path)


def test_adaptive_matrix_pairs_runs_on_the_same_requests() -> None:
    entries = load_matrix("calibration/matrices/adaptive-h200.json")
    by_name = {e.name: e for e in entries}
    steady = [e for e in entries if e.trace is None]
    assert len({(e.arch, e.split, e.width, e.workload, e.mean_depth) for e in steady}) >= 4
    for e in steady:  # each configuration runs adaptive and one fixed policy, same requests otherwise
        same = [o for o in steady if replace(o, name=e.name, policy=e.policy, coda_batch=e.coda_batch) == e]
        assert sorted(o.policy == "adaptive" for o in same) == [False, True], e.name
    shifted = [e for e in entries if e.trace is not None]
    assert {e.policy for e in shifted} == {"adaptive", "norefill", "refill"} and len({e.trace for e in shifted}) == 1
    requests = shifted[0].build_requests()
    assert len(requests) > 64 and requests[-1].arrival > 1.0 and shifted[0].online
    assert by_name[shifted[0].name].config()


def test_entry_with_trace_and_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        Entry(name="x", trace="t.csv", rate_of_capacity=0.5)


def test_validate_against_saved_logs(tmp_path) -> None:
    from traces import ExitModel, build_trace, write_trace

    trace = write_trace(build_trace("alpaca", 30, 4, 2, ExitModel(mean=2.5), rate=20.0, seed=4), tmp_path / "t.csv")
    entries = [Entry(name="refill", requests=40), Entry(name="cb", policy="cb", requests=40),
               Entry(name="online", requests=40, rate_of_capacity=0.5),
               Entry(name="adaptive-trace", policy="adaptive", trace=str(trace))]
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"configs": [e.__dict__ for e in entries]}))
    measured = tmp_path / "measured"
    for entry in entries:  # a "measurement" that is the simulator itself: errors must be zero
        requests, rate = requests_for(entry, latency_for(entry.spec()))
        log = simulate(entry.spec(), entry.config(), requests, latency_for(entry.spec()), entry.kv_blocks())
        log.meta["rate"] = rate
        log.save(measured / entry.name)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["validate", "--matrix", str(matrix), "--measured", str(measured),
                                      "--out", str(out), "--profile", "roofline", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)[0]
    assert summary["profile"].startswith("h200-roofline")  # the table names the profile it predicted with
    assert all(abs(row["tok/s error %"]) < 1e-6 for row in summary["summary"])
    # the host line refitted from the "measured" log is the profile's own: the same prediction again
    assert all(abs(row["error with run's host %"]) < 1e-6 for row in summary["summary"])
    # offline, every launch's own host time replayed gives the same run again; online it is not replayed
    times = {row["config"]: row["error with run's host times %"] for row in summary["summary"]}
    assert all(abs(times[name]) < 1e-6 for name in ("refill", "cb"))
    assert all(times[name] != times[name] for name in ("online", "adaptive-trace"))  # NaN
    assert summary["errors"]["offline |error| with run's host times worst %"] < 1e-6
    assert summary["errors"]["online p50 |error| with run's host worst %"] < 1e-6
    assert all(row["run host us"] > 0 for row in summary["summary"])
    assert summary["errors"]["online norm p50 |error| worst %"] < 1e-6
    for name in ("summary.csv", "summary.json", "scatter.png", "timeline.png", "stages.csv"):
        assert (out / name).stat().st_size > 0
    stages = json.loads((out / "summary.json").read_text())["stages"]["refill"]
    assert {row["stage"] for row in stages} == {"prefill", "prelude", "core", "coda"}
    assert all(abs(row["error"]) < 1e-9 for row in stages)
    for stage in ("prelude", "core", "coda"):  # the batch ranges partition each stage's launches
        rows = [r for r in stages if r["stage"] == stage]
        assert rows[0]["batch"] == "all" and len(rows) >= 2
        assert sum(r["launches"] for r in rows[1:]) == rows[0]["launches"]
    comps = compare(load_matrix(matrix), {e.name: __import__("cdbsim.report.logs", fromlist=["RunLog"]).RunLog.load(
        measured / e.name) for e in entries}, latency_for)
    assert comps[2].online and comps[2].rows[0]["metric"] == "output_tps"


def test_stage_errors_by_batch_range() -> None:
    """A latency model that is exact for small batches and twice too slow above 16 rows shows it."""
    from calibration.validation import Entry
    from cdbsim.report.validate import batch_range, stage_errors

    assert [batch_range(b) for b in (1, 16, 17, 64, 256, 257)] == ["1-16", "1-16", "17-64", "17-64", "129-256",
                                                                  "257+"]
    entry = Entry(name="refill", requests=60, width=64)
    requests, _ = requests_for(entry, latency_for(entry.spec()))
    log = simulate(entry.spec(), entry.config(), requests, latency_for(entry.spec()), entry.kv_blocks())
    launches = log.launches
    duration = dict(zip(launches["index"], launches["end"] - launches["start"], strict=True))
    rows = stage_errors(log, lambda launch: duration[launch.index] * (2.0 if launch.padded > 16 else 1.0))
    core = {r["batch"]: r["error"] for r in rows if r["stage"] == "core"}
    assert core["1-16"] == pytest.approx(0.0)
    assert core["17-64"] == pytest.approx(1.0)
    assert 0.0 < core["all"] < 1.0


@pytest.mark.parametrize("timing", ["lookahead", "sync"])
def test_stage_errors_of_queued_launches(timing: str) -> None:
    """Offline under lookahead every launch is queued behind the previous one, so the queued error is the
    error; under sync timing the device waits for the host before every launch, so none is queued."""
    from calibration.validation import Entry
    from cdbsim.report.validate import stage_errors

    entry = Entry(name="refill", requests=30, width=16)
    arch, latency = entry.spec(), latency_for(entry.spec())
    requests, _ = requests_for(entry, latency)
    log = simulate(arch, replace(entry.config(), timing=timing), requests, latency, entry.kv_blocks())
    duration = dict(zip(log.launches["index"], log.launches["end"] - log.launches["start"], strict=True))
    rows = stage_errors(log, lambda launch: 1.1 * duration[launch.index])
    decode = [r for r in rows if r["stage"] != "prefill"]
    assert all(r["error"] == pytest.approx(0.1) for r in decode)
    if timing == "lookahead":
        assert all(r["queued launches"] == r["launches"] and r["queued error"] == pytest.approx(0.1) for r in decode)
    else:
        assert all(r["queued launches"] == 0 and np.isnan(r["queued error"]) for r in rows)


def test_run_host_fits_each_stage_to_its_mean() -> None:
    """A run whose codas cost the host twice a core step and whose core steps have a slow tail: each stage
    gets its own line, through the stage's mean host time (the tail counts); prefill keeps the pooled line."""
    from cdbsim.report.validate import run_host
    from cdbsim.serving.launch import Stage

    entry = Entry(name="refill", requests=40, width=16)
    arch, latency = entry.spec(), latency_for(entry.spec())
    requests, _ = requests_for(entry, latency)
    log = simulate(arch, entry.config(), requests, latency, entry.kv_blocks())
    launches = log.launches.copy()
    host = 100e-6 + 2e-6 * launches["items"]
    host[launches["stage"] == "coda"] *= 2
    tail = (launches["stage"] == "core") & (launches.index % 10 == 0)
    host[tail] *= 5
    log.launches = launches.assign(host_s=host)
    found = run_host(log)
    assert found is not None and Stage.PREFILL not in found.stages
    core = launches[launches["stage"] == "core"]
    assert found.stages[Stage.CORE](core["items"].mean()) == pytest.approx(host[core.index].mean(), rel=1e-6)
    coda = found.stages[Stage.CODA]
    assert (coda.delta, coda.gamma) == (pytest.approx(200e-6), pytest.approx(4e-6))
    assert LatencyModel(arch, roofline_profile(arch)).with_host(found.pooled, found.stages).stage_hosts[
        Stage.CODA] is coda


def test_validate_without_gpu_or_logs_says_so(tmp_path) -> None:
    result = CliRunner().invoke(app, ["validate", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "needs a CUDA GPU" in result.output or "install the GPU extra" in result.output


def test_stage_errors_see_each_launch_as_the_simulator_did(tmp_path) -> None:
    """Re-predicting a saved log gives each launch the time the simulator gave it, mixed contexts included
    (the log keeps each launch's longest item, which the attention-width correction needs)."""
    from pathlib import Path

    from cdbsim.latency.profile import load_profile_file
    from cdbsim.report.logs import RunLog
    from cdbsim.report.validate import stage_errors
    from cdbsim.serving.launch import table_width

    entry = Entry(name="sharegpt", arch="ouro-1.4b", workload="sharegpt", width=16, requests=16,
                  kv_tokens=98304)
    profile = load_profile_file(Path(__file__).parents[1] / "calibration/profiles/h200-ouro-1.4b.json")
    assert profile.attention_slots
    model = LatencyModel(entry.spec(), profile)
    requests, _ = requests_for(entry, model)
    simulate(entry.spec(), entry.config(), requests, model, entry.kv_blocks()).save(tmp_path / "run", "csv")
    log = RunLog.load(tmp_path / "run")
    core = log.launches[log.launches["stage"] == "core"]
    assert (core["longest"] > 1.5 * core["context"] / core["size"]).any()
    width = table_width(requests, entry.config().block_size)  # the simulator charges each metadata copy
    assert all(abs(row["error"]) < 1e-9
               for row in stage_errors(log, lambda launch: model.launch_time(launch, width)))
    assert any(abs(row["error"]) > 1e-6 for row in stage_errors(log, model.launch_time))
    (tmp_path / "run" / "launches.csv").write_text(log.launches.drop(columns="longest").to_csv(index=False))
    assert (RunLog.load(tmp_path / "run").launches["longest"] == 0).all()  # an older log still loads


@pytest.mark.parametrize("name", ["ouro-alpaca-refill-W64", "huginn-alpaca-cb-W64"])
def test_device_idle_is_predicted_from_the_launch_gap(tmp_path, name: str) -> None:
    """Under the lookahead gate the executor's idle time is the gap between consecutive launches; the
    simulator predicts it within 10% from the saved H200 logs (it used to predict 0)."""
    from calibration.fit import BACK_TO_BACK_S, fit_launch_gap, launch_gaps
    from calibration.validation import unpacked_logs
    from cdbsim.latency.shipped import resolve_profile
    from cdbsim.report.logs import RunLog

    with unpacked_logs(Path("benchmarks/results/validation/measured-logs.tgz")) as logs:
        measured = RunLog.load(logs / name)
    entry = next(e for e in load_matrix("calibration/matrices/validation-h200.json") if e.name == name)
    latency = LatencyModel(entry.spec(), resolve_profile("auto", entry.spec()))
    comparison = compare([entry], {name: measured}, lambda arch: latency)[0]
    assert comparison.predicted.device_idle == pytest.approx(comparison.measured.device_idle, rel=0.1)
    # the profile's gap is the mean over the matrix's runs; one run's is within 3% of it (1.26-1.30 us per run)
    assert fit_launch_gap([measured.launches]) == pytest.approx(latency.launch_gap, rel=0.03)
    # the device waited for the host (a gap over BACK_TO_BACK_S) at most once in a thousand launches: one gap of
    # 78 us of 5,582 in the Ouro run, at its one-row tail, where a step is shorter than the host's work per launch
    assert (launch_gaps(measured.launches) >= BACK_TO_BACK_S).mean() < 1e-3


def test_validate_reads_an_archive_of_saved_logs(tmp_path) -> None:
    import tarfile

    entry = Entry(name="refill", requests=30)
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"configs": [entry.__dict__]}))
    requests, rate = requests_for(entry, latency_for(entry.spec()))
    log = simulate(entry.spec(), entry.config(), requests, latency_for(entry.spec()), entry.kv_blocks())
    log.meta["rate"] = rate
    log.save(tmp_path / "logs" / entry.name)
    archive = tmp_path / "measured-logs.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "logs", arcname=".")
    args = ["validate", "--matrix", str(matrix), "--out", str(tmp_path / "out"), "--profile", "roofline", "--json"]
    result = CliRunner().invoke(app, [*args, "--measured", str(archive)])
    assert result.exit_code == 0, result.output
    assert abs(json.loads(result.stdout)[0]["summary"][0]["tok/s error %"]) < 1e-6

    wrapped = tmp_path / "wrapped.tgz"  # packed with one directory around the runs: read the same
    with tarfile.open(wrapped, "w:gz") as tar:
        tar.add(tmp_path / "logs", arcname="measured")
    result = CliRunner().invoke(app, [*args, "--measured", str(wrapped)])
    assert result.exit_code == 0, result.output

    escaping = tmp_path / "escaping.tgz"  # a member outside the directory is refused, with one line
    with tarfile.open(escaping, "w:gz") as tar:
        tar.add(matrix, arcname="../outside.json")
    result = CliRunner().invoke(app, [*args, "--measured", str(escaping)])
    assert result.exit_code == 2
    assert "cannot unpack" in result.output and "Traceback" not in result.output
    assert not (tmp_path.parent / "outside.json").exists()
