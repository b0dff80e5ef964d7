"""Workload sampling, exit models and trace file IO."""

from __future__ import annotations

import numpy as np
import pytest

from traces import ExitModel, InputError, build_trace, length_model, read_trace, write_trace


@pytest.mark.parametrize("name,prompt_median,output_median", [
    ("sharegpt", 1730, 415), ("alpaca", 17, 50), ("arxiv", 2730, 167)])
def test_workload_lengths_follow_the_quantiles(name: str, prompt_median: float, output_median: float,
                                               rng: np.random.Generator) -> None:
    prompt, output = length_model(name).sample(20_000, rng)
    assert np.median(prompt) == pytest.approx(prompt_median, rel=0.05)
    assert np.median(output) == pytest.approx(output_median, rel=0.05)
    assert prompt.min() >= 1 and output.min() >= 1


def test_unknown_workload_lists_the_valid_ones() -> None:
    with pytest.raises(InputError, match="alpaca, arxiv, sharegpt"):
        length_model("c4")


def test_synthetic_exit_model_hits_mean_and_range(rng: np.random.Generator) -> None:
    model = ExitModel("synthetic", mean=2.5, dispersion=0.3, correlation=0.6)
    depths = np.concatenate(model.depths(np.full(400, 300), r_min=2, r_max=4, rng=rng))
    assert depths.min() >= 2 and depths.max() <= 4
    assert depths.mean() == pytest.approx(2.5, abs=0.03)
    # token-to-token correlation within a request is positive
    seq = model.depths(np.array([20_000]), r_min=2, r_max=4, rng=rng)[0].astype(float)
    assert np.corrcoef(seq[:-1], seq[1:])[0, 1] > 0.3
    uncorrelated = ExitModel("synthetic", mean=2.5, correlation=0.0)
    seq = uncorrelated.depths(np.array([20_000]), 2, 4, rng)[0].astype(float)
    assert abs(np.corrcoef(seq[:-1], seq[1:])[0, 1]) < 0.05


def test_exit_model_pmf_mean_is_exact() -> None:
    for disp in (0.0, 0.2, 0.7):
        pmf = ExitModel("synthetic", mean=8.0, dispersion=disp).pmf(2, 16)
        assert (pmf * np.arange(1, 17)).sum() == pytest.approx(8.0)
    assert ExitModel("none").pmf(1, 4).tolist() == [0, 0, 0, 1]
    with pytest.raises(InputError, match="outside"):
        ExitModel("synthetic", mean=5).pmf(2, 4)
    with pytest.raises(InputError, match="choose one of"):
        ExitModel("gate")


@pytest.mark.parametrize("n", [1, 2, 3, 7, 31, 63])
def test_exit_pmfs_are_scipy_stats_to_the_bit(n: int) -> None:
    """The exit model computes the binomial and beta-binomial pmf without importing scipy.stats; they must be
    scipy.stats' values exactly, or seeded traces would change."""
    from scipy import stats

    from traces.exits import beta_binomial_pmf, binomial_pmf

    k = np.arange(n + 1)
    for p in (0.0, 0.013, 0.25, 0.5, 0.61, 0.999, 1.0):
        assert np.array_equal(binomial_pmf(n, p), stats.binom.pmf(k, n, p))
    for dispersion in (0.01, 0.3, 0.5, 0.97):
        scale = 1.0 / dispersion - 1.0
        for frac in (0.013, 0.25, 0.5, 0.61, 0.999):
            a, b = frac * scale, (1.0 - frac) * scale
            assert np.array_equal(beta_binomial_pmf(n, a, b), stats.betabinom.pmf(k, n, a, b))


def test_ar1_filter_is_lfilter_to_the_bit(rng: np.random.Generator) -> None:
    """The correlated depths filter their draws without importing scipy.signal; the result must be
    lfilter's exactly, or seeded traces would change."""
    from scipy.signal import lfilter

    from traces.exits import ar1_filter

    for rho in (0.1, 0.7, 0.95):
        x = rng.standard_normal((37, 129))
        state = rho * rng.standard_normal(37)
        gain = np.sqrt(1.0 - rho * rho)
        expected, _ = lfilter([gain], [1.0, -rho], x, axis=1, zi=state[:, None])
        assert np.array_equal(ar1_filter(x, gain, rho, state), expected)


def test_trace_roundtrip_csv_and_parquet(tmp_path) -> None:
    requests = build_trace("alpaca", 50, r_max=4, r_min=2, exits=ExitModel(mean=3), rate=5.0, seed=3)
    for name in ("t.csv", "t.parquet"):
        path = write_trace(requests, tmp_path / name)
        back = read_trace(path, r_max=4)
        assert [(r.request_id, r.prompt_len, r.output_len) for r in back] == \
               [(r.request_id, r.prompt_len, r.output_len) for r in requests]
        assert all(np.array_equal(a.depths, b.depths) for a, b in zip(back, requests, strict=True))
        assert [r.arrival for r in back] == pytest.approx([r.arrival for r in requests])


def test_same_seed_same_trace() -> None:
    a = build_trace("sharegpt", 20, 4, 2, ExitModel(mean=2.5), seed=7)
    b = build_trace("sharegpt", 20, 4, 2, ExitModel(mean=2.5), seed=7)
    assert all(x.prompt_len == y.prompt_len and np.array_equal(x.depths, y.depths)
               for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("body,message", [
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,5,3,0,2 2\n1,5,3,0,2 9\n",
     "t.csv:3: exit depth 9 is outside"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,5,3,0,2 2\n1,x,3,0,2 2\n",
     "t.csv:3: prompt_len must be"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,5,3,0,2\n", "t.csv:2: exit_depths has 1"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,5,3,0,2 a\n", "t.csv:2: exit_depths must"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,5,3,0,0 1\n", "t.csv:2: exit depth 0"),
    ("request_id,prompt_len\n0,5\n", "missing column"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,5,1,0,\n0,5,1,0,\n", "t.csv:3: duplicate"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n", r"t.csv:2: no requests \(the file has only a header"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,5,1,0,\n1,5,1,1e300,\n",
     r"t.csv:3: arrival_s must be a number in \[0, 1e\+06\], got '1e300'"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,5,1,inf,\n", "t.csv:2: arrival_s must be a number"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,5,1,nan,\n", "t.csv:2: arrival_s must be a number"),
    ("request_id,prompt_len,output_len,arrival_s,exit_depths\n0,1e300,1,0,\n", "t.csv:2: prompt_len must be a whole"),
])
def test_malformed_trace_names_file_and_line(tmp_path, body: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(InputError, match=message):
        read_trace(path, r_max=4)


def test_empty_parquet_trace_is_refused(tmp_path) -> None:
    path = write_trace([], tmp_path / "t.parquet")
    with pytest.raises(InputError, match=r"t\.parquet: no rows"):
        read_trace(path)


@pytest.mark.parametrize("rate", [float("inf"), float("nan"), 0.0, -1.0])
def test_request_rate_must_be_a_positive_number(rate: float) -> None:
    with pytest.raises(InputError, match="request rate must be a number > 0"):
        build_trace("alpaca", 10, 4, rate=rate)


def test_a_rate_that_spreads_arrivals_past_the_limit_is_refused() -> None:
    with pytest.raises(InputError, match="arrive over about 1e\\+07 s"):
        build_trace("alpaca", 10, 4, rate=1e-6)
    assert build_trace("alpaca", 10, 4, rate=1e-4)[-1].arrival > 0


@pytest.mark.parametrize("args", [["--rate", "inf"], ["--trace", "HEADER_ONLY"], ["--trace", "FAR"]])
def test_bad_arrivals_are_one_line_errors_on_the_command_line(tmp_path, args: list[str]) -> None:
    from typer.testing import CliRunner

    from cli import app

    header = "request_id,prompt_len,output_len,arrival_s,exit_depths\n"
    files = {"HEADER_ONLY": header, "FAR": header + "0,5,3,0,2 2\n1,5,3,1e300,2 2\n"}
    if args[0] == "--trace":
        path = tmp_path / f"{args[1]}.csv"
        path.write_text(files[args[1]])
        args = ["--trace", str(path)]
    result = CliRunner().invoke(app, ["predict", "-n", "20", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
    if args[0] == "--trace":
        assert str(path) in lines[0]
