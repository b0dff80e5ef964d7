"""The batched, paged executor generates exactly what the per-request reference decoder does.

Every policy (CB, no-refill, refill with K = 1 and 2) x every KV layout x both block styles, with mixed
exit depths, chunked prefill and queueing (W = 4 for 6 requests, M = 32), plus the pipelined driver
modes and a preemption (recompute) case. The default run takes every policy x layout pair and every
policy and layout with both styles; the other half of the matrix is marked ``slow`` (CI runs it).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from cdbsim.serving.config import ServeConfig
from executor.driver import execute

from .helpers import assert_matches_reference, tiny_arch, tiny_model, tiny_requests

POLICIES = [("cb", 1), ("norefill", 1), ("refill", 1), ("refill", 2), ("adaptive", 1)]
LAYOUTS = ["depth", "shared", "first-shared"]
STYLES = ["ouro", "huginn"]


def half_slow(cases: list[tuple]) -> list:
    """``cases`` (the style last) as parameters, the style alternating between the default run and
    ``slow`` so that every other combination of the remaining factors is run in both styles."""
    rests: list[tuple] = []
    out = []
    for case in cases:
        *rest, style = case
        if tuple(rest) not in rests:
            rests.append(tuple(rest))
        fast = STYLES[rests.index(tuple(rest)) % 2]
        out.append(pytest.param(*case, marks=() if style == fast else pytest.mark.slow))
    return out


MATRIX = half_slow([(p, k, layout, style) for p, k in POLICIES for layout in LAYOUTS for style in STYLES])


@pytest.mark.parametrize(("policy", "k", "layout", "style"), MATRIX)
def test_executor_matches_reference(style: str, layout: str, policy: str, k: int) -> None:
    arch = tiny_arch(style)
    model = tiny_model(arch)
    requests = tiny_requests()
    config = ServeConfig(policy=policy, width=4, coda_batch=k, prefill_budget=32, timing="sync", layout=layout)
    run = execute(arch, config, requests, kv_blocks=64, model=model, keep_logits=True)
    assert run.scheduler.done
    assert any(len(e[0].chunks) > 1 for e in run.episodes), "some prompt should have been chunked"
    assert_matches_reference(run, model, arch, config, requests)


@pytest.mark.parametrize("mode", ["async", "lookahead"])
@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_pipelined_modes_match_reference(style: str, mode: str) -> None:
    arch = tiny_arch(style)
    model = tiny_model(arch)
    requests = tiny_requests(seed=3)
    config = ServeConfig(policy="refill", width=4, coda_batch=1, prefill_budget=32, timing=mode, layout="depth")
    run = execute(arch, config, requests, kv_blocks=64, model=model, keep_logits=True, mode=mode)
    assert run.log.meta["mode"] == mode
    assert_matches_reference(run, model, arch, config, requests)


PREEMPTING = [("cb", "depth", "ouro"), ("refill", "depth", "huginn")]  # the default run; the rest is slow


@pytest.mark.parametrize(("policy", "layout", "style"), [
    pytest.param(p, layout, style, marks=() if (p, layout, style) in PREEMPTING else pytest.mark.slow)
    for p, layout in [("cb", "depth"), ("norefill", "shared"), ("refill", "depth"), ("refill", "first-shared")]
    for style in STYLES])
def test_preemption_recompute_matches_reference(style: str, policy: str, layout: str) -> None:
    """Five KV blocks for four growing requests: decode tokens stall, requests are preempted and re-prefilled
    (prompt + generated tokens at full depth), and the reference replays the same recomputes (23-52 s of
    CPU each: two run by default, the other six under ``slow``)."""
    import numpy as np

    from traces.request import Request

    arch = tiny_arch(style)
    model = tiny_model(arch)
    rng = np.random.default_rng(0)
    requests = [Request(i, 13 + i, 30, 0.0, rng.integers(1, 5, size=29).astype(np.int16)) for i in range(4)]
    config = ServeConfig(policy=policy, width=4, coda_batch=1, prefill_budget=64, timing="sync", layout=layout)
    run = execute(arch, config, requests, kv_blocks=5, model=model, keep_logits=True)
    assert run.scheduler.preemptions > 0
    assert any(len(e) > 1 for e in run.episodes)
    assert_matches_reference(run, model, arch, config, requests)


def test_resplit_with_prelude_and_coda_ouro() -> None:
    """An Ouro-style model re-split 1-2-1 (prelude and coda layers with their own KV) still matches."""
    arch = tiny_arch("ouro").with_split("1-2-1")
    model = tiny_model(arch)
    requests = tiny_requests(seed=5)
    config = ServeConfig(policy="refill", width=4, coda_batch=2, prefill_budget=32, timing="sync", layout="depth")
    run = execute(arch, config, requests, kv_blocks=64, model=model, keep_logits=True)
    assert_matches_reference(run, model, arch, config, requests)


@pytest.mark.parametrize(("policy", "layout", "style"), half_slow([
    (p, layout, style) for p, layout in [("cb", "shared"), ("refill", "depth"), ("norefill", "first-shared")]
    for style in STYLES]))
def test_graph_static_buffers_match_reference(style: str, policy: str, layout: str) -> None:
    """The CUDA-graph path's static metadata (full-width block tables, padded rows, static fill loop),
    re-run eagerly on CPU, generates the reference's tokens."""
    arch = tiny_arch(style)
    model = tiny_model(arch)
    requests = tiny_requests(seed=9)
    config = ServeConfig(policy=policy, width=4, coda_batch=2, prefill_budget=32, timing="lookahead", layout=layout)
    run = execute(arch, config, requests, kv_blocks=64, model=model, keep_logits=True, graphs=True)
    assert run.log.meta["launch_path"] == "static-buffers"
    assert_matches_reference(run, model, arch, config, requests)


@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_fused_small_batch_layers_equal_the_plain_ones(style: str) -> None:
    """The fused skinny-matmul composition (norms, residuals and SwiGLU folded into the projections) is
    the same layer: with it on for every batch, tokens are equal and logits agree to 1e-5."""
    from executor.ops import Ops

    arch = tiny_arch(style)
    config = ServeConfig(policy="refill", width=4, coda_batch=2, prefill_budget=32, timing="sync", layout="depth")
    runs, calls = [], []
    for fuse_rows in (0, 64):
        model = tiny_model(arch)
        model.ops = ops = Ops("torch", fuse_rows=fuse_rows)
        residual = ops.gemv_residual
        ops.gemv_residual = lambda *a, residual=residual, tag=fuse_rows, **kw: calls.append(tag) or residual(*a, **kw)
        runs.append(execute(arch, config, tiny_requests(), kv_blocks=64, model=model, keep_logits=True))
    assert calls and set(calls) == {64}  # only the fused model takes the fused path
    plain, fused = runs
    assert all((a == b).all() for a, b in zip(plain.tokens, fused.tokens, strict=True))
    assert plain.logits.keys() == fused.logits.keys()
    worst = max(float((plain.logits[k] - fused.logits[k]).abs().max()) for k in plain.logits)
    assert worst < 1e-5


@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_fused_attention_on_multi_row_launches_matches_reference(style: str) -> None:
    """Every decode launch's RoPE, KV write and attention composed as the one-kernel path composes them
    (``Ops.fused_attention_rows`` past the width; a benchmark compares it with the three-kernel path)."""
    arch = tiny_arch(style)
    model = tiny_model(arch)
    model.ops.fused_attention_rows = 64
    requests = tiny_requests(seed=7)
    config = ServeConfig(policy="refill", width=4, coda_batch=2, prefill_budget=32, timing="sync", layout="depth")
    run = execute(arch, config, requests, kv_blocks=64, model=model, keep_logits=True)
    assert run.log.launches["size"].max() > 1  # multi-row decode launches took the fused path
    assert_matches_reference(run, model, arch, config, requests)


@pytest.mark.parametrize("style", STYLES)
def test_heads_sized_apart_from_hidden_match_reference(style: str) -> None:
    """Attention wider than the model (4 heads of 32 on a 64-wide layer, one KV head), as Gemma sizes its heads."""
    from dataclasses import replace

    tiny = tiny_arch(style)
    arch = replace(tiny, layer=replace(tiny.layer, head_dim=32, kv_heads=1))
    model = tiny_model(arch)
    requests = tiny_requests(seed=5)
    config = ServeConfig(policy="refill", width=4, coda_batch=1, prefill_budget=32, timing="sync", layout="depth")
    run = execute(arch, config, requests, kv_blocks=64, model=model, keep_logits=True)
    assert_matches_reference(run, model, arch, config, requests)
