"""``cdbsim sweep`` and ``cdbsim capacity`` on the command line: files, tables, and one-line errors that
leave nothing behind."""

from __future__ import annotations

import builtins
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()
SMALL = ["--workload", "alpaca", "--requests", "30"]


def files_in(path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_sweep_writes_rows_plots_and_the_best_points(tmp_path) -> None:
    out = tmp_path / "grid.parquet"
    args = ["sweep", *SMALL, "--grid", "serve.width=16,64", "--grid", "serve.policy=cb,refill", "--out", str(out),
            "--csv", "--cache", str(tmp_path / "cache.sqlite")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert files_in(tmp_path) == ["cache.sqlite", "grid-fields.png", "grid-pareto.png", "grid.csv", "grid.parquet"]
    rows = pd.read_parquet(out)
    assert list(rows["serve.width"]) == [16, 16, 64, 64] and (rows["status"] == "ok").all()
    assert pd.read_csv(tmp_path / "grid.csv")["output_tps"].tolist() == rows["output_tps"].tolist()
    assert "Best points" in result.stdout and "output tok/s per GPU" in result.stdout
    assert "4 points: 4 simulated, 0 from the cache, 0 skipped" in result.stdout
    again = runner.invoke(app, [*args, "--json", "--no-plots"])
    summary = json.loads(again.stdout)
    assert (summary["simulated"], summary["cached"]) == (0, 4)
    best = {row["objective"]: row for row in summary["best"]}
    assert best["output tok/s per GPU"]["best"] == rows["output_tps"].max()
    assert best["p99 TPOT ms"]["best"] == pytest.approx(rows["tpot_s_p99"].min() * 1e3)


def test_sweep_reads_grid_and_points_from_the_config_file(tmp_path) -> None:
    config = tmp_path / "study.toml"
    config.write_text('[workload]\nname = "alpaca"\nrequests = 30\n\n[grid]\nserve.width = [16, 32]\n\n'
                      '[[points]]\narch.name = "ouro-1.4b"\n\n[[points]]\narch.name = "huginn-3.5b"\n'
                      'exits.mean_depth = 6\n')
    out = tmp_path / "study.parquet"
    result = runner.invoke(app, ["sweep", "--config", str(config), "--out", str(out), "--no-cache", "--no-plots"])
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(out)
    assert list(rows["arch.name"]) == ["ouro-1.4b"] * 2 + ["huginn-3.5b"] * 2
    assert list(rows["serve.width"]) == [16, 32, 16, 32]
    assert list(rows["exits.mean_depth"].fillna(0)) == [0, 0, 6, 6] and rows["r_max"].tolist() == [4, 4, 16, 16]


PROGRESS_LINE = re.compile(r"[^:]+: [\d,]+/[\d,]+ (\(|done in )")
"""A plain-text progress line (stderr is not a terminal here): ``LABEL: 2/3 (67%), ...`` or ``LABEL: 3/3 done in``."""


def bad(args: list[str], tmp_path) -> str:
    """Run a command that must fail: exit 2, one line on stderr, nothing on stdout, no file left."""
    before = files_in(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = [line for line in result.stderr.strip().splitlines() if not PROGRESS_LINE.match(line)]
    assert len(lines) == 1, result.stderr  # a search that fails after seconds of work may first report progress
    assert files_in(tmp_path) == before
    return lines[0]


@pytest.mark.parametrize("grid,message", [
    ([], "error: the grid is empty: give fields to sweep"),
    (["--grid", "serve.widht=16"], "error: --grid: unknown key serve.widht; valid keys of [serve]: coda_batch"),
    (["--grid", "serve.width=16,wide"], "error: --grid: serve.width: expected an integer, got 'wide'"),
    (["--grid", "serve.width=16,32", "--grid", "serve.coda_batch=64"],
     "error: no point of the grid can run; the first (serve.width=16 serve.coda_batch=64): K (64) must not exceed "
     "W (16)"),
    (["--grid", "serve.width=16", "--dask", "tcp://127.0.0.1:9"], "error: no Dask scheduler answered at "
                                                                 "tcp://127.0.0.1:9 within 3 s"),
    (["--grid", "serve.width=16", "--jobs", "0"], "error: --jobs must be >= 1, got 0"),
])
def test_bad_sweep_is_one_line_and_leaves_no_file(tmp_path, grid: list[str], message: str) -> None:
    out = tmp_path / "rows.parquet"
    assert bad(["sweep", *SMALL, *grid, "--out", str(out), "--no-cache"], tmp_path).startswith(message)


def test_sweep_into_a_missing_folder_is_refused(tmp_path) -> None:
    message = bad(["sweep", *SMALL, "--grid", "serve.width=16", "--out", str(tmp_path / "no" / "rows.parquet"),
                   "--no-cache"], tmp_path)
    out = tmp_path / "no" / "rows.parquet"
    assert message == f"error: --out {out}: directory {tmp_path / 'no'} does not exist"


def test_sweep_whose_points_all_fail_while_running_leaves_no_file(tmp_path) -> None:
    message = bad(["sweep", *SMALL, "--kv-tokens", "64", "--grid", "serve.width=16,32", "--out",
                   str(tmp_path / "rows.parquet"), "--no-cache", "--no-plots"], tmp_path)
    assert message.startswith("error: no point of the grid could run; the first: KV capacity of 4 blocks")


def test_dask_without_the_extra_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    real_import = builtins.__import__

    def no_distributed(name, *args, **kwargs):
        if name.split(".")[0] in ("dask", "distributed"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_distributed)
    message = bad(["sweep", *SMALL, "--grid", "serve.width=16", "--dask", "local", "--out",
                   str(tmp_path / "rows.parquet"), "--no-cache"], tmp_path)
    assert message == "error: --dask needs the dask extra: pip install 'cdbsim[dask]'"


def test_capacity_prints_rate_per_gpu_and_gpus_needed() -> None:
    result = runner.invoke(app, ["capacity", "--workload", "alpaca", "--requests", "200", "--profile", "roofline",
                                 "--W", "32", "--ttft-s", "0.3", "--tpot-ms", "15", "--policies", "cb,refill",
                                 "--target-rate", "500", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)[0]
    assert data["slo"] == "p99 TTFT <= 300 ms, p99 TPOT <= 15 ms"
    cb, refill = data["results"]
    assert (cb["policy"], refill["policy"]) == ("cb", "refill")
    for row in (cb, refill):
        assert row["simulations"] <= 12 and row["search within %"] <= 2.0 and "note" not in row
        assert row["GPUs for 500 req/s"] == -(-500 // row["req/s per GPU"])
    table = runner.invoke(app, ["capacity", "--workload", "alpaca", "--requests", "60", "--profile", "roofline",
                                "--tpot-ms", "1000", "--policies", "refill"])
    assert table.exit_code == 0 and "req/s per GPU" in table.stdout
    assert "refill: offline bound only: the SLOs hold even offline" in " ".join(table.stdout.split())


@pytest.mark.parametrize("args,message", [
    (["--tpot-ms", "0.1", "--policies", "refill"], "error: refill: the SLOs (p99 TPOT <= 0.1 ms) are not met even at"),
    (["--tpot-ms", "0.1"], "error: no policy meets the SLOs; cb: the SLOs"),
    ([], "error: give at least one SLO"),
    (["--tpot-ms", "50", "--policies", "cb,fifo"],
     "error: unknown policy 'fifo'; choose one of: adaptive, cb, norefill, refill"),
    (["--tpot-ms", "50", "--target-rate", "0"], "error: the target rate must be a finite number > 0 req/s, got 0"),
    (["--tpot-ms", "50", "--attainment", "2"], "error: the attainment must be in (0, 1]"),
])
def test_bad_capacity_is_one_line(tmp_path, args: list[str], message: str) -> None:
    assert bad(["capacity", "--workload", "alpaca", "--requests", "40", "--profile", "roofline", *args],
               tmp_path).startswith(message)


def test_a_bad_grid_in_the_config_file_names_the_file(tmp_path) -> None:
    config = tmp_path / "study.toml"
    config.write_text("[grid]\nserve.widht = [16]\n")
    message = bad(["sweep", "--config", str(config), "--out", str(tmp_path / "rows.parquet"), "--no-cache"], tmp_path)
    assert message.startswith(f"error: {config}: [grid]: unknown key serve.widht; valid keys of [serve]")
    config.write_text("[[points]]\narch.r_max = 'deep'\n")
    message = bad(["sweep", "--config", str(config), "--out", str(tmp_path / "rows.parquet"), "--no-cache"], tmp_path)
    assert message == f"error: {config}: [grid]: point 1: arch.r_max: expected an integer (or none), got 'deep'"


def test_a_stopped_sweep_leaves_no_file(tmp_path) -> None:
    """SIGTERM (a scheduler's stop) unwinds like Ctrl-C: the temporary rows file is removed."""
    root = Path(__file__).parents[1]
    command = [sys.executable, "-m", "cli", "sweep", "--workload", "alpaca", "--requests", "300", "--no-cache",
               "--grid", "serve.width=16,24,32,48,64,96,128", "--out", str(tmp_path / "rows.parquet")]
    env = {**os.environ, "PYTHONPATH": str(root)}
    process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".rows.parquet.*")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert process.poll() is None, "the sweep ended before it could be stopped"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert files_in(tmp_path) == []
