"""Checks shared by the tests of the CUDA C++ few-row kernels (:mod:`executor.few_rows_tma`,
:mod:`executor.few_rows_direct`): CPU tensors refused, ptxas's report of the source, the reference they are held to,
a PDL chain captured in a CUDA graph, a served run."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def assert_cpu_tensors_refused(kernel: ModuleType) -> None:
    """A kernel module names why it cannot take CPU tensors, and its ``linear`` raises with that reason."""
    x, w = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16)
    assert kernel.supports(x, w, False) == "bf16 CUDA tensors only"
    with pytest.raises(ValueError, match="bf16 CUDA tensors only"):
        kernel.linear(x, w)


def ptxas_report(source: Path, out_dir: Path) -> tuple[list[tuple[str, str]], list[int]]:
    """Compile ``source`` for sm_90a as the driver does and return ptxas's (spill stores, spill loads) and registers
    per kernel."""
    from executor.cuda_driver import nvcc

    done = subprocess.run([nvcc(), "-cubin", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-o",
                           str(out_dir / "k.cubin"), str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return (re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr),
            [int(r) for r in re.findall(r"Used (\d+) registers", done.stderr)])


def reference(x: torch.Tensor, w: torch.Tensor, swiglu: bool) -> torch.Tensor:
    """``F.linear`` in float32, rounded to ``x``'s dtype; with ``swiglu`` ``silu(gate) * up`` of its two halves."""
    out = torch.nn.functional.linear(x.float(), w.float()).to(x.dtype)
    if swiglu:
        gate, up = out.float().chunk(2, dim=-1)
        out = (torch.nn.functional.silu(gate) * up).to(x.dtype)
    return out


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    diff = (got.float() - want.float()).abs()
    assert bool((diff <= 2e-2 + 2e-2 * want.float().abs()).all()), float(diff.max())


def assert_pdl_chain_waits(linear: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> None:
    """Six calls of ``linear(x, w, trigger)``, each on the output of the one before, launched under PDL with both
    triggers, captured in a CUDA graph and replayed: every call must wait for its input."""
    from executor.chain import EARLY, LATE

    gen = torch.Generator(device="cuda").manual_seed(3)
    ws = [torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, generator=gen) * 2048**-0.5 for _ in range(6)]
    x = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16, generator=gen)
    want = x
    for w in ws:
        want = reference(want, w, False)
    for trigger in (EARLY, LATE):
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            graph.capture_begin()
            y = x
            for w in ws:
                y = linear(y, w, trigger)
            graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert_close(y, want)


def assert_served_run_completes() -> None:
    """A tiny Ouro model served with refill in CUDA graphs (the kernel chosen by ``CDBSIM_FEW_ROWS_KERNEL``, set by
    the caller): finite logits and every request's tokens."""
    from cdbsim.serving.config import ServeConfig
    from executor.driver import execute

    from .helpers import tiny_arch, tiny_model, tiny_requests

    arch = tiny_arch("ouro")
    model = tiny_model(arch, backend="triton", device="cuda", dtype=torch.bfloat16)
    model.ops.fuse_rows, model.ops.few_rows = 0, 16
    requests = tiny_requests(n=12, seed=11, max_prompt=60, max_output=20)
    config = ServeConfig(policy="refill", width=8, coda_batch=2, prefill_budget=64, timing="lookahead", layout="depth")
    run = execute(arch, config, requests, 128, model=model, mode="lookahead", keep_logits=True)
    assert run.log.meta["cuda_graphs"]
    assert all(torch.isfinite(v).all() for v in run.logits.values())
    assert [len(t) for t in run.tokens] == [r.output_len for r in requests]
