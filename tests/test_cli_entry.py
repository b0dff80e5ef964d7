"""The installed ``cdbsim`` entry point, run as a user runs it (a subprocess on this checkout): settings that must
work do, and each bad input is one line on stderr, exit code 2, no traceback and no file written."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXE = shutil.which("cdbsim")
pytestmark = pytest.mark.skipif(EXE is None, reason="the cdbsim entry point is not installed")
SMALL = ("-n", "20", "--workload", "alpaca")


def cdbsim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250", "XDG_CACHE_HOME": str(cwd / ".cache")}
    return subprocess.run([EXE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if ".cache" not in p.parts)


def refused(folder: Path, *args: str) -> str:
    """Run a bad command in ``folder``: exit 2, one line on stderr, nothing on stdout, nothing new written."""
    before = files(folder)
    result = cdbsim(*args, cwd=folder)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and not result.stdout, result.stderr
    assert "Traceback" not in result.stderr and files(folder) == before
    return lines[0]


def strict_json(text: str) -> object:
    def no_nan(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=no_nan)


def predicted(folder: Path, *args: str) -> tuple[float, str]:
    """Output tok/s and the profile label of a ``predict --csv`` run."""
    result = cdbsim("predict", *SMALL, "--no-baseline", "--csv", *args, cwd=folder)
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()[:2]
    values = dict(zip(header.split(","), next(csv.reader([row])), strict=True))
    return float(values["output tok/s"]), values["profile"]


def test_what_if_figures_carry_a_measured_profile_or_are_refused(tmp_path) -> None:
    base, _ = predicted(tmp_path, "--profile", "h200-ouro-1.4b")
    faster, label = predicted(tmp_path, "--profile", "h200-ouro-1.4b", "--bandwidth", "100")
    assert faster > 1.2 * base and "carried from the NVIDIA H200" in label
    slower, label = predicted(tmp_path, "--profile", "h200-ouro-1.4b", "--device", "h100-sxm")
    assert slower < base and "NVIDIA H100 SXM" in label and "not validated" in label
    refusal = refused(tmp_path, "predict", "--memory-gb", "1")
    assert "do not fit in 90% of the NVIDIA H200, what-if memory_gb 1's 0.9 GiB" in refusal


@pytest.mark.parametrize("arch", ["ouro-1.4b", "huginn-3.5b"])
def test_r_max_2_runs_with_the_default_mean_depth(tmp_path, arch: str) -> None:
    result = cdbsim("predict", "--r-max", "2", "--arch", arch, *SMALL, "--no-baseline", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert strict_json(result.stdout)["refill K=1"]["mean_depth"] == 2.0  # lookahead serves depth 2 and up


def test_capacity_json_is_strict_and_counts_what_ran(tmp_path) -> None:
    args = ["capacity", "-n", "40", "--r-max", "8", "--exits", "fixed", "--depth", "2", "--tpot-ms", "12",
            "--policies", "cb,refill"]
    result = cdbsim(*args, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cb, refill = strict_json(result.stdout)[0]["results"]
    assert cb["req/s per GPU"] == 0 and cb["simulations"] == 2 and cb["attainment %"] is None
    assert cb["note"].startswith("the SLOs (p99 TPOT <= 12 ms) are not met even at")
    assert refill["req/s per GPU"] > 0 and refill["simulations"] > 2
    table = " ".join(cdbsim(*args, cwd=tmp_path).stdout.split())
    assert "cb: the SLOs (p99 TPOT <= 12 ms)" in table and "cb: cb:" not in table


def test_capacity_says_when_the_rate_is_only_the_offline_bound(tmp_path) -> None:
    args = ["capacity", *SMALL, "--tpot-ms", "1000", "--policies", "cb"]
    row = strict_json(cdbsim(*args, "--json", cwd=tmp_path).stdout)[0]["results"][0]
    assert row["search within %"] is None and row["note"].startswith("offline bound only: ")
    assert "too few requests to bracket the knee" in row["note"]
    assert "cb: offline bound only: " in " ".join(cdbsim(*args, cwd=tmp_path).stdout.split())


def test_capacity_refuses_an_absurd_target_rate_and_suggests_close_options(tmp_path) -> None:
    line = refused(tmp_path, "capacity", *SMALL, "--tpot-ms", "50", "--target-rate", "1e300")
    assert line == ("error: the target rate 1e+300 req/s is above 1e+06 req/s, more than any deployment serves; "
                    "give a lower one")
    assert refused(tmp_path, "capacity", "--rate", "3") == ("error: No such option: --rate; did you mean "
                                                            "--target-rate?")


def test_sweep_refuses_a_value_no_point_can_run_with(tmp_path) -> None:
    line = refused(tmp_path, "sweep", *SMALL, "--grid", "serve.width=-16,64", "--no-cache")
    assert line == "error: grid value serve.width=-16: W must be >= 1, got -16"


def test_sweep_lists_the_points_it_skips(tmp_path) -> None:
    result = cdbsim("sweep", *SMALL, "--grid", "serve.width=16,64", "--grid", "serve.coda_batch=1,32",
                    "--no-cache", "--no-plots", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "skipped point 1 (serve.width=16 serve.coda_batch=32): K (32) must not exceed W (16)" in result.stdout
    assert [p.name for p in files(tmp_path)] == ["sweep.parquet"]


def test_a_directory_given_for_a_file_says_so(tmp_path) -> None:
    (tmp_path / "folder").mkdir()
    assert (refused(tmp_path, "predict", "--config", "folder")
            == "error: experiment file folder is a directory; give a file")
    assert (refused(tmp_path, "predict", "--hf-config", "folder")
            == "error: Hugging Face config folder is a directory; give a file")
    assert refused(tmp_path, "validate", "--matrix", "folder") == ("error: validation matrix folder is a directory; "
                                                                   "give a file")


def test_validate_names_what_has_no_saved_run(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    assert refused(tmp_path, "validate", "--measured", "empty") == (
        "error: --measured empty: no saved executor run for the configuration of the options; expected "
        "empty/config/launches.parquet (or .csv), as validate --out DIR saves them in DIR/measured")


def test_every_plot_option_takes_a_png_file_not_a_directory(tmp_path) -> None:
    (tmp_path / "plots").mkdir()
    expected = "is a directory; give a file name ending in .png"
    assert refused(tmp_path, "rate-sweep", *SMALL, "--rates", "1", "--plot", "plots").endswith(
        f"--plot plots: {expected}")
    assert refused(tmp_path, "predict", *SMALL, "--plot-cdf", "plots").endswith(f"--plot-cdf plots: {expected}")
    assert refused(tmp_path, "predict", *SMALL, "--plot-k", "plots").endswith(f"--plot-k plots: {expected}")
    assert refused(tmp_path, "predict", *SMALL, "--policy", "cb", "--plot-k", "k.png") == (
        "error: --plot-k k.png: the coda batch K is a refill policy's; --policy cb launches no codas (choose "
        "norefill, refill or adaptive)")


def test_save_logs_never_deletes_files_it_did_not_write(tmp_path) -> None:
    (tmp_path / "logs" / "run").mkdir(parents=True)
    (tmp_path / "logs" / "run" / "notes.txt").write_text("mine")
    assert refused(tmp_path, "predict", *SMALL, "--save-logs", "logs") == (
        "error: --save-logs logs: logs/run holds files a saved run does not (notes.txt), which saving would delete; "
        "give a new or empty directory")
    (tmp_path / "logs" / "run" / "notes.txt").unlink()
    (tmp_path / "logs" / "notes.txt").write_text("mine")
    for _ in range(2):  # a run saved before is replaced; files beside the run folders stay
        result = cdbsim("predict", *SMALL, "--save-logs", "logs", "--policy", "norefill", "--plot-k", "k.png",
                        cwd=tmp_path)
        assert result.returncode == 0 and "Warning" not in result.stderr, result.stderr
    assert (tmp_path / "logs" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "logs" / "run").iterdir()) == [
        "launches.parquet", "meta.json", "requests.parquet", "trace.json.gz"]
