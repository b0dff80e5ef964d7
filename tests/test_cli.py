"""The command line: tables, machine-readable output and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("schedule", "bound"):
        assert command in result.output


def test_schedule_prints_twenty_launches() -> None:
    args = ["schedule", "--arch", "ouro-1.4b", "--policy", "refill", "--K", "16", "--W", "64",
            "--workload", "sharegpt", "--launches", "20", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 20 and rows[0]["stage"] == "prefill"
    table = runner.invoke(app, args[:-1])
    assert table.exit_code == 0 and "prelude" in table.output


def test_bound_reports_layouts() -> None:
    result = runner.invoke(app, ["bound", "--arch", "huginn-3.5b", "--mean-depth", "8", "--json"])
    assert result.exit_code == 0
    row = json.loads(result.output)[0]
    assert row["KV B/token depth"] == 1_436_160 and row["S_dec"] > 1.8


@pytest.mark.parametrize("args,message", [
    (["schedule", "--arch", "llama"], "unknown architecture 'llama'"),
    (["schedule", "--K", "65"], "K (65) must not exceed W (64)"),
    (["schedule", "--W", "0"], "W must be >= 1"),
    (["schedule", "--r-min", "5"], "r_min (5) must not exceed r_max (4)"),
    (["schedule", "--policy", "fifo"], "unknown policy"),
    (["schedule", "--workload", "c4"], "unknown workload"),
    (["schedule", "--exits", "fixed", "--depth", "7"], "outside [r_min, r_max]"),
    (["schedule", "--kv-tokens", "64"], "smaller than request"),
    (["bound", "--mean-depth", "9"], "mean depth must be in"),
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
