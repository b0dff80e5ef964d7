"""The adaptive CDB policy: its online cost fit, its launch rule, and that every driver feeds it."""

from __future__ import annotations

import pytest

from cdbsim.adaptive import OnlineCosts
from cdbsim.arch import PRESETS
from cdbsim.config import ServeConfig
from cdbsim.latency import LatencyModel
from cdbsim.launch import Launch, Stage
from cdbsim.replay import drive
from cdbsim.scheduler import Scheduler
from cdbsim.shipped import resolve_profile
from cdbsim.sim import Simulation
from tests.conftest import make_requests, tiny_arch
from traces import ExitModel, build_trace


def launch(stage: Stage, padded: int) -> Launch:
    return Launch(index=0, stage=stage, requests=[], positions=[], size=padded, padded=padded)


def costs_from(lines: dict[Stage, tuple[float, float]]) -> OnlineCosts:
    costs = OnlineCosts()
    for stage, (delta, gamma) in lines.items():
        for batch in (1, 2, 4, 8, 16, 32):
            costs.observe(launch(stage, batch), delta + gamma * batch)
    return costs


def test_the_fit_recovers_each_stage_line() -> None:
    costs = costs_from({Stage.CORE: (2e-3, 1e-5), Stage.CODA: (3e-4, 2e-6)})
    assert costs.lines[Stage.CORE].coefficients() == pytest.approx((2e-3, 1e-5))
    assert costs.lines[Stage.CODA].coefficients() == pytest.approx((3e-4, 2e-6))
    assert not costs.lines[Stage.PRELUDE].ready


def test_rule_launches_when_waiting_costs_more_than_a_launch() -> None:
    # core 1 ms flat, coda 0.25 ms: a coda pays once n / (b + n) of a core step reaches 0.25
    costs = costs_from({Stage.CORE: (1e-3, 0.0), Stage.CODA: (2.5e-4, 0.0)})
    assert not costs.worth_launching(Stage.CODA, 4, 20)
    assert costs.worth_launching(Stage.CODA, 8, 20)
    assert costs.effective_k(Stage.CODA, 24, 64) == 8
    assert costs.worth_launching(Stage.CODA, 1, 0), "nothing else can run"
    # unknown costs: launch at once, as refill with K = 1
    assert OnlineCosts().worth_launching(Stage.CODA, 1, 60)


def test_without_observed_costs_adaptive_is_refill_with_k_1() -> None:
    arch = tiny_arch(r_max=4)
    requests = make_requests([(5, 6), (9, 4), (3, 7)], depths=[[1, 4, 2, 3, 2], [4, 4, 1], [2, 2, 3, 1, 4, 4]])

    def launches(policy: str) -> list[tuple]:
        config = ServeConfig(policy=policy, width=4, coda_batch=1, prefill_budget=16, timing="sync")
        return [(x.stage, x.requests, x.steps) for x in drive(Scheduler(arch, config, requests, 64))]

    assert launches("adaptive") == launches("refill")


def test_simulated_durations_reach_the_rule_and_hold_huginn_codas() -> None:
    """Huginn's coda (two layers and the head) is dear next to its four-layer core step, so the rule lets
    exits gather: larger codas than refill K = 1, and no slower than it."""
    arch = PRESETS["huginn-3.5b"]
    latency = LatencyModel(arch, resolve_profile("auto", arch))
    requests = build_trace("alpaca", 60, arch.r_max, 2, ExitModel(mean=8), seed=2)
    sim = Simulation(arch, ServeConfig(policy="adaptive", width=32), requests, latency, 8000)
    log = sim.run()
    core = sim.scheduler.costs.lines[Stage.CORE]
    assert core.ready and core.n > 50
    coda = log.launches[log.launches["stage"] == "coda"]["size"]
    refill = Simulation(arch, ServeConfig(policy="refill", width=32), requests, latency, 8000).run().launches
    assert coda.mean() > 1.5 * refill[refill["stage"] == "coda"]["size"].mean()
    assert log.launches["end"].max() <= refill["end"].max() * 1.01
