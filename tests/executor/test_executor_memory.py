"""The memory plan against the executor's own buffers, and the executor's refusal before it allocates."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from calibration import validation  # noqa: E402
from calibration.validation import Entry  # noqa: E402
from cdbsim.errors import ConfigError  # noqa: E402
from cdbsim.model.arch import load_arch  # noqa: E402
from cdbsim.planner.experiment import Experiment  # noqa: E402
from cdbsim.serving.config import Policy, ServeConfig, prefill_graph_sizes  # noqa: E402
from cdbsim.serving.launch import Stage  # noqa: E402
from cdbsim.serving.memory import RequestShape, executor_runtime  # noqa: E402
from executor import driver  # noqa: E402
from executor.driver import Executor, gpu_plan  # noqa: E402

from .helpers import tiny_arch, tiny_model, tiny_requests  # noqa: E402

H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=85_017_493_504)


@pytest.mark.parametrize("style,policy", [("ouro", Policy.REFILL), ("huginn", Policy.CB)])
def test_the_plan_counts_the_executors_request_buffers_and_metadata(style: str, policy: Policy) -> None:
    arch = tiny_arch(style)
    config = ServeConfig(policy=policy, width=8, prefill_budget=512)
    requests = tiny_requests(5)
    executor = Executor(arch, config, requests, 64, model=tiny_model(arch), graphs=True)  # CPU: static buffers
    engine, graphs = executor.engine, executor.graphs
    stages = (Stage.DECODE,) if policy is Policy.CB else (Stage.PRELUDE, Stage.CORE, Stage.CODA)
    graphs.capture_all(stages, config.decode_sizes())
    graphs.capture_prefill(prefill_graph_sizes(config.prefill_budget))
    plan = executor_runtime(replace(arch, dtype_bytes=4), config, RequestShape.of(requests))  # float32 on CPU

    def size(t: torch.Tensor | None) -> int:
        return 0 if t is None else t.numel() * t.element_size()

    held = (size(engine.tokens) + size(engine.rope.cos) + size(engine.rope.sin) + size(engine.bank_state)
            + size(engine.bank_inject))
    assert plan.requests == held
    zeros = sum(rows for stage, rows in graphs.graphs if stage is Stage.PREFILL)  # each prefill graph's zero column
    assert plan.metadata == sum(size(g.meta) for g in graphs.graphs.values()) + 4 * zeros


def test_the_executor_refuses_a_cache_the_gpu_cannot_hold_before_allocating(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: H100)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: pytest.fail("plan accepted"))
    requests = tiny_requests(4)
    with pytest.raises(ConfigError, match=r"65,536 KV tokens need 96\.0 GiB.*NVIDIA H100 80GB HBM3's 79\.2 GiB"):
        gpu_plan(load_arch("ouro-2.6b"), ServeConfig(), requests, 65_536 // 16, torch.device("cuda"))
    assert gpu_plan(load_arch("ouro-2.6b"), ServeConfig(), requests, 4096, torch.device("cpu")) is None


@pytest.mark.parametrize("tokens", [65_536, 49_152])
def test_validate_refuses_oversized_entries_before_any_model_loads(monkeypatch, tmp_path, tokens: int) -> None:
    monkeypatch.setattr(validation, "gpu_memory", lambda: (H100.name, float(H100.total_memory)))
    monkeypatch.setattr(driver, "build_model", lambda *a, **k: pytest.fail("a model was loaded"))
    entry = Entry("ouro26", Experiment().override(["arch.name=ouro-2.6b", f"serve.kv_tokens={tokens}",
                                                   "workload.requests=8", "workload.name=alpaca"]))
    small = Entry("small", Experiment().override(["workload.requests=8", "workload.name=alpaca"]))
    with pytest.raises(ConfigError, match=rf"^ouro26: ouro-2\.6b .*{tokens:,} KV tokens need .* at most [\d,]+ "
                                          r"tokens fit, or use the first-shared layout"):
        validation.measure([small, entry], tmp_path, lambda arch: None)
    plans = validation.plan_entries([small], H100.name, float(H100.total_memory))
    assert plans["small"].fits and plans["small"].kv_blocks > 0  # no KV given: sized from the GPU's memory


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_peak_gpu_memory_matches_the_plan() -> None:
    arch = load_arch("ouro-1.4b")
    config = ServeConfig(width=16, prefill_budget=2048)
    requests = tiny_requests(16, max_prompt=400, max_output=40)
    run = driver.execute(arch, config, requests, 4096, device="cuda")
    memory = run.log.meta["memory"]
    assert memory["fits"] and abs(memory["total_gib"] / memory["peak_allocated_gib"] - 1) < 0.05, memory


def test_calibrate_refuses_a_model_the_gpu_cannot_hold_before_measuring(monkeypatch, tmp_path) -> None:
    from calibration import measure, run

    monkeypatch.setattr(measure, "environment", lambda device: ({"name": "a 4 GB GPU", "memory_bytes": 4e9}, {}))
    monkeypatch.setattr(measure, "measure_shape", lambda *a, **k: pytest.fail("measured"))
    with pytest.raises(ConfigError, match=r"the weights of huginn-3\.5b \(6\.6 GiB\).*do not fit in 90% of the a 4 GB"):
        run.calibrate([load_arch("huginn-3.5b")], tmp_path, device="cpu")
