"""The few-row matmul on the tensor copy engine (``csrc/few_rows_tma.cu``): ``x @ w.T`` for up to 16 bf16 rows, with
the SwiGLU of a fused gate/up projection in the epilogue, PDL-launched like the Triton kernels around it.

Why a second few-row kernel: the Triton one (:mod:`executor.few_rows`) keeps a few KB of weights in flight per SM
and refills its pipeline in every program; this one streams each CTA's whole share of the weights through a ring
of shared-memory stages from one producer thread, starting before it waits for its predecessor (the source file
says how). It is selected by ``CDBSIM_FEW_ROWS_KERNEL=tma`` (:func:`executor.few_rows.linear`), on CUDA only.
Both operands reach the kernel as tensor maps (``cuTensorMapEncodeTiled``): the weights' map is built once per
weight tensor and kept, the rows' on every call (a host-side encoding of a few microseconds; CUDA graphs keep it).

The kernel is CUDA C++, compiled with ``nvcc`` on first use and launched through the CUDA driver with the PDL
attribute on PyTorch's current stream by :mod:`executor.cuda_driver`, so CUDA graphs capture it like any other kernel.
No build step at install time, and nothing of it is imported without CUDA.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from executor import cuda_driver
from executor.cuda_driver import BLOCK_LIMIT, KernelUnavailable, check, driver, nvcc  # noqa: F401 (re-exported)

PDL_KIND = "few_rows_tma"  # its name in executor.chain.pdl_mode (one of LATE_KINDS)
SOURCE = cuda_driver.CSRC / "few_rows_tma.cu"
NAMES = ("few_rows_tma_8", "few_rows_tma_16", "few_rows_tma_swiglu_8", "few_rows_tma_swiglu_16")
MAX_ROWS = 16  # two MMAs of 8 rows
UNIT = 16  # output columns per weight unit (the source's UNIT_ROWS)
DEFAULT_RING_KB = 96  # shared memory for the ring: two CTAs of this size fit on an SM beside each other
MAX_RING_KB = 200  # within an H200 block's 227 KB

TmaUnavailable = KernelUnavailable


def compile_cubin(arch: str = "sm_90a", extra: tuple[str, ...] = ()) -> Path:
    """The kernel's cubin for ``arch`` (:func:`executor.cuda_driver.compile_cubin`)."""
    return cuda_driver.compile_cubin(SOURCE, arch, extra)


@dataclass(frozen=True)
class TmaSettings:
    """How a launch runs: the ring's shared memory in KB, the K columns of a stage in 64-column segments (4, 8 or 16),
    the consumer warps (4 or 8, taking a stage's segments in turn) and whether a stage is released by one arrival per
    warp instead of per thread."""

    ring_kb: int = DEFAULT_RING_KB
    segments: int = 4
    consumer_warps: int = 4
    warp_arrive: bool = False

    def __post_init__(self) -> None:
        if not 16 <= self.ring_kb <= MAX_RING_KB:
            raise ValueError(f"few-row TMA ring must be 16..{MAX_RING_KB} KB, got {self.ring_kb}")
        if self.segments not in (4, 8, 16):
            raise ValueError(f"few-row TMA stage must be 4, 8 or 16 segments, got {self.segments}")
        if self.consumer_warps not in (4, 8):
            raise ValueError(f"few-row TMA consumer warps must be 4 or 8, got {self.consumer_warps}")

    @property
    def threads(self) -> int:
        return 32 * (self.consumer_warps + 1)

    @property
    def options(self) -> int:
        """The kernel's option bits (the source's OPTION_*)."""
        return int(self.warp_arrive)

    @classmethod
    def from_env(cls) -> TmaSettings:
        """``CDBSIM_TMA_RING_KB``, ``CDBSIM_TMA_SEGMENTS``, ``CDBSIM_TMA_WARPS`` and ``CDBSIM_TMA_WARP_ARRIVE`` (0/1)
        over the defaults."""
        values: dict[str, int | bool] = {}
        for field, env in (("ring_kb", "CDBSIM_TMA_RING_KB"), ("segments", "CDBSIM_TMA_SEGMENTS"),
                           ("consumer_warps", "CDBSIM_TMA_WARPS"), ("warp_arrive", "CDBSIM_TMA_WARP_ARRIVE")):
            raw = os.environ.get(env)
            if raw is not None:
                if not raw.isdigit():
                    raise ValueError(f"{env} must be a whole number, got {raw!r}")
                values[field] = bool(int(raw)) if field == "warp_arrive" else int(raw)
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"{exc} (from the CDBSIM_TMA_* settings)") from None


def stage_bytes(rows: int, swiglu: bool, segments: int = 4) -> int:
    """One stage: the weight box (16 rows x ``segments`` x 64 columns; two with SwiGLU) and the rows' box (8 or 16
    rows)."""
    return ((2 if swiglu else 1) * UNIT + (8 if rows <= 8 else 16)) * segments * 64 * 2


def stages_for(settings: TmaSettings, rows: int, swiglu: bool) -> int:
    """Stages of the ring (two at least)."""
    return max(2, settings.ring_kb * 1024 // stage_bytes(rows, swiglu, settings.segments))


def shared_bytes(settings: TmaSettings, rows: int, swiglu: bool) -> int:
    """Dynamic shared memory of a launch: 1 KB of alignment slack (the swizzle wants 1,024-byte boxes), the ring,
    the consumer warps' partial sums, two barriers a stage."""
    tiles, nt, stages = (2 if swiglu else 1), (1 if rows <= 8 else 2), stages_for(settings, rows, swiglu)
    return (1024 + stages * stage_bytes(rows, swiglu, settings.segments)
            + settings.consumer_warps * tiles * nt * 4 * 32 * 4 + 2 * stages * 8)


def grid_for(units: int, sms: int) -> int:
    """CTAs for ``units`` weight units: as few as keep every CTA's count of units the least it can be."""
    per_cta = -(-units // sms)
    return -(-units // per_cta)


def supports(x: torch.Tensor, w: torch.Tensor, swiglu: bool) -> str | None:
    """Why this kernel cannot take ``x @ w.T`` (None when it can)."""
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    return cuda_driver.operand_problem(x, w) or shape_problem(x.shape[0], n, x.shape[1], swiglu)


def shape_problem(m: int, n: int, k: int, swiglu: bool) -> str | None:
    """Why an ``m``-row launch of ``n`` output columns over ``k`` does not fit the kernel (None when it does): at most
    :data:`MAX_ROWS` rows (two MMAs of 8), ``k`` a multiple of 64 (the tensor maps' 128-byte segments), ``n`` of 16
    (the weight unit; per half with SwiGLU)."""
    if not 1 <= m <= MAX_ROWS:
        return f"1..{MAX_ROWS} rows, got {m}"
    if k % 64:
        return f"K a multiple of 64, got {k}"
    if n % UNIT:
        return f"N a multiple of {UNIT}{' per half' if swiglu else ''}, got {n}"
    return None


class _TensorMap(ctypes.Structure):
    _fields_ = [("raw", ctypes.c_uint64 * 24)]  # 128 bytes at a 64-byte aligned offset inside

    def aligned(self) -> int:
        return (ctypes.addressof(self) + 63) // 64 * 64


_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, _CU_TENSOR_MAP_SWIZZLE_128B, _CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 9, 3, 3


def tensor_map(t: torch.Tensor, box_rows: int, segments: int) -> _TensorMap:
    """A map of the 2-d bf16 ``t`` as ``[rows][K / 64][64]`` with the 128-byte swizzle, in boxes of ``box_rows`` rows x
    ``segments`` segments of 64 columns; rows and segments past the tensor read as zeros."""
    rows, k = t.shape
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    out = _TensorMap()
    dims, strides = (u64 * 3)(64, k // 64, rows), (u64 * 2)(128, k * 2)
    box, steps = (u32 * 3)(64, segments, box_rows), (u32 * 3)(1, 1, 1)
    check(driver().cuTensorMapEncodeTiled(
        ctypes.c_void_p(out.aligned()), _CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, ctypes.c_void_p(t.data_ptr()), dims,
        strides, box, steps, 0, _CU_TENSOR_MAP_SWIZZLE_128B, _CU_TENSOR_MAP_L2_PROMOTION_L2_256B, 0),
        "cuTensorMapEncodeTiled")
    return out


_WEIGHT_MAPS: dict[tuple[int, int, int, int], _TensorMap] = {}


def weight_map(w: torch.Tensor, segments: int) -> _TensorMap:
    """``w``'s tensor map, built once per address, shape and box (a map holds nothing else, so one built for a tensor
    since freed serves a new one at the same address)."""
    key = (w.data_ptr(), *w.shape, segments)
    if key not in _WEIGHT_MAPS:
        _WEIGHT_MAPS[key] = tensor_map(w, UNIT, segments)
    return _WEIGHT_MAPS[key]


def linear(x: torch.Tensor, w: torch.Tensor, swiglu: bool = False, pdl: int = 0,
           settings: TmaSettings | None = None) -> torch.Tensor:
    """``x @ w.T`` for contiguous bf16 ``x`` ``[M, K]`` (``M <= 16``) and ``w`` ``[N, K]``; with ``swiglu``,
    ``silu(gate) * up`` of the fused ``[2N, K]`` projection (gate and up each rounded to bf16 first, as the torch
    backend rounds). ``pdl``: :func:`executor.chain.pdl_mode`'s value: 0 a plain launch; under PDL the
    successor may launch once the producer has issued its last copy (``EARLY``) or once the consumers are past
    their last stage (``LATE``). ``settings``: default from the ``CDBSIM_TMA_*`` variables."""
    settings = settings or TmaSettings.from_env()
    why = supports(x, w, swiglu)
    if why:
        raise ValueError(f"few-row TMA matmul: {why}")
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    stages, shared = stages_for(settings, m, swiglu), shared_bytes(settings, m, swiglu)
    if shared > BLOCK_LIMIT:
        raise ValueError(f"few-row TMA matmul: a ring of {settings.ring_kb} KB needs {shared} bytes of shared memory, "
                         f"more than a block's {BLOCK_LIMIT}")
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    name = f"few_rows_tma{'_swiglu' if swiglu else ''}_{8 if m <= 8 else 16}"
    kernels = cuda_driver.functions(SOURCE, NAMES, cuda_driver.device_index(x), BLOCK_LIMIT)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    wmap, xmap = weight_map(w, settings.segments), tensor_map(x, 8 if m <= 8 else 16, settings.segments)
    args = [ctypes.c_void_p(out.data_ptr()), ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k), ctypes.c_int(stages),
            ctypes.c_int(settings.segments), ctypes.c_int(pdl), ctypes.c_int(settings.options)]
    cuda_driver.launch(kernels, name, x.device, grid_for(n // UNIT, sms), settings.threads, shared,
                       [wmap.aligned(), xmap.aligned(), *(ctypes.addressof(a) for a in args)], bool(pdl))
    return out
