"""The fingerprint of the executor build running here, recorded in every profile calibration writes and in every
executor run's ``meta.json``, so that validate can tell a profile measured by another build.

The hashed sources (:func:`source_files`) are every module of this package that decides what runs on the GPU and
how it is launched (kernels, ops, model, cache layout, engine, CUDA graphs, driver), plus
``cdbsim/latency/gpu_work.py``, whose split counts and row thresholds the kernels are launched with. Left out, as
they change no launch: ``__init__`` (lazy names), ``build`` (this file), ``gates`` (records exit traces), ``loader``
(reads checkpoints into the same weights), ``record`` (traces from a checkpoint), ``reference`` (the tests'
decoder), ``sm90`` (an offline compile check) and ``tokens`` (synthetic prompt ids). A new module of the package
is hashed unless named here.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Iterable
from pathlib import Path

import torch

from cdbsim.latency.build import Build

PACKAGE = Path(__file__).resolve().parent
NOT_HASHED = frozenset({"__init__.py", "build.py", "gates.py", "loader.py", "record.py", "reference.py", "sm90.py",
                        "tokens.py"})
LAUNCH_RULES = PACKAGE.parent / "cdbsim" / "latency" / "gpu_work.py"
HASH_CHARS = 8


def source_files() -> list[Path]:
    """The executor's kernel and launch sources, in a fixed order."""
    return [*sorted(p for p in PACKAGE.glob("*.py") if p.name not in NOT_HASHED), LAUNCH_RULES]


def source_hash(files: Iterable[Path] | None = None) -> str:
    """A short hash of the files' names and contents (line endings normalised), :func:`source_files` by default."""
    digest = hashlib.sha256()
    for path in source_files() if files is None else files:
        text = path.read_bytes().replace(b"\r\n", b"\n")
        digest.update(f"{path.name}\0{len(text)}\0".encode())
        digest.update(text)
    return digest.hexdigest()[:HASH_CHARS]


def current_build(device: torch.device | str = "cuda") -> Build:
    """This machine's executor build on ``device``: the source hash, torch, Triton and CUDA versions, the GPU."""
    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = ""
    return Build(sources=source_hash(), torch=torch.__version__, triton=triton_version,
                 cuda=torch.version.cuda or "", gpu=gpu)
