"""Choosing profiles by GPU, carrying them to another device, and what-if figures that change the prediction."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibration.validation import measured_gpu
from cdbsim.errors import ConfigError
from cdbsim.latency.devices import H200, device_preset, device_tag, preset_of
from cdbsim.latency.model import HOST, LatencyModel
from cdbsim.latency.shipped import resolve_profile, shipped_profiles
from cdbsim.model.arch import PRESETS
from cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--requests", "40", "--no-baseline", "--csv"]


def predict(*args: str) -> dict:
    result = runner.invoke(app, ["predict", *args, *SMALL])
    assert result.exit_code == 0, result.output
    row = next(csv.DictReader(io.StringIO(result.stdout)))
    return {**row, "output tok/s": float(row["output tok/s"])}


def test_gpu_names_map_to_presets() -> None:
    assert device_tag("NVIDIA H100 80GB HBM3") == "h100" and preset_of("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert preset_of("NVIDIA H200") == "h200" and preset_of("NVIDIA L40S") is None


def test_a_gpu_tag_picks_among_that_gpus_profiles_on_any_device() -> None:
    arch, h100 = PRESETS["huginn-3.5b"], device_preset("h100-sxm")
    assert resolve_profile("h100", arch, h100).name == "h100-huginn-3.5b"
    from_h200 = resolve_profile("h200", arch, h100)
    assert from_h200.name == "h200-huginn-3.5b" and "carried" in from_h200.label()
    with pytest.raises(ConfigError, match="h100"):  # the tags are listed among the valid names
        resolve_profile("h300", arch)


def test_carrying_moves_every_stage_and_keeps_the_host() -> None:
    arch = PRESETS["ouro-1.4b"]
    measured = shipped_profiles()["h200-ouro-1.4b"]
    carried = resolve_profile("h200-ouro-1.4b", arch, device_preset("h100-sxm"))
    assert carried.components[HOST] == measured.components[HOST]
    core = "core/ouro-1.4b-0-24-0-r4"
    before, after = measured.components[core].points, carried.components[core].points
    assert [p[:-1] for p in before] == [p[:-1] for p in after]
    assert all(b[-1] < a[-1] < 1.5 * b[-1] for b, a in zip(before, after, strict=True))  # slower, by less than 1.5x
    assert carried.memory_bytes == device_preset("h100-sxm").memory_bytes


def test_a_faster_what_if_device_is_faster_and_a_host_what_if_replaces_the_host() -> None:
    arch = PRESETS["ouro-1.4b"]
    launch_time = LatencyModel(arch, resolve_profile("h200-ouro-1.4b", arch)).costs
    faster = LatencyModel(arch, resolve_profile("h200-ouro-1.4b", arch, replace(H200, bandwidth=2 * H200.bandwidth)))
    assert faster.costs[next(iter(faster.costs))].delta < launch_time[next(iter(launch_time))].delta
    slow_host = LatencyModel(arch, resolve_profile("h200-ouro-1.4b", arch, replace(H200, host_launch_s=1e-3)))
    assert slow_host.host.delta == 1e-3


def test_a_profile_of_a_gpu_without_a_preset_is_used_as_is_but_not_carried(tmp_path: Path) -> None:
    data = json.loads(Path(shipped_profiles()["h200-ouro-1.4b"].source).read_text())
    data["device"]["name"] = "NVIDIA L40S"
    path = tmp_path / "l40s-ouro-1.4b.json"
    path.write_text(json.dumps(data))
    arch = PRESETS["ouro-1.4b"]
    assert resolve_profile(str(path), arch).device["name"] == "NVIDIA L40S"
    with pytest.raises(ConfigError, match="no preset to carry it from"):
        resolve_profile(str(path), arch, device_preset("h100-sxm"))


def test_what_if_flags_change_the_prediction_or_are_refused() -> None:
    base = predict("--profile", "h200-ouro-1.4b")
    faster = predict("--profile", "h200-ouro-1.4b", "--bandwidth", "100")
    assert faster["output tok/s"] > 1.2 * base["output tok/s"] and "carried" in faster["profile"]
    on_h100 = predict("--profile", "h200-ouro-1.4b", "--device", "h100-sxm", "--kv-tokens", "32768")
    assert on_h100["output tok/s"] < base["output tok/s"] and "NVIDIA H100 SXM" in on_h100["profile"]
    measured_h100 = predict("--device", "h100-sxm", "--kv-tokens", "32768")
    assert measured_h100["profile"].startswith("h100-ouro-1.4b") and "not validated" not in measured_h100["profile"]
    refused = runner.invoke(app, ["predict", "--memory-gb", "1", *SMALL])
    assert refused.exit_code == 2 and "do not fit" in refused.output
    too_big = runner.invoke(app, ["predict", "--arch", "huginn-3.5b", "--device", "h100-sxm", "--kv-tokens",
                                  "65536", *SMALL])
    assert too_big.exit_code == 2 and "65,536 KV tokens need 87.7 GiB" in too_big.output


def test_validate_predicts_saved_runs_with_the_profiles_of_the_gpu_they_ran_on(tmp_path: Path) -> None:
    logs = ROOT / "benchmarks" / "results" / "validation-h100" / "measured-logs.tgz"
    matrix = ROOT / "calibration" / "matrices" / "validation-h100.json"
    result = runner.invoke(app, ["validate", "--matrix", str(matrix), "--only", "ouro-alpaca-refill-W16",
                                 "--measured", str(logs), "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["profile"].startswith("h100-ouro-1.4b (measured, NVIDIA H100")


def test_measured_gpu_reads_the_saved_logs_meta(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    assert measured_gpu(tmp_path) is None
    (tmp_path / "run" / "meta.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3"}))
    assert measured_gpu(tmp_path) == "NVIDIA H100 80GB HBM3"
