"""The SimPy simulator, the latency model and the report."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cdbsim.errors import ConfigError
from cdbsim.latency.model import LatencyModel, constant_profile, roofline_profile
from cdbsim.latency.profile import fit_points, load_profile_file
from cdbsim.model.arch import PRESETS
from cdbsim.planner.study import compare_policies, with_baseline
from cdbsim.report.logs import RunLog
from cdbsim.report.metrics import summarize
from cdbsim.serving.config import ServeConfig
from cdbsim.serving.launch import Stage
from cdbsim.serving.memory import KVCapacity
from cdbsim.simulator.sim import simulate
from tests.conftest import make_requests, tiny_arch
from traces import ExitModel, build_trace

MS = 1e-3


def constant(arch, host_s: float = 0.0) -> LatencyModel:
    return LatencyModel(arch, constant_profile(MS, host_s=host_s))


@pytest.mark.parametrize("policy,launches,token_times", [
    # prefill, prelude, core(r0 exits, r1 loops), coda(r0), core, core(r1 exits), coda(r1)
    ("refill", 7, [[1, 4], [1, 7]]),
    # prefill, prelude, core x3 (2, 1, 1 tokens), one coda for the wave
    ("norefill", 6, [[1, 6], [1, 6]]),
    # prefill, one fused decode step
    ("cb", 2, [[1, 2], [1, 2]]),
])
def test_constant_latency_gives_hand_computed_times(policy: str, launches: int, token_times: list) -> None:
    arch = tiny_arch(r_max=3)
    requests = make_requests([(4, 2), (4, 2)], depths=[[1], [3]])
    config = ServeConfig(policy=policy, width=4, timing="sync")
    log = simulate(arch, config, requests, constant(arch), kv_blocks=64)
    assert len(log.launches) == launches
    assert log.launches["end"].max() == pytest.approx(launches * MS)
    for got, want in zip(log.token_times, token_times, strict=True):
        assert got == pytest.approx(np.array(want) * MS)


def test_sync_idles_for_the_host_and_lookahead_hides_it() -> None:
    arch = tiny_arch(r_max=4)
    requests = make_requests([(20, 30)] * 8, depths=[([2, 3, 4] * 10)[:29]] * 8)
    host = 0.25 * MS
    sync = simulate(arch, ServeConfig(width=8, timing="sync"), requests, constant(arch, host), 256)
    starts, ends = sync.launches["start"].to_numpy(), sync.launches["end"].to_numpy()
    assert starts[1:] - ends[:-1] == pytest.approx(np.full(len(starts) - 1, host))
    report = summarize(sync, arch, requests, 2)
    assert report.device_idle == pytest.approx(host / (host + MS), rel=0.02)
    ahead = simulate(arch, ServeConfig(width=8, timing="lookahead"), requests, constant(arch, host), 256)
    assert summarize(ahead, arch, requests, 2).device_idle < 0.002
    # async overlaps everything but what follows a core launch
    overlap = simulate(arch, ServeConfig(width=8, timing="async"), requests, constant(arch, host), 256)
    gaps = overlap.launches["start"].to_numpy()[1:] - overlap.launches["end"].to_numpy()[:-1]
    after_core = (overlap.launches["stage"].to_numpy()[:-1] == "core")
    assert gaps[after_core] == pytest.approx(np.full(after_core.sum(), host))
    assert np.allclose(gaps[~after_core], 0.0)


def test_online_arrivals_wait_for_their_time() -> None:
    arch = tiny_arch(r_max=2)
    requests = make_requests([(4, 2), (4, 2)], depths=[[2], [2]], arrivals=[0.0, 0.5])
    log = simulate(arch, ServeConfig(width=4, timing="sync"), requests, constant(arch), 64)
    assert log.launches["start"].iloc[-1] >= 0.5
    assert log.requests["first_token"].iloc[1] == pytest.approx(0.5 + MS)


def test_fit_recovers_coefficients_from_noisy_points() -> None:
    rng = np.random.default_rng(0)
    delta, gamma, alpha = 5.4e-3, 2.0e-5, 3.0e-9
    batch = np.repeat([1, 2, 4, 8, 16, 32, 64, 128, 256, 512], 4)
    context = np.tile([128, 512, 2048, 8192], 10) * batch
    t = (delta + gamma * batch + alpha * context) * rng.normal(1.0, 0.005, size=batch.size)
    fit = fit_points(np.stack([batch, context, t], axis=1))
    assert fit.delta == pytest.approx(delta, rel=0.02)
    assert fit.gamma == pytest.approx(gamma, rel=0.02)
    assert fit.alpha == pytest.approx(alpha, rel=0.02)
    assert fit.r2 > 0.99 and fit.max_rel_residual < 0.03


def test_profile_roundtrip_and_shape_check(tmp_path) -> None:
    ouro, huginn = PRESETS["ouro-1.4b"], PRESETS["huginn-3.5b"]
    profile = roofline_profile(ouro)
    path = profile.save(tmp_path / "p.json")
    back = load_profile_file(path)
    assert back.components.keys() == profile.components.keys()
    assert LatencyModel(ouro, back).costs == LatencyModel(ouro, profile).costs
    with pytest.raises(ConfigError, match="no measurement of layer/huginn"):
        LatencyModel(huginn, back)
    forced = LatencyModel(huginn, back, force=True)
    assert forced.costs[Stage.CORE].delta == pytest.approx(LatencyModel(huginn, roofline_profile(huginn))
                                                           .costs[Stage.CORE].delta)
    (tmp_path / "bad.json").write_text('{"format": "cdbsim-profile/1",\n"name": }')
    with pytest.raises(ConfigError, match=r"bad\.json:2"):
        load_profile_file(tmp_path / "bad.json")


def test_resplit_costs_come_from_the_same_components() -> None:
    base = PRESETS["huginn-3.5b"]
    profile = roofline_profile(base)
    full = LatencyModel(base, profile)
    small = LatencyModel(base.with_split("1-4-1"), profile)
    layer = profile.components["layer/" + base.layer.key]
    assert full.costs[Stage.CORE] == small.costs[Stage.CORE]
    assert full.costs[Stage.CODA].delta - small.costs[Stage.CODA].delta == pytest.approx(layer.delta)
    assert full.costs[Stage.PRELUDE].gamma - small.costs[Stage.PRELUDE].gamma == pytest.approx(layer.gamma)


def test_same_seed_same_result() -> None:
    arch = PRESETS["ouro-1.4b"]
    latency = LatencyModel(arch, roofline_profile(arch))

    def once():
        requests = build_trace("alpaca", 150, 4, 2, ExitModel(mean=2.5), rate=40.0, seed=11)
        return simulate(arch, ServeConfig(), requests, latency, 4096)

    a, b = once(), once()
    pd.testing.assert_frame_equal(a.launches, b.launches)
    pd.testing.assert_frame_equal(a.requests, b.requests)


@pytest.mark.parametrize("workload", ["alpaca", "sharegpt"])
def test_policies_order_as_expected(workload: str) -> None:
    arch = PRESETS["ouro-1.4b"]
    latency = LatencyModel(arch, roofline_profile(arch))
    kv = KVCapacity(tokens=150_000)
    none = build_trace(workload, 300, 4, 2, ExitModel("none"), seed=1)
    cb, norefill, refill, _ = (r.report for r in compare_policies(arch, ServeConfig(), none, latency, kv))
    assert norefill.output_tps == pytest.approx(cb.output_tps, rel=0.03)
    assert refill.output_tps == pytest.approx(cb.output_tps, rel=0.03)
    exits = build_trace(workload, 300, 4, 2, ExitModel(mean=2.5), seed=1)
    cb, norefill, refill, _ = (r.report for r in compare_policies(arch, ServeConfig(), exits, latency, kv))
    assert refill.output_tps >= norefill.output_tps >= cb.output_tps * 1.05
    assert 0.8 < refill.bound_realised <= 1.0


def test_report_on_a_hand_built_log() -> None:
    arch = tiny_arch(r_max=4)
    requests = make_requests([(10, 3), (6, 2)], depths=[[2, 4], [3]])
    launches = pd.DataFrame({
        "index": [0, 1, 2, 3], "stage": ["prefill", "core", "coda", "coda"], "size": [16, 2, 1, 1],
        "padded": [16, 2, 1, 1], "items": [2, 2, 1, 1], "context": [0, 0, 0, 0], "kv_copies": [0] * 4,
        "start": [0.0, 1.0, 2.0, 3.5], "end": [1.0, 2.0, 3.0, 4.0], "host_s": [0.0] * 4,
        "step_mix": ["", "0:2", "", ""], "exits": [0, 1, 0, 0], "tokens": [2, 0, 1, 2],
        "queue_waiting": [0] * 4, "queue_core": [0] * 4, "queue_coda": [0] * 4, "active": [2] * 4})
    token_times = [np.array([1.0, 3.0, 4.0]), np.array([1.0, 4.0])]
    reqs = pd.DataFrame({"request_id": [0, 1], "prompt_len": [10, 6], "output_len": [3, 2],
                         "arrival": [0.0, 0.5], "scheduled": [0.0, 0.0], "first_token": [1.0, 1.0],
                         "finish": [4.0, 4.0]})
    report = summarize(RunLog(launches, reqs, token_times, {"policy": "refill"}), arch, requests, r_min=2)
    assert report.makespan_s == 4.0
    assert report.output_tps == pytest.approx(5 / 4.0)
    assert report.ttft_s.p50 == pytest.approx(0.75)  # (1.0, 0.5)
    assert report.tpot_s.mean == pytest.approx((1.5 + 3.0) / 2)
    assert report.itl_s.mean == pytest.approx((2.0 + 1.0 + 3.0) / 3)
    assert report.e2e_s.mean == pytest.approx((4.0 + 3.5) / 2)
    assert report.normalized_s.mean == pytest.approx((4.0 / 3 + 3.5 / 2) / 2)
    assert report.device_busy == pytest.approx(3.5 / 4.0)
    assert report.device_idle == pytest.approx(0.5 / 4.0)
    assert report.prefill_share == pytest.approx(1.0 / 3.5)
    assert report.launches == {"prefill": 1, "core": 1, "coda": 2}
    assert report.mean_depth == pytest.approx((4 + 2 + 4 + 4 + 3) / 5)
    assert report.f1 == pytest.approx(2 / 5)


def test_idle_share_drops_summation_noise() -> None:
    from cdbsim.report.metrics import idle_share

    assert idle_share(3.0 - 1e-14, 3.0) == 0.0
    assert idle_share(2.0, 4.0) == pytest.approx(0.5)
    assert idle_share(1.0, 0.0) == 0.0


def test_a_measured_prefill_is_priced_on_the_curve_through_its_points() -> None:
    """A whole-model prefill follows its measured points (a straight line missed them by up to 20%), no
    prefill is predicted faster than the smallest one measured, and a re-split model's prefill, composed
    from the layer components' curves, levels off the same way."""
    from pathlib import Path

    from cdbsim.latency.model import LatencyModel, model_stage_name
    from cdbsim.latency.profile import load_profile_file
    from cdbsim.model.arch import PRESETS
    from cdbsim.serving.launch import Launch, Stage

    arch = PRESETS["huginn-3.5b"]
    profile = load_profile_file(Path(__file__).parents[1] / "calibration/profiles/h200-huginn-3.5b.json")
    model = LatencyModel(arch, profile)
    points = profile.components[model_stage_name(arch, Stage.PREFILL)].points
    smallest = min(p[-1] for p in points)

    def prefill(tokens: int, padded: int, chunks: int = 1) -> Launch:
        per = tokens // chunks
        return Launch(0, Stage.PREFILL, requests=[0] * chunks, positions=[0] * chunks, chunk_lens=[per] * chunks,
                      finishes=[True] * chunks, size=tokens, padded=padded, context=chunks * per * (per + 1) // 2)

    for tokens, pairs, chunks, seconds in points:
        launch = Launch(0, Stage.PREFILL, requests=[0] * int(chunks), positions=[0] * int(chunks),
                        chunk_lens=[0] * int(chunks), finishes=[True] * int(chunks), size=int(tokens),
                        padded=int(tokens), context=int(pairs))
        assert model.launch_time(launch) == pytest.approx(seconds, rel=0.03)
    line = model.costs[Stage.PREFILL]
    assert abs(line(128, 1088, chunks=8) / smallest - 1) > 0.1  # the line alone misses a point the curve meets
    assert model.launch_time(prefill(12, 16)) >= smallest * 0.99
    resplit = LatencyModel(arch.with_split("1-4-1"), profile)  # composed from the layer components
    short, long = resplit.launch_time(prefill(12, 16)), resplit.launch_time(prefill(4096, 4096))
    assert 0 < short < long
    assert resplit.launch_time(prefill(4096, 4096, chunks=4)) < long  # fewer pairs attended


def test_decode_launches_pay_their_metadata_copy_where_the_profile_measured_it() -> None:
    """The copy grows with the padded rows and the run's block-table width; prefill and profiles without
    a ``meta_copy`` fit pay none; the simulator charges it at the width of the run's longest request."""
    from cdbsim.latency.model import META_COPY
    from cdbsim.latency.profile import Fit
    from cdbsim.serving.launch import FIELDS, Launch, metadata_bytes, table_width

    arch = tiny_arch(r_max=3)
    profile = constant_profile(MS)
    plain = LatencyModel(arch, profile)
    profile.components[META_COPY] = Fit(delta=2e-6, gamma=1e-10)
    copying = LatencyModel(arch, profile)
    core = Launch(0, Stage.CORE, requests=[0, 1], positions=[5, 9], size=2, padded=4, steps=[0, 0],
                  exits=[False, False])
    prefill = Launch(0, Stage.PREFILL, requests=[0], positions=[0], chunk_lens=[8], finishes=[True], size=8,
                     padded=8)
    assert metadata_bytes(4, 10) == 4 * 4 * (len(FIELDS) + 10)
    assert copying.launch_time(core, table_width=10) == pytest.approx(MS + 2e-6 + 1e-10 * metadata_bytes(4, 10))
    assert copying.launch_time(core) == plain.launch_time(core, table_width=10) == MS
    assert copying.launch_time(prefill, table_width=10) == MS
    requests = make_requests([(20, 13), (4, 2)], depths=[[1] * 12, [3]])
    assert table_width(requests, 16) == 3  # 33 tokens
    config = ServeConfig(policy="refill", width=4, timing="sync")
    with_copy = simulate(arch, config, requests, copying, kv_blocks=64).launches
    without = simulate(arch, config, requests, plain, kv_blocks=64).launches
    took = (with_copy["end"] - with_copy["start"]).to_numpy() - (without["end"] - without["start"]).to_numpy()
    decode_type = (with_copy["stage"] != "prefill").to_numpy()
    want = [2e-6 + 1e-10 * metadata_bytes(p, 3) for p in with_copy["padded"][decode_type]]
    assert took[decode_type] == pytest.approx(want) and np.allclose(took[~decode_type], 0.0)


def test_a_difference_fitted_unweighted_is_not_pinned_to_its_zeros() -> None:
    """A cost measured as the difference of two steps comes out at ~0 where it is below the noise; a
    relative weight would hold the line there, plain residuals follow the points that carry it."""
    copies = np.array([28, 224, 1792, 7168, 14336], dtype=float)
    t = np.array([1e-9, 0.5e-6, 1e-9, 40e-6, 86e-6])
    points = np.column_stack([copies, np.zeros(5), t])
    plain = fit_points(points, relative=False)
    assert 5e-9 < plain.gamma < 7e-9  # ~6 ns a copy, as the two large points say
    assert fit_points(points).gamma < 0.2 * plain.gamma
    negative = points.copy()
    negative[0, 2] = -1e-6  # noise below zero: kept for a plain fit, refused for a relative one
    assert fit_points(negative, relative=False).gamma > 0
    with pytest.raises(ConfigError):
        fit_points(negative)


@pytest.mark.parametrize("exits", [ExitModel(mean=2.5), ExitModel("none")], ids=["exits", "full-depth"])
def test_share_of_s_e2e_realised_never_exceeds_100_percent(exits: ExitModel) -> None:
    """On the shipped H200 profile refill used to reach 100.8% of the parameter bound on ShareGPT: the
    head takes less time per parameter than a core loop, and the split stages cost less than CB's fused
    step at long contexts. The bound now prices both, so it cannot be beaten."""
    from cdbsim.latency.shipped import resolve_profile

    arch = PRESETS["ouro-1.4b"]
    latency = LatencyModel(arch, resolve_profile("auto", arch))
    requests = build_trace("sharegpt", 200, 4, 2, exits, seed=0)
    results = compare_policies(arch, ServeConfig(), requests, latency, KVCapacity(tokens=150_000))
    for result in results:
        report = result.report
        assert report.s_e2e is not None and report.bound_realised <= 1.0, report.meta["policy"]
        assert report.speedup <= report.s_e2e
    if exits.kind != "none":
        assert results[2].report.bound_realised > 0.95


def test_online_runs_have_no_share_of_s_e2e() -> None:
    arch = PRESETS["ouro-1.4b"]
    latency = LatencyModel(arch, roofline_profile(arch))
    requests = build_trace("alpaca", 80, 4, 2, ExitModel(mean=2.5), rate=20.0, seed=3)
    result, _ = with_baseline(arch, ServeConfig(), requests, latency, KVCapacity(tokens=150_000))
    report = result.report
    assert report.online and report.speedup is not None
    assert report.s_e2e is None and report.bound_realised is None
    assert "% of S_e2e" not in report.row() and "vs CB" in report.row()


def test_launches_are_a_launch_gap_apart_on_a_busy_device() -> None:
    """Offline under lookahead the device never waits for the host, so consecutive launches are exactly
    the latency model's launch gap apart and idle time is that gap per launch; a constant profile has no gap."""
    from calibration.fit import fit_launch_gap, launch_gaps

    arch = PRESETS["ouro-1.4b"]
    latency = LatencyModel(arch, roofline_profile(arch))
    assert latency.launch_gap == pytest.approx(1.30e-6)
    requests = build_trace("alpaca", 60, 4, 2, ExitModel(mean=2.5), seed=5)
    log = simulate(arch, ServeConfig(), requests, latency, 4096)
    gaps = launch_gaps(log.launches)
    assert gaps.min() >= latency.launch_gap * (1 - 1e-6) and fit_launch_gap([log.launches]) == pytest.approx(
        latency.launch_gap, rel=1e-3)
    report = summarize(log, arch, requests, 2)
    span = log.launches["end"].max() - log.launches["start"].min()
    assert report.device_idle == pytest.approx(gaps.sum() / span, rel=1e-3) and report.device_idle > 0
    assert constant(arch).launch_gap == 0.0
    wide = roofline_profile(arch)
    wide.device["launch_gap_s"] = 5e-6  # a profile may carry its own device's gap
    assert LatencyModel(arch, wide).launch_gap == 5e-6


def test_a_launch_handed_to_an_idle_device_starts_the_idle_start_later() -> None:
    """Under sync timing the device idles while the host plans each launch: every launch starts the idle
    start after the host is done with it (the previous end plus its host time), not at once."""
    arch = PRESETS["ouro-1.4b"]
    latency = LatencyModel(arch, roofline_profile(arch))
    assert latency.idle_start == pytest.approx(4.5e-6) and constant(arch).idle_start == 0.0
    requests = build_trace("alpaca", 20, 4, 2, ExitModel(mean=2.5), seed=5)
    log = simulate(arch, ServeConfig(timing="sync"), requests, latency, 4096).launches
    waited = log["start"].to_numpy()[1:] - log["end"].to_numpy()[:-1]
    assert waited == pytest.approx(log["host_s"].to_numpy()[1:] + latency.idle_start, abs=1e-9)


def test_replayed_host_times_go_by_launch_index() -> None:
    """Launch i takes the i-th replayed host time; a launch past the replayed ones keeps the host line."""
    from cdbsim.serving.launch import Stage, decode_launch

    arch = PRESETS["ouro-1.4b"]
    latency = LatencyModel(arch, roofline_profile(arch))
    replayed = latency.with_host_times([1e-3, 2e-3])
    launch = [decode_launch(Stage.CORE, [0, 1], [10, 20], [[0], [1]], 2, index=i) for i in range(3)]
    assert [replayed.host_time(x) for x in launch[:2]] == [1e-3, 2e-3]
    assert replayed.host_time(launch[2]) == latency.host_time(launch[2]) > 0

