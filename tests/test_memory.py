"""The memory plan shared by simulator and executor: KV per layout, sizing from memory, and refusals up front."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdbsim.errors import ConfigError
from cdbsim.model.arch import KVLayout, load_arch
from cdbsim.serving.config import Policy, ServeConfig
from cdbsim.serving.memory import KVCapacity, MemoryPlan, RequestShape, executor_runtime
from cli import app
from tests.conftest import tiny_arch

H100 = ("NVIDIA H100 80GB HBM3", 85_017_493_504.0)  # what torch reports for an H100 80GB
SHAPE = RequestShape(256, 2048)


@pytest.mark.parametrize("layout", list(KVLayout))
def test_kv_bytes_follow_the_layout_and_the_trash_block(layout: KVLayout) -> None:
    arch = load_arch("huginn-3.5b")
    plan = MemoryPlan.of(arch, ServeConfig(layout=layout), 100, SHAPE, *H100)
    slots = {KVLayout.DEPTH: arch.r_max, KVLayout.SHARED: 1, KVLayout.FIRST_SHARED: 2}[layout]
    layers = arch.prelude + slots * arch.core + arch.coda
    assert plan.kv == 101 * 16 * layers * 2 * arch.layer.kv_heads * arch.layer.head_dim * 2
    assert plan.total == plan.weights + plan.kv + plan.runtime.total


def test_run_time_grows_with_width_budget_and_requests() -> None:
    arch = load_arch("ouro-1.4b")
    base = executor_runtime(arch, ServeConfig(), SHAPE).total
    assert executor_runtime(arch, ServeConfig(width=256), SHAPE).total > base
    assert executor_runtime(arch, ServeConfig(prefill_budget=16384), SHAPE).total > base
    assert executor_runtime(arch, ServeConfig(), RequestShape(2560, 2048)).requests > \
        executor_runtime(arch, ServeConfig(), SHAPE).requests
    cb = executor_runtime(arch, ServeConfig(policy=Policy.CB), SHAPE)
    assert cb.metadata < executor_runtime(arch, ServeConfig(), SHAPE).metadata  # one decode stage, not three


@pytest.mark.parametrize("tokens", [65_536, 49_152])
def test_oversized_h100_runs_are_refused_with_what_fits(tokens: int) -> None:
    arch = load_arch("ouro-2.6b")
    with pytest.raises(ConfigError) as err:
        KVCapacity(tokens=tokens).plan(arch, ServeConfig(), SHAPE, *H100)
    message = str(err.value)
    assert f"{tokens:,} KV tokens need" in message and "NVIDIA H100 80GB HBM3's 79.2 GiB" in message
    assert "at most" in message and "first-shared layout" in message and "\n" not in message
    fit = KVCapacity().plan(arch, ServeConfig(), SHAPE, *H100)
    assert f"at most {fit.kv_tokens:,} tokens fit" in message


@settings(max_examples=60, deadline=None)
@given(arch=st.sampled_from(["ouro-1.4b", "ouro-2.6b", "huginn-3.5b"]), layout=st.sampled_from(list(KVLayout)),
       width=st.sampled_from([16, 64, 256]), fraction=st.floats(0.3, 1.0),
       memory=st.sampled_from([85_017_493_504.0, 150_109_880_320.0]))
def test_the_cache_sized_from_memory_is_the_largest_that_fits(arch: str, layout: KVLayout, width: int,
                                                              fraction: float, memory: float) -> None:
    spec, config = load_arch(arch), ServeConfig(width=width, layout=layout)
    plan = KVCapacity(memory_fraction=fraction).plan(spec, config, SHAPE, "GPU", memory)
    assert plan.fits and plan.kv_blocks >= 1
    bigger = MemoryPlan.of(spec, config, plan.kv_blocks + 1, SHAPE, "GPU", memory, fraction)
    assert not bigger.fits
    KVCapacity(blocks=plan.kv_blocks, memory_fraction=fraction).plan(spec, config, SHAPE, "GPU", memory)


def test_over_memory_lets_a_what_if_through_and_unknown_memory_takes_a_given_size() -> None:
    arch = load_arch("ouro-2.6b")
    plan = KVCapacity(tokens=65_536, over_memory=True).plan(arch, ServeConfig(), SHAPE, *H100)
    assert not plan.fits and plan.kv_tokens == 65_536
    assert KVCapacity(tokens=65_536).plan(arch, ServeConfig(), SHAPE, "CPU", 0.0).kv_tokens == 65_536
    with pytest.raises(ConfigError, match="no known memory size"):
        KVCapacity().plan(arch, ServeConfig(), SHAPE, "CPU", 0.0)
    with pytest.raises(ConfigError, match="memory_fraction must be in"):
        KVCapacity(memory_fraction=1.5)


def test_weights_larger_than_the_share_are_refused() -> None:
    with pytest.raises(ConfigError, match="nothing is left for the KV cache"):
        KVCapacity().plan(tiny_arch(), ServeConfig(), SHAPE, "GPU", 1e6)


runner = CliRunner()


def test_predict_shows_the_plan_and_refuses_or_marks_a_cache_past_memory() -> None:
    args = ["predict", "-n", "20", "--arch", "ouro-2.6b", "--device", "h100-sxm", "--no-baseline"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["refill K=1"]["meta"]["memory"]
    assert memory["fits"] and memory["device"].startswith("NVIDIA H100") and memory["headroom_gib"] >= 0
    refused = runner.invoke(app, [*args, "--kv-tokens", "65536"])
    assert refused.exit_code == 2 and "at most" in refused.stderr and "--over-memory" in refused.stderr
    what_if = runner.invoke(app, [*args, "--kv-tokens", "65536", "--over-memory"])
    assert what_if.exit_code == 0 and "WHAT-IF PAST DEVICE MEMORY" in " ".join(what_if.stdout.split())
    smaller = runner.invoke(app, [*args, "--memory-fraction", "0.5", "--csv"])
    assert smaller.exit_code == 0 and "KV cache GiB" in smaller.stdout


def test_sweep_skips_points_that_do_not_fit_and_says_why(tmp_path) -> None:
    out = tmp_path / "sweep.parquet"
    grid = ["--grid", "arch.name=ouro-1.4b,ouro-2.6b", "--grid", "serve.kv_tokens=32768,65536"]
    result = runner.invoke(app, ["sweep", "-n", "10", "--device", "h100-sxm", *grid, "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "skipped point 3 (arch.name=ouro-2.6b serve.kv_tokens=65536): ouro-2.6b" in text
    assert "65,536 KV tokens need 96.0 GiB" in text and "at most 44,832 tokens fit" in text
    assert text.count("skipped point") == 1


def test_bound_says_how_many_tokens_each_layout_fits() -> None:
    result = runner.invoke(app, ["bound", "--arch", "ouro-2.6b", "--device", "h100-sxm", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    fit = KVCapacity().plan(load_arch("ouro-2.6b"), ServeConfig(), RequestShape.FEWEST, *H100)
    assert row["KV tokens that fit, depth"] == fit.kv_tokens == 44_832
    assert row["KV tokens that fit, shared"] > row["KV tokens that fit, first-shared"] > fit.kv_tokens
