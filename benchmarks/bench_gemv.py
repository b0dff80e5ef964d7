"""Benchmark the skinny-matmul kernels of :mod:`executor.gemv` against cuBLAS and pick their configs.

For every decode shape (Ouro-1.4B/2.6B, Huginn-3.5B projections and heads) and ``M`` in 1, 2, 4, 8, 16:
cuBLAS ``F.linear``, the unfused path for the fused ops (Triton prologue kernel of
:mod:`executor.triton_kernels` + ``F.linear``), and candidate configs of each Triton kernel.

Search, per (shape, op, M): (a) the plain ``gemv`` over ``mode x BLOCK_N x BLOCK_K x SPLIT_K`` at 4 warps
and 3 stages, pruned (at least half a wave of programs, split-K only where ``N`` alone gives under two
waves and ``K`` is long enough, shared memory and broadcast tiles that fit; the grid itself was narrowed
by a first full sweep, see :func:`coarse_configs`); (b) the best three of (a) over ``num_warps {4, 8} x
num_stages {1..4}``; (c) the fused ops (``rmsnorm``, ``residual``, ``silu``) on the shapes they feed,
over the best two gemv configs of the point, the same at twice ``BLOCK_N``, and their warps/stages
variants. Every config is checked against the torch reference (skipped when wrong); all are compiled
first, in parallel processes, into Triton's disk cache, so the sweep is bounded by timing: ~130 s in
all on an H200 (``--quick``: fewer configs, about half).

Timing: a CUDA graph of 20 back-to-back calls, each reading its own copy of the weight (copies rotate
so the working set exceeds 200 MB, four times the H200's 50 MB L2: every call streams from HBM), replayed
after warm-up; the median over replays, per call. Bandwidth counts weight + activation + output bytes.

    python benchmarks/bench_gemv.py --out gemv.json [--quick] [--measure-copy]
        [--shapes ouro.wo ouro.down] [--ms 1 16] [--no-fused] [--workers 15]

The JSON holds every point, the best per (shape, op, M) and ``config_table``: the entries of
``executor.gemv.CONFIGS`` in its source format, one line each (also printed last), to paste.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DTYPE = torch.bfloat16
MS = (1, 2, 4, 8, 16)
CALLS = 20  # calls per graph
REPLAYS = 7
WORKING_SET = 256 * 2**20  # bytes of weight copies a graph rotates through (> 4x L2)
EPS = 1e-6
STATS = {"check_s": 0.0, "graph_s": 0.0, "main_compiles": 0, "main_compile_s": 0.0}  # where time goes


def _count_compiles(src, metadata, metadata_group, times, cache_hit) -> None:
    """Triton compilation listener: compiles this process did itself (the workers should have)."""
    if not cache_hit:
        STATS["main_compiles"] += 1
        STATS["main_compile_s"] += times.total / 1e6  # microseconds


@dataclass(frozen=True)
class Shape:
    name: str
    n: int
    k: int
    ops: tuple[str, ...]  # fused ops that feed this projection in the models

    @property
    def sandwich(self) -> bool:  # Ouro's residual: x + norm(branch); Huginn's: norm(branch + x)
        return self.name.startswith("ouro")


SHAPES = (
    Shape("ouro.wqkv", 6144, 2048, ("rmsnorm", "residual")),
    Shape("ouro.wo", 2048, 2048, ()),
    Shape("ouro.gate_up", 11264, 2048, ("residual",)),
    Shape("ouro.down", 2048, 5632, ("silu",)),
    Shape("huginn.wqkv", 15840, 5280, ("residual",)),
    Shape("huginn.wo", 5280, 5280, ()),
    Shape("huginn.gate_up", 35840, 5280, ("residual",)),
    Shape("huginn.down", 5280, 17920, ("silu",)),
    Shape("huginn.adapter", 5280, 10560, ()),
    Shape("ouro.head", 49152, 2048, ("rmsnorm",)),
    Shape("huginn.head", 65536, 5280, ("rmsnorm",)),
)


# ----- candidate configs -----------------------------------------------------------------------------------
def fits(cfg, m: int) -> bool:
    """Whether ``cfg`` can compile at ``m`` rows: dot tiles of 16+, broadcast products and pipelined
    shared-memory buffers within the SM's budget."""
    from executor.gemv import m_bucket

    bucket = m_bucket(m)
    if cfg.mode == 0:
        return bucket * cfg.block_n * cfg.block_k <= 16384
    smem = cfg.num_stages * (cfg.block_n + max(bucket, 16)) * cfg.block_k * 2
    return cfg.block_n >= 16 and smem <= 200 * 1024


def coarse_configs(n: int, k: int, m: int, quick: bool) -> list:
    """Phase (a): mode x BLOCK_N x BLOCK_K x SPLIT_K at 4 warps / 3 stages, pruned by a first full sweep
    on the H200: BLOCK_N 8/16 and BLOCK_K 512 came within 3% of their point's best in 4 of their ~880
    timings, so they are dropped (BLOCK_N 128 is added); the broadcast mode (0) was 2-3x slower than the dot modes
    everywhere (its weight loads are not pipelined through shared memory), so it keeps a token pair of
    configs at M <= 4 for the record. ``quick``: dot(w, a.T) only, no token configs."""
    from executor.gemv import NUM_SMS, GemvConfig, m_bucket

    bucket = m_bucket(m)
    out = []
    for mode, bn, bk, split in itertools.product((2,) if quick else (1, 2), (32, 64, 128), (128, 256), (1, 2, 4)):
        cfg = GemvConfig(bn, bk, split, 4, 3, mode)
        programs = math.ceil(n / bn)
        if split > 1 and (programs >= 2 * NUM_SMS or k < 2 * split * bk):
            continue  # enough programs without splitting, or too little K per split
        if programs * split < NUM_SMS // 2 or not fits(cfg, m):
            continue  # under half a wave
        out.append(cfg)
    if not quick and bucket <= 4:
        out += [GemvConfig(bn, 256, 1, 4, 3, 0) for bn in (8, 16)]
    return out


def refine_configs(best: list, m: int, quick: bool) -> list:
    """Phase (b): the best coarse configs over num_warps x num_stages."""
    warps = (4, 8)
    stages = (2, 3, 4) if quick else (1, 2, 3, 4)  # 1: within 3% of the best in 16 of 330 timings
    out = []
    for cfg in best:
        for w, s in itertools.product(warps, stages):
            c = cfg._replace(num_warps=w, num_stages=s)
            if c not in out and fits(c, m):
                out.append(c)
    return out


def fused_configs(best: list, m: int, quick: bool) -> list:
    """Candidates of a fused op: the best gemv configs of the point, at their warps/stages variants and
    at twice their BLOCK_N (a prologue costs per program, so fewer, wider programs may pay)."""
    wider = [c._replace(block_n=2 * c.block_n) for c in best[:2] if c.block_n < 128]
    return refine_configs(best[:2] + wider, m, True)[: 12 if quick else 24]


# ----- inputs and calls --------------------------------------------------------------------------------------
class Point:
    """Inputs for one (shape, M): rotating weight copies, activations, and the calls to time."""

    def __init__(self, shape: Shape, m: int) -> None:
        self.shape, self.m = shape, m
        n, k = shape.n, shape.k
        weight_bytes = n * k * 2
        self.copies = max(4, math.ceil(WORKING_SET / weight_bytes))
        gen = torch.Generator(device="cuda").manual_seed(0)
        w0 = torch.randn(n, k, device="cuda", dtype=DTYPE, generator=gen) * k**-0.5
        self.w = [w0] + [w0.clone() for _ in range(self.copies - 1)]
        self.x = torch.randn(m, k, device="cuda", dtype=DTYPE, generator=gen)
        self.gu = torch.randn(m, 2 * k, device="cuda", dtype=DTYPE, generator=gen)
        self.branch = torch.randn(m, k, device="cuda", dtype=DTYPE, generator=gen) * 3
        self.w_post = 1 + 0.1 * torch.randn(k, device="cuda", dtype=DTYPE, generator=gen)
        self.w_next = 1 + 0.1 * torch.randn(k, device="cuda", dtype=DTYPE, generator=gen)
        self.sandwich = shape.sandwich
        self._reference: dict[str, torch.Tensor] = {}

    def bytes(self, op: str) -> int:
        n, k, m = self.shape.n, self.shape.k, self.m
        act = {"gemv": m * k, "silu": 2 * m * k, "rmsnorm": m * k + k, "residual": 3 * m * k + 2 * k}[op]
        return 2 * (n * k + act + m * n)

    def triton_call(self, op: str, cfg, i: int) -> Callable[[], torch.Tensor]:
        from executor import gemv as g

        w = self.w[i % self.copies]
        if op == "gemv":
            return lambda: g.gemv(self.x, w, cfg)
        if op == "silu":
            return lambda: g.gemv_silu(self.gu, w, cfg)
        if op == "rmsnorm":
            return lambda: g.gemv_rmsnorm(self.x, self.w_post, EPS, w, cfg)
        return lambda: g.gemv_residual(self.branch, self.x, self.w_post, self.w_next, EPS, self.sandwich, w,
                                       cfg)[0]

    def cublas_call(self, i: int) -> Callable[[], torch.Tensor]:
        w = self.w[i % self.copies]
        return lambda: F.linear(self.x, w)

    def unfused_call(self, op: str, i: int) -> Callable[[], torch.Tensor] | None:
        """The prologue as its own kernel (executor.triton_kernels) followed by cuBLAS."""
        try:
            from executor import triton_kernels as tk
        except ImportError:
            return None
        w = self.w[i % self.copies]
        if op == "silu":
            return lambda: F.linear(tk.silu_mul(self.gu), w)
        if op == "rmsnorm":
            return lambda: F.linear(tk.rms_norm(self.x, self.w_post, EPS), w)
        if op == "residual":
            return lambda: F.linear(tk.residual_norm(self.branch, self.x, self.w_post, self.w_next, EPS,
                                                     self.sandwich)[1], w)
        return None

    def reference(self, op: str) -> torch.Tensor:
        if op not in self._reference:
            self._reference[op] = self._compute_reference(op)
        return self._reference[op]

    def _compute_reference(self, op: str) -> torch.Tensor:
        from executor import ops

        w = self.w[0]
        if op == "gemv":
            a = self.x
        elif op == "silu":
            a = ops.silu_mul(self.gu)
        elif op == "rmsnorm":
            a = ops.rms_norm(self.x, self.w_post, EPS)
        else:
            a = ops.residual_norm(self.branch, self.x, self.w_post, self.w_next, EPS, self.sandwich)[1]
        return F.linear(a, w)


def max_error(got: torch.Tensor, want: torch.Tensor) -> tuple[float, bool]:
    """Max abs difference, and whether every element is within bf16 tolerance of the reference."""
    diff = (got.float() - want.float()).abs()
    ok = bool((diff <= 1e-2 + 2e-2 * want.float().abs()).all())
    return float(diff.max()), ok


def time_graph(make_call: Callable[[int], Callable[[], object]]) -> float:
    """Microseconds per call: a graph of ``CALLS`` calls (call ``i`` on weight copy ``i``), replayed.

    Captured with ``capture_begin``/``capture_end`` on a side stream rather than ``torch.cuda.graph``,
    whose ``gc.collect()`` per capture would dominate a sweep of thousands of graphs."""
    calls = [make_call(i) for i in range(CALLS)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        for call in calls[:2]:
            call()
        graph.capture_begin()
        for call in calls:
            call()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(2):
        graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    del graph
    return statistics.median(times)


def launch_floor() -> float:
    """Microseconds per call of a one-element kernel in the same graph harness: the fixed cost of a
    kernel boundary that every projection pays on top of its bytes."""
    x = torch.zeros(1, device="cuda")
    return time_graph(lambda i: lambda: x.add_(1.0))


def copy_bandwidth(gib: float = 4.0) -> dict:
    """Bytes read + written per second by a large device-to-device copy."""
    n = int(gib * 2**30) // 2
    src = torch.randn(n, device="cuda", dtype=DTYPE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    s = statistics.median(times)
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": 4 * n, "seconds": s, "bandwidth_TBps": 4 * n / s / 1e12}


# ----- parallel compilation ------------------------------------------------------------------------------------
def _compile_job(jobs: list) -> int:
    """Worker: compile each ``(op, m, n, k, config)`` into Triton's on-disk cache (nothing runs)."""
    from executor.gemv import GemvConfig, precompile

    done = 0
    for op, m, n, k, cfg, sandwich in jobs:
        try:
            precompile(op, m, n, k, DTYPE, sandwich=sandwich, config=GemvConfig(*cfg))
            done += 1
        except Exception as exc:  # a config the compiler rejects is reported when timed
            print(f"compile failed: {op} M={m} {n}x{k} {cfg}: {type(exc).__name__}: {exc}"[:300], flush=True)
    return done


def precompile_all(jobs: list, workers: int) -> float:
    """Compile ``jobs`` (``op, m, shape, config``) in ``workers`` processes; Triton's disk cache then
    serves this process."""
    t0 = time.perf_counter()
    unique = list(dict.fromkeys((op, m, s.n, s.k, tuple(cfg), s.sandwich) for op, m, s, cfg in jobs))
    if workers <= 1 or len(unique) < 8:
        _compile_job(unique)
    else:
        chunks = [unique[i::workers] for i in range(workers)]
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            list(pool.map(_compile_job, chunks))
    return time.perf_counter() - t0


# ----- the sweep ----------------------------------------------------------------------------------------------
def measure(point: Point, op: str, cfg) -> dict:
    """Check then time one Triton config at one point."""
    row = {"shape": point.shape.name, "op": op, "n": point.shape.n, "k": point.shape.k, "m": point.m,
           "config": list(cfg)}
    t0 = time.perf_counter()
    try:
        err, ok = max_error(point.triton_call(op, cfg, 0)(), point.reference(op))
    except Exception as exc:  # compile or launch failure: recorded, skipped
        return {**row, "error": f"{type(exc).__name__}: {exc}"[:300], "ok": False}
    t1 = time.perf_counter()
    row.update(max_abs_err=err, ok=ok, check_ms=1e3 * (t1 - t0))
    if ok:
        us = time_graph(lambda i: point.triton_call(op, cfg, i))
        row.update(us=us, tbps=point.bytes(op) / us / 1e6)
    STATS["check_s"] += t1 - t0
    STATS["graph_s"] += time.perf_counter() - t1
    return row


def top(rows: list, count: int) -> list:
    from executor.gemv import GemvConfig

    good = sorted((r for r in rows if r.get("ok") and "us" in r), key=lambda r: r["us"])
    return [GemvConfig(*r["config"]) for r in good[:count]]


def sweep(args: argparse.Namespace) -> dict:
    shapes = [s for s in SHAPES if not args.shapes or s.name in args.shapes]
    ms = args.ms or MS
    workers = max(1, min(args.workers, (os.cpu_count() or 2) - 1))
    rows, baselines, timings = [], [], {}
    keys = [(s, m) for s in shapes for m in ms]

    coarse = {(s.name, m): coarse_configs(s.n, s.k, m, args.quick) for s, m in keys}
    timings["compile_coarse_s"] = precompile_all(
        [("gemv", m, s, c) for s, m in keys for c in coarse[(s.name, m)]], workers)
    t0 = time.perf_counter()
    coarse_rows = {}
    for s, m in keys:
        point = Point(s, m)
        baselines.append(baseline(point))
        coarse_rows[(s.name, m)] = [measure(point, "gemv", c) for c in coarse[(s.name, m)]]
        rows += coarse_rows[(s.name, m)]
        del point
    timings["time_coarse_s"] = time.perf_counter() - t0
    if args.out:  # a partial record, in case the rest is cut short
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"partial": True, "baselines": baselines, "points": rows,
                                        "timings": timings}))

    n_top = 2 if args.quick else 3
    fine = {(s.name, m): refine_configs(top(coarse_rows[(s.name, m)], n_top), m, args.quick) for s, m in keys}
    fused = {(s.name, m): fused_configs(top(coarse_rows[(s.name, m)], 2), m, args.quick) for s, m in keys}
    fused_ops = [] if args.no_fused else [(s, m, op) for s, m in keys for op in s.ops]
    timings["compile_fine_s"] = precompile_all(
        [("gemv", m, s, c) for s, m in keys for c in fine[(s.name, m)]]
        + [(op, m, s, c) for s, m, op in fused_ops for c in fused[(s.name, m)]], workers)
    t0 = time.perf_counter()
    for s, m in keys:
        point = Point(s, m)
        tried = set(map(tuple, coarse[(s.name, m)]))
        rows += [measure(point, "gemv", c) for c in fine[(s.name, m)] if tuple(c) not in tried]
        for op in s.ops if not args.no_fused else ():
            rows += [measure(point, op, c) for c in fused[(s.name, m)]]
        del point
        torch.cuda.empty_cache()
    timings["time_fine_s"] = time.perf_counter() - t0
    timings.update(STATS)
    return {"points": rows, "baselines": baselines, "timings": timings}


def baseline(point: Point) -> dict:
    """cuBLAS F.linear and, for the fused ops, the unfused path, at one point."""
    out = {"shape": point.shape.name, "n": point.shape.n, "k": point.shape.k, "m": point.m,
           "cublas_us": time_graph(point.cublas_call)}
    out["cublas_tbps"] = point.bytes("gemv") / out["cublas_us"] / 1e6
    for op in point.shape.ops:
        if point.unfused_call(op, 0) is not None:
            out[f"unfused_{op}_us"] = time_graph(lambda i, op=op: point.unfused_call(op, i))
    return out


def summarise(result: dict) -> tuple[list, list]:
    """Best config per (shape, op, M) against cuBLAS; the config-table lines."""
    base = {(b["shape"], b["m"]): b for b in result["baselines"]}
    groups: dict = {}
    for r in result["points"]:
        if r.get("ok") and "us" in r:
            groups.setdefault((r["shape"], r["op"], r["m"]), []).append(r)
    best, lines = [], []
    for (shape, op, m), rs in groups.items():
        r = min(rs, key=lambda r: r["us"])
        b = base[(shape, m)]
        ref_us = b["cublas_us"] if op == "gemv" else b.get(f"unfused_{op}_us", b["cublas_us"])
        best.append({"shape": shape, "op": op, "n": r["n"], "k": r["k"], "m": m, "config": r["config"],
                     "us": r["us"], "tbps": r["tbps"], "cublas_us": b["cublas_us"],
                     "cublas_tbps": b["cublas_tbps"], "baseline_us": ref_us,
                     "speedup": ref_us / r["us"], "candidates": len(rs)})
        cfg = ", ".join(str(v) for v in r["config"])
        lines.append(f"('{op}', {m}, {r['n']}, {r['k']}): GemvConfig({cfg}),  # {shape}: "
                     f"{r['us']:.1f} us, {ref_us / r['us']:.2f}x")
    return best, lines


def print_table(best: list, meta: dict) -> None:
    print(f"\n{meta['device']}  torch {meta['torch']}  triton {meta['triton']}"
          + (f"  copy {meta['copy']['bandwidth_TBps']:.2f} TB/s" if "copy" in meta else "")
          + f"  launch floor {meta['launch_floor_us']:.2f} us/kernel")
    print(f"{'shape':16} {'op':9} {'M':>2} {'cuBLAS us':>9} {'TB/s':>5} {'base us':>8}  "
          f"{'best config (bn, bk, split, warps, stages, mode)':48} {'us':>7} {'TB/s':>5} {'speedup':>7}")
    for b in best:
        print(f"{b['shape']:16} {b['op']:9} {b['m']:2d} {b['cublas_us']:9.2f} {b['cublas_tbps']:5.2f} "
              f"{b['baseline_us']:8.2f}  {tuple(b['config'])!s:48} {b['us']:7.2f} {b['tbps']:5.2f} "
              f"{b['speedup']:7.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write all points, the best per point and the table as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer candidate configs")
    parser.add_argument("--measure-copy", action="store_true", help="add a large device-to-device copy's "
                        "bandwidth (the ceiling) to the results")
    parser.add_argument("--shapes", nargs="*", help="shape names to run (default all): "
                        + " ".join(s.name for s in SHAPES))
    parser.add_argument("--ms", nargs="*", type=int, help="row counts (default 1 2 4 8 16)")
    parser.add_argument("--no-fused", action="store_true", help="plain gemv only")
    parser.add_argument("--workers", type=int, default=16, help="compile processes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gemv: needs a CUDA GPU, and none is available", file=sys.stderr)
        return 2
    import triton

    triton.knobs.compilation.listener = _count_compiles
    t0 = time.perf_counter()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "quick": args.quick, "calls_per_graph": CALLS, "replays": REPLAYS, "working_set_bytes": WORKING_SET,
            "bytes_counted": "weight + activation in + output", "dtype": str(DTYPE)}
    if args.measure_copy:
        meta["copy"] = copy_bandwidth()
    meta["launch_floor_us"] = launch_floor()
    result = sweep(args)
    best, lines = summarise(result)
    meta["timings"] = {**result["timings"], "total_s": time.perf_counter() - t0}
    print_table(best, meta)
    print("\n# executor/gemv.py CONFIGS entries:")
    print("\n".join(lines))
    parts = ", ".join(f"{k} {v:.0f}" for k, v in result["timings"].items())
    print(f"\ntotal {meta['timings']['total_s']:.0f} s ({parts})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "best": best, "config_table": lines,
                                        "baselines": result["baselines"], "points": result["points"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
