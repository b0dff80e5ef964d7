"""Registers a thread of the decode-attention kernels, compiled for sm_90 without a GPU.

Registers bound how many programs an SM keeps resident, and so how many KV bytes a memory-bound attention
kernel has in flight; this prints what ``cuobjdump --dump-resource-usage`` reports for the Ouro-shaped
(16 heads x 128) kernels of :mod:`executor.triton_kernels`, 4 warps, 8 splits.

    python benchmarks/kernel_registers.py
"""

from __future__ import annotations

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

COMMON = dict(H=16, KVH=16, D=128, BLOCK_D=128, PAGE=16, BLOCK=64, SPLITS=8, MIN_PER=64, PDL=True)
PLAIN = {"Q": "*bf16", "KC": "*bf16", "VC": "*bf16", "BT": "*i32", "LB": "*i32", "SL": "*i32", "MO": "*fp32",
         "ML": "*fp32", "OUT": "*bf16", "layer": "i32", "pages_per_layer": "i32", "scale": "fp32", "bt_stride": "i32"}
FUSED = {"QKV": "*bf16", "QB": "*bf16", "KB": "*bf16", "POS": "*i32", "COS": "*fp32", "SIN": "*fp32", "ROW0": "*i32",
         "FILL": "*i32", "KC": "*bf16", "VC": "*bf16", "BT": "*i32", "LB": "*i32", "SL": "*i32", "MO": "*fp32",
         "ML": "*fp32", "CNT": "*i32", "OUT": "*bf16", "layer": "i32", "rows_per_layer": "i32", "slot_stride": "i32",
         "qkv_stride": "i32", "pages_per_layer": "i32", "scale": "fp32", "bt_stride": "i32"}


def resource_usage(fn, signature: dict, constants: dict, num_warps: int = 4) -> str:
    """The ``REG:...`` line of the kernel compiled for sm_90 (pointers assumed 16-byte aligned, as at launch)."""
    sig = {**signature, **{k: "constexpr" for k in constants}}
    pointers = [i for i, t in enumerate(signature.values()) if t.startswith("*")]
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constants,
                                    attrs={(i,): [["tt.divisibility", 16]] for i in pointers})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True, text=True)
    return next((line.strip() for line in out.stdout.splitlines() if "REG:" in line), out.stderr.strip())


def main() -> int:
    print("decode_attention      ", resource_usage(tk._decode_attn_kernel, PLAIN, COMMON))
    fused = dict(COMMON, HALF=64, HAS_BIAS=False, INTERLEAVED=False)
    print("rope_decode_attention ", resource_usage(tk._rope_decode_attn_kernel, FUSED, fused))
    return 0


if __name__ == "__main__":
    sys.exit(main())
