"""The packed prefill attention kernel swept over its launch shape, per head shape, against the matmul rate.

Prefill attention is a quarter to two fifths of a full-depth Ouro-1.4B prefill (profile_prefill.py); this
times the kernel alone on one causal chunk of ``T`` tokens (and a chunk after a cached prefix) for every
query tile (work-item height), key tile, warp count and pipeline depth, so the shipped launch shape
(:func:`executor.triton_kernels.prefill_tiles`, :data:`executor.prefill.BLOCK_M`) is a measured choice.

    python benchmarks/bench_prefill_attention.py --out DIR [--quick] [--reference]

Writes ``DIR/prefill-attention.csv`` (shape, tokens, prefix, tile, ms, TFLOP/s of the causal work) and prints
the best shapes per head layout next to the shipped one (``--summarize CSV`` prints it again from a saved
table, on any machine). ``--reference`` also times PyTorch's own attention kernels (``scaled_dot_product_attention``
under each backend: FlashAttention-2, cuDNN, memory-efficient) on the same causal cases with contiguous K/V and one
sequence, rows ``sdpa-BACKEND`` of ``prefill-attention-reference.csv``: the rate the best kernels this machine has
reach at these shapes, which bounds what a paged, packed Triton kernel can be expected to. Needs a CUDA GPU to
measure.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from cdbsim.kvlayout import KVLayout  # noqa: E402
from cdbsim.launch import causal_pairs  # noqa: E402
from executor import triton_kernels as tk  # noqa: E402
from executor.kv_cache import CacheGeometry, PagedKVCache  # noqa: E402
from executor.prefill import BLOCK_M, Chunk, PrefillLayout, pack, prefill_views, work_items  # noqa: E402

# (name, query heads, KV heads, head_dim): Ouro-1.4B/2.6B, Huginn-3.5B, a GQA head of 64 (unseen matrix)
HEADS = (("ouro", 16, 16, 128), ("huginn", 55, 55, 96), ("gqa-64", 32, 8, 64))


def causal_flops(tokens: int, prefix: int, heads: int, d: int) -> float:
    """Two matmuls of 2 flops per (query, visible key, column)."""
    pairs = causal_pairs(tokens, prefix)
    return 4 * pairs * heads * d


def setup(heads: int, kv_heads: int, d: int, tokens: int, prefix: int, device: str = "cuda",
          dtype: torch.dtype = torch.bfloat16):
    """A one-layer cache holding the chunk's prefix and its own K/V, the chunk's metadata and queries."""
    total = prefix + tokens
    pages = -(-total // 16)
    geo = CacheGeometry(1, 0, 0, 1, KVLayout.DEPTH, num_blocks=pages)
    cache = PagedKVCache(geo, kv_heads, d, device=device, dtype=dtype)
    cache.k.normal_()
    cache.v.normal_()
    blocks = np.random.default_rng(0).permutation(pages)
    layout = PrefillLayout(tokens, 1, pages)
    packed = pack(layout, [Chunk(prefix, tokens, blocks, 0, True)], 0, geo.trash_block, geo.block_size)
    meta = prefill_views(torch.from_numpy(packed).to(device), layout)
    q = torch.randn(tokens, heads, d, device=device, dtype=dtype)
    return cache, meta, q


def with_items(meta, tokens: int, prefix: int, block_m: int):
    """``meta`` with work items ``block_m`` queries high."""
    chunk, q0 = work_items([tokens], block_m, [prefix])
    device = meta.start.device
    return replace(meta, item_chunk=torch.from_numpy(chunk).to(device), item_q0=torch.from_numpy(q0).to(device))


def shipped(block_m: int, block_n: int, warps: int, stages: int, head_dim: int) -> bool:
    """Whether this launch shape is the one the executor uses for ``head_dim``."""
    t = tk.prefill_tiles(head_dim)
    return (block_m, block_n, warps, stages) == (BLOCK_M, t.block_n, t.warps, t.stages)


def summarize(table: pd.DataFrame) -> None:
    """Per head shape: the launch shapes of best geometric-mean rate over its cases, and the shipped one."""
    keys = ["block_m", "block_n", "warps", "stages"]
    for name, part in table.groupby("shape", sort=False):
        cases = part.pivot_table(index=keys, columns=["tokens", "prefix"], values="tflops")
        cases[("geomean", "")] = np.exp(np.log(cases).mean(axis=1))
        cases = cases.sort_values("geomean", ascending=False)
        mine = [i for i in cases.index if shipped(*i, int(part.head_dim.iloc[0]))]
        top = cases.head(3)
        rows = pd.concat([top, cases.loc[[i for i in mine if i not in top.index]]])
        rows.index = [f"{'*' if i in mine else ' '} {i[0]}x{i[1]} w{i[2]} s{i[3]}" for i in rows.index]
        print(f"\n{name} (d={int(part.head_dim.iloc[0])}), TFLOP/s by (tokens, prefix); * = shipped")
        print(rows.round(0).to_string())


def reference_rows(name: str, heads: int, kv_heads: int, d: int, tokens: int, prefix: int) -> list[dict]:
    """``scaled_dot_product_attention`` on the case, one row per backend that runs it: queries at positions
    ``prefix .. prefix + tokens`` see keys up to their own (causal, aligned to the lower right)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, heads, tokens, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(1, kv_heads, prefix + tokens, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    gqa = heads != kv_heads
    flops = causal_flops(tokens, prefix, heads, d)
    rows = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        if prefix:  # lower-right alignment: the bias object picks the kernels that take it
            call = functools.partial(F.scaled_dot_product_attention, q, k, v,
                                     attn_mask=causal_lower_right(tokens, prefix + tokens), enable_gqa=gqa)
        else:
            call = functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True, enable_gqa=gqa)
        try:
            with sdpa_kernel(backend):
                ms = triton.testing.do_bench(call, warmup=10, rep=40)
        except Exception as exc:  # a backend that does not take the case: recorded, the others go on
            print(f"{name} T={tokens} prefix={prefix} sdpa {backend.name}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0][:120]}", flush=True)
            continue
        impl = "sdpa-" + backend.name.lower().removesuffix("_attention")
        rows.append(dict(shape=name, heads=heads, kv_heads=kv_heads, head_dim=d, tokens=tokens, prefix=prefix,
                         impl=impl, ms=ms, tflops=flops / ms / 1e9))
        print(f"{name:7s} T={tokens} prefix={prefix}: {impl} {rows[-1]['tflops']:.0f} TFLOP/s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--prefix", type=int, default=2048, help="cached positions before the second chunk")
    parser.add_argument("--quick", action="store_true", help="fewer launch shapes")
    parser.add_argument("--reference", action="store_true",
                        help="also time PyTorch's attention kernels on the same cases (contiguous K/V)")
    parser.add_argument("--summarize", type=Path, metavar="CSV", help="print the summary of a saved table")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/prefill-attention"))
    args = parser.parse_args()
    if args.summarize:
        summarize(pd.read_csv(args.summarize))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    # stages beyond 3 compile to the same code as 3 for this kernel (kernel_registers.py)
    block_ms, block_ns, warps, stages = (64, 128), (32, 64, 128), (4, 8), (2, 3)
    if args.quick:
        block_ns, stages = (64, 128), (3,)
    rows, reference = [], []
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    for (name, heads, kvh, d), tokens, prefix in itertools.product(HEADS, args.tokens, (0, args.prefix)):
        cache, meta, q = setup(heads, kvh, d, tokens, prefix)
        flops = causal_flops(tokens, prefix, heads, d)
        for bm, bn, w, st in itertools.product(block_ms, block_ns, warps, stages):
            tiles = tk.PrefillTiles(bn, w, st)
            launch = functools.partial(tk.prefill_attention, q, cache, with_items(meta, tokens, prefix, bm), 0,
                                       1 / math.sqrt(d), tiles, bm)
            try:
                ms = triton.testing.do_bench(launch, warmup=10, rep=40)
            except Exception as exc:  # a shape that does not fit shared memory: recorded, not fatal
                print(f"{name} T={tokens} prefix={prefix} {bm}x{bn} w{w} s{st}: {type(exc).__name__}", flush=True)
                continue
            rows.append(dict(shape=name, heads=heads, kv_heads=kvh, head_dim=d, tokens=tokens, prefix=prefix,
                             block_m=bm, block_n=bn, warps=w, stages=st, ms=ms, tflops=flops / ms / 1e9))
        best = max((r for r in rows if r["shape"] == name and r["tokens"] == tokens and r["prefix"] == prefix),
                   key=lambda r: r["tflops"])
        print(f"{name:7s} T={tokens} prefix={prefix}: best {best['block_m']}x{best['block_n']} w{best['warps']} "
              f"s{best['stages']} {best['tflops']:.0f} TFLOP/s", flush=True)
        table = pd.DataFrame(rows)  # rewritten per case, so a run cut short keeps what it measured
        table.to_csv(args.out / "prefill-attention.csv", index=False)
        if args.reference:
            reference += reference_rows(name, heads, kvh, d, tokens, prefix)
            pd.DataFrame(reference).to_csv(args.out / "prefill-attention-reference.csv", index=False)
    summarize(table)


if __name__ == "__main__":
    main()
