"""Registers, spills and shared memory of the executor's Triton kernels, compiled for sm_90 without a GPU.

Registers bound how many programs an SM keeps resident (and so how many bytes a memory-bound kernel has in
flight); spills and shared memory decide whether a launch shape of the prefill attention kernel is worth
timing at all (more than the H200's 227 KB per block does not launch). This compiles (:mod:`executor.sm90`)
the decode attention kernels (Ouro's 16 x 128 heads, 8 splits), ``rope_write_kv`` in both RoPE styles and
the prefill attention kernel over the launch shapes ``bench_prefill_attention.py`` sweeps, and prints what
``cuobjdump --dump-resource-usage`` reports.

    python benchmarks/kernel_registers.py [--prefill-only]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import triton  # noqa: E402

from executor import triton_kernels as tk  # noqa: E402
from executor.sm90 import SIGNATURES, compile_sm90, resources  # noqa: E402

# (name, heads, KV heads, head_dim) as in bench_prefill_attention.py
HEADS = (("ouro", 16, 16, 128), ("huginn", 55, 55, 96), ("gqa-64", 32, 8, 64))


def show(name: str, fn, signature: str, constants: dict, num_warps: int = 4, num_stages: int = 3) -> None:
    try:
        r = resources(compile_sm90(fn, SIGNATURES[signature], constants, num_warps, num_stages))
    except Exception as exc:  # a shape the compiler refuses: reported, the others go on
        print(f"{name:44s} {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
        return
    print(f"{name:44s} {r.registers:4d} registers  {r.stack:5d} B stack  {r.shared / 1024:6.1f} KB shared"
          + ("" if r.fits else "  (over the shared-memory limit)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill-only", action="store_true", help="only the prefill attention shapes")
    args = parser.parse_args(argv)
    if not args.prefill_only:
        common = dict(H=16, KVH=16, D=128, PAGE=16, BLOCK=tk.decode_tile(128)[0], SPLITS=8, MIN_PER=64, PDL=True)
        show("decode_attention", tk._decode_attn_kernel, "decode", dict(common, DA=128, DB=0, EVICT=tk.DECODE_EVICT),
             tk.decode_tile(128)[1])
        show("decode_attention 55x96", tk._decode_attn_kernel, "decode",
             dict(common, H=55, KVH=55, D=96, DA=tk.head_parts(96)[0], DB=tk.head_parts(96)[1],
                  BLOCK=tk.decode_tile(96)[0], EVICT=tk.DECODE_EVICT),
             tk.decode_tile(96)[1])
        show("rope_decode_attention", tk._rope_decode_attn_kernel, "rope_decode",
             dict(common, BLOCK_D=128, HALF=64, HAS_BIAS=False, INTERLEAVED=False))
        for interleaved, (heads, d) in itertools.product((False, True), ((16, 128), (55, 96))):
            show(f"rope_write_kv {heads}x{d} interleaved={interleaved}", tk._rope_kv_kernel, "rope_kv",
                 dict(H=heads, KVH=heads, D=d, HALF=d // 2, BLOCK_HALF=triton.next_power_of_2(d // 2),
                      BLOCK_T=tk.ROPE_ROWS, HAS_BIAS=False, INTERLEAVED=interleaved, PAGE=16, PDL=True))
    for (name, heads, kvh, d), bm, bn, warps, stages in itertools.product(
            HEADS, (64, 128), (32, 64, 128), (4, 8), (2, 3)):  # 4 stages: the same code as 3
        da, db = tk.prefill_head_parts(d)
        show(f"prefill_attention {name} {bm}x{bn} w{warps} s{stages}", tk._prefill_attn_kernel, "prefill",
             dict(H=heads, KVH=kvh, D=d, DA=da, DB=db, PAGE=16, BLOCK_M=bm, BLOCK_N=bn, PRECISION="tf32"),
             warps, stages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
