"""Triton kernels against the torch backend, op by op and end to end; shared by the CPU-interpreter test
(run as ``TRITON_INTERPRET=1 python -m tests.executor.kernel_checks [CHECK ...]``) and the GPU tests.

Triton's interpreter runs every program of a grid one after another in Python (20-50 ms each), so under
it the checks use the smallest shapes that still take every path of every kernel (:data:`PATHS`): the
automatic split count of decode attention is capped at :data:`INTERPRETER_SPLITS` (the production rule
gives 16 splits to these tiny launches, most of them empty) and the end-to-end runs serve short prompts
through an 8-token prefill budget.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
from collections.abc import Iterator
from dataclasses import replace

import torch

import cdbsim.latency.gpu_work
from cdbsim.model.arch import KVLayout
from cdbsim.serving.config import ServeConfig
from executor import ops as torch_ops
from executor.driver import execute
from executor.kv_cache import CacheGeometry, PagedKVCache
from executor.ops import RopeTable

from .helpers import assert_matches_reference, tiny_arch, tiny_model, tiny_requests
from .triton_interpreter import patch_loop_bounds

patch_loop_bounds()

PATHS = """
rms_norm, residual_norm  hidden 64 and 96 (masked block); residual_norm sandwich x with/without next norm;
                         bf16 rounding as the torch backend's (also through the chained matmul's prologues)
silu_mul                 an intermediate size spanning several blocks
rope_write_kv            rotate-half and interleaved RoPE x with/without q/k bias; GQA; last-exited fill
                         of 0-2 deeper slots; rows at and across page boundaries (positions 0, 15, 16, 40, 47)
decode_attention         1 split (direct store); 2 and 4 splits with the merge kernel; splits past a row's
                         context (empty: -inf weight); 128-position splits; the automatic split count;
                         a head in two parts (24 = 16 + 8, 96 = 64 + 32) and in one padded part; tiles of
                         16-64 positions
rope_decode_attention    the same split counts with the in-kernel merge (counters back to zero), own k/v
                         from registers (peeled first tile), fill writes, writing to the trash block
prefill_attention        a cached prefix, a chunk spanning two work items, a one-token chunk, padding items;
                         a head in one padded part (24) and two (48 = 32 + 16); unmasked tiles below the
                         diagonal and several masked ones (16 x 16 tiles)
end to end               Ouro refill K=2 depth-KV and Huginn no-refill first-shared KV through CUDA graphs
                         (static buffers) with chunked prefill; Ouro and Huginn refill at width 1 on the
                         chained skinny-matmul path (:mod:`executor.chain`)
"""
INTERPRETER_SPLITS = 3  # automatic split count under the interpreter (also a count that is no power of two)


@contextlib.contextmanager
def split_cap(cap: int | None) -> Iterator[None]:
    """Cap the automatic split count of decode attention (``cdbsim.latency.gpu_work.MAX_SPLITS``) while inside."""
    saved = cdbsim.latency.gpu_work.MAX_SPLITS
    cdbsim.latency.gpu_work.MAX_SPLITS = cap or saved
    try:
        yield
    finally:
        cdbsim.latency.gpu_work.MAX_SPLITS = saved


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, what: str) -> None:
    diff = float((got.float() - want.float()).abs().max()) if got.numel() else 0.0
    if not diff <= atol:
        raise AssertionError(f"{what}: max difference {diff:.3e} > {atol:.1e}")


def check_ops(device: str = "cpu", dtype: torch.dtype = torch.float32, atol: float = 1e-5) -> None:
    from executor import triton_decode as dec
    from executor import triton_pointwise as pw

    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    for hidden in (64, 96):
        x, a, w1, w2 = randn(5, hidden), randn(5, hidden), randn(hidden), randn(hidden)
        _close(pw.rms_norm(x, w1, 1e-6), torch_ops.rms_norm(x, w1, 1e-6), atol, "rms_norm")
        for sandwich in (True, False):
            for w_next in (w2, None):
                got = pw.residual_norm(a, x, w1, w_next, 1e-6, sandwich)
                want = torch_ops.residual_norm(a, x, w1, w_next, 1e-6, sandwich)
                _close(got[0], want[0], atol, f"residual_norm x sandwich={sandwich}")
                if w_next is not None:
                    _close(got[1], want[1], atol, f"residual_norm h sandwich={sandwich}")
    gu = randn(3, 2 * 1100)
    _close(pw.silu_mul(gu), torch_ops.silu_mul(gu), atol, "silu_mul")

    heads, kv_heads, d = 4, 2, 24  # head_dim 24: not a power of two, as Huginn's 96
    geo = CacheGeometry(1, 2, 1, 3, KVLayout.DEPTH, num_blocks=12)
    caches = []
    for _ in range(2):
        cache = PagedKVCache(geo, kv_heads, d, device=device, dtype=dtype)
        cache.k.copy_(randn(*cache.k.shape))
        cache.v.copy_(randn(*cache.v.shape))
        caches.append(cache)
    caches[1].k.copy_(caches[0].k)
    caches[1].v.copy_(caches[0].v)
    rows = 5
    pos = torch.tensor([0, 15, 16, 40, 47], dtype=torch.int32, device=device)
    perm = torch.randperm(geo.num_blocks, generator=torch.Generator().manual_seed(1)).tolist()
    width = 3
    table = torch.full((rows, width), geo.trash_block, dtype=torch.int32)
    for i, p in enumerate(pos.tolist()):
        used = p // 16 + 1
        table[i, :used] = torch.tensor(perm[i: i + used])
    table = table.to(device)
    row0 = (table.long().gather(1, (pos.long() // 16)[:, None])[:, 0] * 16 + pos.long() % 16).int()
    slots = torch.tensor([0, 2, 1, 0, 1], dtype=torch.int32, device=device)
    layer_base = (slots * geo.core).int()
    fill = torch.tensor([2, 0, 1, 0, 0], dtype=torch.int32, device=device)
    seq_len = (pos + 1).int()
    for interleaved in (False, True):
        rope = RopeTable.build(d, 1e4, 64, interleaved, device)
        for bias in (False, True):
            qkv = randn(rows, (heads + 2 * kv_heads) * d)
            qb, kb = (randn(heads * d), randn(kv_heads * d)) if bias else (None, None)
            # two rows per program on the interleaved pass: three programs, the last one half past the rows
            q1 = pw.rope_write_kv(qkv, qb, kb, pos, rope, caches[0], row0, layer_base, 1, fill, 2,
                                  block_rows=2 if interleaved else None)
            q2 = torch_ops.rope_write_kv(qkv, qb, kb, pos, rope, caches[1], row0, layer_base, 1, fill, 2)
            _close(q1, q2, atol, f"rope q interleaved={interleaved}")
            # trash rows hold whatever padded rows wrote last; compare every other row
            keep = torch.ones(caches[0].k_rows.shape[0], dtype=torch.bool, device=device)
            keep[geo.trash_row] = False
            _close(caches[0].k_rows[keep], caches[1].k_rows[keep], atol, "rope k cache")
            _close(caches[0].v_rows[keep], caches[1].v_rows[keep], atol, "rope v cache")
    q = randn(rows, heads, d)
    want = torch_ops.decode_attention(q, caches[1], table, layer_base, 1, seq_len, 1 / math.sqrt(d))
    # min_split 16 splits these short rows over up to 3 pages, leaving some splits past a row's context
    # head_dim 24 loads in two parts (16 + 8, as 96 = 64 + 32); (32, 0) is one padded part, as 128
    for splits, min_split, parts, block in ((1, 16, None, 32), (2, 16, None, 16), (4, 16, None, 32),
                                            (4, 128, None, 32), (None, 16, None, 32), (2, 16, (32, 0), 64),
                                            (1, 16, (32, 0), 32)):
        got = dec.decode_attention(q, caches[0], table, layer_base, 1, seq_len, 1 / math.sqrt(d), splits=splits,
                                  min_split=min_split, parts=parts, block=block)
        _close(got, want, atol * 10, f"decode_attention splits={splits} min_split={min_split} parts={parts}")
        _counters_back_to_zero(dec, device)
    _check_wide_head_parts(dec, device, dtype, atol)
    # RoPE + KV write + attention in one kernel: the new k/v come from registers at each row's position
    # (the cache there holds noise until the launch writes it), so heads 1 and 3 (no writer of their
    # group) and splits past the first must still see them
    start_k, start_v = caches[0].k.clone(), caches[0].v.clone()
    for interleaved, bias, splits, min_split in ((False, False, None, 64), (True, True, 4, 16), (False, True, 2, 16),
                                                 (True, False, 1, 16)):
        rope = RopeTable.build(d, 1e4, 64, interleaved, device)
        qkv = randn(rows, (heads + 2 * kv_heads) * d)
        qb, kb = (randn(heads * d), randn(kv_heads * d)) if bias else (None, None)
        for cache in caches:
            cache.k.copy_(start_k)
            cache.v.copy_(start_v)
        got = dec.rope_decode_attention(qkv, qb, kb, pos, rope, caches[0], row0, layer_base, 1, fill, 2, table,
                                       seq_len, 1 / math.sqrt(d), splits=splits, min_split=min_split)
        want = torch_ops.rope_decode_attention(qkv, qb, kb, pos, rope, caches[1], row0, layer_base, 1, fill, 2,
                                               table, seq_len, 1 / math.sqrt(d))
        what = f"rope_decode_attention interleaved={interleaved} bias={bias} splits={splits}"
        _close(got, want, atol * 10, what)
        keep = torch.ones(caches[0].k_rows.shape[0], dtype=torch.bool, device=device)
        keep[geo.trash_row] = False
        _close(caches[0].k_rows[keep], caches[1].k_rows[keep], atol, what + " k cache")
        _close(caches[0].v_rows[keep], caches[1].v_rows[keep], atol, what + " v cache")
        # the same launch writing to the trash block instead: the cache keeps its noise at every row's own
        # position, so the output is right only if the new k/v are taken from registers
        trash = torch.full_like(row0, geo.trash_row)
        caches[0].k.copy_(start_k)
        caches[0].v.copy_(start_v)
        alone = dec.rope_decode_attention(qkv, qb, kb, pos, rope, caches[0], trash, layer_base, 1, fill * 0, 0,
                                         table, seq_len, 1 / math.sqrt(d), splits=splits, min_split=min_split)
        _close(alone, want, atol * 10, what + " (own k/v from registers)")
        _counters_back_to_zero(dec, device)


def _check_wide_head_parts(dec, device: str, dtype: torch.dtype, atol: float) -> None:
    """Heads in two parts, Huginn's 96 = 64 + 32 and 80 = 64 + 16, against the torch backend and against one padded
    128-lane part."""
    assert dec.head_parts(96) == (64, 32) and dec.head_parts(128) == (128, 0) and dec.head_parts(64) == (64, 0)
    assert dec.head_parts(80) == (64, 16) and dec.head_parts(256) == (256, 0)
    gen = torch.Generator(device=device).manual_seed(3)
    geo = CacheGeometry(0, 1, 0, 1, KVLayout.SHARED, num_blocks=6)
    table = torch.tensor([[4, 1, 2], [0, 5, 3]], dtype=torch.int32, device=device)
    seq = torch.tensor([40, 33], dtype=torch.int32, device=device)
    base = torch.zeros(2, dtype=torch.int32, device=device)
    for d in (96, 80):
        cache = PagedKVCache(geo, 1, d, device=device, dtype=dtype)
        cache.k.copy_(torch.randn(*cache.k.shape, generator=gen, device=device).to(dtype))
        cache.v.copy_(torch.randn(*cache.v.shape, generator=gen, device=device).to(dtype))
        q = torch.randn(2, 2, d, generator=gen, device=device).to(dtype)
        want = torch_ops.decode_attention(q, cache, table, base, 0, seq, d ** -0.5)
        for parts in (None, (128, 0)):
            got = dec.decode_attention(q, cache, table, base, 0, seq, d ** -0.5, splits=2, min_split=16, parts=parts)
            _close(got, want, atol * 10, f"decode_attention head_dim {d} parts={parts}")


def _counters_back_to_zero(dec, device: str) -> None:
    """The in-kernel merge leaves its split counters zero for the next launch (a CUDA graph relies on it)."""
    counters = dec.split_counters(torch.device(device), 1)
    if int(counters.abs().sum()):
        raise AssertionError(f"split counters left non-zero: {int(counters.abs().sum())}")


def check_prefill_attention(device: str = "cpu", dtype: torch.dtype = torch.float32, atol: float = 1e-5) -> None:
    """Packed prefill chunks (a cached prefix, a chunk spanning two work items, a one-token chunk, padding)
    for a head loaded in one padded part (24) and in two (48 = 32 + 16), at the shipped tiles and at tiles
    small enough that items have several unmasked tiles below the diagonal and several on it; and heads of 80
    (64 + 16) and 256 (eight warps) at the shipped tiles."""
    import numpy as np

    from executor import triton_prefill as pre
    from executor.prefill import BLOCK_M, Chunk, PrefillLayout, pack, prefill_views, work_items

    assert pre.prefill_head_parts(24)[1] == 0 and pre.prefill_head_parts(48) == (32, 16)
    geo = CacheGeometry(1, 2, 1, 3, KVLayout.DEPTH, num_blocks=16)
    blocks = np.random.default_rng(3).permutation(geo.num_blocks)
    chunks = [Chunk(20, 70, blocks[:6], 0, True), Chunk(0, 9, blocks[6:7], 100, False),
              Chunk(5, 1, blocks[7:8], 200, True)]
    layout = PrefillLayout(96, 4, 6)
    packed = torch.from_numpy(pack(layout, chunks, 999, geo.trash_block, geo.block_size)).to(device)
    cases = [*itertools.product((24, 48), ((BLOCK_M, None), (16, pre.PrefillTiles(16, 1, 1)))),
             (80, (BLOCK_M, None)), (256, (BLOCK_M, None))]
    for d, (block_m, tiles) in cases:
        heads, kv_heads = 4, 2
        gen = torch.Generator(device=device).manual_seed(d)
        cache = PagedKVCache(geo, kv_heads, d, device=device, dtype=dtype)
        cache.k.copy_(torch.randn(*cache.k.shape, generator=gen, device=device).to(dtype))
        cache.v.copy_(torch.randn(*cache.v.shape, generator=gen, device=device).to(dtype))
        meta = prefill_views(packed, layout)
        if block_m != BLOCK_M:  # work items of the smaller tile (padding items: chunk -1)
            chunk, q0 = work_items([c.length for c in chunks], block_m, [c.start for c in chunks])
            items = torch.full((2, len(chunk) + 2), -1, dtype=packed.dtype)
            items[0, : len(chunk)], items[1, : len(chunk)] = torch.from_numpy(chunk), torch.from_numpy(q0)
            meta = replace(meta, item_chunk=items[0].to(device), item_q0=items[1].to(device))
        q = torch.randn(layout.tokens, heads, d, generator=gen, device=device).to(dtype)
        want = torch_ops.prefill_attention(q, cache, meta, 2, 1 / math.sqrt(d))
        got = pre.prefill_attention(q, cache, meta, 2, 1 / math.sqrt(d), tiles=tiles, block_m=block_m)
        _close(got, want, atol * 10, f"prefill_attention d={d} block_m={block_m}")


END_TO_END = [("ouro", "refill", 2, "depth", 2, 0), ("huginn", "norefill", 1, "first-shared", 2, 0),
              ("ouro", "refill", 1, "depth", 1, 1), ("huginn", "refill", 1, "depth", 1, 1)]


def check_end_to_end(device: str = "cpu", graphs: bool = True, atol: float = 1e-4, cases: list[int] | None = None,
                     max_prompt: int = 20, prefill_budget: int = 16) -> None:
    """Whole runs on the Triton backend match the reference decoder; the last two cases (width 1) run
    every decode-type launch on the chained skinny-matmul path (:mod:`executor.chain`). Prompts longer
    than ``prefill_budget`` are chunked."""
    requests = tiny_requests(n=3, seed=7, max_prompt=max_prompt, max_output=5)
    assert max(r.prompt_len for r in requests) > prefill_budget, "no prompt is chunked"
    for case in cases if cases is not None else range(len(END_TO_END)):
        style, policy, k, layout, width, fuse_rows = END_TO_END[case]
        arch = tiny_arch(style)
        model = tiny_model(arch, backend="triton", device=device)
        model.ops.fuse_rows = fuse_rows
        chained = []
        gemv = model.ops.gemv
        model.ops.gemv = lambda x, w, gemv=gemv, seen=chained: seen.append(1) or gemv(x, w)
        config = ServeConfig(policy=policy, width=width, coda_batch=k, prefill_budget=prefill_budget, timing="sync",
                             layout=layout)
        run = execute(arch, config, requests, 32, model=model, keep_logits=True, graphs=graphs, warmup=False)
        assert run.log.meta["ops"] == "triton"
        assert bool(chained) == bool(fuse_rows), f"{style}: chained path used {len(chained)} times"
        assert_matches_reference(run, model, arch, config, requests, atol=atol)


def check_norm_rounding(device: str = "cpu", hidden: int = 160) -> None:
    """In bf16 the Triton norms (pointwise, and the chained matmul's prologue, read through an identity matmul)
    round as the torch backend (:func:`executor.ops.rms_norm`, the authors' order). Each side sums its squares in
    its own order, which may move a value across a bf16 rounding boundary, so a few may differ; the other order
    (the weight applied before the one rounding) differs on about a quarter."""
    from executor import chain
    from executor import triton_pointwise as pw

    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * scale).bfloat16()

    def differ(got: torch.Tensor, want: torch.Tensor, what: str, most: float = 0.01) -> None:
        share = float((got != want).float().mean())
        if not share <= most:
            raise AssertionError(f"{what}: {share:.1%} of bf16 elements differ from the torch backend")

    x, branch, w1, w2 = randn(2, hidden, scale=3.0), randn(2, hidden, scale=2.0), randn(hidden), randn(hidden)
    eye = torch.eye(hidden, device=device, dtype=torch.bfloat16)
    want = torch_ops.rms_norm(x, w1, 1e-6)
    xf = x.float()
    weight_last = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w1.float()).bfloat16()
    assert float((want != weight_last).float().mean()) > 0.1, "the two orders should differ in bf16"
    differ(pw.rms_norm(x, w1, 1e-6), want, "rms_norm")
    differ(chain.gemv_rmsnorm(x, w1, 1e-6, eye), want, "chained rms_norm prologue")
    for sandwich in (True, False):
        x_new, h = torch_ops.residual_norm(branch, x, w1, w2, 1e-6, sandwich)
        got_x, got_h = pw.residual_norm(branch, x, w1, w2, 1e-6, sandwich)
        differ(got_x, x_new, f"residual_norm x (sandwich={sandwich})")
        differ(got_h, h, f"residual_norm h (sandwich={sandwich})")
        chained, chained_x = chain.gemv_residual(branch, x, w1, w2, 1e-6, sandwich, eye)
        differ(chained_x, x_new, f"chained residual prologue x (sandwich={sandwich})")
        differ(chained, h, f"chained residual prologue h (sandwich={sandwich})")


CHECKS = {"ops": check_ops, "prefill": check_prefill_attention, "norm-rounding": check_norm_rounding,
          **{f"end-to-end-{i}": lambda i=i: check_end_to_end(cases=[i], max_prompt=12, prefill_budget=8)
             for i in range(len(END_TO_END))}}


if __name__ == "__main__":
    names = sys.argv[1:] or list(CHECKS)
    with split_cap(INTERPRETER_SPLITS):
        for name in names:
            CHECKS[name]()
    print(f"kernel checks passed: {' '.join(names)}", file=sys.stderr)
