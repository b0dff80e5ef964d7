"""Benchmark the chained skinny-matmul kernels of :mod:`executor.chain` and pick their configs.

Parts (``--parts``):

``sweep``  per decode shape (Ouro-1.4B and Huginn-3.5B projections, the op that feeds each in a fused
           layer) and row count: the candidate ``(BLOCK_N, warps, tiles)`` configs with PDL, each checked
           against the torch reference; the best again without PDL, and cuBLAS ``F.linear`` beside it.
           Timing: a CUDA graph of 20 back-to-back calls, each on its own copy of the weight (the
           copies exceed 200 MB, four times the L2, so every call streams from HBM), median of replays,
           per call. Under PDL consecutive calls overlap, as the kernels of a layer do.
``rows``   per decode shape, the few-row matmul (:mod:`executor.few_rows`): its configs at 8 rows (tile,
           then warps and stages), then the best at every ``--sizes`` against cuBLAS (and the SwiGLU kernel).
``tma``    the few-row matmul on the bulk copy engine (:mod:`executor.few_rows_tma`) against the Triton one: per
           projection shape and ``--sizes`` (its ring at several depths, both PDL triggers; every call checked
           against ``F.linear``), then Ouro-1.4B's few-row layers (as ``layers`` times them) on each kernel.
``direct`` the same for the few-row matmul with weights loaded straight into MMA registers
           (:mod:`executor.few_rows_direct`): as built with both triggers and at every split count of K.
``layers`` Ouro-1.4B's four projections per layer, 24 layers of distinct weights in one graph: as the
           chained path runs them up to its most rows (residual + QKV, O, residual + gate/up + SwiGLU, down) with
           and without PDL, and at every ``--sizes`` as the few-row path and the cuBLAS path run them (the latter with
           the Triton norm / SiLU kernels; attention left out), and the few-row path without its residual-norm
           kernels (what folding them into the projections could gain at most): microseconds per layer against
           the weight-read roofline.

    python benchmarks/bench_chain.py --out chain.json [--parts sweep rows tma direct layers] [--sizes 1 2 4 8 16]
        [--quick]

The JSON holds every point, ``config_table`` and ``few_rows_table``: the entries of ``executor.chain.CONFIGS``
and ``executor.few_rows.CONFIGS`` in their source format (also printed), to paste where they differ from the
defaults.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_executor import copy_bandwidth  # noqa: E402  (the same copy-bandwidth reference)

DTYPE = torch.bfloat16
CALLS = 20
REPLAYS = 7
WORKING_SET = 256 * 2**20
EPS = 1e-6


@dataclass(frozen=True)
class Shape:
    name: str
    n: int  # output columns (per half for swiglu)
    k: int
    op: str  # gemv, rmsnorm, residual, swiglu

    @property
    def sandwich(self) -> bool:
        return self.name.startswith("ouro")

    @property
    def weight_rows(self) -> int:
        return 2 * self.n if self.op == "swiglu" else self.n


SHAPES = (
    Shape("ouro.wqkv", 6144, 2048, "residual"),
    Shape("ouro.wo", 2048, 2048, "gemv"),
    Shape("ouro.gate_up", 5632, 2048, "swiglu"),
    Shape("ouro.down", 2048, 5632, "gemv"),
    Shape("ouro.head", 49152, 2048, "gemv"),
    Shape("huginn.wqkv", 15840, 5280, "residual"),
    Shape("huginn.wo", 5280, 5280, "gemv"),
    Shape("huginn.gate_up", 17920, 5280, "swiglu"),
    Shape("huginn.down", 5280, 17920, "gemv"),
    Shape("huginn.adapter", 5280, 10560, "gemv"),
)


def candidates(shape: Shape, quick: bool, rows: int = 1) -> list:
    """Tiles of 4K, 8K or 16K weight elements, about 2 or 4 programs per SM, 4 or 8 warps (quick: the
    default rule's config only)."""
    from executor.chain import default_config

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    swiglu = shape.op == "swiglu"
    if quick:
        return [default_config(shape.n, shape.k, swiglu, sms, rows=rows)]
    out = []
    for elements in (4096, 8192, 16384):
        for per_sm in (2, 4):
            for warps in (4, 8):
                cfg = default_config(shape.n, shape.k, swiglu, sms, elements, per_sm, warps)
                if cfg not in out:
                    out.append(cfg)
    return out


class Point:
    """Inputs for one (shape, M): rotating weight copies, activations, the calls to time."""

    def __init__(self, shape: Shape, m: int = 1) -> None:
        self.shape, self.m = shape, m
        rows, k = shape.weight_rows, shape.k
        self.copies = max(4, math.ceil(WORKING_SET / (rows * k * 2)))
        gen = torch.Generator(device="cuda").manual_seed(0)
        w0 = torch.randn(rows, k, device="cuda", dtype=DTYPE, generator=gen) * k**-0.5
        self.w = [w0] + [w0.clone() for _ in range(self.copies - 1)]
        self.x = torch.randn(m, k, device="cuda", dtype=DTYPE, generator=gen)
        self.branch = torch.randn(m, k, device="cuda", dtype=DTYPE, generator=gen) * 3
        self.w_post = 1 + 0.1 * torch.randn(k, device="cuda", dtype=DTYPE, generator=gen)
        self.w_next = 1 + 0.1 * torch.randn(k, device="cuda", dtype=DTYPE, generator=gen)

    def bytes(self) -> int:
        s, m = self.shape, self.m
        act = {"gemv": m * s.k, "rmsnorm": m * s.k + s.k, "residual": 3 * m * s.k + 2 * s.k,
               "swiglu": 3 * m * s.k + 2 * s.k}[s.op]
        return 2 * (s.weight_rows * s.k + act + m * s.n)

    def chain_call(self, cfg, i: int) -> Callable[[], torch.Tensor]:
        from executor import chain as c

        w, s = self.w[i % self.copies], self.shape
        if s.op == "gemv":
            return lambda: c.gemv(self.x, w, cfg)
        if s.op == "rmsnorm":
            return lambda: c.gemv_rmsnorm(self.x, self.w_post, EPS, w, cfg)
        return lambda: c.gemv_residual(self.branch, self.x, self.w_post, self.w_next, EPS, s.sandwich, w,
                                       s.op == "swiglu", cfg)[0]

    def cublas_call(self, i: int) -> Callable[[], torch.Tensor]:
        w = self.w[i % self.copies]
        return lambda: F.linear(self.x, w)

    def reference(self) -> torch.Tensor:
        from executor import ops

        s = self.shape
        if s.op == "gemv":
            return F.linear(self.x, self.w[0])
        if s.op == "rmsnorm":
            return F.linear(ops.rms_norm(self.x, self.w_post, EPS), self.w[0])
        return ops.gemv_residual(self.branch, self.x, self.w_post, self.w_next, EPS, s.sandwich, self.w[0],
                                 s.op == "swiglu")[0]


def set_pdl(on: bool) -> None:
    os.environ["CDBSIM_PDL"] = "1" if on else "0"


def time_graph(calls: list[Callable[[], object]], per: int) -> float:
    """Microseconds per unit (``len(calls) / per`` units): one graph of all calls, replayed, median."""
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
        times.append(start.elapsed_time(end) * 1e3 / per)
    del graph
    return statistics.median(times)


def measure(point: Point, cfg, pdl: bool) -> dict:
    set_pdl(pdl)
    got = point.chain_call(cfg, 0)()
    want = point.reference()
    diff = (got.float() - want.float()).abs()
    ok = bool((diff <= 1e-2 + 2e-2 * want.float().abs()).all())
    us = time_graph([point.chain_call(cfg, i) for i in range(CALLS)], CALLS) if ok else float("nan")
    return {"shape": point.shape.name, "op": point.shape.op, "m": point.m, "config": list(cfg), "pdl": pdl,
            "us": us, "tbps": point.bytes() / us / 1e6 if ok else float("nan"), "ok": ok,
            "max_error": float(diff.max())}


def sweep(shapes: list[Shape], quick: bool, sizes: tuple[int, ...] = (1,)) -> tuple[list, list]:
    """Per shape and row count (those of ``sizes`` the chained kernels take): every candidate config with PDL,
    the best again without, cuBLAS beside it; the table lines of the best."""
    from executor.chain import MAX_ROWS

    points, table = [], []
    for shape, m in ((shape, m) for shape in shapes for m in sizes if m <= MAX_ROWS):
        point = Point(shape, m)
        rows = [measure(point, cfg, True) for cfg in candidates(shape, quick, m)]
        good = [r for r in rows if r["ok"]]
        if not good:
            points += rows
            print(f"{shape.name}: no candidate matched the reference", flush=True)
            continue
        best = min(good, key=lambda r: r["us"])
        cfg = type(candidates(shape, quick, m)[0])(*best["config"])
        rows.append(measure(point, cfg, False))
        cublas = time_graph([point.cublas_call(i) for i in range(CALLS)], CALLS) if shape.op == "gemv" else None
        print(f"{shape.name:16s} M={m} best {tuple(cfg)} {best['us']:.2f} us ({best['tbps']:.2f} TB/s) with PDL, "
              f"{rows[-1]['us']:.2f} us without" + (f"; cuBLAS {cublas:.2f} us" if cublas else ""), flush=True)
        for r in rows:
            r["cublas_us"] = cublas
        del point
        points += rows
        key = "swiglu" if shape.op == "swiglu" else "gemv"
        table.append(f"    ({key!r}, {shape.n}, {shape.k}, {m}): ChainConfig{tuple(cfg)},  "
                     f"# {shape.name}: {best['us']:.1f} us with PDL")
        torch.cuda.empty_cache()
    return points, table


def few_candidates(shape: Shape, round_: int, best: tuple[int, int] = (16, 256), quick: bool = False) -> list:
    """Round 1: output columns x K chunk (a tile of at most 32K weight elements, both halves with SwiGLU) at
    four warps and four stages; round 2: warps and stages around round 1's best tile (quick: the default). Up to
    12 stages: at 8 a program of Ouro-1.4B's O projection (8 chunks of 256) keeps 7 chunk loads in flight, against 3
    at its shipped 4."""
    from executor.few_rows import FewRowsConfig, default_config

    if quick:
        return [default_config(shape.n, shape.k, shape.op == "swiglu")] if round_ == 1 else []
    halves = 2 if shape.op == "swiglu" else 1
    if round_ == 1:
        return [FewRowsConfig(bn, bk, 4, 4) for bn in (16, 32, 64) for bk in (128, 256, 512)
                if bn * bk * halves <= 32768 and bk <= next_pow2(shape.k)]
    return [FewRowsConfig(*best, warps, stages) for warps in (2, 4, 8) for stages in (2, 3, 4, 6, 8, 12)
            if (warps, stages) != (4, 4)]


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


class RowsPoint(Point):
    """A shape's inputs at up to 16 rows, timed at ``m`` rows on the few-row matmul and on cuBLAS."""

    def few_call(self, cfg, i: int, m: int) -> Callable[[], torch.Tensor]:
        from executor import few_rows

        w, x = self.w[i % self.copies], self.x[:m]
        return lambda: few_rows.linear(x, w, self.shape.op == "swiglu", cfg)

    def cublas_rows_call(self, i: int, m: int) -> Callable[[], torch.Tensor]:
        from executor import triton_kernels as tk

        w, x = self.w[i % self.copies], self.x[:m]
        if self.shape.op == "swiglu":
            return lambda: tk.silu_mul(F.linear(x, w))
        return lambda: F.linear(x, w)

    def check(self, cfg, m: int) -> tuple[bool, float]:
        from executor import triton_kernels as tk

        got = self.few_call(cfg, 0, m)()
        want = F.linear(self.x[:m], self.w[0])
        want = tk.silu_mul(want) if self.shape.op == "swiglu" else want
        diff = (got.float() - want.float()).abs()
        return bool((diff <= 1e-2 + 2e-2 * want.float().abs()).all()), float(diff.max())

    def weight_bytes(self) -> int:
        return 2 * self.shape.weight_rows * self.shape.k


def sweep_rows(shapes: list[Shape], sizes: tuple[int, ...], quick: bool) -> tuple[list, list]:
    """Per shape: the few-row matmul's configs (two rounds at 8 rows), then the best at every size against
    cuBLAS (with the SwiGLU kernel after the gate/up projection); microseconds per call in a graph of 20."""
    from executor.few_rows import FewRowsConfig

    set_pdl(True)
    bw = copy_bandwidth()["bandwidth_Bps"]
    points, table = [], []
    for shape in shapes:
        point = RowsPoint(shape, max(sizes))
        probe = 8 if 8 in sizes else max(sizes)

        def timed(cfg, m: int, point=point) -> dict:
            try:
                ok, err = point.check(cfg, m)
                us = time_graph([point.few_call(cfg, i, m) for i in range(CALLS)], CALLS) if ok else float("nan")
            except Exception as exc:  # a config that does not launch (shared memory): reported, the others go on
                print(f"{point.shape.name} {tuple(cfg)}: {type(exc).__name__}", flush=True)
                ok, err, us = False, float("nan"), float("nan")
            return {"shape": point.shape.name, "op": point.shape.op, "m": m, "config": list(cfg), "us": us, "ok": ok,
                    "max_error": err, "x_roofline": us / (point.weight_bytes() / bw * 1e6)}

        rows = [timed(cfg, probe) for cfg in few_candidates(shape, 1, quick=quick)]
        good = [r for r in rows if r["ok"]]
        if not good:
            print(f"{shape.name}: no config matched the reference", flush=True)
            points += rows
            continue
        best = min(good, key=lambda r: r["us"])
        rows += [timed(cfg, probe) for cfg in few_candidates(shape, 2, tuple(best["config"][:2]), quick)]
        best = min((r for r in rows if r["ok"]), key=lambda r: r["us"])
        cfg = FewRowsConfig(*best["config"])
        for m in sizes:
            row = timed(cfg, m) if m != probe else dict(best)
            cublas = time_graph([point.cublas_rows_call(i, m) for i in range(CALLS)], CALLS)
            row.update(best=True, cublas_us=cublas, cublas_x_roofline=cublas / (point.weight_bytes() / bw * 1e6))
            rows.append(row)
            print(f"{shape.name:16s} M={m:2d} few-row {tuple(cfg)} {row['us']:7.2f} us ({row['x_roofline']:.2f}x) "
                  f"cuBLAS {cublas:7.2f} us ({row['cublas_x_roofline']:.2f}x)", flush=True)
        points += rows
        table.append(f"    ({shape.n}, {shape.k}, {shape.op == 'swiglu'}): FewRowsConfig{tuple(cfg)},  # {shape.name}: "
                     f"{best['us']:.1f} us at M = {probe}")
        del point
        torch.cuda.empty_cache()
    return points, table


class CudaPoint(RowsPoint):
    """A shape's inputs timed on a CUDA C++ few-row kernel (``module``'s ``linear`` with ``args`` after the PDL
    trigger) or the Triton one."""

    def module_call(self, module, i: int, m: int, pdl: int, *args) -> Callable[[], torch.Tensor]:
        w, x = self.w[i % self.copies], self.x[:m]
        return lambda: module.linear(x, w, self.shape.op == "swiglu", pdl, *args)

    def error(self, got: torch.Tensor, m: int) -> tuple[bool, float]:
        from executor import triton_kernels as tk

        want = F.linear(self.x[:m], self.w[0])
        want = tk.silu_mul(want) if self.shape.op == "swiglu" else want
        diff = (got.float() - want.float()).abs()
        return bool((diff <= 1e-2 + 2e-2 * want.float().abs()).all()), float(diff.max())


TMA_VARIANTS = {"tma": {}, "tma-192k": {"ring_kb": 192}, "tma-8warps": {"consumer_warps": 8},
                "tma-warp-arrive": {"warp_arrive": True}, "tma-8seg": {"segments": 8},
                "tma-8seg-8warps": {"segments": 8, "consumer_warps": 8},
                "tma-16seg-8warps-144k": {"segments": 16, "consumer_warps": 8, "ring_kb": 144}}


def tma_rows(sizes: tuple[int, ...]) -> list[dict]:
    """Per projection shape and size: the Triton few-row matmul (its shipped config) and the TMA kernel in every
    setting of :data:`TMA_VARIANTS` (late trigger) and as built with the early trigger, PDL on, microseconds per call
    in a graph of 20; then Ouro-1.4B's few-row layers on each kernel (``CDBSIM_FEW_ROWS_KERNEL``)."""
    from executor import few_rows_tma as tma
    from executor.chain import EARLY, LATE

    def runs(ouro: bool) -> list[tuple[str, int, tuple]]:
        variants = TMA_VARIANTS if ouro else {"tma": {}}
        return ([(name, LATE, (tma.TmaSettings(**kw),)) for name, kw in variants.items()]
                + [("tma-early", EARLY, (tma.TmaSettings(),))])

    return kernel_rows(sizes, tma, runs, "tma", ("triton", "tma"))


def direct_rows(sizes: tuple[int, ...]) -> list[dict]:
    """Per projection shape and size: the Triton few-row matmul (its shipped config) and the direct kernel as built
    (:func:`executor.few_rows_direct.splits_for`, both PDL triggers) and at every split count (Ouro's shapes), PDL
    on, microseconds per call in a graph of 20; then Ouro-1.4B's few-row layers on each kernel."""
    from executor import few_rows_direct as direct
    from executor.chain import EARLY, LATE

    def runs(ouro: bool) -> list[tuple[str, int, tuple]]:
        sweep = [(f"direct-{s}split", LATE, (s,)) for s in range(1, direct.MAX_SPLITS + 1)] if ouro else []
        return [("direct", LATE, ()), ("direct-early", EARLY, ()), *sweep]

    return kernel_rows(sizes, direct, runs, "direct", ("triton", "direct", "direct-all"))


def kernel_rows(sizes: tuple[int, ...], module, runs: Callable[[bool], list[tuple[str, int, tuple]]],
                kernel: str, layer_kernels: tuple[str, ...]) -> list[dict]:
    """Time ``module``'s ``linear`` against the Triton few-row matmul on every projection shape it takes
    (``runs(ouro)``: name, PDL trigger and extra arguments of each variant; Ouro's shapes at every size, others at
    the smallest and largest), each call checked against ``F.linear``; then Ouro-1.4B's few-row layers with
    ``CDBSIM_FEW_ROWS_KERNEL`` set to each of ``layer_kernels``."""
    from executor.few_rows import config_for

    set_pdl(True)
    bw = copy_bandwidth()["bandwidth_Bps"]
    out = []
    for shape in SHAPES:
        ouro = shape.name.startswith("ouro")
        if module.shape_problem(1, shape.n, shape.k, shape.op == "swiglu"):
            continue
        point = CudaPoint(shape, max(sizes))
        roof = point.weight_bytes() / bw * 1e6
        cfg = config_for(shape.n, shape.k, shape.op == "swiglu")
        for m in sizes if ouro else (min(sizes), max(sizes)):
            for name, trigger, args in [("triton", 0, None), *runs(ouro)]:
                def call(i: int, m=m, trigger=trigger, args=args, point=point, cfg=cfg) -> Callable:
                    return point.few_call(cfg, i, m) if args is None else point.module_call(module, i, m, trigger,
                                                                                            *args)

                ok, err = point.error(call(0)(), m)
                us = time_graph([call(i) for i in range(CALLS)], CALLS) if ok else float("nan")
                out.append({"shape": shape.name, "m": m, "kernel": name, "us": us, "ok": ok, "max_error": err,
                            "x_roofline": us / roof})
                print(f"{kernel} {shape.name:16s} M={m:2d} {name:16s} {us:7.2f} us ({us / roof:.2f}x) "
                      f"{'ok' if ok else f'WRONG max error {err:.3g}'}", flush=True)
        del point
        torch.cuda.empty_cache()
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=DTYPE, generator=gen) * scale

    weights = ouro_layer_weights(24, randn)
    norm = 1 + randn(2048, scale=0.1)
    roof = sum(w.numel() * 2 for w in weights[0].values()) / bw * 1e6
    for m in sizes:
        x, branch, o, act = randn(m, 2048), randn(m, 2048), randn(m, 2048), randn(m, 5632)
        for name in layer_kernels:
            os.environ["CDBSIM_FEW_ROWS_KERNEL"] = name
            us = time_graph(few_layer_calls(weights, norm, x, branch, o, act), 24)
            out.append({"shape": "ouro.layer", "m": m, "kernel": name, "us": us, "ok": True, "x_roofline": us / roof})
            print(f"{kernel} layers M={m:2d} {name:10s} {us:7.2f} us/layer ({us / roof:.2f}x)", flush=True)
    os.environ.pop("CDBSIM_FEW_ROWS_KERNEL")
    return out


def few_layer_calls(weights: list[dict], norm: torch.Tensor, x: torch.Tensor, branch: torch.Tensor, o: torch.Tensor,
                    act: torch.Tensor, late: bool | None = None, norm_pdl: bool | None = None, norms: bool = True,
                    configs: dict | None = None) -> list[Callable[[], object]]:
    """Ouro-1.4B's few-row layer as served, per layer of ``weights`` (``qkv``, ``o``, ``gu``, ``down``): residual norm,
    QKV, O, residual norm, gate/up with SwiGLU, down (attention left out). ``configs``: a launch config per
    projection (default: the table's); ``norms=False``: the residual-norm kernels left out (wrong numbers, right
    projections): how much a layer would gain at most if the norms were folded into the projections."""
    from executor import few_rows as fr
    from executor import triton_kernels as tk

    configs = configs or {}

    def normed() -> torch.Tensor:
        return tk.residual_norm(branch, x, norm, norm, EPS, True, norm_pdl)[1] if norms else x

    calls = []
    for w in weights:
        calls += [lambda w=w: fr.linear(normed(), w["qkv"], config=configs.get("qkv"), late=late),
                  lambda w=w: fr.linear(o, w["o"], config=configs.get("o"), late=late),
                  lambda w=w: fr.linear(normed(), w["gu"], True, config=configs.get("gu"), late=late),
                  lambda w=w: fr.linear(act, w["down"], config=configs.get("down"), late=late)]
    return calls


def ouro_layer_weights(layers: int, randn: Callable[..., torch.Tensor], h: int = 2048, i: int = 5632) -> list[dict]:
    """``layers`` distinct random copies of Ouro-1.4B's four projection weights (``qkv``, ``o``, ``gu``, ``down``)."""
    return [dict(qkv=randn(3 * h, h, scale=h**-0.5), o=randn(h, h, scale=h**-0.5),
                 gu=randn(2 * i, h, scale=h**-0.5), down=randn(h, i, scale=i**-0.5)) for _ in range(layers)]


def layer_chain(layers: int = 24, sizes: tuple[int, ...] = (1,)) -> list[dict]:
    """Ouro-1.4B's projections, per layer: on the chained path up to its most rows (PDL on, off); at every size on
    the few-row path (PDL on, off) and on the cuBLAS path (norm and SwiGLU kernels PDL-launched)."""
    from executor import chain as c
    from executor import triton_kernels as tk

    h, i = 2048, 5632
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=DTYPE, generator=gen) * scale

    weights = ouro_layer_weights(layers, randn, h, i)
    norm = 1 + randn(h, scale=0.1)
    weight_bytes = sum(w.numel() * 2 for w in weights[0].values())
    bw = copy_bandwidth()["bandwidth_Bps"]
    out = []
    for m in sizes:
        x, branch, o, act = randn(m, h), randn(m, h), randn(m, h), randn(m, i)

        def chained(x=x, branch=branch, o=o, act=act) -> list[Callable[[], object]]:
            calls = []
            for w in weights:
                calls += [lambda w=w: c.gemv_residual(branch, x, norm, norm, EPS, True, w["qkv"]),
                          lambda w=w: c.gemv(o, w["o"]),
                          lambda w=w: c.gemv_residual(branch, x, norm, norm, EPS, True, w["gu"], True),
                          lambda w=w: c.gemv(act, w["down"])]
            return calls

        def default(x=x, branch=branch, o=o, act=act) -> list[Callable[[], object]]:
            calls = []
            for w in weights:
                calls += [lambda w=w: F.linear(tk.residual_norm(branch, x, norm, norm, EPS, True)[1], w["qkv"]),
                          lambda w=w: F.linear(o, w["o"]),
                          lambda w=w: tk.silu_mul(F.linear(tk.residual_norm(branch, x, norm, norm, EPS, True)[1],
                                                           w["gu"])),
                          lambda w=w: F.linear(act, w["down"])]
            return calls

        def few(x=x, branch=branch, o=o, act=act, late=None, norm_pdl=None, norms=True
                ) -> list[Callable[[], object]]:
            return few_layer_calls(weights, norm, x, branch, o, act, late, norm_pdl, norms)

        paths = [("few+pdl-late", lambda: few(late=True), True),
                 ("few+pdl-late,no-norm-kernels", lambda: few(late=True, norms=False), True),
                 ("few+pdl-early", lambda: few(late=False), True),
                 ("few+pdl-late,plain-norms", lambda: few(late=True, norm_pdl=False), True),
                 ("few+pdl-early,plain-norms", lambda: few(late=False, norm_pdl=False), True),
                 ("few", few, False), ("default+pdl", default, True), ("default", default, False)]
        if m <= c.MAX_ROWS:  # the rows the chained kernels take
            paths = [("chained+pdl", chained, True), ("chained", chained, False), *paths]
        for name, make, pdl in paths:
            set_pdl(pdl)
            us = time_graph(make(), layers)
            row = {"path": name, "m": m, "us_per_layer": us, "roofline_us": weight_bytes / bw * 1e6,
                   "x_roofline": us / (weight_bytes / bw * 1e6)}
            out.append(row)
            print(f"layers M={m} {name:12s} {us:.2f} us/layer = {row['x_roofline']:.2f}x the weight-read roofline "
                  f"({row['roofline_us']:.2f} us)", flush=True)
    set_pdl(True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--parts", nargs="+", choices=("sweep", "rows", "tma", "direct", "layers"),
                        default=["sweep", "layers"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1],
                        help="rows of every part (the sweep part: those the chained kernels take)")
    parser.add_argument("--shapes", nargs="+", choices=[s.name for s in SHAPES], help="limit the sweep")
    parser.add_argument("--quick", action="store_true", help="one config per shape (the default rule's size)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_chain.py needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    result: dict = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                             "calls_per_graph": CALLS, "replays": REPLAYS, "working_set_bytes": WORKING_SET}}
    if "sweep" in args.parts:
        shapes = [s for s in SHAPES if not args.shapes or s.name in args.shapes]
        result["points"], result["config_table"] = sweep(shapes, args.quick, tuple(args.sizes))
        print("\n".join(result["config_table"]))
    if "rows" in args.parts:
        shapes = [s for s in SHAPES if (not args.shapes or s.name in args.shapes) and s.name != "ouro.head"]
        result["rows"], result["few_rows_table"] = sweep_rows(shapes, tuple(args.sizes), args.quick)
        print("\n".join(result["few_rows_table"]))
    if "tma" in args.parts:
        result["tma"] = tma_rows(tuple(args.sizes))
    if "direct" in args.parts:
        result["direct"] = direct_rows(tuple(args.sizes))
    if "layers" in args.parts:
        result["layers"] = layer_chain(sizes=tuple(args.sizes))
    result["meta"]["wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
