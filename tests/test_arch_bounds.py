"""Architecture numbers and bounds against the public model configs and the CDB paper's formulas."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdbsim.errors import ConfigError
from cdbsim.model import bounds
from cdbsim.model.arch import PRESETS, load_arch
from cdbsim.model.bounds import DeviceTimes, e2e_bound, first_token_fraction, mean_depth, s_dec, s_e2e, saturation_batch
from tests.conftest import make_requests


def test_ouro_numbers_match_models_md() -> None:
    ouro = PRESETS["ouro-1.4b"]
    assert ouro.layer.params == 51_388_416
    assert ouro.core_params == 1_233_321_984
    assert PRESETS["ouro-2.6b"].core_params == 2_466_643_968
    assert ouro.embedding_params == ouro.head_params == 100_663_296
    assert ouro.kv_bytes_per_token("depth") == 786_432
    assert ouro.kv_bytes_per_token("shared") == 196_608
    assert ouro.weight_bytes()["core"] == pytest.approx(2.47e9, rel=0.01)


def test_huginn_numbers_match_models_md() -> None:
    huginn = PRESETS["huginn-3.5b"]
    assert huginn.layer.params == 395_398_080
    assert huginn.adapter_params == 55_756_800
    assert huginn.core_params == 1_637_349_120
    assert huginn.prelude_params == huginn.coda_params == 790_796_160
    assert huginn.embedding_params == 346_030_080
    assert huginn.total_params == pytest.approx(3.565e9, rel=1e-3)
    assert huginn.f0 / huginn.fr == pytest.approx(1.18, abs=0.005)
    assert huginn.layer.kv_bytes_per_slot == 21_120
    assert huginn.kv_bytes_per_token("depth") == 1_436_160
    assert huginn.kv_bytes_per_token("shared") == 168_960
    assert huginn.weight_bytes()["core"] == pytest.approx(3.27e9, rel=0.01)


def test_resplit_keeps_the_layer_and_changes_the_stages() -> None:
    base = PRESETS["huginn-3.5b"]
    small = load_arch("huginn-3.5b", split="1-4-1")
    bare = load_arch("huginn-3.5b", split="0-4-0")
    assert small.layer == bare.layer == base.layer
    assert small.prelude_params == base.layer.params
    assert bare.f0 == pytest.approx(base.head_params + base.final_norm_params)
    assert bare.kv_bytes_per_token("depth") == 4 * 16 * 21_120
    with pytest.raises(ConfigError, match="prelude-core-coda"):
        load_arch("huginn-3.5b", split="1-4")


def test_custom_architecture_file(tmp_path) -> None:
    spec = PRESETS["ouro-1.4b"].to_dict()
    spec.update(name="my-ouro", core=12, r_max=8)
    path = tmp_path / "arch.json"
    path.write_text(json.dumps(spec))
    arch = load_arch(str(path))
    assert (arch.core, arch.r_max, arch.name) == (12, 8, "my-ouro")
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",\n "layer": }')
    with pytest.raises(ConfigError, match=r"bad\.json:2"):
        load_arch(str(bad))
    with pytest.raises(ConfigError, match="r_min"):
        load_arch("ouro-1.4b", r_max=4, r_min=5)
    with pytest.raises(ConfigError, match="choose one of"):
        load_arch("gpt-5")


def test_s_dec_matches_the_paper() -> None:
    ouro = PRESETS["ouro-1.4b"]
    # F_0 = final norm + head; F_r = 24 layers -> ~1.58x at a mean depth of 2.5 (paper: "~1.6x")
    expected = (ouro.f0 + 4 * ouro.fr) / (ouro.f0 + 2.5 * ouro.fr)
    assert s_dec(ouro, 2.5) == pytest.approx(expected)
    assert s_dec(ouro, 2.5) == pytest.approx(1.581, abs=1e-3)
    assert s_dec(ouro, 4) == pytest.approx(1.0)
    with pytest.raises(ConfigError):
        s_dec(ouro, 5)


def test_s_e2e_reduces_to_amdahl_and_to_s_dec() -> None:
    assert s_e2e(1.6, 0.0, 0.0) == pytest.approx(1.6)
    assert s_e2e(1.6, 0.25, 0.0) == pytest.approx(1 / (0.25 + 0.75 / 1.6))
    # with f1 the decoded tokens carry all the savings: w = (1/S - f1)/(1 - f1)
    w = (1 / 1.6 - 0.1) / 0.9
    assert s_e2e(1.6, 0.2, 0.1) == pytest.approx(1 / (0.2 + 0.8 * w))


def test_mean_depth_counts_first_token_at_r_max() -> None:
    requests = make_requests([(5, 3), (5, 1)], depths=[[2, 3], []])
    # tokens: r0 first (4), 2, 3; r1 first (4) -> (4 + 2 + 3 + 4) / 4
    assert mean_depth(requests, r_max=4) == pytest.approx(13 / 4)
    assert mean_depth(requests, r_max=4, r_min=3) == pytest.approx(14 / 4)
    assert first_token_fraction(requests) == pytest.approx(2 / 4)


def test_saturation_batch() -> None:
    assert saturation_batch(5.4e-3, 3e-5, 1e-8, 128) == pytest.approx(5.4e-3 / (3e-5 + 1.28e-6))
    assert saturation_batch(1.0, 0.0, 0.0, 0) == float("inf")


def test_e2e_bound_is_the_papers_when_neither_run_has_an_advantage() -> None:
    ouro = PRESETS["ouro-1.4b"]
    share = bounds.parameter_loop_share(ouro)
    dbar, f1 = 2.8, 0.05
    depth = bounds.decoded_depth(dbar, f1, ouro.r_max)
    assert f1 * ouro.r_max + (1 - f1) * depth == pytest.approx(dbar)
    baseline = DeviceTimes(makespan=10.0, prefill=2.0, decode=8.0)  # CB: fused steps only
    # a run whose split stages cost what CB's fused step does, loops taking their parameter share
    tokens = 1000
    loop_tokens = round(depth * tokens)
    per_token, per_loop = 8.0 * (1 - share), 8.0 * share * loop_tokens / (ouro.r_max * tokens)
    run = DeviceTimes(makespan=2.0 + per_token + per_loop, prefill=2.0, decode=per_token + per_loop,
                      per_token=per_token, per_loop=per_loop, decoded_tokens=tokens, loop_tokens=loop_tokens)
    assert run.full_depth_decode(ouro.r_max) == pytest.approx(8.0)
    assert run.loop_share(ouro.r_max) == pytest.approx(share)
    assert e2e_bound(run, baseline, ouro.r_max, share, run.depth()) == pytest.approx(
        s_e2e(s_dec(ouro, f1 * ouro.r_max + (1 - f1) * run.depth()), 0.2, f1))
    # a run that beats the parameter bound (loops cost more than their parameter share) meets a higher bound
    decode = 0.5 * per_token + per_loop
    cheap_head = DeviceTimes(makespan=2.0 + decode, prefill=2.0, decode=decode, per_token=0.5 * per_token,
                             per_loop=per_loop, decoded_tokens=tokens, loop_tokens=loop_tokens)
    assert e2e_bound(cheap_head, baseline, ouro.r_max, share, depth) > e2e_bound(run, baseline, ouro.r_max, share,
                                                                                 depth)


@st.composite
def run_pairs(draw):
    """A CB baseline and a split run of the same requests, with times as a launch log would give them."""
    r_max = draw(st.integers(2, 16))
    tokens = draw(st.integers(1, 10_000))
    depth = draw(st.floats(1.0, r_max))  # loops the run ran per decoded token
    per_token = draw(st.floats(0.0, 10.0))
    per_loop = draw(st.floats(1e-3, 100.0))
    prefill = draw(st.floats(0.0, 50.0))
    idle = draw(st.floats(0.0, 5.0))
    run = DeviceTimes(makespan=prefill + per_token + per_loop + idle, prefill=prefill, decode=per_token + per_loop,
                      per_token=per_token, per_loop=per_loop, decoded_tokens=tokens,
                      loop_tokens=max(1, round(depth * tokens)))
    cb_prefill, cb_decode = draw(st.floats(0.0, 50.0)), draw(st.floats(1e-3, 200.0))
    baseline = DeviceTimes(makespan=cb_prefill + cb_decode + draw(st.floats(0.0, 5.0)), prefill=cb_prefill,
                           decode=cb_decode)
    requested = draw(st.floats(1.0, r_max)) if draw(st.booleans()) else run.depth()
    return run, baseline, r_max, draw(st.floats(0.0, 1.0)), requested


@settings(max_examples=500, deadline=None)
@given(run_pairs())
def test_no_run_beats_its_e2e_bound(case) -> None:
    """Whatever the two runs' prefill, fused and split costs: speed-up (CB's makespan over the run's)
    over S_e2e is at most 1."""
    run, baseline, r_max, share, depth = case
    bound = e2e_bound(run, baseline, r_max, share, depth)
    assert baseline.makespan / run.makespan <= bound * (1 + 1e-9)
