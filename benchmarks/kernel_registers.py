"""Registers, spills and shared memory of the executor's Triton kernels, compiled for sm_90 without a GPU.

Registers bound how many programs an SM keeps resident (and so how many bytes a memory-bound kernel has in
flight); spills and shared memory decide whether a launch shape of the prefill attention kernel is worth
timing at all (more than the H200's 227 KB per block does not launch). This compiles, for Hopper and on any
machine, the decode attention kernels (Ouro's 16 x 128 heads, 8 splits), ``rope_write_kv`` in both RoPE
styles and the prefill attention kernel over the launch shapes ``bench_prefill_attention.py`` sweeps, and
prints what ``cuobjdump --dump-resource-usage`` reports.

    python benchmarks/kernel_registers.py [--prefill-only]
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from executor import triton_kernels as tk  # noqa: E402

SHARED_LIMIT = 227 * 1024  # bytes of shared memory one block may use on the H100/H200

DECODE = {"Q": "*bf16", "KC": "*bf16", "VC": "*bf16", "BT": "*i32", "LB": "*i32", "SL": "*i32", "MO": "*fp32",
          "ML": "*fp32", "OUT": "*bf16", "layer": "i32", "pages_per_layer": "i32", "scale": "fp32", "bt_stride": "i32"}
FUSED = {"QKV": "*bf16", "QB": "*bf16", "KB": "*bf16", "POS": "*i32", "COS": "*fp32", "SIN": "*fp32", "ROW0": "*i32",
         "FILL": "*i32", "KC": "*bf16", "VC": "*bf16", "BT": "*i32", "LB": "*i32", "SL": "*i32", "MO": "*fp32",
         "ML": "*fp32", "CNT": "*i32", "OUT": "*bf16", "layer": "i32", "rows_per_layer": "i32", "slot_stride": "i32",
         "qkv_stride": "i32", "pages_per_layer": "i32", "scale": "fp32", "bt_stride": "i32"}
ROPE = {"QKV": "*bf16", "QB": "*bf16", "KB": "*bf16", "POS": "*i32", "COS": "*fp32", "SIN": "*fp32", "QO": "*bf16",
        "KC": "*bf16", "VC": "*bf16", "ROW0": "*i32", "LB": "*i32", "FILL": "*i32", "n": "i32", "layer": "i32",
        "rows_per_layer": "i32", "slot_stride": "i32", "qkv_stride": "i32"}
PREFILL = {"Q": "*bf16", "KC": "*bf16", "VC": "*bf16", "OUT": "*bf16", "BT": "*i32", "START": "*i32", "LEN": "*i32",
           "QOFF": "*i32", "ICHUNK": "*i32", "IQ0": "*i32", "layer": "i32", "pages_per_layer": "i32",
           "qk_scale": "fp32", "bt_stride": "i32"}
# (name, heads, KV heads, head_dim) as in bench_prefill_attention.py
HEADS = (("ouro", 16, 16, 128), ("huginn", 55, 55, 96), ("gqa-64", 32, 8, 64))


def resource_usage(fn, signature: dict, constants: dict, num_warps: int = 4, num_stages: int = 3) -> dict:
    """Registers, spill bytes and shared memory of ``fn`` compiled for sm_90 (pointers assumed 16-byte
    aligned, as at launch); ``error`` instead when it does not compile."""
    sig = {**signature, **{k: "constexpr" for k in constants}}
    pointers = [i for i, t in enumerate(signature.values()) if t.startswith("*")]
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constants,
                                    attrs={(i,): [["tt.divisibility", 16]] for i in pointers})
    try:
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": num_warps, "num_stages": num_stages})
    except Exception as exc:  # a shape the compiler refuses: reported, the others go on
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"}
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True, text=True)
    line = next((ln for ln in out.stdout.splitlines() if "REG:" in ln), "")
    regs = re.search(r"REG:(\d+)", line)
    stack = re.search(r"STACK:(\d+)", line)
    return {"registers": int(regs.group(1)) if regs else -1, "stack": int(stack.group(1)) if stack else -1,
            "shared": kernel.metadata.shared}


def show(name: str, usage: dict) -> None:
    if "error" in usage:
        print(f"{name:44s} {usage['error']}")
        return
    fits = "" if usage["shared"] <= SHARED_LIMIT else "  (over the shared-memory limit)"
    print(f"{name:44s} {usage['registers']:4d} registers  {usage['stack']:5d} B stack  "
          f"{usage['shared'] / 1024:6.1f} KB shared{fits}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill-only", action="store_true", help="only the prefill attention shapes")
    args = parser.parse_args(argv)
    if not args.prefill_only:
        common = dict(H=16, KVH=16, D=128, PAGE=16, BLOCK=tk.DECODE_BLOCK, SPLITS=8, MIN_PER=64, PDL=True)
        show("decode_attention", resource_usage(tk._decode_attn_kernel, DECODE,
                                                dict(common, DA=128, DB=0, EVICT=tk.DECODE_EVICT), tk.DECODE_WARPS))
        show("rope_decode_attention", resource_usage(
            tk._rope_decode_attn_kernel, FUSED, dict(common, BLOCK_D=128, HALF=64, HAS_BIAS=False, INTERLEAVED=False)))
        for interleaved, (heads, d) in itertools.product((False, True), ((16, 128), (55, 96))):
            constants = dict(H=heads, KVH=heads, D=d, HALF=d // 2, BLOCK_HALF=triton.next_power_of_2(d // 2),
                             BLOCK_T=tk.ROPE_ROWS, HAS_BIAS=False, INTERLEAVED=interleaved, PDL=True)
            show(f"rope_write_kv {heads}x{d} interleaved={interleaved}",
                 resource_usage(tk._rope_kv_kernel, ROPE, constants))
    for (name, heads, kvh, d), bm, bn, warps, stages in itertools.product(
            HEADS, (64, 128), (32, 64, 128), (4, 8), (2, 3)):  # 4 stages: the same code as 3
        da, db = tk.prefill_head_parts(d)
        constants = dict(H=heads, KVH=kvh, D=d, DA=da, DB=db, PAGE=16, BLOCK_M=bm, BLOCK_N=bn, PRECISION="tf32")
        show(f"prefill_attention {name} {bm}x{bn} w{warps} s{stages}",
             resource_usage(tk._prefill_attn_kernel, PREFILL, constants, warps, stages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
