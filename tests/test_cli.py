"""The command line: tables, machine-readable output and one-line errors with exit code 2."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("schedule", "trace", "bound", "predict", "compare", "rate-sweep", "validate", "calibrate", "sweep",
                    "capacity"):
        assert command in result.output


def test_schedule_prints_twenty_launches() -> None:
    args = ["schedule", "--arch", "ouro-1.4b", "--policy", "refill", "--K", "16", "--W", "64",
            "--workload", "sharegpt", "--launches", "20", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 20 and rows[0]["stage"] == "prefill"
    table = runner.invoke(app, args[:-1])
    assert table.exit_code == 0 and "prelude" in table.output


def test_bound_reports_layouts() -> None:
    result = runner.invoke(app, ["bound", "--arch", "huginn-3.5b", "--mean-depth", "8", "--json"])
    assert result.exit_code == 0
    row = json.loads(result.stdout)[0]
    assert row["KV B/token depth"] == 1_436_160 and row["S_dec"] > 1.8


@pytest.mark.parametrize("args,message", [
    (["schedule", "--arch", "llama"], "unknown architecture 'llama'"),
    (["schedule", "--K", "65"], "K (65) must not exceed W (64)"),
    (["schedule", "--W", "0"], "W must be >= 1"),
    (["schedule", "--r-min", "5"], "r_min (5) must not exceed r_max (4)"),
    (["schedule", "--policy", "fifo"], "unknown policy"),
    (["predict", "--policy", "adaptive", "--K", "1"], "adaptive chooses the coda batch K itself"),
    (["sweep", "--grid", "serve.policy=adaptive", "--grid", "serve.coda_batch=4"],
     "adaptive chooses the coda batch K itself"),
    (["schedule", "--workload", "c4"], "unknown workload"),
    (["schedule", "--exits", "fixed", "--depth", "7"], "outside [r_min, r_max]"),
    (["schedule", "--kv-tokens", "64"], "smaller than request"),
    (["bound", "--mean-depth", "9"], "mean depth must be in"),
    (["predict", "--profile", "a100"], "unknown profile 'a100'; choose one of"),
    (["predict", "--kv-tokens", "100"], "smaller than request"),
    (["rate-sweep", "--rates", "1,x"], "--rates must be comma-separated"),
])
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_trace_depth_outside_range_names_file_and_line(tmp_path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,8,3,0,2 2\n1,8,3,0,2 5\n")
    result = runner.invoke(app, ["schedule", "--trace", str(path)])
    assert result.exit_code == 2
    assert f"{path}:3: exit depth 5 is outside [1, r_max = 4]" in result.output


def test_predict_runs_with_no_arguments() -> None:
    result = runner.invoke(app, ["predict", "--requests", "60"])
    assert result.exit_code == 0, result.output
    assert "refill K=1" in result.output and "cb" in result.output and "profile" in result.output


def test_predict_json_has_speedup_and_bound() -> None:
    result = runner.invoke(app, ["predict", "--workload", "alpaca", "--requests", "100", "--json",
                                 "--profile", "roofline"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    refill = data["refill K=1"]
    assert refill["speedup"] > 1.0 and 0 < refill["bound_realised"] <= 1.0
    assert refill["meta"]["profile"].startswith("h200-roofline")


def test_compare_and_rate_sweep(tmp_path) -> None:
    k_plot = tmp_path / "k.png"
    result = runner.invoke(app, ["compare", "--workload", "alpaca", "--requests", "80", "--csv",
                                 "--plot-k", str(k_plot)])
    assert result.exit_code == 0, result.output
    assert [line.split(",")[0] for line in result.stdout.strip().splitlines()[1:]] == ["cb", "norefill",
                                                                                       "refill K=1", "adaptive"]
    assert k_plot.stat().st_size > 1000
    plot = tmp_path / "sweep.png"
    result = runner.invoke(app, ["rate-sweep", "--workload", "alpaca", "--requests", "60", "--rates", "5,20",
                                 "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    assert plot.stat().st_size > 1000
    assert len(json.loads(result.stdout)[0]["points"]) == 6


def test_roofline_overrides_change_the_prediction() -> None:
    base = runner.invoke(app, ["predict", "--requests", "40", "--no-baseline", "--json"])
    fast = runner.invoke(app, ["predict", "--requests", "40", "--no-baseline", "--json", "--bandwidth", "8"])
    assert base.exit_code == fast.exit_code == 0
    slow_tps = json.loads(base.stdout)["refill K=1"]["output_tps"]
    fast_data = json.loads(fast.stdout)["refill K=1"]
    assert fast_data["output_tps"] > 1.3 * slow_tps and "what-if bandwidth 8" in fast_data["meta"]["profile"]


def test_trace_command_writes_a_replayable_trace(tmp_path) -> None:
    path = tmp_path / "alpaca.parquet"
    result = runner.invoke(app, ["trace", "--workload", "alpaca", "--requests", "30", "--rate", "5",
                                 "--out", str(path)])
    assert result.exit_code == 0, result.output
    replay = runner.invoke(app, ["predict", "--trace", str(path), "--json", "--profile", "roofline"])
    assert replay.exit_code == 0, replay.output
    assert json.loads(replay.stdout)["refill K=1"]["requests"] == 30
    bad = runner.invoke(app, ["trace", "--out", str(tmp_path / "t.txt")])
    assert bad.exit_code == 2 and "must end in .csv or .parquet" in bad.output


def test_calibrate_refit_rewrites_a_profile_from_its_raw_points(tmp_path) -> None:
    """--refit needs no GPU: the fits come back from the raw points, the points stay as they were."""
    import shutil
    from pathlib import Path

    from cdbsim.latency.profile import load_profile_file

    shipped = Path(__file__).parents[1] / "calibration/profiles/h200-ouro-1.4b.json"
    path = tmp_path / "p.json"
    shutil.copy(shipped, path)
    raw = json.loads(path.read_text())
    raw["components"]["layer/ouro-h2048-i5632-a16x128-kv16"]["delta"] = 1.0  # a stale fit
    path.write_text(json.dumps(raw))
    result = runner.invoke(app, ["calibrate", "--refit", str(path)])
    assert result.exit_code == 0, result.output
    before, after = load_profile_file(shipped), load_profile_file(path)
    layer = "layer/ouro-h2048-i5632-a16x128-kv16"
    assert after.components[layer].delta == pytest.approx(before.components[layer].delta)
    assert all(after.components[n].points == before.components[n].points for n in before.components)
    # the stored mixed-context points give the same width and p; a profile measured before the head width
    # was recorded with them gets it from its layer
    assert after.attention == {**before.attention, "head_dim": 128}
    title = f"attention width {before.attention_slots:,.0f}, sharpness {before.attention_sharpness:g}"
    assert title in " ".join(result.output.split())
    missing = runner.invoke(app, ["calibrate", "--refit", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_calibrate_refit_sets_the_launch_gap_from_saved_runs(tmp_path) -> None:
    """--launch-gap fits the device's gap over the runs of a saved matrix (the shipped profiles' own came from
    the logs beside them); it needs --refit and saved runs."""
    import shutil
    from pathlib import Path

    import pandas as pd

    from calibration.fit import fit_launch_gap
    from calibration.validation import unpacked_logs

    root = Path(__file__).parents[1]
    logs = root / "benchmarks/results/validation/measured-logs.tgz"
    path = tmp_path / "p.json"
    shutil.copy(root / "calibration/profiles/h200-huginn-3.5b.json", path)
    raw = json.loads(path.read_text())
    raw["device"]["launch_gap_s"] = 9e-6
    path.write_text(json.dumps(raw))
    result = runner.invoke(app, ["calibrate", "--refit", str(path), "--launch-gap", str(logs)])
    assert result.exit_code == 0, result.output
    with unpacked_logs(logs) as runs:
        want = fit_launch_gap([pd.read_parquet(f) for f in sorted(runs.glob("*/launches.parquet"))])
    assert json.loads(path.read_text())["device"]["launch_gap_s"] == pytest.approx(want, rel=1e-9)
    assert 1e-6 < want < 2e-6
    for args, message in ((["--launch-gap", str(logs)], "goes with --refit"),
                          (["--refit", str(path), "--launch-gap", str(tmp_path)], "no saved executor runs"),
                          (["--refit", str(path), "--launch-gap", str(tmp_path / "none")], "no such directory")):
        bad = runner.invoke(app, ["calibrate", *args])
        assert bad.exit_code == 2 and message in " ".join(bad.output.split()), bad.output


def run_predict(*args: str) -> dict:
    result = runner.invoke(app, ["predict", "--no-baseline", "--json", "--profile", "roofline", *args])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.stdout).values()
    return report


def test_config_file_flags_and_set_take_precedence_in_that_order(tmp_path) -> None:
    config = tmp_path / "exp.toml"
    config.write_text('[serve]\nwidth = 32\ncoda_batch = 4\n\n[workload]\nname = "alpaca"\nrequests = 30\n')
    from_file = run_predict("--config", str(config))
    assert (from_file["meta"]["width"], from_file["meta"]["coda_batch"], from_file["requests"]) == (32, 4, 30)
    flag = run_predict("--config", str(config), "--W", "48", "--requests", "20")
    assert (flag["meta"]["width"], flag["meta"]["coda_batch"], flag["requests"]) == (48, 4, 20)
    at_default = run_predict("--config", str(config), "--W", "64")  # a flag equal to the default still wins
    assert at_default["meta"]["width"] == 64
    both = run_predict("--config", str(config), "--W", "48", "--set", "serve.width=16", "--set", "serve.coda_batch=2")
    assert (both["meta"]["width"], both["meta"]["coda_batch"]) == (16, 2)
    assert both == run_predict("--W", "16", "--K", "2", "--workload", "alpaca", "--requests", "30")


def test_command_defaults_sit_below_the_config_file(tmp_path) -> None:
    """schedule shows 256 requests unless the file says otherwise (its Q_P counts the waiting prompts)."""
    config = tmp_path / "exp.toml"
    config.write_text("[workload]\nrequests = 40\n")
    rows = json.loads(runner.invoke(app, ["schedule", "--json", "--launches", "1"]).stdout)
    assert rows[0]["Q_P"] + rows[0]["active"] == 256
    rows = json.loads(runner.invoke(app, ["schedule", "--json", "--launches", "1", "--config", str(config)]).stdout)
    assert rows[0]["Q_P"] + rows[0]["active"] == 40


@pytest.mark.parametrize("args,message", [
    (["--set", "serve.width=abc"], "error: --set: serve.width: expected an integer, got 'abc'"),
    (["--set", "exits.dispersion=high"], "error: --set: exits.dispersion: expected a number, got 'high'"),
    (["--set", "serve.widht=8"], "error: --set: unknown key serve.widht; valid keys of [serve]: coda_batch, "
                                 "core_launch, kv_blocks, kv_layout, kv_tokens, memory_fraction, over_memory, policy, "
                                 "prefill_budget, timing, width"),
    (["--set", "serve.timing=later"], "error: --set: serve.timing: unknown exit timing 'later'; choose one of: "
                                      "async, lookahead, sync"),
    (["--set", "width=8"], "error: --set: expected section.field=value, got 'width'"),
    (["--config", "missing.toml"], "error: experiment file missing.toml does not exist"),
])
def test_bad_set_or_config_is_one_line_on_stderr(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["predict", "--requests", "10", *args])
    assert result.exit_code == 2
    assert result.stderr.strip() == message
    assert "Traceback" not in result.output and result.stdout == ""


def test_bad_config_file_names_the_file_and_key(tmp_path) -> None:
    config = tmp_path / "exp.toml"
    config.write_text("[latency]\nprofile = 'roofline'\nbandwith = 8\n")
    result = runner.invoke(app, ["compare", "--config", str(config)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.strip() == (f"error: {config}: unknown key latency.bandwith; valid keys of [latency]: "
                                     "bandwidth, device, force, host_us, launch_us, matmul_tflops, memory_gb, profile")


def test_help_lists_every_option_once() -> None:
    for command in ("predict", "compare", "rate-sweep", "schedule", "trace", "bound", "validate", "sweep", "capacity"):
        result = runner.invoke(app, [command, "--help"], terminal_width=200)
        assert result.exit_code == 0
        lines = re.findall(r"^  (-[^ ,]+(?:(?:, | / )-[^ ,]+)*)", result.output.split("Options:")[1], re.M)
        flags = [flag for line in lines for flag in re.split(", | / ", line)]
        assert len(flags) == len(set(flags)), (command, sorted(flags))
        assert {"--config", "--set", "--arch", "--help"} <= set(flags), command
    predict = runner.invoke(app, ["predict", "--help"], terminal_width=200).output
    for flag in ("--hf-config", "--W", "--K", "--M", "--kv-tokens", "-n", "--exits", "--bandwidth", "--no-baseline",
                 "--save-logs", "--json"):
        assert re.search(rf"(^|[ ,]){flag}[ ,]", predict, re.M), flag


def test_shape_and_hf_config_options_reach_the_model(tmp_path) -> None:
    config = tmp_path / "huginn" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "huginn_raven", "n_embd": 5280, "n_heads": 55,
                                  "intermediate_size": 17920, "n_layers_in_prelude": 2,
                                  "n_layers_in_recurrent_block": 4, "n_layers_in_coda": 2, "vocab_size": 65536,
                                  "rope_base": 50000, "tie_embeddings": True}))
    from_hf = json.loads(runner.invoke(app, ["bound", "--hf-config", str(config), "--mean-depth", "8",
                                             "--json"]).stdout)[0]
    preset = json.loads(runner.invoke(app, ["bound", "--arch", "huginn-3.5b", "--mean-depth", "8",
                                            "--json"]).stdout)[0]
    assert from_hf.pop("arch") == "huginn" and preset.pop("arch") == "huginn-3.5b"
    shape_only = [k for k in preset if k.startswith(("B*(", "delta")) or k == "profile"]  # from the profile found
    assert {k: v for k, v in from_hf.items() if k not in shape_only} == {
        k: v for k, v in preset.items() if k not in shape_only}
    narrow = json.loads(runner.invoke(app, ["bound", "--set", "arch.kv_heads=4", "--json"]).stdout)[0]
    assert narrow["KV B/token depth"] == 786_432 // 4
    both = runner.invoke(app, ["bound", "--hf-config", str(config), "--arch", "ouro-2.6b"])
    assert both.exit_code == 2 and "not both" in both.stderr


def test_validate_refuses_two_sources_of_arrivals(tmp_path) -> None:
    result = runner.invoke(app, ["validate", "--out", str(tmp_path), "--set", "workload.rate=5",
                                 "--rate-of-capacity", "0.5"])
    assert result.exit_code == 2
    assert "give one of workload.rate and rate_of_capacity" in result.stderr


def test_profiles_folder_from_the_environment(tmp_path, monkeypatch) -> None:
    """CDBSIM_PROFILES points auto at another build's profiles (saved results re-predict with theirs);
    a folder without profiles is refused in one line."""
    import json

    from cdbsim.latency.shipped import profile_dir

    shipped = profile_dir() / "h200-ouro-1.4b.json"
    record = json.loads(shipped.read_text())
    record["name"] = "older-build-ouro-1.4b"
    (tmp_path / "h200-ouro-1.4b.json").write_text(json.dumps(record))
    args = ["predict", "--requests", "20", "--no-baseline", "--json"]
    monkeypatch.setenv("CDBSIM_PROFILES", str(tmp_path))
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "older-build-ouro-1.4b" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("CDBSIM_PROFILES", str(empty))
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0
    assert "CDBSIM_PROFILES" in result.output


def test_an_unknown_option_suggests_the_options_it_resembles() -> None:
    from commands.common import json_text, similar_options

    options = ["--core", "--style", "--target-rate", "--width", "--W", "--tpot-ms", "--policy"]
    assert similar_options("--rate", options) == ["--target-rate"]
    assert similar_options("--widht", options) == ["--width"]
    assert similar_options("--w", options) == ["--W"]
    assert similar_options("--tpot", options) == ["--tpot-ms"]
    assert similar_options("--zzz", options) == []
    assert json_text({"a": [float("nan"), 1.5, float("inf")]}) == '{\n  "a": [\n    null,\n    1.5,\n    null\n  ]\n}\n'
