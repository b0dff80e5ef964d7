"""Every bad command-line input is refused up front: exit code 2, one ``error:`` line on stderr naming the
cause, no traceback, and nothing written (each case runs in an empty directory that must stay empty)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdbsim.model.arch import PRESETS
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
    write_malformed(directory, profile)
    (directory / "pareto-pareto.png").mkdir()  # a directory where a sweep's plot would go
    (directory / "logs_with_file").mkdir()
    (directory / "logs_with_file" / "run").write_text("")


def write_malformed(directory: Path, profile: dict) -> None:
    """Files with one mistake each: bytes that are not UTF-8, a wrong type or range in a profile, an
    architecture, a trace or a validation matrix, and saved executor logs that are cut short."""
    (directory / "binary.json").write_bytes(b'{"name": "\xff\xfe"}')
    (directory / "latin1.toml").write_bytes(b"[serve]\nwidth = 8  # caf\xe9\n")
    for name, change in (("kind_list", {"kind": [1, 2]}),
                         ("slots_text", {"attention": {**profile.get("attention", {}), "slots": "x"}}),
                         ("power_slowdown", {"kernels": {"sustained": {"onset_s": 0.1, "slowdown": 0.5}}})):
        (directory / f"{name}.json").write_text(json.dumps({**profile, **change}))
    for key, value in (("dtype_bytes", 0), ("rope_theta", -1.0)):
        (directory / f"arch_{key}.json").write_text(json.dumps({**PRESETS["ouro-1.4b"].to_dict(), key: value}))
    header = "request_id,prompt_len,output_len,arrival_s,exit_depths\n"
    (directory / "good.csv").write_text(header + "0,8,3,0,2 2\n")
    (directory / "depth_huge.csv").write_text(header + "0,8,3,0,2 99999999999999999999\n")
    (directory / "extra_field.csv").write_text(header + "0,8,3,0,2 2,9\n")
    settings = ["workload.name=alpaca", "workload.requests=5", "serve.kv_tokens=65536"]
    entry = {"name": "a", "set": settings}
    for name, config in (("matrix", entry), ("matrix_width", {**entry, "set": [*settings, "serve.width=abc"]}),
                         ("matrix_seed", {**entry, "set": [*settings, "workload.seed=-1"]}),
                         ("matrix_rate", {**entry, "rate_of_capacity": -1}), ("matrix_name", {**entry, "name": 5}),
                         ("matrix_arch", {**entry, "set": [*settings, "arch.name=llama"]}),
                         ("matrix_old", {"name": "a", "width": 8}), ("matrix_item", "a")):
        (directory / f"{name}.json").write_text(json.dumps({"configs": [config]}))
    from cdbsim.report.logs import REQUEST_LOG_COLUMNS, SAVED_LAUNCH_COLUMNS

    launches = ",".join(SAVED_LAUNCH_COLUMNS) + "\n" + ",".join(
        {"stage": "prefill", "step_mix": ""}.get(c, "0") for c in SAVED_LAUNCH_COLUMNS) + "\n"
    requests = ",".join(REQUEST_LOG_COLUMNS) + "\n0,8,3,0,0,0.1,0.2,0.1 0.15 0.2\n"
    for name, files in (("logs_garbage", {"launches.parquet": "PAR1 cut short"}),
                        ("logs_no_requests", {"launches.csv": launches}),
                        ("logs_columns", {"launches.csv": "index,stage\n0,prefill\n", "requests.csv": requests}),
                        ("logs_meta", {"launches.csv": launches, "requests.csv": requests, "meta.json": "{"})):
        (directory / name / "a").mkdir(parents=True)
        for file, text in files.items():
            (directory / name / "a" / file).write_text(text)
    import io
    import tarfile

    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        data = bytes(range(256)) * 2048 + json.dumps(profile).encode()  # compresses poorly: cut mid-member
        member = tarfile.TarInfo("a/launches.parquet")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    (directory / "truncated.tgz").write_bytes(packed.getvalue()[: len(packed.getvalue()) // 2])
    with tarfile.open(directory / "empty.tgz", "w:gz"):
        pass


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
    ("predict -n 5 --r-max 100000", "one KV block of 16 tokens needs 293.0 GiB"),
    ("predict -n 5 --split 0-100000-0", "the weights of ouro-1.4b@0-100000-0 (9,572.2 GiB) and its run-time buffers"),
    ("predict -n 5 --kv-tokens 1000000000000000", "1,000,000,000,000,000 KV tokens need 732,421,875,000.0 GiB"),
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
    ("sweep --grid serve.width=16 --out IN/logs_with_file", "is a directory; give a file name ending in .parquet"),
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
    ("validate --matrix IN/matrix.json --arch huginn-3.5b --W 8 --out v",
     "--arch, --W: a --matrix entry sets its own configuration; of the options only --profile, --force and "
     "--device apply"),
    ("validate --measured missing --out v", "--measured missing: not a directory of saved executor logs"),
    ("calibrate --update IN/list.json --kernels --device cpu --out k", "IN/list.json: not a cdbsim profile"),
    # malformed files: the file and, where there is one, the line
    ("bound --arch IN/binary.json", "IN/binary.json:1: not UTF-8 text (byte 0xff at offset 10)"),
    # a file without the .json suffix is still read as the file it is, not taken for an unknown name
    ("bound --arch IN/good.csv", "IN/good.csv:1: invalid JSON"),
    ("bound --profile IN/good.csv", "IN/good.csv:1: invalid JSON"),
    ("predict -n 5 --config IN/latin1.toml", "IN/latin1.toml:2: not UTF-8 text (byte 0xe9"),
    ("bound --profile IN/kind_list.json", "IN/kind_list.json: malformed profile (unknown profile kind [1, 2]"),
    ("bound --profile IN/slots_text.json", "IN/slots_text.json: attention.slots must be a finite number > 0"),
    ("bound --profile IN/power_slowdown.json", "IN/power_slowdown.json: kernels.sustained: a sustained load needs"),
    ("bound --arch IN/arch_dtype_bytes.json", "IN/arch_dtype_bytes.json: dtype_bytes must be >= 1, got 0"),
    ("bound --arch IN/arch_rope_theta.json", "IN/arch_rope_theta.json: rope_theta must be > 0, got -1.0"),
    ("predict --trace IN/depth_huge.csv", "IN/depth_huge.csv:2: exit_depths must be space-separated whole numbers"),
    ("predict --trace IN/extra_field.csv", "IN/extra_field.csv:2: more fields than the header's 5"),
    ("validate --matrix IN/matrix_width.json --out v", "IN/matrix_width.json: config 0 (a): serve.width: expected an "
                                                      "integer, got 'abc'"),
    ("validate --matrix IN/matrix_seed.json --out v", "IN/matrix_seed.json: config 0 (a): workload.seed: must be >= 0"),
    ("validate --matrix IN/matrix_rate.json --out v", "config 0 (a): rate_of_capacity must be > 0, got -1.0"),
    ("validate --matrix IN/matrix_name.json --out v", "config 0: name must be a text that names a directory"),
    ("validate --matrix IN/matrix_arch.json --out v", "IN/matrix_arch.json: config 0 (a): unknown architecture"),
    ("validate --matrix IN/matrix_old.json --out v", "IN/matrix_old.json: config 0 (a): unknown key(s) width; "
                                                    "an entry has name, set, rate_of_capacity"),
    ("validate --matrix IN/matrix_item.json --out v", "IN/matrix_item.json: config 0 must be an object"),
    ("validate --matrix IN/matrix.json --measured IN/logs_garbage --out v",
     "IN/logs_garbage/a/launches.parquet: not a readable parquet log"),
    ("validate --matrix IN/matrix.json --measured IN/logs_no_requests --out v",
     "IN/logs_no_requests/a/requests.csv: missing"),
    ("validate --matrix IN/matrix.json --measured IN/logs_columns --out v",
     "IN/logs_columns/a/launches.csv: missing column(s) size, padded"),
    ("validate --matrix IN/matrix.json --measured IN/logs_meta --out v", "IN/logs_meta/a/meta.json:1: invalid JSON"),
    ("validate --matrix IN/matrix.json --measured IN/truncated.tgz --out v", "--measured IN/truncated.tgz: cannot "
                                                                             "unpack"),
    ("validate --matrix IN/matrix.json --measured IN/empty.tgz --out v",  # the archive, not a temporary directory
     "--measured IN/empty.tgz: no saved executor run for matrix entry a; expected a/launches.parquet (or .csv) in "
     "the archive"),
    # impossible or contradictory settings
    ("predict -n 5 --K 0", "serve.coda_batch: must be >= 1, got 0"),
    ("predict -n 5 --exits synthetic --depth 2", "--depth goes with --exits fixed, not synthetic"),
    ("predict -n 5 --exits none --mean-depth 3", "--mean-depth goes with --exits synthetic, not none"),
    ("predict --trace IN/good.csv --rate 5", "carries its own arrivals; drop --rate 5 (workload.rate)"),
    ("predict --trace IN/good.csv -n 5", "holds the requests and their exit depths; --requests would be ignored"),
    ("predict --trace IN/good.csv --seed 2 --mean-depth 3", "--seed, --mean-depth would be ignored: drop them"),
    ("predict --trace IN/good.csv --set workload.name=alpaca", "--workload would be ignored: drop it"),
    ("capacity --tpot-ms inf", "the TPOT limit must be a finite number > 0, got inf"),
    ("capacity --tpot-ms 50 --target-rate inf", "the target rate must be a finite number > 0 req/s, got inf"),
    ("capacity --tpot-ms 50 --policies ,", "--policies: no names in ','"),
    ("calibrate --arch , --no-kernels --device cpu --out c", "--arch: no names in ','"),
    ("calibrate --families , --kernels --device cpu --out c", "--families: no names in ','"),
    ("calibrate --head-dims 64,63 --kernels --device cpu --out c", "--head-dims: '63' is not an even positive head"),
    ("calibrate --head-dims 64 --kernels --device cpu --out c", "--head-dims re-measures some head sizes into a kernel"
                                                                " profile; give --update"),
    ("calibrate --head-dims 64 --no-kernels --device cpu --out c", "--head-dims chooses head sizes of the "
                                                                   "kernel-level profile; drop --no-kernels"),
    ("calibrate --device tpu --no-kernels --out c", "unknown device 'tpu'; choose one of: cpu, cuda"),
    ("validate --only a --out v", "--only picks configurations of a --matrix file"),
    ("validate --matrix IN/matrix.json --rate-of-capacity 0.5 --out v", "--rate-of-capacity sets the configuration"),
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
    from cdbsim.model.arch import load_arch

    wide = load_arch(str(path))  # a file written from it says so again, and reads back
    back = tmp_path / "back.json"
    back.write_text(json.dumps(wide.to_dict()))
    assert load_arch(str(back)).layer == wide.layer


def test_no_command_prints_the_help() -> None:
    result = CliRunner().invoke(app, [])
    assert result.exit_code == 0 and "predict" in result.output


def test_refit_rewrites_no_file_when_a_later_one_fails(tmp_path) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(SHIPPED.read_text())
    profile = json.loads(SHIPPED.read_text())
    first = sorted(profile["components"])[0]
    profile["components"][first]["points"] = [[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]]  # times of 0 cannot be fitted
    bad.write_text(json.dumps(profile))
    result = CliRunner().invoke(app, ["calibrate", "--refit", str(good), "--refit", str(bad)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == f"error: {bad}: components.{first}: measured times must be > 0"
    assert good.read_text() == SHIPPED.read_text()  # the first file was not rewritten either


def _valid_inputs() -> dict[str, tuple[str, bytes]]:
    """A valid file of each kind a command reads, by the option that reads it."""
    return {"--arch": (".json", json.dumps(PRESETS["ouro-1.4b"].to_dict()).encode()),
            "--profile": (".json", SHIPPED.read_bytes()),
            "--config": (".toml", b"[serve]\nwidth = 32\n[workload]\nrequests = 4\n"),
            "--trace": (".csv", b"request_id,prompt_len,output_len,arrival_s,exit_depths\n0,8,3,0,2 2\n1,9,2,0,3\n")}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(sorted(_valid_inputs())), cut=st.integers(0, 10**6), noise=st.binary(max_size=64),
       garbage=st.booleans())
def test_damaged_input_files_are_one_line_errors(tmp_path, option: str, cut: int, noise: bytes, garbage: bool) -> None:
    """A valid input cut short and followed by stray bytes (or stray bytes alone) either still reads or is
    refused with one ``error:`` line and exit code 2, never a traceback."""
    suffix, valid = _valid_inputs()[option]
    path = tmp_path / f"damaged{suffix}"
    path.write_bytes(noise if garbage else valid[: cut % (len(valid) + 1)] + noise)
    command = "bound" if option in ("--arch", "--profile") else "schedule"
    result = CliRunner().invoke(app, [command, option, str(path), "--json", *(["--launches", "1"] if
                                                                              command == "schedule" else [])])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if result.exit_code != 0:
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
