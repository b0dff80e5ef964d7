"""Benchmark the chained skinny-matmul kernels of :mod:`executor.chain` and pick their configs.

Two parts (``--parts``):

``sweep``  per decode shape (Ouro-1.4B and Huginn-3.5B projections, the op that feeds each in a fused
           layer) and row count (``--rows``): the candidate configs with PDL (one row: ``(BLOCK_N, warps,
           tiles)`` of the CUDA-core kernel; more: ``(BLOCK_N, BLOCK_K, warps, stages)`` of the tensor-core
           one), each checked against the torch reference; the best again without PDL, and beside it the
           default path the engine takes without the chain (Triton norm / SwiGLU kernels, cuBLAS ``F.linear``).
           Timing: a CUDA graph of 20 back-to-back calls, each on its own copy of the weight (the
           copies exceed 200 MB, four times the L2, so every call streams from HBM), median of replays,
           per call. Under PDL consecutive calls overlap, as the kernels of a layer do.
``layers`` Ouro-1.4B's and Huginn-3.5B's four projections per layer at each row count, layers of distinct
           weights in one graph (twice the L2 at least), as the fused path runs them (residual + QKV, O,
           residual + gate/up + SwiGLU, down) with and without PDL, against the default path's cuBLAS
           projections and Triton norm / SiLU kernels (attention left out of both): microseconds per layer
           against the weight-read roofline.

    python benchmarks/bench_chain.py --out chain.json [--parts sweep layers] [--rows 1 2 8 16 32] [--quick]

The JSON holds every point and ``config_table``, the entries of ``executor.chain.CONFIGS`` (one row) and
``ROWS_CONFIGS`` (the config fastest over all the row counts swept) in their source format (also
printed), to paste where they differ from the defaults.
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
from triton.runtime.errors import OutOfResources  # noqa: E402

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


def candidates(shape: Shape, quick: bool, m: int = 1) -> list:
    """One row: tiles of 4K, 8K or 16K weight elements, about 2 or 4 programs per SM, 4 or 8 warps. More
    rows: 16, 32 or 64 columns per program, steps of 128 or 256 weight columns, 3 or 5 stages. Quick:
    the default rule's config only."""
    from executor import chain as c

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    swiglu = shape.op == "swiglu"
    if m > 1:
        if quick:
            return [c.default_rows_config(shape.n, shape.k, sms)]
        return [c.RowsConfig(n, k, 4, stages) for n in (16, 32, 64) for k in (128, 256) for stages in (3, 5)]
    if quick:
        return [c.default_config(shape.n, shape.k, swiglu, sms)]
    out = []
    for elements in (4096, 8192, 16384):
        for per_sm in (2, 4):
            for warps in (4, 8):
                cfg = c.default_config(shape.n, shape.k, swiglu, sms, elements, per_sm, warps)
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

    def default_call(self, i: int) -> Callable[[], torch.Tensor]:
        """The op as the engine runs it off the chain: Triton norm / SwiGLU kernels around cuBLAS."""
        from executor import triton_kernels as tk

        w, s = self.w[i % self.copies], self.shape
        if s.op == "gemv":
            return lambda: F.linear(self.x, w)
        if s.op == "rmsnorm":
            return lambda: F.linear(tk.rms_norm(self.x, self.w_post, EPS), w)
        out = (lambda: tk.silu_mul(F.linear(tk.residual_norm(self.branch, self.x, self.w_post, self.w_next, EPS,
                                                             s.sandwich)[1], w))) if s.op == "swiglu" else \
            (lambda: F.linear(tk.residual_norm(self.branch, self.x, self.w_post, self.w_next, EPS, s.sandwich)[1], w))
        return out

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
        for call in calls[:4]:  # every kernel of a layer compiled (and refused) before capture
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
    try:
        got = point.chain_call(cfg, 0)()
    except OutOfResources as exc:  # a config whose pipeline does not fit shared memory
        return {"shape": point.shape.name, "op": point.shape.op, "m": point.m, "config": list(cfg), "pdl": pdl,
                "us": float("nan"), "tbps": float("nan"), "ok": False, "max_error": float("nan"), "error": str(exc)}
    want = point.reference()
    diff = (got.float() - want.float()).abs()
    ok = bool((diff <= 1e-2 + 2e-2 * want.float().abs()).all())
    us = time_graph([point.chain_call(cfg, i) for i in range(CALLS)], CALLS) if ok else float("nan")
    return {"shape": point.shape.name, "op": point.shape.op, "m": point.m, "config": list(cfg), "pdl": pdl,
            "us": us, "tbps": point.bytes() / us / 1e6 if ok else float("nan"), "ok": ok,
            "max_error": float(diff.max())}


def sweep(shapes: list[Shape], rows: list[int], quick: bool) -> tuple[list, list, dict]:
    """Every point, the config table's lines, and the few-row configs chosen (``ROWS_CONFIGS`` entries)."""
    from executor.chain import RowsConfig

    points, table, chosen = [], [], {}
    for shape in shapes:
        few: dict[tuple, list[float]] = {}  # few-row config -> its microseconds at each row count
        for m in rows:
            point = Point(shape, m)
            tried = [measure(point, cfg, True) for cfg in candidates(shape, quick, m)]
            good = [r for r in tried if r["ok"]]
            if not good:
                points += tried
                print(f"{shape.name}: M={m} no candidate matched the reference", flush=True)
                continue
            best = min(good, key=lambda r: r["us"])
            cfg = type(candidates(shape, quick, m)[0])(*best["config"])
            tried.append(measure(point, cfg, False))
            default = time_graph([point.default_call(i) for i in range(CALLS)], CALLS)
            print(f"{shape.name:16s} M={m:<3d} best {tuple(cfg)} {best['us']:.2f} us ({best['tbps']:.2f} TB/s) "
                  f"with PDL, {tried[-1]['us']:.2f} us without; default path {default:.2f} us", flush=True)
            for r in tried:
                r["default_us"] = default
                if m > 1 and r["pdl"] and r["ok"]:
                    few.setdefault(tuple(r["config"]), []).append(r["us"])
            del point
            points += tried
            key = "swiglu" if shape.op == "swiglu" else "gemv"
            if m == 1:
                table.append(f"    ({key!r}, {shape.n}, {shape.k}): ChainConfig{tuple(cfg)},  # {shape.name}: "
                             f"{best['us']:.1f} us with PDL")
            torch.cuda.empty_cache()
        everywhere = {c: sum(us) for c, us in few.items() if len(us) == sum(m > 1 for m in rows)}
        if everywhere:  # the config that matched at every row count and is fastest summed over them
            cfg = RowsConfig(*min(everywhere, key=everywhere.get))
            chosen[(key, shape.n, shape.k)] = cfg
            table.append(f"    ({key!r}, {shape.n}, {shape.k}): RowsConfig{tuple(cfg)},  # {shape.name}: "
                         f"{everywhere[tuple(cfg)]:.1f} us summed over M = {', '.join(str(m) for m in rows if m > 1)}")
    return points, table


LAYER_SHAPES = {"ouro-1.4b": (2048, 5632, 6144, True), "huginn-3.5b": (5280, 17920, 15840, False)}


def layer_chain(model: str, rows: list[int]) -> list[dict]:
    """One model's projections, per layer, on the chained path (PDL on, off) and on the default path, at
    each row count."""
    from executor import chain as c
    from executor import triton_kernels as tk

    h, i, qkv, sandwich = LAYER_SHAPES[model]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=DTYPE, generator=gen) * scale

    weight_bytes = 2 * h * (qkv + h + 3 * i)
    layers = max(8, math.ceil(2 * WORKING_SET / weight_bytes))
    weights = [dict(qkv=randn(qkv, h, scale=h**-0.5), o=randn(h, h, scale=h**-0.5),
                    gu=randn(2 * i, h, scale=h**-0.5), down=randn(h, i, scale=i**-0.5)) for _ in range(layers)]
    norm = 1 + randn(h, scale=0.1)
    bw = copy_bandwidth()["bandwidth_Bps"]
    out = []
    for m in rows:
        x, branch, o, act = randn(m, h), randn(m, h), randn(m, h), randn(m, i)

        def chained(x=x, branch=branch, o=o, act=act) -> list[Callable[[], object]]:
            calls = []
            for w in weights:
                calls += [lambda w=w: c.gemv_residual(branch, x, norm, norm, EPS, sandwich, w["qkv"]),
                          lambda w=w: c.gemv(o, w["o"]),
                          lambda w=w: c.gemv_residual(branch, x, norm, norm, EPS, sandwich, w["gu"], True),
                          lambda w=w: c.gemv(act, w["down"])]
            return calls

        def default(x=x, branch=branch, o=o, act=act) -> list[Callable[[], object]]:
            def normed() -> torch.Tensor:
                return tk.residual_norm(branch, x, norm, norm, EPS, sandwich)[1]

            calls = []
            for w in weights:
                calls += [lambda w=w: F.linear(normed(), w["qkv"]), lambda w=w: F.linear(o, w["o"]),
                          lambda w=w: tk.silu_mul(F.linear(normed(), w["gu"])), lambda w=w: F.linear(act, w["down"])]
            return calls

        roofline = (weight_bytes + 2 * m * (4 * h + 2 * i + qkv)) / bw * 1e6
        for name, make, pdl in (("chained+pdl", chained, True), ("chained", chained, False),
                                ("default", default, False)):
            set_pdl(pdl)
            try:
                us = time_graph(make(), layers)
            except OutOfResources as exc:  # a swept config that does not fit at this many rows
                print(f"layers {model} M={m:<3d} {name:12s} failed: {exc}", flush=True)
                continue
            row = {"model": model, "path": name, "m": m, "us_per_layer": us, "roofline_us": roofline,
                   "x_roofline": us / roofline}
            out.append(row)
            print(f"layers {model} M={m:<3d} {name:12s} {us:7.2f} us/layer = {row['x_roofline']:.2f}x the "
                  f"weight-read roofline ({roofline:.2f} us)", flush=True)
    set_pdl(True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--parts", nargs="+", choices=("sweep", "layers"), default=["sweep", "layers"])
    parser.add_argument("--shapes", nargs="+", choices=[s.name for s in SHAPES], help="limit the sweep")
    parser.add_argument("--rows", type=int, nargs="+", default=[1], help="row counts (default 1)")
    parser.add_argument("--layer-rows", type=int, nargs="+", help="row counts of the layers part (default --rows)")
    parser.add_argument("--models", nargs="+", choices=list(LAYER_SHAPES), default=list(LAYER_SHAPES),
                        help="models of the layers part")
    parser.add_argument("--quick", action="store_true", help="one config per shape (the default rule's size)")
    args = parser.parse_args(argv)
    from executor.chain import MAX_ROWS

    args.layer_rows = args.layer_rows or args.rows
    if not all(1 <= m <= MAX_ROWS for m in args.rows + args.layer_rows):
        parser.error(f"--rows and --layer-rows must lie in 1..{MAX_ROWS}, got {args.rows} and {args.layer_rows}")
    if not torch.cuda.is_available():
        print("error: bench_chain.py needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    result: dict = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                             "calls_per_graph": CALLS, "replays": REPLAYS, "working_set_bytes": WORKING_SET}}
    if "sweep" in args.parts:
        shapes = [s for s in SHAPES if not args.shapes or s.name in args.shapes]
        result["points"], result["config_table"], swept = sweep(shapes, args.rows, args.quick)
        print("\n".join(result["config_table"]))
        from executor import chain

        chain.ROWS_CONFIGS.update(swept)  # the layers part below runs the few-row kernel on what was just swept
    if "layers" in args.parts:
        result["layers"] = []
        for model in args.models:
            result["layers"] += layer_chain(model, args.layer_rows)
            torch.cuda.empty_cache()
    result["meta"]["wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
