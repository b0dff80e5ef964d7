"""Architecture numbers and bounds against reference/models.md and the paper's formulas."""

from __future__ import annotations

import json

import pytest

from cdbsim.arch import PRESETS, load_arch
from cdbsim.bounds import first_token_fraction, mean_depth, s_dec, s_e2e, saturation_batch
from cdbsim.errors import ConfigError
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
