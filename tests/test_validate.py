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
from cdbsim.planner.experiment import Experiment
from cdbsim.simulator.sim import simulate
from cli import app

BASE = ("workload.name=alpaca", "workload.seed=1", "serve.kv_tokens=65536")


def latency_for(arch):
    return LatencyModel(arch, roofline_profile(arch))


def entry(name: str, *settings: str, rate_of_capacity: float | None = None) -> Entry:
    """A matrix entry: ``BASE`` and ``settings`` in the ``--set`` syntax."""
    return Entry(name, Experiment().override([*BASE, *settings]), rate_of_capacity)


def matrix_row(name: str, *settings: str, rate_of_capacity: float | None = None) -> dict:
    """The same entry as a matrix file holds it."""
    row = {"name": name, "set": [*BASE, *settings]}
    return row if rate_of_capacity is None else {**row, "rate_of_capacity": rate_of_capacity}


def write_matrix(path: Path, rows: list[dict], **top) -> Path:
    path.write_text(json.dumps({**top, "configs": rows}))
    return path


def test_shipped_matrix_covers_what_validation_needs() -> None:
    entries = load_matrix("calibration/matrices/validation-h200.json")
    exps = [e.experiment for e in entries]
    assert len(entries) >= 16
    assert {x.arch.name for x in exps} >= {"ouro-1.4b", "huginn-3.5b"}
    assert {e.config().policy.value for e in entries} == {"cb", "norefill", "refill"}
    assert {x.workload.name for x in exps} >= {"alpaca", "sharegpt"}
    assert sum(e.online for e in entries) >= 2
    assert any(x.arch.split for x in exps)
    assert {x.exits.model for x in exps} == {"none", "synthetic"}
    assert len({x.serve.width for x in exps if x.arch.name == "ouro-1.4b"}) >= 2


def test_matrix_names_key_the_saved_logs() -> None:
    """Saved executor logs are found by entry name: every configuration of the 20-run matrix has one."""
    import tarfile

    with tarfile.open("benchmarks/results/validation/measured-logs.tgz") as tar:
        runs = {Path(name).parent.name for name in tar.getnames() if name.endswith("meta.json")}
    assert {e.name for e in load_matrix("calibration/matrices/validation-h200.json")} == runs


def test_paper_matrix_runs_huginn_w64_under_per_step_core_launches() -> None:
    entries = load_matrix("calibration/matrices/paper-huginn-h200.json")
    launch = {(e.config().policy.value, e.config().coda_batch, e.config().core_launch.value) for e in entries}
    assert launch == {("norefill", 1, "per-step"), ("refill", 16, "per-step"), ("cb", 1, "per-step"),
                      ("refill", 16, "mixed")}
    assert {(e.spec().name, e.config().width, e.experiment.workload.name) for e in entries} == {
        ("huginn-3.5b", 64, "alpaca")}


def test_wide_matrix_runs_huginn_at_w256_on_the_same_requests() -> None:
    entries = load_matrix("calibration/matrices/wide-huginn-h200.json")
    assert {(e.config().policy.value, e.config().coda_batch) for e in entries} == {("cb", 1), ("refill", 16)}
    assert {(e.spec().name, e.config().width, e.experiment.workload) for e in entries} == {
        ("huginn-3.5b", 256, entries[0].experiment.workload)}
    assert (entries[0].experiment.workload.requests, entries[0].experiment.workload.seed) == (1024, 1)
    for e in entries:  # every resident row has room for an Alpaca request (~90 tokens)
        assert e.experiment.serve.kv_tokens >= 256 * 128


def test_entry_carries_every_serving_setting_to_the_executor() -> None:
    exp = Experiment(serve={"core_launch": "per-step", "prefill_budget": 4096, "kv_tokens": 65536})
    config = Entry.from_experiment("x", exp).config()
    assert (config.core_launch.value, config.prefill_budget) == ("per-step", 4096)
    assert Entry.from_experiment("x", Experiment()).given_blocks() is None  # sized from the GPU's memory


def test_matrix_set_applies_to_every_entry_and_an_entry_overrides_it(tmp_path) -> None:
    path = write_matrix(tmp_path / "m.json", [{"name": "a"}, {"name": "b", "set": ["serve.width=16"]}],
                        set=[*BASE, "serve.width=32"])
    assert [e.config().width for e in load_matrix(path)] == [32, 16]


@pytest.mark.parametrize(("top", "rows", "message"), [
    ({}, [{"name": "a", "widht": 8}], "config 0 (a): unknown key(s) widht; an entry has name, set"),
    ({"defaults": {}}, [{"name": "a"}], "m.json: unknown key(s) defaults; a validation matrix is"),
    ({}, [{"name": "a", "set": ["serve.widht=8"]}], "config 0 (a): unknown key serve.widht"),
    ({}, [{"name": "a", "set": ["serve.width=abc"]}], "config 0 (a): serve.width: expected an integer, got 'abc'"),
    ({}, [{"name": "a", "set": "serve.width=8"}], "config 0 (a): set must be a list"),
    ({}, [{"name": "a", "set": ["serve.width"]}], "config 0 (a): set: expected \"section.field=value\""),
    ({}, [{"name": "a", "set": ["latency.profile=roofline"]}], "latency.profile is chosen for the whole matrix"),
    ({}, [{"name": "a"}, {"name": "a"}], "config 1 (a): a second config of this name"),
    ({}, [{"name": "a/b"}], "config 0: name must be a text that names a directory"),
    ({}, [{"name": "a", "rate_of_capacity": "x"}], "config 0 (a): expected a number"),
    ({}, [{"name": "a", "set": ["workload.rate=5"], "rate_of_capacity": 0.5}],
     "config 0 (a): give one of workload.rate and rate_of_capacity"),
    ({"set": ["serve.width=0x"]}, [{"name": "a"}], "m.json: serve.width: expected an integer"),
    ({}, [], "m.json: no configs"),
])
def test_bad_matrix_is_one_line_naming_the_file_and_the_entry(tmp_path, top, rows, message) -> None:
    rows = [{**row, "set": [*BASE, *row.get("set", [])]} if isinstance(row.get("set", []), list) else row
            for row in rows]  # otherwise valid entries
    path = write_matrix(tmp_path / "m.json", rows, **top)
    with pytest.raises(ValueError) as info:
        load_matrix(path)
    text = str(info.value)
    assert message in text and "\n" not in text and text.startswith(str(path)), text


def test_adaptive_matrix_pairs_runs_on_the_same_requests() -> None:
    from cdbsim.serving.config import Policy

    entries = load_matrix("calibration/matrices/adaptive-h200.json")

    def fixed_part(e: Entry) -> Experiment:  # everything but the policy and its coda batch
        return replace(e.experiment, serve=replace(e.experiment.serve, policy=Policy.REFILL, coda_batch=None))

    steady = [e for e in entries if e.experiment.workload.trace is None]
    assert len({fixed_part(e) for e in steady}) >= 4
    for e in steady:  # each configuration runs adaptive and one fixed policy, same requests otherwise
        same = [o for o in steady if fixed_part(o) == fixed_part(e)]
        assert sorted(o.config().policy is Policy.ADAPTIVE for o in same) == [False, True], e.name
    shifted = [e for e in entries if e.experiment.workload.trace is not None]
    assert {e.config().policy.value for e in shifted} == {"adaptive", "norefill", "refill"}
    assert len({e.experiment.workload.trace for e in shifted}) == 1
    requests = shifted[0].build_requests()
    assert len(requests) > 64 and requests[-1].arrival > 1.0 and shifted[0].online


def test_entry_with_trace_and_rate_is_refused() -> None:
    with pytest.raises(ValueError, match=r"give one of workload\.trace and rate_of_capacity"):
        entry("x", "workload.trace=t.csv", rate_of_capacity=0.5)


def test_validate_against_saved_logs(tmp_path) -> None:
    from traces import ExitModel, build_trace, write_trace

    trace = write_trace(build_trace("alpaca", 30, 4, 2, ExitModel(mean=2.5), rate=20.0, seed=4), tmp_path / "t.csv")
    rows = [matrix_row("refill", "workload.requests=40"),
            matrix_row("cb", "serve.policy=cb", "workload.requests=40"),
            matrix_row("online", "workload.requests=40", rate_of_capacity=0.5),
            {"name": "adaptive-trace", "set": ["serve.policy=adaptive", f"workload.trace={trace}",
                                               "serve.kv_tokens=65536"]}]
    matrix = write_matrix(tmp_path / "matrix.json", rows)
    entries = load_matrix(matrix)
    measured = tmp_path / "measured"
    for e in entries:  # a "measurement" that is the simulator itself: errors must be zero
        requests, rate = requests_for(e, latency_for(e.spec()), e.given_blocks())
        log = simulate(e.spec(), e.config(), requests, latency_for(e.spec()), e.given_blocks())
        log.meta["rate"] = rate
        log.save(measured / e.name)
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
    assert all(times[name] is None for name in ("online", "adaptive-trace"))  # NaN, written null
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
    from cdbsim.report.validate import batch_range, stage_errors

    assert [batch_range(b) for b in (1, 16, 17, 64, 256, 257)] == ["1-16", "1-16", "17-64", "17-64", "129-256",
                                                                  "257+"]
    refill = entry("refill", "workload.requests=60", "serve.width=64")
    requests, _ = requests_for(refill, latency_for(refill.spec()), refill.given_blocks())
    log = simulate(refill.spec(), refill.config(), requests, latency_for(refill.spec()), refill.given_blocks())
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
    from cdbsim.report.validate import stage_errors

    refill = entry("refill", "workload.requests=30", "serve.width=16")
    arch, latency = refill.spec(), latency_for(refill.spec())
    requests, _ = requests_for(refill, latency, refill.given_blocks())
    log = simulate(arch, replace(refill.config(), timing=timing), requests, latency, refill.given_blocks())
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

    refill = entry("refill", "workload.requests=40", "serve.width=16")
    arch, latency = refill.spec(), latency_for(refill.spec())
    requests, _ = requests_for(refill, latency, refill.given_blocks())
    log = simulate(arch, refill.config(), requests, latency, refill.given_blocks())
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

    sharegpt = entry("sharegpt", "arch.name=ouro-1.4b", "workload.name=sharegpt", "serve.width=16",
                     "workload.requests=16", "serve.kv_tokens=98304")
    profile = load_profile_file(Path(__file__).parents[1] / "calibration/profiles/h200-ouro-1.4b.json")
    assert profile.attention_slots
    model = LatencyModel(sharegpt.spec(), profile)
    requests, _ = requests_for(sharegpt, model, sharegpt.given_blocks())
    simulate(sharegpt.spec(), sharegpt.config(), requests, model, sharegpt.given_blocks()).save(tmp_path / "run", "csv")
    log = RunLog.load(tmp_path / "run")
    core = log.launches[log.launches["stage"] == "core"]
    assert (core["longest"] > 1.5 * core["context"] / core["size"]).any()
    width = table_width(requests, sharegpt.config().block_size)  # the simulator charges each metadata copy
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
    run = next(e for e in load_matrix("calibration/matrices/validation-h200.json") if e.name == name)
    latency = LatencyModel(run.spec(), resolve_profile("auto", run.spec()))
    comparison = compare([run], {name: measured}, lambda arch: latency)[0]
    assert comparison.predicted.device_idle == pytest.approx(comparison.measured.device_idle, rel=0.1)
    # the profile's gap is the mean over the matrix's runs; one run's is within 3% of it (1.26-1.30 us per run)
    assert fit_launch_gap([measured.launches]) == pytest.approx(latency.launch_gap, rel=0.03)
    # the device waited for the host (a gap over BACK_TO_BACK_S) at most once in a thousand launches: one gap of
    # 78 us of 5,582 in the Ouro run, at its one-row tail, where a step is shorter than the host's work per launch
    assert (launch_gaps(measured.launches) >= BACK_TO_BACK_S).mean() < 1e-3


def test_validate_reads_an_archive_of_saved_logs(tmp_path) -> None:
    import tarfile

    matrix = write_matrix(tmp_path / "matrix.json", [matrix_row("refill", "workload.requests=30")])
    refill = load_matrix(matrix)[0]
    requests, rate = requests_for(refill, latency_for(refill.spec()), refill.given_blocks())
    log = simulate(refill.spec(), refill.config(), requests, latency_for(refill.spec()), refill.given_blocks())
    log.meta["rate"] = rate
    log.save(tmp_path / "logs" / refill.name)
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


def test_an_entry_without_a_kv_size_replays_the_capacity_its_run_used() -> None:
    sized = Entry("sized", Experiment().override(["workload.name=alpaca", "workload.requests=30"]))
    assert sized.given_blocks() is None
    arch = sized.spec()
    requests = sized.build_requests()
    real = simulate(arch, sized.config(), requests, latency_for(arch), 777)  # the run's own capacity
    (comparison,) = compare([sized], {"sized": real}, latency_for)
    assert comparison.predicted_log.meta["kv_blocks"] == 777
    real.meta.pop("kv_blocks")
    with pytest.raises(ValueError, match="records no KV capacity and the entry gives none"):
        compare([sized], {"sized": real}, latency_for)
