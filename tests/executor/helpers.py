"""Tiny models, requests and the executor-vs-reference comparison shared by the executor tests."""

from __future__ import annotations

import numpy as np
import torch

from cdbsim.model.arch import ArchSpec, LayerShape
from cdbsim.serving.config import Policy, ServeConfig
from executor.driver import ExecutorRun, build_model
from executor.model import LoopedLM
from executor.reference import ReferenceDecoder
from executor.tokens import prompt_ids
from traces.request import Request

# weight scales at which the tiny random models give varied tokens yet stay far from chaotic (so float
# rounding differences between batched and per-request math stay ~1e-6)
INIT_STD = {"ouro": 0.15, "huginn": 0.1}


def replayed(kernel, change) -> object:
    """``kernel``'s result replayed from a CUDA graph captured of it, after ``change()`` altered its inputs (so a
    result that does not follow them shows)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = kernel()
    change()
    graph.replay()
    torch.cuda.synchronize()
    return got


def tiny_arch(style: str, r_max: int = 4, kv_heads: int = 2) -> ArchSpec:
    """hidden 64, 4 heads of 16 (GQA 2 kv heads), Ouro 0-2-0 or Huginn 1-2-1, vocab 101."""
    layer = LayerShape(hidden=64, intermediate=96, heads=4, kv_heads=kv_heads, head_dim=16, style=style)
    huginn = style == "huginn"
    return ArchSpec(name=f"tiny-{style}", layer=layer, vocab=101, prelude=int(huginn), core=2, coda=int(huginn),
                    r_max=r_max, tied_head=huginn, rope_theta=10000.0 if huginn else 1e6)


def tiny_model(arch: ArchSpec, seed: int = 1, backend: str = "torch", device: str = "cpu",
               dtype: torch.dtype | None = torch.float32) -> LoopedLM:
    return build_model(arch, seed=seed, backend=backend, device=device, dtype=dtype,
                       init_std=INIT_STD[arch.style])


def tiny_requests(n: int = 6, seed: int = 0, r_max: int = 4, max_prompt: int = 40,
                  max_output: int = 10) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p, o = int(rng.integers(3, max_prompt)), int(rng.integers(1, max_output))
        out.append(Request(i, p, o, 0.0, rng.integers(1, r_max + 1, size=max(o - 1, 0)).astype(np.int16)))
    return out


def executed_depths(request: Request, arch: ArchSpec, config: ServeConfig) -> list[int]:
    """The depth each decoded token runs at: r_max under CB, else the trace's clamped to [r_min, r_max]."""
    if config.policy is Policy.CB:
        return [arch.r_max] * len(request.depths)
    r_min = config.r_min(arch)
    return [min(max(int(d), r_min), arch.r_max) for d in request.depths]


def assert_matches_reference(run: ExecutorRun, model: LoopedLM, arch: ArchSpec, config: ServeConfig,
                             requests: list[Request], atol: float = 1e-4, seed: int = 0) -> None:
    """Every request's tokens equal the reference decoder's, and every token's logits agree to ``atol``."""
    reference = ReferenceDecoder(model, config.layout)
    for i, r in enumerate(requests):
        prompt = prompt_ids(r.request_id, r.prompt_len, arch.vocab, seed)
        want = reference.generate(prompt, r.output_len, executed_depths(r, arch, config), run.episodes[i],
                                  request_id=r.request_id)
        assert run.tokens[i].tolist() == want.tokens, f"request {i}: tokens differ"
        for j in range(r.output_len):
            got = run.logits[(i, j)].to(want.logits.device)
            diff = float((got - want.logits[j].float()).abs().max())
            assert diff <= atol, f"request {i} token {j}: logits differ by {diff:.2e}"
