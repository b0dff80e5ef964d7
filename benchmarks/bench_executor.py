"""Benchmark the GPU executor: stage latencies, decode-attention bandwidth, offline serving throughput.

Parts (each bounded by ``--budget-s``):

(a) ``stages``     per-stage latency (prelude, core, coda, CB decode, prefill chunk) at several batch sizes
                   for each model, replayed as CUDA graphs, against the weight-read roofline (weight bytes
                   one pass reads / measured copy bandwidth) and the weight + KV roofline.
(b) ``attention``  the paged decode-attention kernel at B = 64, L = 4,096 and B = 1, L = 512
                   (``--attention-points`` for others): KV bytes read / time, against the copy bandwidth.
(c) ``throughput`` offline output-token throughput of CB, no-refill and refill on a small Alpaca trace
                   (``--workload`` for others) with synthetic exits (mean 2.5 for Ouro, 8 for Huginn) and
                   without exits, in lookahead mode (full runs add sync), with the device's idle share.
(d) ``checkpoint`` each model saved as a checkpoint in its authors' layout and opened as ``--checkpoint`` does;
                   ``cdbsim record`` on random prompts of Alpaca lengths (tokens per second), and the bf16
                   executor's logits against a float32 run of the same checkpoint (``checkpoint.csv``).
(e) ``layers``     one decode layer as served, kernel by kernel (``--layer-archs``, ``--layer-rows``, ``--contexts``):
                   a core step of eight layers replayed under the PyTorch profiler gives the layer's period and each
                   kernel's share of it, beside the layer a two-layer step adds to a one-layer step (how profiles
                   measure it) and the layer the GPU's kernel profile composes (``layers.csv``).

Random weights and KV contents (never zeros), CUDA graphs, CUDA events, warm-up replays, median of repeats;
the copy bandwidth (bytes read + written by a large device-to-device copy) is the ceiling every roofline uses.
Writes ``stages.csv``, ``attention.csv``, ``throughput.csv``, ``layers.csv`` and ``results.json`` (everything) to
``--out`` and prints a short table. Needs a CUDA GPU (``--smoke``: a tiny model on the CPU, to check the script).

Run time on an H200: the README's executor table (``bash benchmarks/gpu_session.sh bench``) about 4.5 min for
``--parts stages attention``, 2 min for ``--parts throughput --exits none --k 1 --requests 128``.

    python benchmarks/bench_executor.py --quick --out /tmp/bench
"""

# ruff: noqa: E402  (the imports follow the sys.path line that picks this checkout)
from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's packages, not an installed copy
    sys.path.insert(0, str(ROOT))

import numpy as np
import torch

from cdbsim.model.arch import PRESETS, ArchSpec, KVLayout, load_arch
from cdbsim.serving.blocks import need_blocks
from cdbsim.serving.config import Policy, ServeConfig
from cdbsim.serving.launch import Stage, decode_launch, prefill_launch
from executor.driver import Executor, build_model
from executor.engine import Engine
from executor.graphs import capture
from executor.kv_cache import CacheGeometry, PagedKVCache
from traces import ExitModel, build_trace
from traces.request import Request

DEVICE = torch.device("cuda")
DTYPE = torch.bfloat16
MAX_KV_TOKENS = 64 * 4096  # rows x context of the stage bench's cache (every layer's KV: ~50 GB for Ouro-1.4B)


def sync() -> None:
    if cuda():
        torch.cuda.synchronize()


def empty_cache() -> None:
    """Hand the memory of what the last part built (an engine's KV cache of up to ~50 GB, its captured graphs)
    back to the device before the next part builds its own: collected first, in case a cycle still holds it."""
    gc.collect()
    if cuda():
        torch.cuda.empty_cache()


MODELS = {"ouro-1.4b": {"mean_exit": 2.5, "layout": "depth", "k": lambda w: 1},
          "huginn-3.5b": {"mean_exit": 8.0, "layout": "shared", "k": lambda w: max(1, w // 4)}}


# ----- timing helpers --------------------------------------------------------------------------------
def cuda() -> bool:
    return torch.cuda.is_available() and DEVICE.type == "cuda"


def time_fn(fn, iters: int, repeats: int, warmup: int = 3) -> float:
    """Median over ``repeats`` of the mean time (ms) of ``iters`` back-to-back calls, by CUDA events
    (wall clock in a CPU smoke run)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if not cuda():
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / iters)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def graphed(fn):
    """Capture ``fn`` (warmed up on a side stream) as a CUDA graph; returns its replay (``fn`` on CPU)."""
    if not cuda():
        return fn
    return capture(fn)[0].replay


def copy_bandwidth(gib: float = 4.0) -> dict:
    """Bytes read + written per second by a large device-to-device copy (random data)."""
    n = int(gib * 2**30) // 2
    src = torch.randn(n, device=DEVICE, dtype=DTYPE)
    dst = torch.empty_like(src)
    ms = time_fn(lambda: dst.copy_(src), iters=5, repeats=7)
    return {"bytes_per_copy": 2 * n * 2, "ms": ms, "bandwidth_Bps": 2 * n * 2 / (ms / 1e3)}


# ----- (a) stage latency -----------------------------------------------------------------------------
def stage_latency(arch: ArchSpec, model, sizes: list[int], context: int, prefill_tokens: list[int],
                  bandwidth: float, iters: int, repeats: int, layout: KVLayout = KVLayout.SHARED) -> list[dict]:
    """Latency of each stage's CUDA graph with ``B`` rows attending ``context + 1`` positions each, on the KV
    ``layout`` (shared: one slot per layer)."""
    from executor.graphs import StageGraphs

    rows = max(sizes)
    prompt = max([context, *prefill_tokens])
    per_row = need_blocks(context + 1, 2)  # decode rows attend context + 1 positions
    prefill_blocks = need_blocks(max(prefill_tokens, default=1), 2)  # the prefill chunk (request 0) gets its own pages
    requests = [Request(i, prompt, 2) for i in range(rows)]
    config = ServeConfig(policy="refill", width=rows, prefill_budget=max([rows, *prefill_tokens]),
                         layout=layout, graph_sizes=tuple(sizes))
    engine = Engine(model, config, requests, rows * per_row + prefill_blocks)
    engine.fill_random()
    engine.admit(range(rows))
    blocks = [list(range(i * per_row, (i + 1) * per_row)) for i in range(rows)]
    graphs = StageGraphs(engine) if cuda() else None
    weights = arch.weight_bytes()
    stage_bytes = {Stage.PRELUDE: weights["prelude"], Stage.CORE: weights["core"], Stage.CODA: weights["coda"],
                   Stage.DECODE: weights["prelude"] + arch.r_max * weights["core"] + weights["coda"]}
    kv_slot = arch.layer.kv_bytes_per_slot
    layers_read = {Stage.PRELUDE: arch.prelude, Stage.CORE: arch.core, Stage.CODA: arch.coda,
                   Stage.DECODE: arch.prelude + arch.r_max * arch.core + arch.coda}
    out = []
    with torch.inference_mode():
        for stage in (Stage.PRELUDE, Stage.CORE, Stage.CODA, Stage.DECODE):
            for b in sizes:
                launch = decode_launch(stage, list(range(b)), [context] * b, blocks[:b], b)
                prepared = engine.prepare(launch, engine.max_blocks)
                if graphs is not None:
                    captured = graphs.get(stage, b)
                    captured.meta.copy_(torch.from_numpy(prepared.meta))
                    ms = time_fn(captured.graph.replay, iters, repeats)
                else:
                    ms = time_fn(lambda p=prepared: engine.run_eager(p), iters, repeats)
                kv = b * (context + 1) * layers_read[stage] * kv_slot
                out.append(_stage_row(arch, stage.value, b, context, ms, stage_bytes[stage], kv, bandwidth))
        chunk_blocks = [list(range(rows * per_row, rows * per_row + prefill_blocks))]
        for tokens in prefill_tokens:
            launch = prefill_launch([0], [0], [tokens], chunk_blocks, tokens)
            if graphs is not None:
                prepared = engine.prepare(launch, engine.max_blocks)
                captured = graphs.get(Stage.PREFILL, tokens)
                captured.meta.copy_(torch.from_numpy(prepared.meta))
                ms = time_fn(captured.replay, 1, repeats)
            else:
                prepared = engine.prepare(launch)
                ms = time_fn(lambda p=prepared: engine.run_eager(p), 1, repeats)
            full = stage_bytes[Stage.DECODE]
            kv = tokens * layers_read[Stage.DECODE] * kv_slot
            out.append(_stage_row(arch, "prefill", tokens, 0, ms, full, kv, bandwidth))
    return out


def _stage_row(arch: ArchSpec, stage: str, b: int, context: int, ms: float, weight_bytes: float,
               kv_bytes: float, bandwidth: float) -> dict:
    roof_w = weight_bytes / bandwidth * 1e3
    roof_wkv = (weight_bytes + kv_bytes) / bandwidth * 1e3
    return {"model": arch.name, "stage": stage, "batch": b, "context": context, "ms": ms,
            "weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "roofline_weights_ms": roof_w,
            "roofline_weights_kv_ms": roof_wkv, "x_roofline": ms / roof_w if roof_w > 0 else math.nan,
            "x_roofline_weights_kv": ms / roof_wkv if roof_wkv > 0 else math.nan}


# ----- (b) decode attention --------------------------------------------------------------------------
def attention_bandwidth(name: str, heads: int, kv_heads: int, head_dim: int, batch: int, length: int,
                        bandwidth: float, iters: int, repeats: int, with_torch: bool) -> list[dict]:
    """The shipped decode-attention kernel (``triton``; on a CPU run only the torch path) at ``batch`` rows of
    ``length`` positions: KV bytes read per second against ``bandwidth``."""
    from executor import ops as torch_ops
    from executor import triton_decode as tk

    blocks = batch * (length // 16)
    geo = CacheGeometry(0, 1, 0, 1, KVLayout.SHARED, num_blocks=blocks)
    cache = PagedKVCache(geo, kv_heads, head_dim, device=DEVICE, dtype=DTYPE)
    cache.k.normal_()
    cache.v.normal_()
    table = torch.randperm(blocks, device=DEVICE).view(batch, length // 16).int()
    seq = torch.full((batch,), length, device=DEVICE, dtype=torch.int32)
    base = torch.zeros(batch, device=DEVICE, dtype=torch.int32)
    q = torch.randn(batch, heads, head_dim, device=DEVICE, dtype=DTYPE)
    scale = head_dim ** -0.5
    kv_bytes = batch * length * kv_heads * head_dim * 2 * cache.k.element_size()
    impls = []
    if cuda():
        impls.append(("triton", lambda: tk.decode_attention(q, cache, table, base, 0, seq, scale)))
    if with_torch:
        impls.append(("torch-gather", lambda: torch_ops.decode_attention(q, cache, table, base, 0, seq, scale)))
    rows = []
    for impl, fn in impls:
        ms = time_fn(graphed(fn), iters, repeats)
        achieved = kv_bytes / (ms / 1e3)
        rows.append({"shape": name, "impl": impl, "batch": batch, "length": length, "heads": heads,
                     "splits": tk.decode_splits(batch, heads, head_dim), "kv_heads": kv_heads,
                     "head_dim": head_dim, "ms": ms, "kv_bytes": kv_bytes, "achieved_Bps": achieved,
                     "fraction_of_copy_bw": achieved / bandwidth})
    return rows


def _int_pair(text: str, form: str) -> tuple[int, int]:
    """``A:B`` as two integers (an argparse error naming ``form`` otherwise)."""
    try:
        first, second = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {form} (two integers), got {text!r}") from None
    return first, second


def attention_point(text: str) -> tuple[int, int]:
    """``B:L`` (rows, positions a row; ``L`` a multiple of the 16-position page) as an argparse type."""
    batch, length = _int_pair(text, "B:L")
    if batch < 1 or length < 16 or length % 16:
        raise argparse.ArgumentTypeError(f"B must be >= 1 and L a positive multiple of 16, got {text!r}")
    return batch, length


# ----- (c) throughput --------------------------------------------------------------------------------
def kv_blocks_for(arch: ArchSpec, layout: str, requests: list[Request], fraction: float = 0.5) -> int:
    """Enough blocks for every request at once, capped at ``fraction`` of free device memory."""
    need = sum(need_blocks(r.prompt_len, r.output_len) for r in requests)
    if not cuda():
        return need
    free, _ = torch.cuda.mem_get_info()
    per_block = arch.kv_bytes_per_token(layout) * 16
    return max(1, min(need, int(free * fraction // per_block)))


def throughput_runs(arch: ArchSpec, model, workload: str, n: int, width: int, budget_m: int,
                    max_len: int | None, policies: list[str], exits: list[str], layout: str, mean_exit: float,
                    k: int, modes: list[str], seed: int, rows: list[dict], on_row=lambda: None) -> list[dict]:
    """Append one row per (exits, policy, mode) run to ``rows``, calling ``on_row`` after each (to save)."""
    r_min = max(arch.r_min, 2)  # the lookahead gate's minimum depth; CB ignores depths anyway
    for exit_kind in exits:
        mean = min(mean_exit, arch.r_max - 0.5)
        exit_model = ExitModel("synthetic", mean=mean) if exit_kind == "synthetic" else ExitModel("none")
        requests = build_trace(workload, n, arch.r_max, r_min, exit_model, seed=seed, max_total_len=max_len)
        for policy in policies:
            for mode in modes:
                config = ServeConfig(policy=policy, width=width, coda_batch=k if policy == "refill" else 1,
                                     prefill_budget=budget_m, timing="lookahead", layout=layout)
                blocks = kv_blocks_for(arch, layout, requests)
                executor = Executor(arch, config, requests, blocks, model=model, mode=mode)
                executor.warmup()
                sync()
                run = executor.run()
                rows.append(_throughput_row(arch, config, workload, exit_kind, mode, run, requests))
                speedups_vs_cb(rows)
                on_row()
                del executor, run
                empty_cache()
    return rows


def speedups_vs_cb(rows: list[dict]) -> None:
    """Each row's throughput over CB's on the same model, requests and mode (NaN until CB has run)."""
    by_key = {(r["model"], r["exits"], r["mode"]): r["output_tok_s"] for r in rows if r["policy"] == "cb"}
    for r in rows:
        base = by_key.get((r["model"], r["exits"], r["mode"]))
        r["speedup_vs_cb"] = r["output_tok_s"] / base if base else math.nan


def _throughput_row(arch: ArchSpec, config: ServeConfig, workload: str, exit_kind: str, mode: str, run,
                    requests) -> dict:
    launches = run.log.launches
    span = float(launches["end"].max() - launches["start"].min())
    busy = float((launches["end"] - launches["start"]).sum())
    tokens = int(sum(r.output_len for r in requests))
    core = launches[launches["stage"] == "core"]
    decoded = sum(max(r.output_len - 1, 0) for r in requests)
    steps = int(core["items"].sum()) if config.policy is not Policy.CB else decoded * arch.r_max
    return {"model": arch.name, "workload": workload, "policy": config.policy.value, "K": config.coda_batch,
            "W": config.width, "layout": config.layout.value, "exits": exit_kind, "mode": mode,
            "requests": len(requests),
            "output_tokens": tokens, "span_s": span, "output_tok_s": tokens / span if span > 0 else math.nan,
            "device_idle_share": 1.0 - busy / span if span > 0 else math.nan,
            "mean_core_steps_per_decoded_token": steps / decoded if decoded else math.nan,
            "launches": len(launches), "preemptions": run.scheduler.preemptions,
            "mean_host_ms": float(launches["host_s"].mean() * 1e3)}


COMPARED_TOKENS = 16  # greedy tokens of each of 8 prompts the bf16 run and the float32 run both generate
PERTURBATION = 1e-5  # relative noise on a float32 run's embeddings, to set bf16's error beside the model's own gain


def checkpoint_runs(arch: ArchSpec, model, n: int, max_new: int, q: float, folder: Path, seed: int) -> list[dict]:
    """Save ``model`` as a checkpoint in its family's public layout, open it as ``--checkpoint`` does, record ``n``
    random prompts (Alpaca lengths) through it, and set its logits beside a float32 run of the same checkpoint."""
    import shutil

    from executor.loader import save_checkpoint
    from executor.record import Checkpoint, record
    from executor.reference import ReferenceDecoder

    t0 = time.perf_counter()
    save_checkpoint(model, arch, folder)
    saved_s, size = time.perf_counter() - t0, sum(f.stat().st_size for f in folder.iterdir())
    t0 = time.perf_counter()
    opened = Checkpoint.open(folder, device=DEVICE, dtype=DTYPE, r_max=arch.r_max)
    sync()
    opened_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(seed)
    lengths = [r.prompt_len for r in build_trace("alpaca", n, arch.r_max, 1, ExitModel("none"), seed=seed)]
    prompts = [torch.randint(0, arch.vocab, (length,), generator=gen).tolist() for length in lengths]
    t0 = time.perf_counter()
    recorded = record(opened, prompts, q, max_new_tokens=max_new)
    sync()
    recorded_s = time.perf_counter() - t0
    tokens = sum(len(o) for o in recorded.outputs)
    depths = np.concatenate([r.depths for r in recorded.requests if len(r.depths)])
    row = {"model": arch.name, "device": torch.cuda.get_device_name() if cuda() else "cpu",
           "checkpoint_gb": size / 1e9, "save_s": saved_s, "open_s": opened_s,
           "prompts": n, "max_new_tokens": max_new, "q": q, "output_tokens": tokens, "record_s": recorded_s,
           "record_tok_s": tokens / recorded_s, "mean_exit_depth": float(depths.mean()) if len(depths) else math.nan}
    # bf16 executor logits against a float32 run of the same checkpoint, on the first prompts at full depth
    few = [Request(i, len(p), COMPARED_TOKENS, 0.0) for i, p in enumerate(prompts[:8])]
    config = ServeConfig(policy="cb", width=8, prefill_budget=4096, timing="sync", layout=KVLayout.DEPTH)
    blocks = 2 * sum(need_blocks(r.prompt_len, r.output_len) for r in few)
    run = Executor(arch, config, few, blocks, model=opened.model, mode="sync", keep_logits=True,
                   prompts=prompts[:8]).run()
    del opened
    empty_cache()
    full = Checkpoint.open(folder, device=DEVICE, dtype=torch.float32, r_max=arch.r_max)
    reference = ReferenceDecoder(full.model, KVLayout.DEPTH)
    first_diff, first_rel, first_same, same_tokens, firsts = [], [], [], [], []
    for r, prompt in zip(few, prompts[:8], strict=True):
        want = reference.generate(prompt, r.output_len, [arch.r_max] * r.output_len)
        firsts.append(want.logits[0])
        got = run.logits[(r.request_id, 0)].float().to(want.logits.device)
        first_diff.append(float((got - want.logits[0]).abs().max()))
        first_rel.append(float((got - want.logits[0]).norm() / want.logits[0].norm()))
        first_same.append(int(got.argmax()) == want.tokens[0])
        ours = [int(t) for t in run.tokens[r.request_id]]
        pairs = enumerate(zip(ours, want.tokens, strict=False))
        same_tokens.append(next((j for j, (a, b) in pairs if a != b), len(ours)))
    # the same comparison for a float32 run whose embeddings are nudged by PERTURBATION (relative): how far the
    # model itself carries a tiny change through its loop (random weights need not contract as trained ones do)
    embed = full.model.embed
    noise = torch.Generator(device=embed.device).manual_seed(seed)
    embed.mul_(1 + PERTURBATION * torch.randn(embed.shape, generator=noise, device=embed.device))
    nudged = [float((reference.generate(p, 1, []).logits[0] - want).norm() / want.norm())
              for p, want in zip(prompts[:8], firsts, strict=True)]
    row |= {"dtype": str(DTYPE).replace("torch.", ""), "vs_fp32_first_logit_max_abs": max(first_diff),
            "vs_fp32_first_logit_rel_l2": statistics.median(first_rel),
            "vs_fp32_first_token_agree": sum(first_same) / len(first_same),
            "vs_fp32_greedy_tokens_before_divergence": statistics.median(same_tokens),
            "vs_fp32_compared_tokens": COMPARED_TOKENS, "perturbation": PERTURBATION,
            "fp32_perturbed_first_logit_rel_l2": statistics.median(nudged)}
    del full, reference
    shutil.rmtree(folder, ignore_errors=True)
    return [row]


# ----- driver ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kernel:
    """One kernel of a profiled replay: its name, start and duration (microseconds)."""

    name: str
    start: float
    duration: float


@dataclass(frozen=True)
class LayerTimes:
    """A steady layer: its period, and per kernel its share of the period (from the end of the kernel before it to
    its own end, so overlap is not counted twice; the shares add up to the period less the idle after the layer's
    last kernel), microseconds."""

    period: float
    shares: dict[str, float]


def layer_times(kernels: list[Kernel], layers: int, replays: int) -> LayerTimes:
    """The steady layer of ``replays`` replays of a ``layers``-layer step. The layer's first kernel is the first of
    those that run a multiple of ``layers`` times a replay; the layers from its second run to its last are the steady
    ones, every kernel in them counts (whatever else runs under its name) and the step's glue at either end stays out."""
    if not kernels or len(kernels) % replays:
        raise ValueError(f"{len(kernels)} kernels do not split into {replays} replays")
    kernels = sorted(kernels, key=lambda k: k.start)
    per_replay = len(kernels) // replays
    counts = Counter(k.name for k in kernels[:per_replay])
    own = {name for name, count in counts.items() if count % layers == 0}
    if layers < 3 or not own:
        raise ValueError(f"no kernel runs a multiple of {layers} times a replay (at least 3 layers are needed)")
    first = next(k.name for k in kernels[:per_replay] if k.name in own)
    periods, shares = [], Counter()
    for r in range(replays):
        replay = kernels[r * per_replay:(r + 1) * per_replay]
        starts = [k.start for k in replay if k.name == first]
        per_layer = len(starts) // layers
        begin, stop = starts[per_layer], starts[-per_layer]
        periods.append((stop - begin) / (layers - 2))
        end = begin
        for k in replay:
            if begin <= k.start < stop:
                shares[k.name] += max(0.0, k.start + k.duration - end)
                end = max(end, k.start + k.duration)
    return LayerTimes(statistics.median(periods), {n: t / (replays * (layers - 2)) for n, t in shares.items()})


def profiled_kernels(replay, replays: int) -> list[Kernel]:
    """The device kernels of ``replays`` calls of ``replay`` (a CUDA graph's), from the PyTorch profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        replay()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        sync()
    return [Kernel(e.name, e.time_range.start, e.time_range.end - e.time_range.start) for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]


def layer_arch(spec: str) -> ArchSpec:
    """A preset, an architecture file, or ``probeN``: the kernel profile's N-th probe layer shape."""
    if spec.startswith("probe") and spec[5:].isdigit():
        from calibration.fit import probe_arch
        from cdbsim.latency.kernels import PROBE_SHAPES

        return replace(probe_arch(PROBE_SHAPES[int(spec[5:])]), name=spec)
    return load_arch(spec)


LAYER_STEP = 8  # layers of the profiled core step
LAYER_REPLAYS = 20


def layer_rows(arch: ArchSpec, rows: list[int], contexts: list[int], profile: str) -> list[dict]:
    """``layers.csv`` rows of one shape: per rows and context, the served layer's period and kernel shares, the
    layer a two-layer step adds to a one-layer step, and the kernel profile's composition (its tables and layer)."""
    from calibration.measure import Timer, UnitBench
    from cdbsim.latency.kernels import KernelModel
    from cdbsim.latency.shipped import shipped_profiles

    model = KernelModel(shipped_profiles()[profile].kernels)
    longest = max(contexts)

    def bench(core: int) -> UnitBench:
        unit = ArchSpec(name=f"{arch.name}-c{core}", layer=arch.layer, vocab=4096, prelude=0, core=core, coda=0,
                        r_max=1)
        return UnitBench(unit, max(rows), longest + 1, max(rows) * (longest + 1) + 64, KVLayout.SHARED, DEVICE,
                         Timer(DEVICE, 7, 2))

    points = [(b, c) for c in contexts for b in rows]
    one, two = bench(1), bench(2)
    try:
        added = {(b, c): 1e6 * (two.stage(Stage.CORE, b, c) - one.stage(Stage.CORE, b, c)) for b, c in points}
    finally:
        one.close()
        two.close()
    step = bench(LAYER_STEP)
    out = []
    try:
        for b, c in points:
            served = layer_times(profiled_kernels(step.graph(Stage.CORE, b, c), LAYER_REPLAYS), LAYER_STEP,
                                 LAYER_REPLAYS)
            composed, path = model.layer_kernels(arch, b, float(c))
            key = {"shape": arch.name, "rows": b, "context": c, "path": path}
            out += [{**key, "what": "served layer", "name": "", "us": served.period},
                    {**key, "what": "two-layer less one-layer step", "name": "", "us": added[(b, c)]},
                    {**key, "what": "composed layer", "name": profile, "us": 1e6 * model.layer(arch, b, float(c))},
                    {**key, "what": "composed tables", "name": profile, "us": 1e6 * sum(t for _, t in composed)}]
            out += [{**key, "what": "served kernel", "name": name[:60], "us": t} for name, t in served.shares.items()]
            out += [{**key, "what": "composed kernel", "name": table, "us": 1e6 * t} for table, t in composed]
    finally:
        step.close()
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "runs/bench-executor")
    parser.add_argument("--quick", action="store_true", help="small sizes and traces (a few minutes)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--parts", nargs="+", default=["stages", "attention", "throughput"],
                        choices=["stages", "attention", "throughput", "checkpoint", "layers"])
    parser.add_argument("--workload", default="alpaca", choices=["alpaca", "sharegpt", "arxiv"],
                        help="length distribution of the throughput trace (ShareGPT prompts are long: slow)")
    parser.add_argument("--requests", type=int, help="requests per throughput run (64 quick, 256 full)")
    parser.add_argument("--max-len", type=int, help="truncate prompt + output to this many tokens")
    parser.add_argument("--width", type=int, default=64, help="W for the throughput runs")
    parser.add_argument("--sizes", type=int, nargs="+", help="batch sizes of the decode-type stages")
    parser.add_argument("--contexts", type=int, nargs="+", default=[512],
                        help="context lengths of the decode-type stages (sizes whose KV would exceed "
                             f"{MAX_KV_TOKENS:,} tokens are left out)")
    parser.add_argument("--prefill-tokens", type=int, nargs="+", help="prefill chunk sizes of the stage part")
    parser.add_argument("--k", type=int, help="refill's coda batch K (default: 1 for Ouro, W/4 for Huginn)")
    parser.add_argument("--exits", nargs="+", default=["synthetic", "none"], choices=["synthetic", "none"],
                        help="exit models of the throughput runs (none: every token at r_max)")
    parser.add_argument("--budget-s", type=float, help="skip parts that would start after this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attention-points", type=attention_point, nargs="+", default=[(64, 4096), (1, 512)],
                        metavar="B:L", help="attention part: batch and context of each point (default 64:4096 1:512)")
    parser.add_argument("--layer-archs", nargs="+", default=["ouro-1.4b", "huginn-3.5b"],
                        help="layers part: presets, architecture files or probeN (the N-th probe layer shape)")
    parser.add_argument("--layer-rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64],
                        help="layers part: padded rows of each layer")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script itself: tiny same-style models, float32, CPU unless CUDA is there")
    args = parser.parse_args(argv)
    global DEVICE, DTYPE
    if args.smoke:
        DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        DTYPE = torch.float32
    elif not torch.cuda.is_available():
        print("bench_executor needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    quick = args.quick or args.smoke
    budget = args.budget_s if args.budget_s is not None else (200.0 if quick else math.inf)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    device_name = torch.cuda.get_device_name() if cuda() else "cpu"
    results: dict = {"meta": {"device": device_name, "torch": torch.__version__, "cuda": torch.version.cuda,
                              "quick": quick, "smoke": args.smoke, "dtype": str(DTYPE).replace("torch.", "")},
                     "stages": [], "attention": [], "throughput": [], "checkpoint": [], "layers": [], "errors": [],
                     "skipped": []}

    def save() -> None:
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
        write_csv(out / "stages.csv", results["stages"])
        write_csv(out / "attention.csv", results["attention"])
        write_csv(out / "throughput.csv", results["throughput"])
        write_csv(out / "checkpoint.csv", results["checkpoint"])
        write_csv(out / "layers.csv", results["layers"])

    def part(name: str, fn) -> None:
        elapsed = time.perf_counter() - t_start
        if elapsed > budget:
            results["skipped"].append(f"{name} (at {elapsed:.0f} s, over the {budget:.0f} s budget)")
            return
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # one failing part must not lose the others' results
            results["errors"].append({"part": name, "error": repr(exc), "trace": traceback.format_exc()[-2000:]})
            print(f"[{name}] failed: {exc!r}", file=sys.stderr)
        print(f"[{name}] {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        empty_cache()
        save()

    bw = copy_bandwidth(0.05 if args.smoke else 2.0 if quick else 8.0)
    results["meta"]["copy_bandwidth"] = bw
    bandwidth = bw["bandwidth_Bps"]
    iters, repeats = (5, 5) if quick else (20, 7)

    if "attention" in args.parts:
        shapes = [("ouro-mha-16x128", 16, 16, 128), ("huginn-mha-55x96", 55, 55, 96)]
        sizes = [(4, 256)] if args.smoke else args.attention_points  # default: the bandwidth target; a B = 1 step's
        for name, h, kvh, d in shapes:
            for batch, length in sizes:
                part(f"attention {name} B={batch} L={length}",
                     lambda name=name, h=h, kvh=kvh, d=d, batch=batch, length=length: results["attention"].extend(
                         attention_bandwidth(name, h, kvh, d, batch, length, bandwidth, iters, repeats,
                                             with_torch=args.smoke or not quick)))

    if "layers" in args.parts and not cuda():
        results["skipped"].append("layers (the profiler reads CUDA kernels: it needs a GPU)")
    elif "layers" in args.parts:
        from cdbsim.latency.devices import device_tag

        profile = f"{device_tag(device_name)}-kernels"
        for spec in args.layer_archs:
            arch = layer_arch(spec)
            part(f"layers {arch.name}", lambda arch=arch: results["layers"].extend(
                layer_rows(arch, args.layer_rows, args.contexts, profile)))

    models = {}
    for name in args.models:  # stage latencies of every model first: the cheapest, most reused numbers
        arch = tiny_preset(name) if args.smoke else PRESETS[name]
        models[name] = (arch, build_model(arch, device=DEVICE, dtype=DTYPE, seed=args.seed))
        if "stages" in args.parts:
            sizes = args.sizes or ([1, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256])
            prefill = args.prefill_tokens or ([128 if args.smoke else 512] if quick else [256, 1024, 4096])
            arch, model = models[name]
            for i, context in enumerate([64] if args.smoke else args.contexts):
                fits = [b for b in sizes if b * context <= MAX_KV_TOKENS]  # the cache holds every layer's KV
                if fits != sizes:
                    print(f"stages {name} L={context}: B > {max(fits, default=0)} left out "
                          f"(over {MAX_KV_TOKENS:,} KV tokens)")
                part(f"stages {name} L={context}", lambda arch=arch, model=model, sizes=fits, context=context,
                     prefill=prefill if i == 0 else []: results["stages"].extend(stage_latency(
                         arch, model, sizes, context, prefill, bandwidth, iters, repeats)))
        if "checkpoint" in args.parts:
            arch, model = models[name]
            part(f"checkpoint {name}", lambda arch=arch, model=model, folder=out / f"checkpoint-{name}":
                 results["checkpoint"].extend(checkpoint_runs(
                     arch, model, args.requests or (4 if args.smoke else 64), 8 if args.smoke else 128,
                     0.2 if arch.style.value == "ouro" else 0.28, folder, args.seed)))
        if "throughput" not in args.parts:  # nothing reads the weights again: the next model gets the memory
            del models[name]
            model = None
            empty_cache()
    if "throughput" in args.parts:
        n = args.requests or (8 if args.smoke else 64 if quick else 256)
        max_len = args.max_len
        modes = ["lookahead"] if quick else ["lookahead", "sync"]
        for name, (arch, model) in models.items():
            spec = MODELS[name]
            part(f"throughput {name}", lambda arch=arch, model=model, spec=spec: throughput_runs(
                arch, model, args.workload, n, args.width, 2048 if quick else 8192, max_len,
                ["cb", "norefill", "refill"], args.exits, spec["layout"], spec["mean_exit"],
                args.k or spec["k"](args.width), modes, args.seed, results["throughput"], save))
    models.clear()
    empty_cache()

    results["meta"]["wall_s"] = time.perf_counter() - t_start
    save()
    print_table(results)
    return 0


def tiny_preset(name: str) -> ArchSpec:
    """A small model of the preset's style, split and loop count, for ``--smoke``."""
    from cdbsim.model.arch import LayerShape

    arch = PRESETS[name]
    layer = LayerShape(hidden=64, intermediate=128, heads=4, kv_heads=4, head_dim=16, style=arch.style)
    return replace(arch, name=f"{name}-smoke", layer=layer, vocab=128, core=min(arch.core, 2),
                   r_max=min(arch.r_max, 6))


def print_table(results: dict) -> None:
    bw = results["meta"]["copy_bandwidth"]["bandwidth_Bps"]
    print(f"\n{results['meta']['device']}  torch {results['meta']['torch']}  copy bandwidth {bw / 1e12:.2f} TB/s")
    if results["attention"]:
        print("decode attention: shape impl B L ms TB/s %copy")
        for r in results["attention"]:
            print(f"  {r['shape']:18s} {r['impl']:12s} {r['batch']:4d} {r['length']:5d} {r['ms']:8.3f} "
                  f"{r['achieved_Bps'] / 1e12:6.2f} {100 * r['fraction_of_copy_bw']:5.1f}%")
    if results["stages"]:
        print("stage latency: model stage B ms roofline_ms x_roofline")
        for r in results["stages"]:
            print(f"  {r['model']:12s} {r['stage']:8s} {r['batch']:5d} {r['ms']:8.3f} "
                  f"{r['roofline_weights_ms']:8.3f} {r['x_roofline']:6.2f}")
    if results["throughput"]:
        print("throughput: model exits policy mode tok/s speedup idle%")
        for r in results["throughput"]:
            print(f"  {r['model']:12s} {r['exits']:9s} {r['policy']:8s} {r['mode']:9s} {r['output_tok_s']:9.1f} "
                  f"{r['speedup_vs_cb']:5.2f} {100 * r['device_idle_share']:5.1f}")
    for e in results["errors"]:
        print(f"ERROR in {e['part']}: {e['error']}")
    for s in results["skipped"]:
        print(f"skipped: {s}")


if __name__ == "__main__":
    sys.exit(main())
