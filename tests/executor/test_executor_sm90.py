"""The kernels compile for the H200 (sm_90) at their shipped launch shapes, with no register spills and
within a block's shared memory: what the interpreter-run checks cannot see, checked on a CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from executor import sm90  # noqa: E402
from executor import triton_decode as dec  # noqa: E402
from executor import triton_pointwise as pw  # noqa: E402
from executor import triton_prefill as pre  # noqa: E402
from executor.prefill import BLOCK_M  # noqa: E402

pytestmark = pytest.mark.skipif(not sm90.available(), reason="this Triton has no NVIDIA compiler")


@pytest.mark.parametrize("heads,kv_heads,d", [(16, 16, 128), (55, 55, 96), (32, 8, 64), (32, 8, 80), (16, 1, 256)])
def test_prefill_attention_compiles_at_its_shipped_tiles(heads: int, kv_heads: int, d: int) -> None:
    da, db = pre.prefill_head_parts(d)
    tiles = pre.prefill_tiles(d)
    kernel = sm90.compile_sm90(pre._prefill_attn_kernel, sm90.SIGNATURES["prefill"],
                               dict(H=heads, KVH=kv_heads, D=d, DA=da, DB=db, PAGE=16, BLOCK_M=BLOCK_M,
                                    BLOCK_N=tiles.block_n, PRECISION="tf32"), tiles.warps, tiles.stages)
    assert "wgmma" in kernel.asm["ptx"]  # Hopper's tensor-core instruction, not the older mma
    r = sm90.resources(kernel)
    assert r.stack == 0 and r.fits, r


@pytest.mark.parametrize("d", [80, 96, 256])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_write_kv_compiles(interleaved: bool, d: int) -> None:
    kernel = sm90.compile_sm90(pw._rope_kv_kernel, sm90.SIGNATURES["rope_kv"],
                               dict(H=55, KVH=55, D=d, HALF=d // 2, BLOCK_HALF=triton.next_power_of_2(d // 2),
                                    BLOCK_T=pw.ROPE_ROWS, HAS_BIAS=True, INTERLEAVED=interleaved, PAGE=16, PDL=True))
    assert sm90.resources(kernel).stack == 0


@pytest.mark.parametrize("heads,d", [(16, 128), (55, 96), (32, 80), (16, 256)])
def test_decode_attention_compiles_at_its_shipped_tiles(heads: int, d: int) -> None:
    da, db = dec.head_parts(d)
    kernel = sm90.compile_sm90(dec._decode_attn_kernel, sm90.SIGNATURES["decode"],
                               dict(H=heads, KVH=heads, D=d, DA=da, DB=db, PAGE=16, BLOCK=dec.decode_tile(d)[0],
                                    SPLITS=8, MIN_PER=64, PDL=True, EVICT=dec.DECODE_EVICT), dec.decode_tile(d)[1])
    r = sm90.resources(kernel)
    assert r.stack == 0 and r.fits, r


@pytest.mark.parametrize("splits", [2, 11, 16, 32])
@pytest.mark.parametrize("d", [80, 96, 128, 256])
def test_split_merge_compiles_without_spills(splits: int, d: int) -> None:
    """The merge kernel of decode attention's splits, one warp a (row, head), at split counts the rule gives."""
    kernel = sm90.compile_sm90(dec._decode_attn_merge, sm90.SIGNATURES["merge"],
                               dict(H=16, D=d, BLOCK_D=triton.next_power_of_2(d), SPLITS=splits, MIN_PER=64, PAGE=16,
                                    PDL=1), 1)
    r = sm90.resources(kernel)
    assert r.stack == 0 and r.fits, r


@pytest.mark.parametrize("d", [80, 128, 256])
@pytest.mark.parametrize("splits", [16, 32])
def test_fused_decode_attention_compiles_with_its_merge(splits: int, d: int) -> None:
    """The chained path's one-kernel RoPE + attention, whose last split merges up to 32 partials."""
    kernel = sm90.compile_sm90(dec._rope_decode_attn_kernel, sm90.SIGNATURES["rope_decode"],
                               dict(H=16, KVH=16, D=d, BLOCK_D=triton.next_power_of_2(d), HALF=d // 2, HAS_BIAS=False,
                                    INTERLEAVED=False, PAGE=16, BLOCK=64, SPLITS=splits, MIN_PER=64, PDL=1), 4)
    r = sm90.resources(kernel)
    assert r.stack == 0 and r.fits, r


@pytest.mark.parametrize("rows", [16, 32, 64])
@pytest.mark.parametrize("n,k,swiglu", [(6144, 2048, False), (5632, 2048, True), (2048, 2048, False),
                                        (2048, 5632, False), (15840, 5280, False), (17920, 5280, True),
                                        (5280, 17920, False)])
def test_few_row_matmul_compiles_at_its_shipped_configs(n: int, k: int, swiglu: bool, rows: int) -> None:
    """At every row tile, with the stages that fit it (a 64-row tile takes more shared memory per stage)."""
    from executor import few_rows
    from executor.chain import LATE

    cfg = few_rows.config_for(n, k, swiglu)
    block_m = few_rows.block_rows(rows)
    stages = few_rows.stages_for(cfg, block_m, swiglu)
    kernel = sm90.compile_sm90(few_rows._few_rows_kernel, sm90.SIGNATURES["few_rows"],
                               dict(N=n, K=k, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                    STAGES=stages, SWIGLU=swiglu, IEEE=False, PDL=LATE),
                               few_rows.warps_for(cfg, block_m), stages)
    ptx = kernel.asm["ptx"]
    assert "mma" in ptx and "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    r = sm90.resources(kernel)
    assert r.stack == 0 and r.fits, r


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("n,k,swiglu", [(6144, 2048, False), (6144, 2048, True), (5632, 2048, True),
                                        (2048, 2048, False), (2048, 2048, True), (2048, 5632, False),
                                        (3072, 1536, True), (4096, 1024, True), (8192, 2048, True)])
def test_chained_kernels_compile_without_heavy_spills(n: int, k: int, swiglu: bool, rows: int) -> None:
    """The config each launch takes (a table entry or the default) at Ouro's shapes and at unseen ones. A gate/up
    launch once took a plain projection's entry and spilled 3.7 KB a thread (418 us on the H200 against 17 at one
    row); the shipped two-row down projection's entry spills 104 bytes and is still the sweep's fastest, hence a
    bound rather than none."""
    from executor import chain

    cfg = chain.config_for("residual", n, k, swiglu, 132, rows)
    k1, k2 = chain.split_k(k)
    kernel = sm90.compile_sm90(chain._chain_gemv_kernel, sm90.SIGNATURES["chain"],
                               dict(N=n, K=k, K1=k1, K2=k2, BLOCK_N=cfg.block_n, TILES=cfg.tiles, ROWS=rows,
                                    PROLOGUE=chain.RESIDUAL, SANDWICH=True, SWIGLU=swiglu, PDL=chain.EARLY),
                               cfg.num_warps, 1)
    r = sm90.resources(kernel)
    assert r.stack <= 128 and r.fits, (cfg, r)
