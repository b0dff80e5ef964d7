"""What a run leaves to look at: logs in Parquet or CSV, a Trace Event timeline, report fields and CDFs,
progress lines, and outputs that are written whole or not at all."""

from __future__ import annotations

import gzip
import io
import itertools
import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cdbsim.planner.experiment import Experiment
from cdbsim.planner.study import predict
from cdbsim.report.logs import RunLog
from cdbsim.report.metrics import Distribution, kv_in_use, latency_samples, summarize
from cdbsim.report.outputs import atomic_dir, atomic_file
from cdbsim.report.perfetto import DEVICE_PID, DEVICE_TID, HOST_TID, REQUESTS_PID, timeline
from cdbsim.report.progress import PlainStep, progress_display
from cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def small_run():
    """A tiny simulated run (refill, 12 Alpaca requests, roofline profile)."""
    return predict(Experiment(workload={"name": "alpaca", "requests": 12}, latency={"profile": "roofline"}))


def test_logs_round_trip_as_parquet_and_csv(tmp_path, small_run) -> None:
    log = small_run.log
    for fmt in ("parquet", "csv"):
        out = log.save(tmp_path / fmt, fmt)
        assert (out / f"launches.{fmt}").is_file() and (out / f"requests.{fmt}").is_file()
        assert RunLog.saved_in(out)
        back = RunLog.load(out)
        pd.testing.assert_frame_equal(back.launches, log.launches, check_dtype=False)
        pd.testing.assert_frame_equal(back.requests, log.requests, check_dtype=False)
        assert all(np.allclose(a, b) for a, b in zip(back.token_times, log.token_times, strict=True))
        assert back.meta["policy"] == "refill"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csv", "parquet"]  # no temporary names left


def test_timeline_slices_match_the_launch_log(tmp_path, small_run) -> None:
    log = small_run.log
    path = log.save(tmp_path / "run") / "trace.json.gz"
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    assert all({"ph", "pid"} <= set(e) for e in events)
    device = [e for e in events if e["ph"] == "X" and e["pid"] == DEVICE_PID and e["tid"] == DEVICE_TID]
    launches = log.launches
    assert len(device) == len(launches)
    assert [e["name"] for e in device] == list(launches["stage"])
    assert np.allclose([e["ts"] for e in device], launches["start"] * 1e6)
    assert np.allclose([e["ts"] + e["dur"] for e in device], launches["end"] * 1e6)
    assert [e["args"]["batch"] for e in device] == list(launches["size"])
    assert [e["args"]["padded"] for e in device] == list(launches["padded"])
    assert [e["args"]["step_mix"] for e in device] == list(launches["step_mix"])
    assert [e["args"]["exits"] for e in device] == list(launches["exits"])
    host = [e for e in events if e["ph"] == "X" and e["tid"] == HOST_TID]
    assert 0 < len(host) == int((launches["host_s"] > 0).sum())
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-6 for a, b in itertools.pairwise(host))  # no overlap
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"queues", "resident requests", "KV blocks"}
    kv = [e for e in events if e["ph"] == "C" and e["name"] == "KV blocks"]
    assert [e["args"]["used"] for e in kv] == list(launches["kv_used"])
    bare = RunLog(launches.drop(columns="kv_used"), log.requests, log.token_times, log.meta)
    assert "KV blocks" not in {e["name"] for e in timeline(bare)["traceEvents"] if e["ph"] == "C"}
    tracks = [e for e in events if e["ph"] == "b" and e["pid"] == REQUESTS_PID and e["name"].startswith("request")]
    assert len(tracks) == len(log.requests)
    first = [e for e in events if e.get("id") == int(log.requests["request_id"].iloc[0]) and e["ph"] in "be"]
    assert [e["name"] for e in first][:3] == ["request 0", "queued", "queued"]
    assert {e["name"] for e in first} >= {"queued", "prefill", "decode"}


def test_timeline_counts_kv_blocks_when_the_log_has_them(small_run) -> None:
    log = small_run.log
    launches = log.launches.assign(kv_used=np.arange(len(log.launches)) % 7)
    with_kv = RunLog(launches, log.requests, log.token_times, {**log.meta, "kv_blocks": 100})
    kv = [e for e in timeline(with_kv)["traceEvents"] if e["name"] == "KV blocks"]
    assert len(kv) == len(launches)
    assert all(e["args"]["used"] + e["args"]["free"] == 100 for e in kv)
    mean, peak = kv_in_use(launches)
    assert peak == 6 and 0 <= mean <= 6
    assert kv_in_use(log.launches.drop(columns="kv_used")) == (None, None)
    assert kv_in_use(log.launches)[1] == log.launches["kv_used"].max() > 0  # the simulator records it


def test_report_has_input_tokens_scheduling_delay_and_chosen_percentiles(small_run) -> None:
    report, log = small_run.report, small_run.log
    assert report.input_tokens == sum(r.prompt_len for r in small_run.setup.requests)
    assert report.preemptions == log.meta["preemptions"]
    delay = latency_samples(log)["scheduling_s"]
    assert (delay >= 0).all() and report.scheduling_s.p50 == pytest.approx(np.percentile(delay, 50))
    ttft = latency_samples(log)["ttft_s"]
    report.with_percentiles(log, (25, 99.9))
    assert report.ttft_s.percentiles == pytest.approx({"p25": np.percentile(ttft, 25),
                                                       "p99.9": np.percentile(ttft, 99.9)})
    assert report.ttft_s.std == pytest.approx(np.std(ttft))
    assert report.ttft_s.p99 == pytest.approx(np.percentile(ttft, 99))  # the fixed ones stay
    assert np.isnan(Distribution.of(np.array([np.nan])).std)
    again = summarize(log, small_run.setup.arch, small_run.setup.requests, 2)
    assert again.ttft_s.p50 == pytest.approx(report.ttft_s.p50)


def test_table_shows_kv_use_from_the_log_and_n_a_without_it(small_run) -> None:
    from commands.study import metric_rows

    log = small_run.log
    arch, requests = small_run.setup.arch, small_run.setup.requests
    with_kv = RunLog(log.launches.assign(kv_used=np.arange(len(log.launches)) % 7), log.requests, log.token_times,
                     log.meta)
    old = RunLog(log.launches.drop(columns="kv_used"), log.requests, log.token_times, log.meta)
    reports = {"plain": summarize(old, arch, requests, 2), "kv": summarize(with_kv, arch, requests, 2)}
    rows = {row["metric"]: row for row in metric_rows(reports)}
    assert rows["KV blocks in use, peak"] == {"metric": "KV blocks in use, peak", "plain": "n/a", "kv": 6.0}
    assert rows["KV blocks in use, mean"]["plain"] == "n/a" and 0 < rows["KV blocks in use, mean"]["kv"] < 6
    assert rows["preemptions"]["plain"] == float(log.meta["preemptions"])


def test_predict_writes_logs_timeline_and_cdfs(tmp_path) -> None:
    logs, cdf = tmp_path / "logs", tmp_path / "cdf.png"
    result = runner.invoke(app, ["predict", "-n", "8", "--workload", "alpaca", "--profile", "roofline",
                                 "--save-logs", str(logs), "--log-format", "csv", "--plot-cdf", str(cdf),
                                 "--percentiles", "50,99.9"])
    assert result.exit_code == 0, result.output
    for run in ("run", "cb"):
        assert {p.name for p in (logs / run).iterdir()} == {"launches.csv", "requests.csv", "meta.json",
                                                             "trace.json.gz"}
    assert cdf.stat().st_size > 1000
    assert "TTFT p99.9 s" in result.stdout and "TTFT std s" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdf.png", "logs"]


def test_csv_and_bound_name_the_profile() -> None:
    result = runner.invoke(app, ["predict", "-n", "8", "--workload", "alpaca", "--profile", "roofline", "--csv",
                                 "--no-baseline"])
    assert result.exit_code == 0, result.output
    row = pd.read_csv(io.StringIO(result.stdout)).iloc[0]
    assert row["profile"].startswith("h200-roofline") and row["input tokens"] > 0
    bound = json.loads(runner.invoke(app, ["bound", "--json"]).stdout)[0]
    from cdbsim.latency.model import LatencyModel
    from cdbsim.latency.shipped import resolve_profile
    from cdbsim.model.arch import PRESETS

    model = LatencyModel(PRESETS["ouro-1.4b"], resolve_profile("auto", PRESETS["ouro-1.4b"]))
    assert bound["B*(512)"] == pytest.approx(model.saturation_batch(512))
    assert bound["profile"] == model.profile.label()


def test_schedule_window_from_the_first_core_step_shows_mixed_loop_steps() -> None:
    args = ["schedule", "--policy", "refill", "--K", "16", "--W", "64", "--workload", "sharegpt",
            "--from-stage", "core", "--launches", "20", "--json"]
    rows = json.loads(runner.invoke(app, args).stdout)
    assert len(rows) == 20 and rows[0]["stage"] == "core"
    assert any(row["stage"] == "core" and row["detail"].count(":") >= 2 for row in rows)  # e.g. "r1:44 r3:20"
    skipped = json.loads(runner.invoke(app, [*args[:-3], "--skip", "2", "--launches", "3", "--json"]).stdout)
    assert [r["#"] for r in skipped] == [r["#"] for r in rows[2:5]]


def test_rate_sweep_plot_into_a_directory_is_refused(tmp_path) -> None:
    result = runner.invoke(app, ["rate-sweep", "-n", "6", "--workload", "alpaca", "--rates", "5",
                                 "--profile", "roofline", "--plot", str(tmp_path), "--json"])
    assert result.exit_code == 2
    assert f"--plot {tmp_path}: is a directory; give a file name ending in .png" in result.output
    assert list(tmp_path.iterdir()) == []


def test_atomic_writes_leave_nothing_half_written(tmp_path) -> None:
    target = tmp_path / "out.csv"
    with pytest.raises(RuntimeError), atomic_file(target) as staging:
        assert staging.suffix == ".csv" and staging.parent == tmp_path
        staging.write_text("half")
        raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []
    with atomic_file(target) as staging:
        staging.write_text("whole")
    assert target.read_text() == "whole" and list(tmp_path.iterdir()) == [target]
    logs = tmp_path / "logs"
    with atomic_dir(logs) as staging:
        (staging / "a").write_text("first")
    with pytest.raises(RuntimeError), atomic_dir(logs) as staging:
        (staging / "b").write_text("second")
        raise RuntimeError("killed")
    assert [p.name for p in logs.iterdir()] == ["a"]  # the old directory survives a failed rewrite
    with atomic_dir(logs) as staging:
        (staging / "b").write_text("second")
    assert [p.name for p in logs.iterdir()] == ["b"] and sorted(p.name for p in tmp_path.iterdir()) == [
        "logs", "out.csv"]


def test_plain_progress_is_quiet_for_short_steps_and_gives_an_eta() -> None:
    now = [0.0]
    out = io.StringIO()
    step = PlainStep("simulating", 100, out, clock=lambda: now[0])
    for _ in range(20):  # 20 items in 2 s: still quiet
        now[0] += 0.1
        step.advance(1)
    assert out.getvalue() == ""
    now[0] = 4.0
    step.advance(20)  # 40 of 100 after 4 s
    assert out.getvalue() == "simulating: 40/100 (40%), 4s elapsed, about 6s left\n"
    now[0] = 5.0
    step.advance(10)  # within 10 s of the last line: quiet
    now[0] = 10.0
    step.advance(50)
    assert out.getvalue().splitlines()[-1] == "simulating: 100/100 done in 10s"
    short = PlainStep("drawing", 10, out, clock=lambda: now[0])
    short.advance(9)
    short.close()  # ended before reporting anything (a quick step): no line
    now[0] = 20.0
    long = PlainStep("run", 10, out, clock=lambda: now[0])
    now[0] = 25.0
    long.advance(9)
    long.close()  # ended short of its count after reporting: says so
    assert out.getvalue().splitlines()[-2:] == ["run: 9/10 (90%), 5s elapsed, about 1s left", "run: 9/10 done in 5s"]
    quick = io.StringIO()
    with progress_display(quick) as factory:  # not a terminal: plain lines, none for a quick step
        advance = factory("quick", 3)
        for _ in range(3):
            advance(1)
    assert quick.getvalue() == ""


def test_workload_generation_reports_progress() -> None:
    from cdbsim.model.arch import PRESETS
    from cdbsim.simulator.workload import WorkloadSpec

    done: list[int] = []
    requests = WorkloadSpec("alpaca", 600).build(PRESETS["ouro-1.4b"], 1, lambda label, n: done.append)
    assert len(requests) == 600 and sum(done) == 600  # the depths are drawn at once: one advance


def test_memory_estimate_refuses_what_the_machine_cannot_hold() -> None:
    from cdbsim.errors import ConfigError
    from cdbsim.simulator.workload import WorkloadSpec

    spec = WorkloadSpec("sharegpt", 10_000)
    assert 0.5e9 < spec.memory_estimate() < 2e9  # about 116 kB per ShareGPT request simulated
    spec.check_memory(available=int(4e9))
    with pytest.raises(ConfigError, match=r"about 1\.2 GB of memory .* more than this machine's 1\.0 GB"):
        spec.check_memory(available=int(1e9))


def test_capacity_reports_each_search_as_it_ends() -> None:
    from cdbsim.planner.capacity import capacity

    calls: list[tuple[int, int]] = []
    exp = Experiment(workload={"name": "alpaca", "requests": 20}, latency={"profile": "roofline"})
    capacity(exp, policies=["cb", "refill"], tpot_s=0.2, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 2), (2, 2)]

