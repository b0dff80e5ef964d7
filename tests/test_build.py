"""Executor builds: the fingerprint of the sources and versions, recorded in profiles and run logs, and checked by
validate (a warning on a mismatch, an error with --strict, a note where either side records none)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibration.validation import load_matrix, requests_for
from cdbsim.errors import ConfigError
from cdbsim.latency.build import UNKNOWN, Build
from cdbsim.latency.model import LatencyModel
from cdbsim.latency.profile import load_profile_file, profile_from_dict
from cdbsim.simulator.sim import simulate
from cli import app

SHIPPED = Path("calibration/profiles")
BUILD = Build(sources="3f2a9c1e", torch="2.11.0+cu130", triton="3.6.0", cuda="13.0", gpu="NVIDIA H200")


def test_source_hash_is_stable_and_follows_every_hashed_source(tmp_path, monkeypatch) -> None:
    pytest.importorskip("torch")
    from executor import build

    files = build.source_files()
    names = {p.name for p in files}
    assert build.source_hash() == build.source_hash() and len(build.source_hash()) == build.HASH_CHARS
    assert {"triton_decode.py", "engine.py", "graphs.py", "driver.py", "gpu_work.py"} <= names
    assert not names & build.NOT_HASHED and all((build.PACKAGE / n).is_file() for n in build.NOT_HASHED)
    copies = []
    for path in files:
        copies.append(tmp_path / path.name)
        shutil.copyfile(path, copies[-1])
    assert build.source_hash(copies) == build.source_hash()  # names and contents, not where they lie
    monkeypatch.setattr(build, "source_files", lambda: copies)
    before = build.current_build("cpu")
    copies[0].write_text(copies[0].read_text() + "\n# changed\n")
    after = build.current_build("cpu")
    assert after.sources != before.sources and after.differences(before) == ["sources"]


def test_a_build_record_reads_describes_and_compares() -> None:
    assert Build.from_record(BUILD.to_dict()) == BUILD and Build.from_record(None) is None
    assert BUILD.describe() == "build 3f2a9c1e, torch 2.11, NVIDIA H200"
    other = Build(**{**BUILD.to_dict(), "torch": "2.10.0", "gpu": "NVIDIA H100 80GB HBM3"})
    assert BUILD.differences(other) == ["torch", "gpu"]
    with pytest.raises(ConfigError, match=r"^p: build: unknown key\(s\) hash"):
        Build.from_record({"sources": "x", "hash": "y"}, "p: build")
    with pytest.raises(ConfigError, match=r"^p: build.torch must be a text"):
        Build.from_record({"sources": "x", "torch": 2.11}, "p: build")


def test_shipped_profiles_record_the_gpu_they_name_or_no_build_and_a_recorded_one_round_trips(tmp_path) -> None:
    for path in sorted(SHIPPED.glob("*.json")):  # those measured before builds were recorded: none invented
        profile = load_profile_file(path)
        build = profile.executor_build()
        assert (build is None and profile.build_label() == UNKNOWN) or build.gpu == profile.device["name"]
    data = {**json.loads((SHIPPED / "h200-ouro-1.4b.json").read_text()), "build": BUILD.to_dict()}
    back = load_profile_file(profile_from_dict(data, "p").save(tmp_path / "p.json"))
    assert back.executor_build() == BUILD and back.build_label() == BUILD.describe()
    with pytest.raises(ConfigError, match=r"^q: build.sources must be a non-empty text"):
        profile_from_dict({**data, "build": {"torch": "2.11"}}, "q")


def saved_run(tmp_path: Path, profile_build: Build | None, run_build: Build | None) -> list[str]:
    """Validate's arguments for one saved run (the simulator's, with ``run_build`` in its meta) against a copy of
    the shipped Ouro profile with ``profile_build``."""
    data = json.loads((SHIPPED / "h200-ouro-1.4b.json").read_text())
    if profile_build is not None:
        data["build"] = profile_build.to_dict()
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(data))
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"configs": [
        {"name": "online", "set": ["workload.name=alpaca", "workload.requests=24", "serve.kv_tokens=65536"],
         "rate_of_capacity": 0.5}]}))
    entry = load_matrix(matrix)[0]
    latency = LatencyModel(entry.spec(), load_profile_file(profile))
    requests, rate = requests_for(entry, latency, entry.given_blocks())
    log = simulate(entry.spec(), entry.config(), requests, latency, entry.given_blocks())
    log.meta.update({"rate": rate, **({"build": run_build.to_dict()} if run_build else {})})
    log.save(tmp_path / "measured" / entry.name)
    return ["validate", "--matrix", str(matrix), "--measured", str(tmp_path / "measured"),
            "--out", str(tmp_path / "out"), "--profile", str(profile), "--json"]


def test_validate_warns_of_a_profile_from_another_build_and_strict_refuses_it(tmp_path) -> None:
    older = Build(**{**BUILD.to_dict(), "sources": "0badc0de", "torch": "2.10.0"})
    args = saved_run(tmp_path, BUILD, older)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and warning[0].endswith("sources, torch differ") and "build 0badc0de" in warning[0]
    summary = json.loads(result.stdout)[0]
    row = summary["summary"][0]
    assert row["profile build"] == BUILD.describe()
    assert abs(row["TTFT p99 error %"]) < 1e-6 and abs(row["TPOT p99 error %"]) < 1e-6  # online: tails shown
    assert summary["errors"]["online TTFT p99 |error| worst %"] < 1e-6
    assert "online TPOT p99 |error| median %" in summary["errors"]
    strict = CliRunner().invoke(app, [*args, "--strict"])
    assert strict.exit_code == 2 and len(strict.stderr.strip().splitlines()) == 1
    assert strict.stderr.startswith("error: profile h200-ouro-1.4b (build 3f2a9c1e")
    assert strict.stderr.rstrip().endswith("sources, torch differ (--strict)")


@pytest.mark.parametrize(("profile_build", "run_build", "note"), [
    (BUILD, BUILD, None),
    (None, BUILD, "note: profile h200-ouro-1.4b records no executor build (build unknown)"),
    (BUILD, None, "note: the saved runs of online record no executor build"),
])
def test_validate_notes_what_it_cannot_check_and_is_silent_on_a_match(tmp_path, profile_build, run_build,
                                                                        note) -> None:
    result = CliRunner().invoke(app, [*saved_run(tmp_path, profile_build, run_build), "--strict"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith(("note:", "warning:"))]
    assert lines == ([] if note is None else [lines[0]]) and (note is None or lines[0].startswith(note))


def test_predict_names_the_build_its_profile_came_from(tmp_path) -> None:
    data = {**json.loads((SHIPPED / "h200-ouro-1.4b.json").read_text()), "build": BUILD.to_dict()}
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["predict", "--requests", "8", "--no-baseline", "--profile", str(profile)])
    assert result.exit_code == 0, result.output
    assert "build 3f2a9c1e, torch 2.11, NVIDIA H200" in " ".join(result.stdout.split())
    shipped = CliRunner().invoke(app, ["predict", "--requests", "8", "--no-baseline"])
    assert "profile from build unknown" in " ".join(shipped.stdout.split())


def leaves(data: object, where: str = "") -> dict[str, object]:
    """Every scalar of a JSON document by its path."""
    if isinstance(data, dict):
        return {k: v for key, value in data.items() for k, v in leaves(value, f"{where}/{key}").items()}
    if isinstance(data, list):
        return {k: v for i, value in enumerate(data) for k, v in leaves(value, f"{where}[{i}]").items()}
    return {where: data}


@pytest.mark.parametrize("name", sorted(p.name for p in SHIPPED.glob("*.json")))
def test_a_shipped_profile_is_what_refitting_its_raw_points_gives(name: str) -> None:
    """The fits, gaps and their reported errors follow the fitting code: a change to it refits the shipped profiles."""
    from calibration.fit import refit_profile

    shipped = load_profile_file(SHIPPED / name)
    stored, refitted = leaves(shipped.to_dict()), leaves(refit_profile(shipped).to_dict())
    assert stored.keys() == refitted.keys()
    differ = {k: (v, refitted[k]) for k, v in stored.items()
              if v != refitted[k] and not (isinstance(v, float) and refitted[k] == pytest.approx(v, rel=1e-6))}
    assert not differ, f"{name} differs from its refit (cdbsim calibrate --refit): {list(differ.items())[:5]}"
