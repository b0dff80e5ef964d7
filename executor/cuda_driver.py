"""CUDA C++ kernels of ``executor/csrc``: compiled with ``nvcc`` on first use, loaded into PyTorch's context and
launched through the CUDA driver on PyTorch's current stream.

Why the driver and not a PyTorch extension: a launch needs programmatic dependent launch and thread-block clusters
(``cuLaunchKernelEx`` attributes), no build step at install time, and nothing of it imported without CUDA. CUDA
graphs capture these launches like any other kernel. Cubins are cached beside the user's other caches
(``$CDBSIM_CACHE``, else ``~/.cache/cdbsim``), keyed by the source's and the flags' hash.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

CSRC = Path(__file__).with_name("csrc")
BLOCK_LIMIT = 227 * 1024  # an H200 block's most dynamic shared memory

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class KernelUnavailable(RuntimeError):
    """A kernel cannot be built or loaded here (no nvcc, no CUDA driver, not a Hopper GPU)."""


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]  # a 64-byte union


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$CDBSIM_CACHE`` or ``~/.cache/cdbsim``."""
    return Path(os.environ.get("CDBSIM_CACHE") or Path.home() / ".cache" / "cdbsim")


def nvcc() -> str:
    """The CUDA compiler: ``$CUDA_HOME/bin/nvcc`` or the one on ``PATH``."""
    home = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/nonexistent")
    found = str(home / "bin" / "nvcc") if (home / "bin" / "nvcc").exists() else shutil.which("nvcc")
    if not found:
        raise KernelUnavailable("the CUDA C++ kernels need nvcc (set CUDA_HOME or put nvcc on PATH)")
    return found


def operand_problem(x: torch.Tensor, w: torch.Tensor) -> str | None:
    """Why the few-row CUDA C++ kernels cannot take ``x @ w.T`` whatever the shape (None when they can)."""
    if x.device.type != "cuda" or x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        return "bf16 CUDA tensors only"
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        return "16-byte aligned inputs"
    return None


@functools.cache
def available() -> bool:
    """Whether the kernels can be built and run here: ``nvcc`` found and the current CUDA device a Hopper GPU
    (what a default that prefers them falls back from)."""
    try:
        nvcc()
    except KernelUnavailable:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def compile_cubin(source: Path, arch: str = "sm_90a", extra: tuple[str, ...] = ()) -> Path:
    """``source``'s cubin for ``arch``, compiled once per source and flags (cached by their hash)."""
    flags = ("-cubin", "-O3", f"-gencode=arch=compute_{arch[3:]},code={arch}", *extra)
    key = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    out = cache_dir() / f"{source.stem}-{arch}-{key}.cubin"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        done = subprocess.run([nvcc(), *flags, "-o", str(tmp), str(source)], capture_output=True, text=True)
        if done.returncode:
            raise KernelUnavailable(f"nvcc failed on {source.name}: {done.stderr.strip().splitlines()[-1:]}")
        tmp.replace(out)
    return out


def check(result: int, what: str) -> None:
    """Raise :class:`KernelUnavailable` for a failed driver call."""
    if result:
        raise KernelUnavailable(f"{what} failed with CUDA driver error {result}")


@functools.cache
def driver() -> ctypes.CDLL:
    """``libcuda``, with ``cuLaunchKernelEx``'s argument types set."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise KernelUnavailable(f"no CUDA driver: {exc}") from exc
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib


@functools.cache
def functions(source: Path, names: tuple[str, ...], device: int, dynamic_shared: int = 0) -> dict[str, ctypes.c_void_p]:
    """``names`` of ``source``'s cubin, loaded into ``device``'s primary context (PyTorch's), each allowed
    ``dynamic_shared`` bytes of dynamic shared memory (when above the default 48 KB), and that context (key
    ``context``)."""
    major, _ = torch.cuda.get_device_capability(device)
    if major != 9:
        raise KernelUnavailable(f"{source.name} is built for Hopper (sm_90a)")
    with torch.cuda.device(device):
        torch.empty(1, device=f"cuda:{device}")  # PyTorch's context current on this thread
        lib, module = driver(), ctypes.c_void_p()
        check(lib.cuModuleLoadData(ctypes.byref(module), compile_cubin(source).read_bytes()), "cuModuleLoadData")
        out = {}
        for name in names:
            fn = ctypes.c_void_p()
            check(lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), f"cuModuleGetFunction({name})")
            if dynamic_shared > 48 * 1024:
                check(lib.cuFuncSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_shared),
                      "cuFuncSetAttribute")
            out[name] = fn
        context = ctypes.c_void_p()
        check(lib.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        out["context"] = context
    return out


def device_index(t: torch.Tensor) -> int:
    """``t``'s CUDA device number (the current device for a bare ``cuda`` tensor)."""
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def launch(kernels: dict[str, ctypes.c_void_p], name: str, device: torch.device, grid: int, threads: int,
           shared: int, pointers: list[int], pdl: bool, cluster: int = 1) -> None:
    """Launch ``kernels[name]`` (from :func:`functions`) on ``device``'s current stream: ``grid`` CTAs of ``threads``,
    ``shared`` bytes of dynamic shared memory, ``pointers`` the addresses of its arguments; under ``pdl`` with the
    programmatic-stream-serialization attribute, and in clusters of ``cluster`` CTAs when above one."""
    _make_current(kernels["context"])
    attrs = (_LaunchAttribute * 2)()
    count = 0
    if pdl:
        attrs[count].id, attrs[count].value[0] = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1
        count += 1
    if cluster > 1:
        attrs[count].id = _CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[count].value[0], attrs[count].value[1], attrs[count].value[2] = cluster, 1, 1
        count += 1
    config = _LaunchConfig(grid, 1, 1, threads, 1, 1, shared, torch.cuda.current_stream(device).cuda_stream,
                           ctypes.cast(attrs, ctypes.POINTER(_LaunchAttribute)), count)
    params = (ctypes.c_void_p * len(pointers))(*pointers)
    check(driver().cuLaunchKernelEx(ctypes.byref(config), kernels[name], params, None), "cuLaunchKernelEx")


def _make_current(context: ctypes.c_void_p) -> None:
    """PyTorch's context current on this thread (a thread that has not touched the runtime API has none)."""
    current = ctypes.c_void_p()
    check(driver().cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    if current.value != context.value:
        check(driver().cuCtxSetCurrent(context), "cuCtxSetCurrent")
