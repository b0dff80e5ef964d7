"""Every bad command-line input is refused up front: exit code 2, one ``error:`` line on stderr naming the
cause, no traceback, and nothing written (each case runs in an empty directory that must stay empty)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cdbsim.arch import PRESETS
from cli import app

SHIPPED = Path(__file__).parents[1] / "calibration/profiles/h200-ouro-1.4b.json"


def write_inputs(directory: Path) -> None:
    """Malformed profiles and architectures, a file where a directory is expected, and a directory that
    holds a file where a run's logs would go."""
    directory.mkdir()
    (directory / "list.json").write_text("[1, 2]")
    profile = json.loads(SHIPPED.read_text())
    first = next(iter(profile["components"]))
    for name, delta in (("delta_abc", "abc"), ("delta_negative", -1.0)):
        bad = json.loads(json.dumps(profile))
        bad["components"][first]["delta"] = delta
        (directory / f"{name}.json").write_text(json.dumps(bad))
    for name, section, key, value in (("r_max", None, "r_max", 4.5), ("hidden", "layer", "hidden", 2048.5),
                                      ("heads", "layer", "hidden", 4096)):
        arch = PRESETS["ouro-1.4b"].to_dict()
        (arch[section] if section else arch)[key] = value
        (directory / f"arch_{name}.json").write_text(json.dumps(arch))
    (directory / "a_file").write_text("")
    (directory / "pareto-pareto.png").mkdir()  # a directory where a sweep's plot would go
    (directory / "logs_with_file").mkdir()
    (directory / "logs_with_file" / "run").write_text("")


BAD = [
    ("predict -n 5 --seed -1", "workload.seed: must be >= 0, got -1"),
    ("predict -n 5 --profile IN/list.json", "list.json: not a cdbsim profile"),
    ("calibrate --refit IN/list.json", "list.json: not a cdbsim profile"),
    ("predict -n 5 --profile IN/delta_abc.json", "delta must be a finite number >= 0, got 'abc'"),
    ("predict -n 5 --profile IN/delta_negative.json", "delta must be a finite number >= 0, got -1.0"),
    ("predict -n 5 --arch IN/arch_r_max.json", "arch_r_max.json: r_max must be a whole number, got 4.5"),
    ("predict -n 5 --arch IN/arch_hidden.json", "layer: hidden must be a whole number, got 2048.5"),
    ("bound --arch IN/arch_heads.json", "heads x head_dim (16 x 128 = 2048) differs from hidden (4096)"),
    ("bound --hidden 4096", "heads x head_dim (16 x 128 = 2048) differs from hidden (4096)"),
    ("predict -n 0", "workload.requests: must be >= 1, got 0"),
    ("trace -n 0 --out t.csv", "workload.requests: must be >= 1, got 0"),
    ("predict -n 1000000000", "GB of memory (1,000,000,000 sharegpt requests simulated"),
    ("predict -n 5 --rate inf", "workload.rate: expected a finite number, got inf"),
    ("predict -n 5 --rate 0", "workload.rate: must be > 0, got 0"),
    ("predict -n 5 --json --csv", "give --json or --csv, not both"),
    ("rate-sweep -n 5 --rates 5 --plot xplot", "--plot xplot: must end in .png"),
    ("rate-sweep -n 5 --rates 5 --plot x.txt", "--plot x.txt: must end in .png"),
    ("rate-sweep -n 5 --rates 5 --plot /nonexistent/x.png", "directory /nonexistent does not exist"),
    ("rate-sweep -n 5 --rates inf", "--rates must be finite numbers > 0 req/s, got inf"),
    ("predict -n 5 --r-max 100000", "one KV block of 16 tokens needs 314.6 GB"),
    ("predict -n 5 --split 0-100000-0", "the weights of ouro-1.4b@0-100000-0 (10,278.1 GB) do not fit"),
    ("predict -n 5 --kv-tokens 1000000000000000", "a KV cache of 62,500,000,000,000 blocks"),
    ("predict --W abc", "Invalid value for '--W' / '--width'"),
    ("predict --no-such-option", "No such option: --no-such-option"),
    ("trace", "Missing option '--out'"),
    ("predict -n 5 --W 1000000", "serve.width: must be <= 65,536"),
    ("predict -n 5 --save-logs IN/a_file", "--save-logs IN/a_file: is a file, not a directory"),
    ("predict -n 5 --save-logs /proc/x", "--save-logs /proc/x: cannot write in /proc"),
    ("predict -n 5 --save-logs IN/logs_with_file", "IN/logs_with_file/run is a file, not a directory"),
    ("predict -n 5 --save-logs missing/logs", "directory missing does not exist"),
    ("predict -n 5 --save-logs IN/a_file/logs", "IN/a_file is a file, not a directory"),
    ("predict -n 5 --plot-cdf cdf.txt", "--plot-cdf cdf.txt: must end in .png"),
    ("predict -n 5 --log-format xml", "unknown log format 'xml'; choose one of: csv, parquet"),
    ("predict -n 5 --percentiles 50,x", "--percentiles must be comma-separated numbers"),
    ("predict -n 5 --percentiles 0,150", "--percentiles must each lie in (0, 100]"),
    ("trace -n 5 --out /nonexistent/t.csv", "--out /nonexistent/t.csv: directory /nonexistent does not exist"),
    ("trace -n 5 --out /proc/t.csv", "--out /proc/t.csv: cannot write in /proc"),
    ("trace -n 5 --out IN/a_file/t.csv", "IN/a_file is a file, not a directory"),
    ("trace -n 5 --out t.txt", "--out t.txt: must end in .csv or .parquet"),
    ("sweep --grid serve.width=16 --out sweep.csv", "--out sweep.csv: must end in .parquet"),
    ("sweep --grid serve.width=16 --out IN/a_file/s.parquet", "IN/a_file is a file, not a directory"),
    ("sweep --grid serve.width=16 --out /proc/s.parquet", "--out /proc/s.parquet: cannot write in /proc"),
    ("sweep --grid serve.width=16 --out /nonexistent/s.parquet", "directory /nonexistent does not exist"),
    ("sweep --grid serve.width=16 --out IN/logs_with_file", "must end in .parquet"),
    ("sweep --grid serve.width=16 --out IN/pareto.parquet", "IN/pareto-pareto.png: is a directory"),
    ("capacity --tpot-ms 50 --target-rate 0", "the target rate must be a finite number > 0 req/s, got 0"),
    ("validate --out IN/a_file", "--out IN/a_file: is a file, not a directory"),
    ("calibrate --out IN/a_file --device cpu", "--out IN/a_file: is a file, not a directory"),
    ("schedule -n 5 --from-stage decode", "--from-stage decode: this run has no decode launch"),
    ("schedule -n 5 --from-stage nowhere", "unknown stage 'nowhere'"),
    ("rate-sweep -n 5 --rates ''", "--rates: empty value"),
    ("predict -n 5 --save-logs ''", "--save-logs: empty value"),  # not the current directory
    ("trace -n 5 --out=", "--out: empty value"),
    ("predict -n 5 --matmul-tflops 1e-300", "latency.matmul_tflops must be >= 0.001 and finite"),
    ("predict -n 5 --launch-us 1e300", "latency.launch_us: must be <= 1,000,000"),
    ("validate --matrix IN/list.json --out v", "IN/list.json: not a validation matrix"),
    ("validate --measured missing --out v", "--measured missing: not a directory of saved executor logs"),
    ("calibrate --update IN/list.json --kernels --device cpu --out k", "IN/list.json: not a cdbsim profile"),
]


@pytest.mark.parametrize("command,message", BAD, ids=[c for c, _ in BAD])
def test_bad_input_is_refused_up_front(tmp_path, monkeypatch, command: str, message: str) -> None:
    inputs = tmp_path / "IN"
    write_inputs(inputs)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = CliRunner().invoke(app, [arg.replace("IN/", f"{inputs}/") for arg in shlex.split(command)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message.replace("IN/", f"{inputs}/") in lines[0]
    assert "Traceback" not in result.output and result.stdout == ""
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


def test_a_head_size_set_on_purpose_is_allowed(tmp_path) -> None:
    arch = PRESETS["ouro-1.4b"].to_dict()
    arch["layer"].update(hidden=4096, head_dim_explicit=True)
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(arch))
    runner = CliRunner()
    assert runner.invoke(app, ["bound", "--arch", str(path), "--json"]).exit_code == 0
    assert runner.invoke(app, ["bound", "--hidden", "4096", "--head-dim", "128", "--json"]).exit_code == 0
    assert runner.invoke(app, ["bound", "--hidden", "4096", "--heads", "32", "--json"]).exit_code == 0
    from cdbsim.arch import load_arch

    wide = load_arch(str(path))  # a file written from it says so again, and reads back
    back = tmp_path / "back.json"
    back.write_text(json.dumps(wide.to_dict()))
    assert load_arch(str(back)).layer == wide.layer


def test_no_command_prints_the_help() -> None:
    result = CliRunner().invoke(app, [])
    assert result.exit_code == 0 and "predict" in result.output
