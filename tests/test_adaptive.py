"""The adaptive CDB policy: its online cost fit, its launch rule, and that every driver feeds it."""

from __future__ import annotations

import pytest

from cdbsim.latency.model import LatencyModel
from cdbsim.latency.shipped import resolve_profile
from cdbsim.model.arch import PRESETS
from cdbsim.serving.adaptive import OnlineCosts
from cdbsim.serving.config import ServeConfig
from cdbsim.serving.launch import Launch, Stage
from cdbsim.serving.pipeline import drive
from cdbsim.serving.scheduler import Scheduler
from cdbsim.simulator.sim import Simulation
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


def core_step(steps: list[int], exits: list[bool]) -> Launch:
    return Launch(index=0, stage=Stage.CORE, requests=list(range(len(steps))), positions=[0] * len(steps),
                  steps=steps, exits=exits, size=len(steps), padded=len(steps))


def known_costs() -> OnlineCosts:
    """Core 1 ms flat, coda and prelude 0.25 ms each; tokens leave the loop after step 3, never before."""
    costs = costs_from({Stage.CORE: (1e-3, 0.0), Stage.CODA: (2.5e-4, 0.0), Stage.PRELUDE: (2.5e-4, 0.0)})
    for _ in range(20):
        costs.observe(core_step([0, 1, 2, 3], [False, False, False, True]), 1e-3)
    return costs


def test_coda_waits_for_the_order_quantity_of_its_exits() -> None:
    costs = known_costs()
    four_exit = [3] * 4 + [1] * 12  # 16 tokens in the next core step, 4 of them leaving the loop after it
    # slots wanted: h = 1 ms / 16, F = 0.5 ms, e = 4: n (n + 4) >= 2 * 0.5 * 4 * 16 = 64
    assert not costs.coda_due(6, four_exit, slots_wanted=True)
    assert costs.coda_due(7, four_exit, slots_wanted=True)
    # every request resident: h = 1 ms / (16 + n): n (n + 4) >= 4 (16 + n), n >= 8
    assert not costs.coda_due(7, four_exit, slots_wanted=False)
    assert costs.coda_due(8, four_exit, slots_wanted=False)


def test_coda_runs_at_once_when_no_exit_is_coming_or_nothing_else_can_run() -> None:
    costs = known_costs()
    assert costs.coda_due(1, [0] * 16, slots_wanted=True), "tokens at step 0 never leave after it"
    assert costs.coda_due(1, [], slots_wanted=True), "nothing else can run"
    assert OnlineCosts().coda_due(1, [3] * 16, slots_wanted=True), "unknown costs: refill with K = 1"


def test_the_exit_rate_follows_a_shift_in_depth() -> None:
    costs = known_costs()
    assert costs.hazard.expected_exits([1, 3]) == pytest.approx(1.0)
    for _ in range(2000):  # tokens now leave after step 1
        costs.observe(core_step([0, 1], [False, True]), 1e-3)
    assert costs.hazard.expected_exits([1]) == pytest.approx(1.0, abs=1e-3)


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


def arrivals_every(seconds: float, count: int = 50) -> OnlineCosts:
    """A 15 ms prefill (its weight reads at full depth, flat in tokens) and an arrival after every
    ``seconds`` of 1 ms core steps."""
    costs = costs_from({Stage.PREFILL: (15e-3, 0.0), Stage.CORE: (1e-3, 0.0)})
    costs.arrival_rate.arrive(busy=False)  # the first arrival finds the device idle: no gap seen yet
    for _ in range(count):
        for _ in range(round(seconds / 1e-3)):
            costs.observe(core_step([1], [False]), 1e-3)
        costs.arrival_rate.arrive(busy=True)
    return costs


def test_prefill_gathers_arrivals_to_their_order_quantity_while_slots_are_free() -> None:
    frequent = arrivals_every(0.01)  # 100 req/s
    assert frequent.arrival_rate() == pytest.approx(100, rel=0.01)
    # 50 resident: m (m + 1) >= 2 * 15 ms * 100/s * (50 + m), m >= 13.8
    assert not frequent.prefill_due(1, resident=50, free_slots=200), "a lone arrival waits for others"
    assert not frequent.prefill_due(13, resident=50, free_slots=200)
    assert frequent.prefill_due(14, resident=50, free_slots=200)
    # scarce slots: a held arrival would keep a slot empty that the next one needs
    assert frequent.prefill_due(1, resident=15, free_slots=1)
    assert frequent.prefill_due(4, resident=12, free_slots=4)
    assert not frequent.prefill_due(4, resident=12, free_slots=5)
    # rare arrivals (1 req/s): 2 >= 2 * 15 ms * 1/s * 51, the lone arrival is prefilled at once
    assert arrivals_every(1.0, count=5).prefill_due(1, resident=50, free_slots=200)
    assert OnlineCosts().prefill_due(1, resident=50, free_slots=200), "unknown prefill cost: at once"


def test_one_prefill_size_seen_leaves_the_gate_open() -> None:
    """Cold start: a single long first prompt would count whole as the prefill's fixed cost and hold the next
    arrival for hundreds of ms; until prefills of two padded sizes are seen, arrivals are prefilled at once."""

    def after(prefills: list[tuple[int, float]]) -> OnlineCosts:
        costs = OnlineCosts()
        for padded, seconds in prefills:
            costs.observe(launch(Stage.PREFILL, padded), seconds)
        costs.arrival_rate.arrive(busy=False)
        for _ in range(20):  # then arrivals every 10 ms of 1 ms core steps: 100 req/s
            for _ in range(10):
                costs.observe(core_step([1], [False]), 1e-3)
            costs.arrival_rate.arrive(busy=True)
        return costs

    first = [(5120, 0.565)]  # one 5,120-token prefill: 565 ms, all of it "fixed" while alone
    assert after(first).prefill_due(1, resident=20, free_slots=200)
    assert after(first * 2).prefill_due(1, resident=20, free_slots=200)  # the same size again: no better
    known = after([*first, (64, 0.0151)])  # a second size: the fixed part comes out ~ 8 ms
    assert known.lines[Stage.PREFILL].identified
    assert not known.prefill_due(1, resident=20, free_slots=200)  # 2 < 2 * 8 ms * 100/s * 21: it may hold


def test_short_finished_outputs_make_resident_requests_weigh_less_and_arrivals_wait_less() -> None:
    """Normalized latency: a resident request is a length-biased draw, so where finished outputs are mostly
    short and a few long, a prefill's delay to the residents weighs little against a waiting arrival's."""
    uniform, spread = arrivals_every(0.01), arrivals_every(0.01)
    for _ in range(4):
        uniform.resident_weight.finish(50)
    assert uniform.resident_weight() == pytest.approx(1.0)
    assert not uniform.prefill_due(13, resident=50, free_slots=200)  # as with no output seen: m >= 13.8
    for length in (10, 10, 10, 1000):
        spread.resident_weight.finish(length)
    # 1 / (mean L * mean 1/L) = 1 / (257.5 * 0.07525) = 0.0516; m (m + 1) >= 3 * (50 * 0.0516 + m): m >= 3.9
    assert spread.resident_weight() == pytest.approx(0.0516, rel=0.01)
    assert not spread.prefill_due(3, resident=50, free_slots=200)
    assert spread.prefill_due(4, resident=50, free_slots=200)


def test_every_finished_request_reaches_the_output_weight() -> None:
    arch = tiny_arch(r_max=4)
    requests = make_requests([(5, 6), (9, 4), (3, 7)], depths=[[1, 4, 2, 3, 2], [4, 4, 1], [2, 2, 3, 1, 4, 4]])
    scheduler = Scheduler(arch, ServeConfig(policy="adaptive", width=4, prefill_budget=16, timing="sync"),
                          requests, 64)
    for _ in drive(scheduler):
        pass
    weight = scheduler.costs.resident_weight
    assert weight.count == pytest.approx(1 + 0.995 + 0.995**2)
    mean_len, mean_inverse = (6 + 4 + 7) / 3, (1 / 6 + 1 / 4 + 1 / 7) / 3
    assert weight() == pytest.approx(1 / (mean_len * mean_inverse), rel=0.01)


def test_the_arrival_rate_leaves_out_idle_gaps_and_falls_when_arrivals_stop() -> None:
    costs = arrivals_every(0.01)
    costs.arrival_rate.arrive(busy=False)  # the gap that ended at an idle device is not a gap seen
    assert costs.arrival_rate() == pytest.approx(100, rel=0.01)
    for _ in range(500):  # half a second of core steps, nobody arrives
        costs.observe(core_step([1], [False]), 1e-3)
    assert costs.arrival_rate() < 50


def test_simulated_arrivals_gather_into_fewer_prefills_at_a_wide_width() -> None:
    """Huginn's full-depth prefill is dear next to its core step: at W = 128 under frequent arrivals the
    gate prefills several requests per launch where refill prefills each as it comes, and latency falls."""
    arch = PRESETS["huginn-3.5b"]
    latency = LatencyModel(arch, resolve_profile("auto", arch))
    requests = build_trace("alpaca", 160, arch.r_max, 2, ExitModel(mean=5), rate=40.0, seed=3)

    def run(policy: str):
        log = Simulation(arch, ServeConfig(policy=policy, width=128), requests, latency, 40000).run()
        prefills = log.launches[log.launches["stage"] == "prefill"]
        normalized = (log.requests["finish"] - log.requests["arrival"]) / log.requests["output_len"]
        return prefills["items"].mean(), normalized.mean()

    (gathered, adaptive_latency), (single, refill_latency) = run("adaptive"), run("refill")
    assert gathered > 1.5 * single
    assert adaptive_latency < refill_latency
