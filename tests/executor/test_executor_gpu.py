"""GPU checks: Triton kernels on CUDA, CUDA-graph launches, bf16 runs (skipped without CUDA)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_triton_ops_match_torch_on_cuda() -> None:
    from .kernel_checks import check_ops

    check_ops("cuda", torch.float32, atol=1e-4)
    check_ops("cuda", torch.bfloat16, atol=1e-1)  # one bf16 rounding apart at magnitudes up to ~8


def test_triton_norms_round_as_the_authors_code_in_bf16() -> None:
    from .kernel_checks import check_norm_rounding

    check_norm_rounding("cuda", hidden=2048)


@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_live_gates_run_inside_captured_graphs(tmp_path, style: str) -> None:
    """A recorded trace replayed in float32 with the live gates on: the captured graphs give the eager launches'
    comparison, and every first decoded token (whose context the recording saw) its recorded depth (unless a gate
    value lies within the prefill's tf32 rounding of q)."""
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from .test_executor_live_gates import replay_recorded

    captured = replay_recorded(tmp_path / "graphs", style, "refill", device="cuda")
    eager = replay_recorded(tmp_path / "eager", style, "refill", device="cuda", graphs=False)
    assert captured.meta["cuda_graphs"] and not eager.meta["cuda_graphs"]
    assert captured.live == eager.live
    assert captured.live.tokens == 12 and captured.live.agree == 12


def test_prefill_attention_matches_torch_on_cuda() -> None:
    from .kernel_checks import check_prefill_attention

    check_prefill_attention("cuda", torch.float32, atol=1e-3)  # tl.dot in tf32
    check_prefill_attention("cuda", torch.bfloat16, atol=2e-3)


def test_cuda_graph_executor_matches_reference_fp32() -> None:
    from .kernel_checks import check_end_to_end

    check_end_to_end("cuda", graphs=True, atol=1e-3)


@pytest.mark.parametrize("fuse_rows,few_rows", [(0, 0), (0, 16), (2, 16)], ids=["cublas", "few-rows", "chained"])
@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_bf16_lookahead_run_with_captured_graphs(style: str, fuse_rows: int, few_rows: int) -> None:
    from cdbsim.serving.config import ServeConfig
    from executor.driver import execute

    from .helpers import tiny_arch, tiny_model, tiny_requests

    arch = tiny_arch(style)
    model = tiny_model(arch, backend="triton", device="cuda", dtype=torch.bfloat16)
    model.ops.fuse_rows, model.ops.few_rows = fuse_rows, few_rows
    requests = tiny_requests(n=12, seed=11, max_prompt=60, max_output=20)
    config = ServeConfig(policy="refill", width=8, coda_batch=2, prefill_budget=64, timing="lookahead",
                         layout="depth")
    run = execute(arch, config, requests, 128, model=model, mode="lookahead", keep_logits=True)
    assert run.log.meta["cuda_graphs"] and run.log.meta["dtype"] == "bfloat16"
    assert all(torch.isfinite(v).all() for v in run.logits.values())
    assert [len(t) for t in run.tokens] == [r.output_len for r in requests]
    starts, ends = run.log.launches["start"].to_numpy(), run.log.launches["end"].to_numpy()
    assert (ends >= starts).all() and (np.diff(starts) >= 0).all()


def test_decode_attention_cuda_long_contexts() -> None:
    from cdbsim.model.arch import KVLayout
    from executor import ops as torch_ops
    from executor import triton_decode as tk
    from executor.kv_cache import CacheGeometry, PagedKVCache

    rows, heads, d = 16, 16, 128
    geo = CacheGeometry(0, 2, 0, 2, KVLayout.DEPTH, num_blocks=rows * 64)
    cache = PagedKVCache(geo, heads, d, device="cuda", dtype=torch.bfloat16)
    cache.k.normal_()
    cache.v.normal_()
    lengths = torch.randint(1, 1000, (rows,), device="cuda", dtype=torch.int32)
    table = torch.randperm(geo.num_blocks, device="cuda").view(rows, 64).int()
    base = torch.randint(0, 2, (rows,), device="cuda", dtype=torch.int32) * geo.core
    q = torch.randn(rows, heads, d, device="cuda", dtype=torch.bfloat16)
    want = torch_ops.decode_attention(q, cache, table, base, 1, lengths, 1 / math.sqrt(d))
    got = tk.decode_attention(q, cache, table, base, 1, lengths, 1 / math.sqrt(d))
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_calibration_timer_keeps_the_host_out_of_a_replay() -> None:
    """A call that spends 2 ms on the host before queuing 1 µs of device work: bracketed on an idle device
    the events count the host's 2 ms; queued behind the timer's spin kernel they count the device work."""
    import time

    from calibration.measure import Timer

    device = torch.device("cuda")
    x = torch.zeros(16, device=device)

    def slow_launch() -> None:
        time.sleep(2e-3)
        x.add_(1)

    assert Timer(device, 5, 1, spin_s=0.0)(slow_launch) > 1.5e-3
    assert Timer(device, 5, 1, spin_s=5e-3)(slow_launch) < 0.5e-3

