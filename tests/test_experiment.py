"""The experiment declared once: TOML files, --set overrides, one-line errors, Hugging Face configs, and the
Python API a notebook uses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdbsim.errors import ConfigError
from cdbsim.model.arch import PRESETS, KVLayout
from cdbsim.model.hf_config import arch_from_hf_config, hf_config_of
from cdbsim.planner.experiment import MAX_WIDTH, Experiment, ServeSection
from cdbsim.serving.config import Policy, Timing

ROOT = Path(__file__).parents[1]


def test_defaults_build_what_predict_runs() -> None:
    setup = Experiment(workload={"requests": 20}).build()
    assert setup.arch == PRESETS["ouro-1.4b"]
    assert (setup.config.policy, setup.config.width, setup.config.timing) == (Policy.REFILL, 64, Timing.LOOKAHEAD)
    assert len(setup.requests) == 20 and setup.latency.profile.name == "h200-ouro-1.4b"
    assert setup.title().startswith("ouro-1.4b (0-24-0, r_max 4) | W=64 M=8192 lookahead depth-KV | sharegpt x20")


def test_toml_round_trip(tmp_path) -> None:
    exp = Experiment().override(["arch.name=huginn-3.5b", "arch.split=1-4-1", "arch.r_max=12",
                                 "serve.policy=norefill", "serve.kv_layout=first-shared", "serve.kv_tokens=98304",
                                 "workload.trace=runs/t.parquet", "workload.rate=2.5", "exits.mean_depth=6",
                                 "exits.correlation=-0.25", "latency.force=true", "latency.bandwidth=8"])
    path = tmp_path / "exp.toml"
    path.write_text(exp.to_toml())
    back = Experiment.from_toml(path)
    assert back == exp
    assert back.serve.kv_layout is KVLayout.FIRST_SHARED and back.workload.trace == Path("runs/t.parquet")
    assert back.latency.force is True and back.exits.correlation == -0.25
    assert Experiment().merge(exp.to_dict()) == exp  # the dict form round-trips too (None = unset)


@settings(max_examples=60, deadline=None)
@given(width=st.integers(1, MAX_WIDTH),
       rate=st.none() | st.floats(min_value=0, exclude_min=True, allow_nan=False, allow_infinity=False),
       profile=st.text(st.characters(blacklist_categories=("Cs",)), max_size=12), force=st.booleans())
def test_toml_round_trip_of_any_value(tmp_path_factory, width: int, rate: float | None, profile: str,
                                      force: bool) -> None:
    exp = Experiment(serve={"width": width}, workload={"rate": rate}, latency={"profile": profile, "force": force})
    path = tmp_path_factory.mktemp("toml") / "exp.toml"
    path.write_text(exp.to_toml(), encoding="utf-8")
    assert Experiment.from_toml(path) == exp


def test_set_values_are_parsed_to_the_field_type() -> None:
    exp = Experiment().override(["serve.width=128", "serve.policy=no-refill", "latency.force=yes",
                                 "workload.rate=0.5", "arch.hf_config=ckpt/config.json", "serve.kv_tokens=4096"])
    assert exp.serve.width == 128 and exp.serve.policy is Policy.NOREFILL and exp.latency.force is True
    assert exp.workload.rate == 0.5 and exp.arch.hf_config == Path("ckpt/config.json")
    cleared = exp.override(["serve.kv_tokens=none", "workload.rate="])
    assert cleared.serve.kv_tokens is None and cleared.workload.rate is None
    assert exp.override({"serve.width": 16}).serve.width == 16  # a mapping works like the text form
    assert exp.serve.width == 128  # experiments are values: override returns a copy


@pytest.mark.parametrize("assignment,message", [
    ("serve.width=abc", "--set: serve.width: expected an integer, got 'abc'"),
    ("serve.width=1.5", "--set: serve.width: expected an integer, got '1.5'"),
    ("latency.force=maybe", "--set: latency.force: expected true or false, got 'maybe'"),
    ("workload.rate=fast", "--set: workload.rate: expected a number (or none), got 'fast'"),
    ("serve.policy=fifo", "--set: serve.policy: unknown policy 'fifo'; choose one of: adaptive, cb, norefill, refill"),
    ("serve.widht=8", "--set: unknown key serve.widht; valid keys of [serve]: coda_batch, core_launch, "
                      "kv_blocks, kv_layout, kv_tokens, memory_fraction, over_memory, policy, prefill_budget, timing, "
                      "width"),
    ("model.width=8", "--set: unknown section [model]; valid sections: arch, serve, workload, exits, latency"),
    ("width=8", "--set: expected section.field=value, got 'width'"),
    ("serve.width", "--set: expected section.field=value, got 'serve.width'"),
])
def test_bad_set_is_one_line_naming_key_and_what_is_allowed(assignment: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Experiment().override([assignment])
    assert str(info.value) == message


@pytest.mark.parametrize("text,message", [
    ("[exits]\nmodel = 'fixed'\ndpeth = 3\n", "unknown key exits.dpeth; valid keys of [exits]: correlation, depth, "
                                             "dispersion, mean_depth, model, q"),
    ("[serve]\nwidth = 64.0\n", "serve.width: expected an integer, got 64.0"),
    ("[serve]\nwidth = true\n", "serve.width: expected an integer, got True"),
    ("[serve]\npolicy = 3\n", "serve.policy: unknown policy 3; choose one of: adaptive, cb, norefill, refill"),
    ("serve = 3\n", "serve must be a table of settings ([serve]), got 3"),
    ("[serve\n", "invalid TOML (Expected ']' at the end of a table declaration (at line 1, column 7))"),
])
def test_bad_toml_names_the_file_and_key(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        Experiment.from_toml(path)
    assert str(info.value) == f"{path}: {message}"


def test_missing_toml_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"experiment file .*none.toml does not exist"):
        Experiment.from_toml(tmp_path / "none.toml")


def test_sections_given_as_dicts_are_checked_like_a_file() -> None:
    assert Experiment(serve={"width": "32"}).serve == ServeSection(width=32)
    with pytest.raises(ConfigError, match=r"^unknown key serve.widht; valid keys of \[serve\]: coda_batch"):
        Experiment(serve={"widht": 32})
    with pytest.raises(ConfigError, match="expected an integer"):
        ServeSection(width="wide")


def test_shape_fields_override_the_preset() -> None:
    exp = Experiment(arch={"hidden": 1024, "heads": 8, "kv_heads": 8, "intermediate": 2816, "core": 12,
                           "r_max": 8})
    spec = exp.arch.spec()
    assert (spec.layer.hidden, spec.layer.heads, spec.layer.intermediate, spec.layer.head_dim) == (1024, 8, 2816, 128)
    assert (spec.prelude, spec.core, spec.coda, spec.r_max) == (0, 12, 0, 8)
    assert spec.name == "ouro-1.4b[hidden=1024,intermediate=2816,heads=8,kv_heads=8]@0-12-0"
    assert spec.core_params < PRESETS["ouro-1.4b"].core_params / 4
    assert Experiment(arch={"hidden": 2048}).arch.spec() == PRESETS["ouro-1.4b"]  # the preset's own value
    with pytest.raises(ConfigError, match=r"split or arch\.prelude/core/coda, not both"):
        Experiment(arch={"split": "1-4-1", "core": 4}).arch.spec()
    with pytest.raises(ConfigError, match=r"heads \(16\) must be a multiple of kv_heads \(3\)"):
        Experiment(arch={"kv_heads": 3}).arch.spec()


OURO_14B_CONFIG = {  # the fields of ByteDance/Ouro-1.4B's config.json that describe its shape
    "_name_or_path": "ByteDance/Ouro-1.4B", "model_type": "ouro", "architectures": ["OuroForCausalLM"],
    "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_hidden_layers": 24, "total_ut_steps": 4, "vocab_size": 49152, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
HUGINN_CONFIG = {  # tomg-group-umd/huginn-0125 (RavenConfig)
    "model_type": "huginn_raven", "n_embd": 5280, "n_heads": 55, "intermediate_size": 17920,
    "n_layers_in_prelude": 2, "n_layers_in_recurrent_block": 4, "n_layers_in_coda": 2, "vocab_size": 65536,
    "padded_vocab_size": 65536, "rope_base": 50000, "tie_embeddings": True, "norm_eps": 1e-06,
    "mean_recurrence": 32,
}


def write_config(directory: Path, data: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_hf_config_of_ouro_is_the_preset(tmp_path) -> None:
    spec = arch_from_hf_config(write_config(tmp_path, OURO_14B_CONFIG))
    assert spec.name == "Ouro-1.4B" and replace(spec, name="ouro-1.4b") == PRESETS["ouro-1.4b"]
    gqa = arch_from_hf_config(write_config(tmp_path / "gqa", {**OURO_14B_CONFIG, "num_key_value_heads": 4,
                                                               "num_hidden_layers": 48, "_name_or_path": ""}))
    assert (gqa.name, gqa.layer.kv_heads, gqa.core, gqa.layer.head_dim) == ("gqa", 4, 48, 128)
    assert gqa.kv_bytes_per_token("shared") == 48 * 2 * 4 * 128 * 2


def test_hf_config_of_huginn_is_the_preset_at_r_max_16(tmp_path) -> None:
    path = write_config(tmp_path / "huginn-0125", HUGINN_CONFIG)
    spec = arch_from_hf_config(path)
    assert spec.name == "huginn-0125" and spec.r_max == 16
    assert replace(spec, name="huginn-3.5b") == PRESETS["huginn-3.5b"]
    via_experiment = Experiment(arch={"hf_config": str(path), "r_max": 8}).arch.spec()
    assert via_experiment.r_max == 8 and via_experiment.layer == PRESETS["huginn-3.5b"].layer


@pytest.mark.parametrize("change,message", [
    ({"model_type": "llama"}, "unknown model_type 'llama'; choose one of: huginn_raven, ouro"),
    ({"hidden_size": None}, "no hidden_size (an Ouro config.json has it)"),
    ({"num_attention_heads": "16"}, "num_attention_heads must be an integer, got '16'"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings must be true or false, got 1"),
    ({"num_attention_heads": 15}, "no head_dim, and the hidden size 2048 is not a multiple of the 15 attention "
                                  "heads"),
    ({"num_key_value_heads": 3}, "heads (16) must be a multiple of kv_heads (3)"),
])
def test_bad_hf_config_names_file_and_key(tmp_path, change: dict, message: str) -> None:
    data = {k: v for k, v in {**OURO_14B_CONFIG, **change}.items() if v is not None}
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        arch_from_hf_config(path)
    assert str(info.value) == f"{path}: {message}"


def test_hf_config_and_a_preset_are_exclusive(tmp_path) -> None:
    path = write_config(tmp_path, OURO_14B_CONFIG)
    with pytest.raises(ConfigError, match="not both"):
        Experiment(arch={"name": "huginn-3.5b", "hf_config": str(path)}).arch.spec()


def test_import_cdbsim_is_cheap() -> None:
    """``import cdbsim`` loads no numerical library; the API names import theirs on first use."""
    code = ("import sys, cdbsim; heavy = {'simpy', 'pandas', 'scipy', 'numpy'}; "
            "print(sorted(heavy & set(sys.modules))); cdbsim.Experiment; print('simpy' in sys.modules); "
            "cdbsim.predict; print('simpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["[]", "False", "True"]
    import cdbsim

    with pytest.raises(AttributeError, match="no attribute 'sweeps'"):
        cdbsim.sweeps  # noqa: B018


def test_the_python_example_runs() -> None:
    """The code under the inputs guide's "From Python" heading, run as written."""
    text = (ROOT / "docs" / "inputs-and-outputs.md").read_text()
    section = text[text.index("## From Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    result, exp = namespace["result"], namespace["exp"]
    assert result.setup.arch.split == "1-4-1" and result.report.requests == 50
    assert result.baseline is not None and result.report.speedup == pytest.approx(
        result.report.output_tps / result.baseline.report.output_tps)
    frame = namespace["frame"]
    assert frame.shape[0] == 1 and frame["output tok/s"].iloc[0] == result.report.output_tps
    assert "vs CB" in frame.columns
    assert namespace["wider"].serve.width == 128 and exp.serve.width == 64
    rows = namespace["rows"]
    assert len(rows) == 4 and (rows["status"] == "ok").all() and rows["split"].eq("1-4-1").all()
    assert namespace["refill"].policy == "refill" and namespace["refill"].rate > 0


def test_predict_without_baseline_matches_the_command_line() -> None:
    from typer.testing import CliRunner

    import cdbsim
    from cli import app

    args = ["--workload", "alpaca", "--requests", "30", "--profile", "roofline", "--W", "32"]
    cli = json.loads(CliRunner().invoke(app, ["predict", *args, "--no-baseline", "--json"]).stdout)
    exp = cdbsim.Experiment(workload={"name": "alpaca", "requests": 30}, latency={"profile": "roofline"},
                            serve={"width": 32})
    result = cdbsim.predict(exp)
    assert result.baseline is None and result.report.speedup is None
    assert cli["refill K=1"]["output_tps"] == result.report.output_tps


@st.composite
def valid_settings(draw) -> dict:
    """Any valid combination of the settings, the mean depth left at its default."""
    name = draw(st.sampled_from(sorted(PRESETS)))
    r_max = draw(st.integers(1, 20))
    r_min = draw(st.none() | st.integers(1, r_max))
    policy = draw(st.sampled_from(list(Policy)))
    timing = draw(st.sampled_from(list(Timing)))
    width = draw(st.integers(1, 256))
    coda_batch = None if policy is Policy.ADAPTIVE else draw(st.none() | st.integers(1, width))
    served_min = min(max(r_min or 1, 2 if timing is Timing.LOOKAHEAD else 1), r_max)
    exits = draw(st.sampled_from(["none", "fixed", "synthetic", "paper"]))
    chosen: dict = {"model": exits}
    if exits == "fixed":
        chosen["depth"] = draw(st.integers(served_min, r_max))
    if exits == "paper":
        chosen["q"] = draw(st.sampled_from([0.2, 0.4, 0.5, 0.7, 1.0] if "ouro" in name else [0.28, 0.16, 0.10, 0.0]))
    return {"arch": {"name": name, "r_max": r_max, "r_min": r_min},
            "serve": {"policy": policy, "timing": timing, "width": width, "coda_batch": coda_batch},
            "exits": chosen, "workload": {"name": draw(st.sampled_from(["alpaca", "sharegpt"])), "requests": 3}}


@settings(max_examples=60, deadline=None)
@given(chosen=valid_settings())
def test_the_default_mean_depth_is_valid_for_any_valid_settings(chosen: dict) -> None:
    from cdbsim.planner.sweep import impossible

    exp = Experiment(**chosen)
    assert impossible(exp) is None
    setup = exp.build()
    assert all(setup.config.r_min(setup.arch) <= d <= setup.arch.r_max for r in setup.requests for d in r.depths)


@pytest.mark.parametrize("name", ["ouro-1.4b", "huginn-3.5b"])
def test_the_default_mean_depth_respects_the_lookahead_floor(name: str) -> None:
    arch = Experiment(arch={"name": name, "r_max": 2}).arch.spec()
    assert Experiment(arch={"name": name, "r_max": 2}).workload_spec(arch).exits.mean == 2.0
    assert Experiment(serve={"timing": "sync"}).workload_spec(arch).exits.mean == 1.5
    assert Experiment().workload_spec(Experiment().arch.spec()).exits.mean == 2.5  # Ouro's 1..4: unchanged


def test_a_huginn_config_without_a_rope_base_takes_upstreams_and_keeps_its_loop_count(tmp_path) -> None:
    config = {k: v for k, v in HUGINN_CONFIG.items() if k != "rope_base"}
    spec = arch_from_hf_config(write_config(tmp_path, config))
    assert spec.rope_theta == 50_000.0 and spec.r_max == 16 and spec.extras["mean_recurrence"] == 32


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_written_config_reads_back_as_the_same_architecture(tmp_path, name) -> None:
    arch = PRESETS[name]
    assert arch_from_hf_config(write_config(tmp_path, hf_config_of(arch))) == arch


def test_an_ouro_config_cannot_hold_a_prelude() -> None:
    with pytest.raises(ConfigError, match="loops every layer"):
        hf_config_of(PRESETS["ouro-1.4b"].with_split("4-16-4"))
