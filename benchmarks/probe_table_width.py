"""Which work of a decode-type launch grows with the block-table width. Runs on a CPU, no GPU needed.

A decode-type launch's metadata carries a block table ``rows x width`` blocks wide, ``width`` set by the
run's longest request. For the prelude, core and coda of a tiny Ouro (0-2-0 layers) and Huginn (1-2-1)
model this runs each stage function on the same launch prepared at two widths and prints every aten op
and every Triton kernel launch whose shapes differ between them (with ``--backend triton`` under
``TRITON_INTERPRET=1``, the GPU path's kernels, interpreted); then it times the host's share of a launch
that scales with the width: :meth:`executor.engine.Engine.prepare` and the fill of the pinned staging
buffer (:class:`executor.graphs.PinnedStaging`, here a plain array copy of the same bytes).

    python benchmarks/probe_table_width.py
    TRITON_INTERPRET=1 python benchmarks/probe_table_width.py --backend triton
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdbsim.config import Policy, ServeConfig
from cdbsim.launch import Stage, decode_launch
from executor.engine import Engine
from tests.executor.helpers import tiny_arch, tiny_model
from traces.request import Request

BS = 16
Op = tuple[str, tuple]


def shapes(tree) -> tuple:
    return tuple(tuple(t.shape) for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor))


class OpLog(TorchDispatchMode):
    """Every aten op run inside, with its tensor arguments' and results' shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func.overloadpacket.__name__, (shapes((args, kwargs)), shapes(out))))
        return out


def record_kernels(log: list[Op]) -> None:
    """Wrap the Triton kernels so each launch is logged (name, grid, tensor shapes) and its interpreted
    body stays out of the aten op log."""
    from executor import chain, triton_kernels

    class Logged:
        def __init__(self, name: str, kernel) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                log.append((f"triton {self.name}", (grid, shapes(args))))
                with _disable_current_modes():
                    return self.kernel[grid](*args, **kwargs)
            return launch

    for module in (triton_kernels, chain):
        for name in dir(module):
            if name.startswith("_") and (name.endswith("_kernel") or name.endswith("_merge")):
                setattr(module, name, Logged(name, getattr(module, name)))


def engine_for(style: str, backend: str, rows: int, longest: int) -> Engine:
    """An engine over ``rows`` requests of ``longest`` positions (the table width is ``longest / 16``),
    each request holding a bank row."""
    arch = tiny_arch(style)
    requests = [Request(i, longest - 2, 2, 0.0, np.full(1, arch.r_max, dtype=np.int16)) for i in range(rows)]
    engine = Engine(tiny_model(arch, backend=backend), ServeConfig(policy=Policy.REFILL, width=rows), requests,
                    kv_blocks=rows * (longest // BS + 1) + 8)
    engine.admit(range(rows))
    return engine


def launch_for(engine: Engine, stage: Stage, rows: int):
    """Row i at position 100 + 7 i, holding blocks up to it, at loop step 1 and exiting (core)."""
    per = engine.max_blocks + 1
    positions = [100 + 7 * i for i in range(rows)]
    blocks = [list(range(i * per, i * per + p // BS + 1)) for i, p in enumerate(positions)]
    return decode_launch(stage, list(range(rows)), positions, blocks, rows, steps=[1] * rows, exits=[True] * rows)


def stage_ops(engine: Engine, stage: Stage, rows: int, width: int, kernels: list[Op]) -> list[Op]:
    prepared = engine.prepare(launch_for(engine, stage, rows), width)
    views = engine.views(stage, torch.from_numpy(prepared.meta), rows, width)
    max_fill = engine.geo.max_fill if stage is Stage.CORE else 0
    kernels.clear()
    with torch.inference_mode(), OpLog() as log:
        engine.stage_fn(stage)(views, max_fill)
    return log.ops + kernels


def compare_ops(backend: str, widths: tuple[int, int], rows: int) -> None:
    kernels: list[Op] = []
    if backend == "triton":
        record_kernels(kernels)
    for style in ("ouro", "huginn"):
        engine = engine_for(style, backend, rows, BS * max(widths))
        for stage in (Stage.PRELUDE, Stage.CORE, Stage.CODA):
            stage_ops(engine, stage, rows, widths[0], kernels)  # first calls allocate (split counters)
            narrow, wide = (stage_ops(engine, stage, rows, w, kernels) for w in widths)
            if [name for name, _ in narrow] != [name for name, _ in wide]:
                raise RuntimeError(f"{style} {stage.value}: the op sequence differs between widths")
            differ = [(a, b) for a, b in zip(narrow, wide, strict=True) if a != b]
            names = sorted({name for name, _ in narrow})
            print(f"{style} {stage.value} ({backend}, {rows} rows): {len(narrow)} ops ({', '.join(names)}); "
                  f"{len(differ)} differ between widths {widths[0]} and {widths[1]}")
            for (name, a), (_, b) in differ:
                print(f"    {name}: {a}\n    {' ' * len(name)}  {b}")


def median_us(fn: Callable[[], object], repeats: int = 300) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def host_times(widths: tuple[int, ...], batches: tuple[int, ...]) -> None:
    print("host time per launch (median us): Engine.prepare and the staging-buffer fill")
    for width in widths:
        engine = engine_for("ouro", "torch", max(batches), BS * width)
        for rows in batches:
            line = []
            for stage in (Stage.PRELUDE, Stage.CORE):
                launch = launch_for(engine, stage, rows)
                line.append(median_us(partial(engine.prepare, launch, width)))
            meta = engine.prepare(launch, width).meta
            staging = np.empty_like(meta)
            fill = median_us(partial(np.copyto, staging, meta))
            print(f"  width {width:4d}, {rows:3d} rows: {meta.nbytes:7d} B of metadata; prepare prelude "
                  f"{line[0]:6.1f}, core {line[1]:6.1f}; fill {fill:5.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("torch", "triton"), default="torch")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4], help="padded rows of the compared launches")
    args = parser.parse_args(argv)
    if args.backend == "triton":
        from tests.executor.triton_interpreter import patch_loop_bounds

        patch_loop_bounds()
    for rows in args.rows:
        compare_ops(args.backend, (16, 512), rows)
    host_times((37, 508), (1, 8, 32, 64))
    return 0


if __name__ == "__main__":
    sys.exit(main())
