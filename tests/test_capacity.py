"""cdbsim.capacity: goodput counting, the bisection against a fine scan, unreachable SLOs, GPUs needed."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cdbsim
from cdbsim.errors import ConfigError
from cdbsim.planner.capacity import SLO, CapacityResult, CapacityTask, Check, run_search, search, simulate_rate
from cdbsim.planner.experiment import Experiment

EXP = Experiment(workload={"name": "alpaca", "requests": 200}, serve={"width": 32}, latency={"profile": "roofline"})
SLOS = SLO(ttft_s=0.3, tpot_s=0.015)


def test_a_request_counts_only_if_it_meets_every_limit() -> None:
    result = cdbsim.predict(EXP.override({"workload.rate": 60.0}))
    reqs = result.log.requests
    ttft = (reqs["first_token"] - reqs["arrival"]).to_numpy()
    out = reqs["output_len"].to_numpy()
    tpot = np.where(out > 1, (reqs["finish"] - reqs["first_token"]).to_numpy() / np.maximum(out - 1, 1), 0.0)
    ttft_limit, tpot_limit = float(np.quantile(ttft, 0.8)), float(np.quantile(tpot, 0.8))
    slo = SLO(ttft_s=ttft_limit, tpot_s=tpot_limit, attainment=0.7)
    check = Check.of(60.0, result.log, result.report, slo)
    both = (ttft <= ttft_limit) & (tpot <= tpot_limit)
    assert check.attainment == both.mean() < min((ttft <= ttft_limit).mean(), (tpot <= tpot_limit).mean())
    assert check.goodput == both.sum() / result.report.makespan_s
    assert check.met == (both.mean() >= 0.7)
    strict = Check.of(60.0, result.log, result.report, SLO(ttft_s=ttft_limit, tpot_s=tpot_limit))
    assert not strict.met and strict.why.startswith(f"{both.mean():.1%} of requests meet every limit, below 99.0%")
    mean_only = SLO(normalized_mean_s=result.report.normalized_s.mean * 0.99)
    assert "mean normalized latency" in Check.of(60.0, result.log, result.report, mean_only).why


def test_bisection_lands_within_two_percent_of_a_fine_scan() -> None:
    found = search(EXP, SLOS)
    assert found.simulations <= 12 and found.upper / found.rate - 1 <= 0.02
    assert found.at_rate is not None and found.at_rate.rate == found.rate and found.at_rate.met
    scan = found.rate * np.arange(0.9, 1.1001, 0.005)
    met = [simulate_rate(EXP, r, SLOS).met for r in scan]
    assert met[0] and not met[-1]  # the scan brackets the answer
    highest_met = max(r for r, ok in zip(scan, met, strict=True) if ok)
    lowest_failed = min(r for r, ok in zip(scan, met, strict=True) if not ok)
    assert abs(highest_met / found.rate - 1) <= 0.02 and abs(lowest_failed / found.rate - 1) <= 0.02


def test_an_slo_that_holds_offline_is_throughput_bound() -> None:
    found = search(EXP, SLO(tpot_s=1.0))
    assert found.throughput_bound and found.simulations == 1
    assert found.rate == found.offline_rate == found.checks[0].report.request_rate


def test_an_unreachable_slo_is_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        cdbsim.capacity(EXP, tpot_s=1e-4)
    message = str(info.value)
    assert message.startswith("refill: the SLOs (p99 TPOT <= 0.1 ms) are not met even at ") and "\n" not in message
    assert "of requests meet every limit, below 99.0% (TPOT <= 0.1 ms: " in message


def test_policies_searched_in_parallel_match_the_serial_search() -> None:
    small = EXP.override({"workload.requests": 80})
    serial = cdbsim.capacity(small, SLOS, ["cb", "refill"])
    parallel = cdbsim.capacity(small, SLOS, ["cb", "refill"], jobs=2)
    assert [r.policy for r in serial] == ["cb", "refill"]
    assert [r.rate for r in serial] == [r.rate for r in parallel]
    assert [[c.rate for c in r.checks] for r in serial] == [[c.rate for c in r.checks] for r in parallel]


def test_a_policy_that_cannot_meet_the_slo_is_marked_not_fatal() -> None:
    result = CapacityResult("cb", SLOS, rate=0.0, unreachable="not met")
    assert result.row(10.0)["GPUs for 10 req/s"] == "-" and result.row()["note"] == "not met"
    with pytest.raises(ConfigError, match="cb cannot meet the SLOs"):
        result.gpus_for(10.0)


def test_gpus_for_a_target_rate() -> None:
    result = CapacityResult("refill", SLOS, rate=12.5)
    assert result.gpus_for(100) == 8 and result.gpus_for(101) == 9 and result.gpus_for(1) == 1
    assert math.isnan(CapacityResult("refill", SLOS).rate)
    with pytest.raises(ConfigError, match="above 1e\\+06 req/s"):
        result.gpus_for(1e300)


def test_an_unreachable_policy_counts_its_simulations_and_names_itself_once() -> None:
    exp = EXP.override({"workload.requests": 40, "serve.policy": "cb"})
    cb = run_search(CapacityTask(exp, SLO(tpot_s=0.002)))
    assert cb.rate == 0 and cb.unreachable.startswith("the SLOs (p99 TPOT <= 2 ms) are not met")
    assert cb.simulations == 2 and cb.row()["simulations"] == 2 and math.isnan(cb.row()["attainment %"])


@pytest.mark.parametrize("kwargs,message", [
    ({}, "give at least one SLO"),
    ({"tpot_s": -1.0}, "the TPOT limit must be a finite number > 0"),
    ({"ttft_s": 1.0, "attainment": 1.5}, "the attainment must be in (0, 1]"),
])
def test_bad_slo_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        SLO(**kwargs)
