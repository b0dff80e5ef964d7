"""Paged attention equals dense attention, whatever the block tables and per-row slots."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from cdbsim.model.arch import KVLayout  # noqa: E402
from executor.attention import PagedPrefillAttention  # noqa: E402
from executor.kv_cache import CacheGeometry, PagedKVCache  # noqa: E402
from executor.ops import Ops, RopeTable, decode_attention, rope_write_kv, rotate  # noqa: E402
from executor.prefill import Chunk, PrefillLayout, pack, prefill_views, work_items  # noqa: E402

HEADS, KV_HEADS, D = 4, 2, 16


def random_cache(num_blocks: int = 24, seed: int = 0) -> PagedKVCache:
    geo = CacheGeometry(prelude=1, core=2, coda=1, r_max=3, layout=KVLayout.DEPTH, num_blocks=num_blocks)
    cache = PagedKVCache(geo, KV_HEADS, D, device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    return cache


def dense_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One query row [H, D] over [L, KV, D] keys: plain softmax attention."""
    keys = keys.repeat_interleave(HEADS // KV_HEADS, dim=1)
    values = values.repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("hd,lhd->hl", q, keys) / math.sqrt(D)
    return torch.einsum("hl,lhd->hd", scores.softmax(-1), values).reshape(-1)


def gather_dense(cache: PagedKVCache, layer: int, blocks: list[int], length: int) -> tuple[torch.Tensor, ...]:
    rows = [layer * cache.geometry.rows_per_layer + blocks[p // 16] * 16 + p % 16 for p in range(length)]
    return cache.k_rows[rows], cache.v_rows[rows]


def test_paged_decode_attention_equals_dense_with_per_row_slots() -> None:
    cache = random_cache()
    geo = cache.geometry
    gen = torch.Generator().manual_seed(1)
    rows = 6
    lengths = [1, 15, 16, 17, 40, 63]
    slots = [0, 2, 1, 0, 2, 1]
    layer = 1  # core layer 1, scalar part of the cache layer; the per-row part is slot * core layers
    perm = torch.randperm(geo.num_blocks, generator=gen).tolist()
    width = max(-(-n // 16) for n in lengths)
    table = torch.full((rows, width), geo.trash_block, dtype=torch.int32)
    tables = []
    for i, n in enumerate(lengths):
        blocks = perm[(3 * i) % 20: (3 * i) % 20 + 4]
        tables.append(blocks)
        table[i, : -(-n // 16)] = torch.tensor(blocks[: -(-n // 16)], dtype=torch.int32)
    layer_base = torch.tensor([geo.prelude + s * geo.core for s in slots], dtype=torch.int32)
    q = torch.randn(rows, HEADS, D, generator=gen)
    got = decode_attention(q, cache, table, layer_base, layer, torch.tensor(lengths, dtype=torch.int32),
                           1 / math.sqrt(D))
    for i, n in enumerate(lengths):
        k, v = gather_dense(cache, int(layer_base[i]) + layer, tables[i], n)
        torch.testing.assert_close(got[i], dense_attention(q[i], k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_write_kv_writes_slot_and_last_exited_fill(interleaved: bool) -> None:
    cache = random_cache()
    geo = cache.geometry
    rope = RopeTable.build(D, 10000.0, 64, interleaved, "cpu")
    gen = torch.Generator().manual_seed(2)
    rows = 3
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * D, generator=gen)
    q_bias, k_bias = torch.randn(HEADS * D, generator=gen), torch.randn(KV_HEADS * D, generator=gen)
    pos = torch.tensor([5, 17, 33], dtype=torch.int32)
    blocks = [3, 7, 11]
    row0 = torch.tensor([b * 16 + int(p) % 16 for b, p in zip(blocks, pos, strict=True)], dtype=torch.int32)
    slots, fill = [0, 1, 2], [2, 0, 0]  # row 0 exits after step 0: it also fills slots 1 and 2
    layer_base = torch.tensor([s * geo.core for s in slots], dtype=torch.int32)
    layer = geo.prelude + 1
    before_k = cache.k_rows.clone()
    q = rope_write_kv(qkv, q_bias, k_bias, pos, rope, cache, row0, layer_base, layer,
                      torch.tensor(fill, dtype=torch.int32), max_fill=2)
    qq, kk, vv = qkv.split((HEADS * D, KV_HEADS * D, KV_HEADS * D), dim=-1)
    cos, sin = rope.cos[pos.long()], rope.sin[pos.long()]
    want_q = rotate(qq.view(rows, HEADS, D) + q_bias.view(HEADS, D), cos, sin, interleaved)
    want_k = rotate(kk.view(rows, KV_HEADS, D) + k_bias.view(KV_HEADS, D), cos, sin, interleaved)
    torch.testing.assert_close(q, want_q)
    written = set()
    for i in range(rows):
        for extra in range(fill[i] + 1):
            cl = int(layer_base[i]) + layer + extra * geo.core
            r = cl * geo.rows_per_layer + int(row0[i])
            written.add(r)
            torch.testing.assert_close(cache.k_rows[r], want_k[i])
            torch.testing.assert_close(cache.v_rows[r], vv[i].view(KV_HEADS, D))
    changed = {int(r) for r in (cache.k_rows != before_k).any(-1).any(-1).nonzero().flatten()}
    assert changed - {geo.trash_row} <= written


def test_rotate_pairings_are_rotations() -> None:
    x = torch.randn(2, 3, D)
    angle = torch.rand(2, D // 2)
    for interleaved in (False, True):
        y = rotate(x, angle.cos(), angle.sin(), interleaved)
        torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    # rotate-half pairs (i, i + D/2); interleaved pairs (2i, 2i + 1)
    x = torch.zeros(1, 1, D)
    x[..., 0] = 1.0
    quarter = torch.full((1, D // 2), math.pi / 2)
    assert rotate(x, quarter.cos(), quarter.sin(), False)[0, 0, D // 2].item() == pytest.approx(1.0)
    assert rotate(x, quarter.cos(), quarter.sin(), True)[0, 0, 1].item() == pytest.approx(1.0)


def packed_prefill(cache, starts: list[int], lens: list[int], pages: list[list[int]]):
    """Metadata of chunks of requests whose block ids are ``pages`` (as the engine packs them)."""
    geo = cache.geometry
    layout = PrefillLayout(sum(lens) + 5, 3, max(len(p) for p in pages))  # 5 padded tokens, 1 padded chunk
    chunks = [Chunk(s, n, np.asarray(p), 1000 * c, True) for c, (s, n, p) in enumerate(zip(starts, lens, pages,
                                                                                          strict=True))]
    buf = pack(layout, chunks, 9999, geo.trash_block, geo.block_size)
    return prefill_views(torch.from_numpy(buf), layout)


def check_prefill_attention(ops: Ops, atol: float) -> None:
    """Two chunks of two requests, one with 20 cached positions before it (a 70-token chunk: two work
    items), packed in one call with padding."""
    cache = random_cache(seed=3)
    rope = RopeTable.build(D, 10000.0, 128, False, "cpu")
    gen = torch.Generator().manual_seed(4)
    starts, lens = [20, 0], [70, 9]
    pages = [[5, 9, 14, 1, 3, 7], [2]]
    meta = packed_prefill(cache, starts, lens, pages)
    attn = PagedPrefillAttention(ops, cache, rope, meta, 1 / math.sqrt(D))
    qkv = torch.randn(meta.tok.shape[0], (HEADS + 2 * KV_HEADS) * D, generator=gen)
    layer = 4
    out = attn(qkv, layer, None, None)
    pos = meta.pos.long()
    qq = rotate(qkv[:, : HEADS * D].view(-1, HEADS, D), rope.cos[pos], rope.sin[pos], False)
    t = 0
    for c, (s, n) in enumerate(zip(starts, lens, strict=True)):
        for i in range(n):
            k, v = gather_dense(cache, layer, pages[c], s + i + 1)
            torch.testing.assert_close(out[t], dense_attention(qq[t], k, v), atol=atol, rtol=atol)
            t += 1
    assert meta.last[:2].tolist() == [69, 78] and meta.out[:2].tolist() == [90, 1009]


def test_prefill_attention_equals_dense_causal_over_prefix() -> None:
    check_prefill_attention(Ops("torch"), 1e-5)


@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=5), starts_seed=st.integers(0, 10**6),
       block_m=st.sampled_from([16, 64, 128]))
def test_work_items_cover_every_query_once_longest_first(lens: list[int], starts_seed: int, block_m: int) -> None:
    """Every query of every chunk is in exactly one item, and items come in decreasing order of the keys
    their first query sees (the attention grid's longest-first schedule)."""
    starts = list(np.random.default_rng(starts_seed).integers(0, 500, len(lens)))
    chunk, q0 = work_items(lens, block_m, starts)
    covered = {(int(c), q) for c, s in zip(chunk, q0, strict=True) for q in range(s, min(s + block_m, lens[c]))}
    assert covered == {(c, q) for c, n in enumerate(lens) for q in range(n)}
    assert len(chunk) == sum(-(-n // block_m) for n in lens)
    seen = np.asarray(starts)[chunk] + q0
    assert (np.diff(seen) <= 0).all()
