"""Decode attention at few rows and long contexts: how the KV splits are merged, how many there are, and
how the cache's pages are laid out.

Why: at 1-32 rows a decode step is far above its weights + KV roofline (docs/executor.md), and at 2 rows
an Ouro-1.4B core step spends ~9 us per layer in attention that reads 0.35 MB of KV. Three suspects, each
measured here on one GPU in one run:

(a) ``attention``  the attention of one layer alone, as a step runs it (RoPE + KV write, attention, merge;
                   or the fused single-row kernel), at B = 1 ... 64 and L = 512 and 4,096 for Ouro's and
                   Huginn's head shapes: the splits merged one at a time (one memory round trip each, the
                   previous build) or in blocks, and the split count capped at 16 (the previous rule) or more;
(b) ``layout``     token-major pages (``[page, 16, kv_heads, D]``, the cache as built) against head-major ones
                   (``[page, kv_heads, 16, D]``: a page's positions of one head contiguous), at B = 64,
                   L = 4,096, over the many-row kernel's tile and warps. Head-major pages are emulated with the
                   production kernel: every (row, head) becomes a row of one head with its own pages, which
                   keeps the program count and the split rule;
(c) ``stages``     every stage of both models at B = 1 ... 64, L = 512 and 4,096 under each candidate build
                   (merge and split cap), against the weights + KV roofline.

    python benchmarks/probe_few_rows.py --out DIR      (an H200: about four minutes)

Writes ``attention.csv``, ``layout.csv``, ``stages.csv`` and ``results.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import cdbsim.attention as attention_rules  # noqa: E402
from benchmarks import bench_executor as bench  # noqa: E402
from cdbsim.arch import PRESETS  # noqa: E402
from cdbsim.kvlayout import KVLayout  # noqa: E402
from executor.driver import build_model  # noqa: E402
from executor.kv_cache import CacheGeometry, PagedKVCache  # noqa: E402
from executor.ops import RopeTable  # noqa: E402

SHAPES = {"ouro-16x128": (16, 128), "huginn-55x96": (55, 96)}
BUILDS = {  # name -> (split cap, splits per merge block)
    "previous": (16, 1),
    "block-merge": (16, 16),
    "block-merge-cap32": (32, 16),
    "block-merge-cap64": (64, 16),
}


def _cache(heads: int, d: int, batch: int, length: int, head_major: bool):
    """A filled one-layer cache and its block table: token-major with ``heads`` KV heads, or head-major as one
    KV head per (row, head) with pages of its own."""
    pages = length // 16
    perm = torch.randperm(batch * pages, device=bench.DEVICE).view(batch, pages)
    if head_major:
        table = (perm[:, None, :] * heads + torch.arange(heads, device=bench.DEVICE)[None, :, None])
        table = table.reshape(batch * heads, pages).int()
        geo = CacheGeometry(0, 1, 0, 1, KVLayout.SHARED, num_blocks=batch * pages * heads)
        cache = PagedKVCache(geo, 1, d, device=bench.DEVICE, dtype=bench.DTYPE)
    else:
        table = perm.int()
        geo = CacheGeometry(0, 1, 0, 1, KVLayout.SHARED, num_blocks=batch * pages)
        cache = PagedKVCache(geo, heads, d, device=bench.DEVICE, dtype=bench.DTYPE)
    cache.k.normal_()
    cache.v.normal_()
    return cache, table


def _time(fn, iters: int, repeats: int) -> float:
    return bench.time_fn(bench.graphed(fn), iters, repeats)


def attention_rows(name: str, heads: int, d: int, batch: int, length: int, bandwidth: float, iters: int,
                   repeats: int) -> list[dict]:
    """(a): one layer's attention as a step runs it, per build."""
    from executor import triton_kernels as tk

    cache, table = _cache(heads, d, batch, length, head_major=False)
    seq = torch.full((batch,), length, device=bench.DEVICE, dtype=torch.int32)
    base = torch.zeros(batch, device=bench.DEVICE, dtype=torch.int32)
    qkv = torch.randn(batch, 3 * heads * d, device=bench.DEVICE, dtype=bench.DTYPE)
    rope = RopeTable.build(d, 1e6, length, False, bench.DEVICE)
    pos = seq - 1
    row0 = (table.long()[:, -1] * 16 + (length - 1) % 16).int()
    fill = torch.zeros_like(seq)
    scale = d ** -0.5
    kv_bytes = batch * length * heads * d * 2 * cache.k.element_size()
    rows = []
    for build, (cap, merge) in BUILDS.items():
        splits = max(1, min(cap, attention_rules.TARGET_PROGRAMS // (batch * heads)))
        kernels = {
            "rope+attn": lambda splits=splits, merge=merge: tk.decode_attention(
                tk.rope_write_kv(qkv, None, None, pos, rope, cache, row0, base, 0, fill, 0), cache, table, base,
                0, seq, scale, splits=splits, merge=merge),
            "fused": lambda splits=splits, merge=merge: tk.rope_decode_attention(
                qkv, None, None, pos, rope, cache, row0, base, 0, fill, 0, table, seq, scale, splits=splits,
                merge=merge),
        }
        for kernel, fn in kernels.items():
            ms = _time(fn, iters, repeats)
            rows.append({"shape": name, "batch": batch, "length": length, "build": build, "cap": cap,
                         "merge": merge, "splits": splits, "kernel": kernel, "us": ms * 1e3,
                         "kv_bytes": kv_bytes, "of_copy_bw": kv_bytes / (ms / 1e3) / bandwidth})
    return rows


def layout_rows(name: str, heads: int, d: int, batch: int, length: int, bandwidth: float, iters: int,
                repeats: int) -> list[dict]:
    """(b): the many-row kernel over token-major and (emulated) head-major pages."""
    from executor import triton_kernels as tk

    splits = attention_rules.decode_splits(batch, heads)
    scale = d ** -0.5
    kv_bytes = batch * length * heads * d * 2 * 2
    rows = []
    for head_major in (False, True):
        cache, table = _cache(heads, d, batch, length, head_major)
        n, h = (batch * heads, 1) if head_major else (batch, heads)
        q = torch.randn(n, h, d, device=bench.DEVICE, dtype=bench.DTYPE)
        seq = torch.full((n,), length, device=bench.DEVICE, dtype=torch.int32)
        base = torch.zeros(n, device=bench.DEVICE, dtype=torch.int32)
        for block, warps in ((32, 2), (16, 1), (32, 1), (64, 4), (64, 2)):
            ms = _time(lambda q=q, cache=cache, table=table, base=base, seq=seq, block=block, warps=warps:
                       tk.decode_attention(q, cache, table, base, 0, seq, scale, splits=splits, block=block,
                                           warps=warps), iters, repeats)
            rows.append({"shape": name, "batch": batch, "length": length,
                         "pages": "head-major" if head_major else "token-major", "block": block, "warps": warps,
                         "splits": splits, "us": ms * 1e3, "of_copy_bw": kv_bytes / (ms / 1e3) / bandwidth})
        bench.empty_cache()
    return rows


def stage_rows(model_name: str, sizes: list[int], contexts: list[int], bandwidth: float, iters: int,
               repeats: int) -> list[dict]:
    """(c): every stage per build (the split cap and the merge block set as the build would)."""
    from executor import triton_kernels as tk

    arch = bench.tiny_preset(model_name) if bench.DEVICE.type == "cpu" else PRESETS[model_name]
    model = build_model(arch, device=bench.DEVICE, dtype=bench.DTYPE, seed=0)
    saved = attention_rules.MAX_SPLITS, tk.MERGE_CHUNK
    rows = []
    try:
        for build, (cap, merge) in BUILDS.items():
            attention_rules.MAX_SPLITS, tk.MERGE_CHUNK = cap, merge
            for context in contexts:
                fits = [b for b in sizes if b * context <= bench.MAX_KV_TOKENS]
                for row in bench.stage_latency(arch, model, fits, context, [], bandwidth, iters, repeats):
                    rows.append({"build": build, **row})
                bench.empty_cache()
    finally:
        attention_rules.MAX_SPLITS, tk.MERGE_CHUNK = saved
    del model
    bench.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--parts", nargs="+", default=["attention", "layout", "stages"],
                        choices=["attention", "layout", "stages"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--models", nargs="+", default=["ouro-1.4b", "huginn-3.5b"], choices=list(bench.MODELS))
    parser.add_argument("--smoke", action="store_true",
                        help="check the script itself on the CPU (TRITON_INTERPRET=1): tiny shapes, float32")
    args = parser.parse_args(argv)
    if args.smoke:
        bench.DEVICE, bench.DTYPE = torch.device("cpu"), torch.float32
        SHAPES.clear()
        SHAPES["smoke-2x24"] = (2, 24)
        args.sizes, args.contexts = [1, 2], [64]
        from tests.executor.triton_interpreter import patch_loop_bounds

        patch_loop_bounds()  # Triton's interpreter takes no tensor loop bounds
    elif not torch.cuda.is_available():
        print("probe_few_rows needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = bench.copy_bandwidth(0.01 if args.smoke else 2.0)
    bandwidth = bw["bandwidth_Bps"]
    device = torch.cuda.get_device_name() if bench.cuda() else "cpu"
    results: dict = {"meta": {"device": device, "torch": torch.__version__, "copy_bandwidth": bw, "builds": BUILDS},
                     "attention": [], "layout": [], "stages": []}
    iters, repeats = (1, 1) if args.smoke else (5, 5)

    def save() -> None:
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
        for part in ("attention", "layout", "stages"):
            bench.write_csv(out / f"{part}.csv", results[part])

    t0 = time.perf_counter()
    with torch.inference_mode():
        if "attention" in args.parts:
            for name, (heads, d) in SHAPES.items():
                for length in args.contexts:
                    for batch in args.sizes:
                        results["attention"].extend(attention_rows(name, heads, d, batch, length, bandwidth,
                                                                   iters, repeats))
                        bench.empty_cache()
            save()
            print(f"[attention] {time.perf_counter() - t0:.0f} s", flush=True)
        if "layout" in args.parts:
            for name, (heads, d) in SHAPES.items():
                batch, length = (2, 64) if args.smoke else (64, 4096)
                results["layout"].extend(layout_rows(name, heads, d, batch, length, bandwidth, iters, repeats))
            save()
            print(f"[layout] {time.perf_counter() - t0:.0f} s", flush=True)
    if "stages" in args.parts:
        for model_name in args.models:
            results["stages"].extend(stage_rows(model_name, args.sizes, args.contexts, bandwidth, iters, repeats))
            save()
            print(f"[stages {model_name}] {time.perf_counter() - t0:.0f} s", flush=True)
    summarize(results)
    return 0


def summarize(results: dict) -> None:
    """Short tables: attention us per build, layouts' bandwidth, core-step roofline ratios per build."""
    import pandas as pd

    if results["attention"]:
        a = pd.DataFrame(results["attention"])
        print(a.pivot_table(index=["shape", "kernel", "length", "batch"], columns="build", values="us")
              .round(1).to_string())
    if results["layout"]:
        lay = pd.DataFrame(results["layout"])
        print(lay.pivot_table(index=["shape", "block", "warps"], columns="pages", values="of_copy_bw")
              .round(3).to_string())
    if results["stages"]:
        s = pd.DataFrame(results["stages"])
        s = s[s.stage.isin(["core", "decode"])]
        print(s.pivot_table(index=["model", "stage", "context", "batch"], columns="build",
                            values="x_roofline_weights_kv").round(3).to_string())
        print(s.pivot_table(index=["model", "stage", "context", "batch"], columns="build", values="ms")
              .round(3).to_string())


if __name__ == "__main__":
    sys.exit(main())
