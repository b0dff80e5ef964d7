"""The executor computes what the authors' code computes where randomness or rounding shows: Huginn's random start
state (``initialize_state`` of ``raven_modeling_minimal.py``) and RMSNorm's rounding in bf16 (``OuroRMSNorm`` of
``modeling_ouro.py``, ``RMSNorm`` of ``raven_modeling_minimal.py``)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cdbsim.model.arch import load_arch  # noqa: E402
from cdbsim.serving.config import ServeConfig  # noqa: E402
from executor import ops  # noqa: E402
from executor.driver import build_model, execute  # noqa: E402
from executor.model import ModelConfig, token_states  # noqa: E402

from .helpers import INIT_STD, assert_matches_reference, tiny_arch, tiny_requests  # noqa: E402


def random_start_model(seed: int = 7):
    return build_model(tiny_arch("huginn"), seed=1, backend="torch", init_std=INIT_STD["huginn"],
                       state_init="random", state_seed=seed)


def test_random_start_state_is_each_tokens_own_and_seeded() -> None:
    model = random_start_model()
    e = torch.zeros(4, model.config.hidden)
    request, position = torch.tensor([0, 0, 1, 1]), torch.tensor([5, 6, 5, 6])
    states = model.initial_state(e, request, position)
    assert all(not torch.equal(states[i], states[j]) for i in range(4) for j in range(i))  # every token its own
    assert torch.equal(model.initial_state(e, request, position), states)  # the same seed, the same states
    alone = model.initial_state(e[:1], request[3:], position[3:])
    assert torch.equal(alone[0], states[3])  # a token's state does not depend on its batch
    other = random_start_model(seed=8).initial_state(e, request, position)
    assert not torch.equal(other, states)
    assert model.initial_state(e.bfloat16(), request, position).dtype == torch.bfloat16
    zeros = build_model(tiny_arch("huginn"), seed=1, backend="torch")
    assert torch.equal(zeros.initial_state(e), torch.zeros_like(e))
    with pytest.raises(ValueError, match="needs each token's request and position"):
        model.initial_state(e)


def test_random_start_state_has_the_authors_statistics() -> None:
    config = ModelConfig.from_arch(load_arch("huginn-3.5b"), state_init="random", state_seed=3)
    std = math.sqrt(2 / 5)  # init std sqrt(2 / (5 h)) times the embedding scale sqrt(h)
    assert config.state_std == pytest.approx(std)
    tokens = 256
    x = token_states(config, torch.zeros(tokens, dtype=torch.long), torch.arange(tokens)).double()
    assert x.shape == (tokens, 5280)
    phi3 = math.exp(-4.5) / math.sqrt(2 * math.pi)
    mass = math.erf(3 / math.sqrt(2))
    truncated_std = std * math.sqrt(1 - 6 * phi3 / mass)  # a normal cut at 3 std
    assert float(x.std()) == pytest.approx(truncated_std, rel=0.005)
    assert abs(float(x.mean())) < 0.003
    assert 0.99 * 3 * std < float(x.abs().max()) <= 3 * std * (1 + 1e-6)  # cut at 3 std, and reaching it
    beyond_two = (math.erf(3 / math.sqrt(2)) - math.erf(2 / math.sqrt(2))) / mass
    assert float((x.abs() > 2 * std).double().mean()) == pytest.approx(beyond_two, abs=0.002)
    correlation = torch.corrcoef(x[:64]) - torch.eye(64, dtype=torch.float64)
    assert float(correlation.abs().max()) < 0.08  # independent vectors: |r| ~ 1/sqrt(5280) each


@pytest.mark.parametrize("policy", ["refill", "cb"])
def test_runs_from_a_random_start_match_the_reference_and_say_so(policy: str) -> None:
    arch = tiny_arch("huginn")
    model = random_start_model()
    requests = tiny_requests(n=4, seed=3, max_prompt=20, max_output=5)
    config = ServeConfig(policy=policy, width=4, coda_batch=1, prefill_budget=16, timing="sync", layout="depth")
    run = execute(arch, config, requests, 64, model=model, keep_logits=True, graphs=True)
    assert_matches_reference(run, model, arch, config, requests)
    assert run.log.meta["state_init"] == "random (seed 7)"
    zeros = build_model(arch, seed=1, backend="torch", init_std=INIT_STD["huginn"])
    from_zeros = execute(arch, config, requests, 64, model=zeros, keep_logits=True)
    assert from_zeros.log.meta["state_init"] == "zeros"
    assert any(not torch.allclose(run.logits[key], from_zeros.logits[key]) for key in run.logits)
    ouro = execute(tiny_arch("ouro"), config, requests, 64, model=build_model(tiny_arch("ouro"), backend="torch"))
    assert ouro.log.meta["state_init"] == "prelude output"


def upstream_ouro_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def upstream_huginn_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def weight_last(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The other order: the weight multiplied in float32 before the one rounding."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def bf16_inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return tuple((torch.randn(*shape, generator=gen) * scale).bfloat16()
                 for shape, scale in (((16, 96), 3.0), ((16, 96), 2.0), ((96,), 1.0), ((96,), 1.0)))


@pytest.mark.parametrize("upstream", [upstream_ouro_norm, upstream_huginn_norm], ids=["ouro", "huginn"])
def test_rms_norm_rounds_as_the_authors_code_in_bf16(upstream) -> None:
    x, _, w, _ = bf16_inputs()
    got = ops.rms_norm(x, w, 1e-6)
    assert got.dtype == torch.bfloat16 and torch.equal(got, upstream(x, w, 1e-6))
    assert not torch.equal(got, weight_last(x, w, 1e-6))  # the order shows in bf16


def test_residual_norm_rounds_as_the_authors_blocks_in_bf16() -> None:
    branch, x, w_post, w_next = bf16_inputs()
    # Ouro's decoder layer: residual + post_norm(branch), then the next pre-norm
    x_new, h = ops.residual_norm(branch, x, w_post, w_next, 1e-6, sandwich=True)
    want = x + upstream_ouro_norm(branch, w_post, 1e-6)
    assert torch.equal(x_new, want) and torch.equal(h, upstream_ouro_norm(want, w_next, 1e-6))
    assert not torch.equal(x_new, (x.float() + weight_last(branch.float(), w_post, 1e-6)).bfloat16())
    # Huginn's sandwich block: norm(branch + x), the sum rounded to bf16 first
    x_new, h = ops.residual_norm(branch, x, w_post, w_next, 1e-6, sandwich=False)
    want = upstream_huginn_norm(branch + x, w_post, 1e-6)
    assert torch.equal(x_new, want) and torch.equal(h, upstream_huginn_norm(want, w_next, 1e-6))
    assert not torch.equal(x_new, weight_last(branch.float() + x.float(), w_post, 1e-6))
