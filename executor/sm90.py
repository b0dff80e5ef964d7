"""Compile the executor's Triton kernels for Hopper (sm_90) on any machine, GPU or not, with the ptxas Triton
ships: the tests catch kernels that fail to compile, spill registers or ask for too much shared memory.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

SHARED_LIMIT = 227 * 1024  # bytes of shared memory one block may use on the H100/H200
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"  # the ptxas and cuobjdump Triton ships

# argument types of the kernels compiled here (their constexpr arguments are given per call)
SIGNATURES = {
    "decode": {"Q": "*bf16", "KC": "*bf16", "VC": "*bf16", "BT": "*i32", "LB": "*i32", "SL": "*i32", "MO": "*fp32",
               "ML": "*fp32", "OUT": "*bf16", "layer": "i32", "pages_per_layer": "i32", "scale": "fp32",
               "bt_stride": "i32"},
    "rope_decode": {"QKV": "*bf16", "QB": "*bf16", "KB": "*bf16", "POS": "*i32", "COS": "*fp32", "SIN": "*fp32",
                    "ROW0": "*i32", "FILL": "*i32", "KC": "*bf16", "VC": "*bf16", "BT": "*i32", "LB": "*i32",
                    "SL": "*i32", "MO": "*fp32", "ML": "*fp32", "CNT": "*i32", "OUT": "*bf16", "layer": "i32",
                    "rows_per_layer": "i32", "slot_stride": "i32", "qkv_stride": "i32", "pages_per_layer": "i32",
                    "scale": "fp32", "bt_stride": "i32"},
    "rope_kv": {"QKV": "*bf16", "QB": "*bf16", "KB": "*bf16", "POS": "*i32", "COS": "*fp32", "SIN": "*fp32",
                "QO": "*bf16", "KC": "*bf16", "VC": "*bf16", "ROW0": "*i32", "LB": "*i32", "FILL": "*i32", "n": "i32",
                "layer": "i32", "rows_per_layer": "i32", "slot_stride": "i32", "qkv_stride": "i32"},
    "merge": {"MO": "*fp32", "ML": "*fp32", "OUT": "*bf16", "SL": "*i32"},
    "few_rows": {"X": "*bf16", "W": "*bf16", "OUT": "*bf16", "M": "i32"},
    "chain": {"X": "*bf16", "BR": "*bf16", "WP": "*bf16", "WN": "*bf16", "W": "*bf16", "OUT": "*bf16", "XO": "*bf16",
              "eps": "fp32"},
    "prefill": {"Q": "*bf16", "KC": "*bf16", "VC": "*bf16", "OUT": "*bf16", "BT": "*i32", "START": "*i32",
                "LEN": "*i32", "QOFF": "*i32", "ICHUNK": "*i32", "IQ0": "*i32", "layer": "i32",
                "pages_per_layer": "i32", "qk_scale": "fp32", "bt_stride": "i32"},
}


@dataclass(frozen=True)
class Resources:
    """What one thread and one block of a compiled kernel use."""

    registers: int
    stack: int        # bytes per thread; more than 0: registers spilled to local memory
    shared: int       # bytes per block

    @property
    def fits(self) -> bool:
        return self.shared <= SHARED_LIMIT


def compile_sm90(fn, signature: dict[str, str], constants: dict, num_warps: int = 4, num_stages: int = 3):
    """``fn`` compiled for sm_90 with ``constants`` as its constexpr arguments (defaults unless given; pointers
    16-byte aligned, as at launch); raises what Triton raises."""
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.default is not inspect.Parameter.empty}
    constants = {**{k: v for k, v in defaults.items() if k not in signature}, **constants}
    sig = {**signature, **{k: "constexpr" for k in constants}}
    pointers = [i for i, t in enumerate(signature.values()) if t.startswith("*")]
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constants,
                                    attrs={(i,): [["tt.divisibility", 16]] for i in pointers})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def resources(kernel) -> Resources:
    """Registers, stack and shared memory of a kernel from :func:`compile_sm90` (``cuobjdump`` of its cubin)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True)
    line = next(ln for ln in out.stdout.splitlines() if "REG:" in ln)
    regs, stack = (re.search(rf"{key}:(\d+)", line) for key in ("REG", "STACK"))
    return Resources(int(regs.group(1)) if regs else -1, int(stack.group(1)) if stack else -1,
                     int(kernel.metadata.shared))


def available() -> bool:
    """Whether this Triton can compile for NVIDIA GPUs here (its ptxas and cuobjdump are bundled)."""
    return (BIN / "ptxas").is_file() and (BIN / "cuobjdump").is_file()
