"""Kernel-level calibration: time the kernels the executor launches over a grid that spans the design space.

What a stage of *any* looped model costs is composed from these tables by :mod:`cdbsim.latency.kernels`. Each
kernel is timed through the executor's own code (``F.linear`` for cuBLAS GEMMs; :class:`executor.ops.Ops`
for the few-row matmul, the Triton norm, SwiGLU, RoPE/KV-write and attention kernels and the chained
kernels; the engine's real stages for the glue around them), as a CUDA graph that runs a chain of the kernel on
distinct inputs (distinct weights, distinct KV cache layers) so that launch gaps, PDL overlap and L2 misses
are those of a stage, queued behind a spin kernel (:class:`calibration.measure.Timer`). A kernel's time is
the chain's over its length.

Families (see ``TABLE_DIMS`` in :mod:`cdbsim.latency.kernels` for each table's dimensions):

* ``gemm``: tokens m 1..8,192 (powers of two and midpoints) x output n x input k over hidden sizes
  1,024-8,192 and intermediate sizes up to 24,576, non-powers of two included;
* ``few_gemm``: the few-row matmul (:mod:`executor.few_rows`) at the GEMM grid's points a few-row launch reaches
  (at most 16 rows, models up to 2,048 wide), and the rule of the build (``few_rows``: which launches take it);
* ``few_swiglu``: the same kernel as the gate/up projection runs it, SwiGLU in its epilogue, at those points
  whose output is at least twice their input (``I`` x ``h``);
* ``gemv``: the chained kernels (plain, with an RMSNorm prologue, with a residual+norm prologue, with SwiGLU)
  at one and two rows for models up to 2,048 wide, and the rule of the build (``chained_rows``);
* ``rope_kv``, ``decode_attention`` (paged, split-KV, with its merge), ``chained_attention`` (RoPE, KV write
  and attention in one kernel, single rows), ``prefill_attention``: rows x heads, GQA groups 1-8, head
  sizes 64/96/128, contexts 32-16,384 (``rope_kv`` also over prefill launches, past the decode grid);
* ``rms_norm``, ``residual_norm``, ``silu_mul``: rows x width;
* ``prelude0``, ``coda0``, ``core_glue``, ``prefill_glue``, ``adapter``: the engine's real stages on unit
  models of each layer style, hidden size and vocabulary (glue = 2 x one-layer - two-layer, so the layer
  cancels);
* whole layers of probe shapes, from which the per-kernel gap is fitted; core steps whose rows have
  different contexts, from which the attention width per head size is fitted (:mod:`cdbsim.latency.gpu_work`);
  the copy bandwidth (for the last-exited fill); the host time per launch and the metadata copy;
* ``sustained``: a long prefill replayed back to back, from which the onset and slowdown of the board's
  power limit are fitted (:mod:`cdbsim.latency.power`; the tables above are timed in short bursts, on a rested board).

Families are measured one after another and written as they finish, so a run cut short keeps what it
measured.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from calibration.fit import attention_record, fit_attention_width, fit_gaps, fit_mixed_sharpness
from calibration.measure import (
    Timer,
    UnitBench,
    back_to_back,
    environment,
    measure_host,
    measure_meta_copy,
    spread_contexts,
)
from cdbsim.latency.devices import H200
from cdbsim.latency.gpu_work import CHAINED_MAX_HIDDEN, CHAINED_ROWS, FEW_ROWS_MAX, FEW_ROWS_MAX_HIDDEN
from cdbsim.latency.kernels import GEMV_OPS, PROBE_SHAPES, STYLE_CODE, TABLE_DIMS
from cdbsim.latency.power import RESTED_REPLAYS, fit_replays
from cdbsim.latency.profile import Profile, ProfileKind, fit_points
from cdbsim.model.arch import ArchSpec, KVLayout, LayerShape, LayerStyle
from cdbsim.serving.launch import Stage, decode_launch, prefill_launch
from executor.ops import Ops

L2_BYTES = 50 * 2 ** 20  # an H200's L2 is 50 MB: a chain reads at least twice that before it repeats
MAX_CHAIN = 32


@dataclass(frozen=True)
class KernelPlan:
    """The grid. ``quick()`` keeps a few points per family (a smoke run)."""

    gemm_m: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048,
                               4096, 8192)
    gemm_n: tuple[int, ...] = (1024, 1536, 2048, 2560, 3072, 4096, 5280, 6144, 8192, 11264, 12288, 15840, 16384,
                               17920, 24576, 35840, 49152)
    gemm_k: tuple[int, ...] = (1024, 1536, 2048, 2560, 3072, 4096, 5280, 5632, 6144, 8192, 11008, 12288, 17920,
                               24576)
    gemm_max_weight: int = 49152 * 8192       # n x k beyond this is no layer of the design space
    gemv_n: tuple[int, ...] = (512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 11264, 16384)
    gemv_k: tuple[int, ...] = (512, 1024, 1536, 2048, 3072, 4096, 5632, 8192)
    attention_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    attention_heads: int = 8                  # rows x heads is what the kernels' grids follow
    attention_lengths: tuple[int, ...] = (32, 128, 512, 2048, 8192, 16384)
    head_dims: tuple[int, ...] = (64, 96, 128)
    groups: tuple[int, ...] = (1, 2, 4, 8)
    max_positions: int = 2 ** 20              # rows x context per decode-attention point
    chained_heads: tuple[int, ...] = (8, 16, 32)
    prefill_tokens: tuple[int, ...] = (16, 64, 256, 1024, 4096, 8192)
    prefill_chunks: tuple[int, ...] = (1, 8, 32)
    prefill_prefix: tuple[int, ...] = (0, 2048)
    prefill_heads: tuple[int, ...] = (8, 32, 64)  # 64: Huginn-3.5B's 55 heads inside the grid
    prefill_groups: tuple[int, ...] = (1, 4)
    rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    widths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384, 24576)
    glue_hidden: tuple[int, ...] = (1024, 2048, 4096, 8192)
    glue_vocab: tuple[int, ...] = (32768, 131072, 262144)
    glue_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    glue_prefill: tuple[tuple[int, int], ...] = ((16, 1), (64, 1), (256, 1), (1024, 1), (4096, 1), (8192, 1),
                                                 (128, 8), (512, 8), (2048, 8), (512, 32), (2048, 32))
    probes: tuple[LayerShape, ...] = PROBE_SHAPES
    probe_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    probe_lengths: tuple[int, ...] = (128, 2048)
    probe_positions: int = 2 ** 18            # batch x context per probe point (keeps the probes' KV small)
    skew_points: tuple[tuple[int, int, int, int], ...] = (
        (2, 256, 4096, 1), (4, 256, 4096, 1), (8, 128, 4096, 1), (16, 128, 4096, 1), (16, 512, 4096, 4),
        (32, 128, 2048, 1), (48, 32, 1024, 2), (64, 32, 512, 8))
    # the head layout of the mixed-context points: as many heads as the models the tool is asked about, MHA
    # and GQA. Eight MHA heads fitted a width that charged long rows too little in core steps of 20-32-head
    # GQA shapes (3-10% short, benchmarks/results/decode-profile/decode-profile-skew.csv)
    # served batches: rows whose contexts spread evenly in log length from the shortest to the longest, in a graph
    # of more rows than are real (padded, rows, shortest, longest; shortest = longest: a padded uniform batch).
    # The few-long points above alone fitted a rule that served ShareGPT core steps 3-9% short at continuous
    # mixtures and charged a graph's padded rows as real ones (benchmarks/results/decode-profile/served-shapes.csv)
    spread_points: tuple[tuple[int, int, int, int], ...] = (
        (2, 2, 600, 6000), (4, 4, 400, 6000), (8, 8, 300, 6000), (16, 16, 300, 6000), (32, 32, 200, 4000),
        (64, 64, 100, 2000), (12, 9, 300, 6000), (24, 17, 300, 6000), (16, 13, 2500, 2500), (24, 17, 2500, 2500),
        (64, 40, 1000, 1000))
    # whole probe layers at those mixtures, (real rows, shortest, longest), padded as the engine pads: they
    # choose the sharpness, since a long row's tail is exposed in a layer as it may not be in a chain of
    # attention launches
    mixed_probe_points: tuple[tuple[int, int, int], ...] = (
        (2, 600, 6000), (4, 400, 6000), (8, 300, 6000), (13, 300, 6000), (16, 300, 6000), (24, 300, 6000),
        (32, 200, 4000), (13, 2500, 2500), (17, 2500, 2500))
    skew_heads: int = 32
    skew_groups: tuple[int, ...] = (1, 4)
    # the power limit: after a rest and decode-type load, a prefill of this probe shape (four layers, two
    # chunks of half the tokens) replayed back to back for this long
    sustained_probe: int = 4
    sustained_tokens: int = 4096
    sustained_rest_s: float = 1.0
    sustained_lead_s: float = 0.5
    sustained_s: float = 1.0
    repeats: int = 7
    warmup: int = 2

    @property
    def decode_units(self) -> int:
        """Rows x heads of the decode grid's largest launch (``rope_kv`` rows beyond it come from prefill)."""
        return max(self.attention_rows) * self.attention_heads

    @classmethod
    def quick(cls) -> KernelPlan:
        return cls(gemm_m=(1, 8, 64, 512, 2048), gemm_n=(1024, 4096, 16384), gemm_k=(1024, 4096, 16384),
                   gemv_n=(1024, 4096), gemv_k=(1024, 2048), attention_rows=(1, 8, 64, 512),
                   attention_lengths=(128, 2048), head_dims=(64, 128), groups=(1, 4), chained_heads=(16,),
                   prefill_tokens=(64, 1024), prefill_chunks=(1, 8), prefill_prefix=(0,), prefill_groups=(1,),
                   rows=(1, 16, 256, 4096), widths=(1024, 8192), glue_hidden=(1024, 4096),
                   glue_vocab=(32768, 131072), glue_batches=(1, 8, 64, 256),
                   glue_prefill=((64, 1), (1024, 1), (512, 8)), probe_batches=(1, 16, 128),
                   probe_lengths=(512,), skew_points=((8, 128, 2048, 1), (32, 64, 1024, 2)),
                   spread_points=((8, 8, 128, 2048), (24, 17, 1024, 1024)),
                   mixed_probe_points=((4, 128, 1024), (3, 512, 512)), sustained_probe=0, sustained_tokens=256,
                   sustained_rest_s=0.0, sustained_lead_s=0.05, sustained_s=0.3, repeats=4)

    def mixed_points(self) -> list[tuple[int, list[int]]]:
        """``(padded rows, context of each real row)`` of the mixed-context attention points: the few-long
        ``skew_points`` and the ``spread_points``, within ``max_positions``."""
        points = [(b, [long] * n_long + [short] * (b - n_long)) for b, short, long, n_long in self.skew_points]
        points += [(padded, spread_contexts(rows, shortest, longest))
                   for padded, rows, shortest, longest in self.spread_points]
        return [(b, contexts) for b, contexts in points if sum(contexts) <= self.max_positions]

    def gemm_points(self) -> list[tuple[int, int, int]]:
        return [(m, n, k) for n in self.gemm_n for k in self.gemm_k if n * k <= self.gemm_max_weight
                for m in self.gemm_m]


# ----- timing a chain ------------------------------------------------------------------------------------
class ChainTimer:
    """Seconds per call of a CUDA graph that runs ``calls`` one after another (eagerly on a CPU)."""

    def __init__(self, device: torch.device, plan: KernelPlan) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.timer = Timer(device, plan.repeats, plan.warmup)

    def __call__(self, calls: list[Callable[[], object]]) -> float:
        def run() -> None:
            for call in calls:
                call()

        with torch.inference_mode():
            if not self.cuda:
                return self.timer(run) / len(calls)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run()  # compiles kernels, picks cuBLAS algorithms
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # a private pool, freed with the graph
                run()
            seconds = self.timer(graph.replay) / len(calls)
            del graph
            return seconds


def chain_length(bytes_per_call: float) -> int:
    """Calls per chain: enough distinct inputs that the chain reads twice the L2 before repeating."""
    return int(min(MAX_CHAIN, max(1, -(-2 * L2_BYTES // max(bytes_per_call, 1)))))


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# ----- the families --------------------------------------------------------------------------------------
def measure_gemm(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[m, n, k, t]``: ``F.linear`` of ``[m, k]`` by ``[n, k]`` (cuBLAS)."""
    return _time_matmuls(plan.gemm_points(), F.linear, "gemm", chain, progress)


def _time_matmuls(points: list[tuple[int, int, int]], matmul: Callable[[torch.Tensor, torch.Tensor], object],
                  label: str, chain: ChainTimer, progress: Callable[[str], None],
                  weight_rows: int = 1) -> list[list[float]]:
    """``[m, n, k, t]`` of ``matmul(x [m, k], w [weight_rows * n, k])`` at ``points``, each a chain over distinct
    weights."""
    device, dtype = chain.device, _dtype(chain.device)
    rows = []
    for n, k in sorted({(n, k) for _, n, k in points}):
        count = chain_length(2 * weight_rows * n * k)
        weights = [torch.randn(weight_rows * n, k, device=device, dtype=dtype) * 0.02 for _ in range(count)]
        for m in sorted({m for m, n2, k2 in points if (n2, k2) == (n, k)}):
            progress(f"{label} m={m} n={n} k={k}")
            x = torch.randn(m, k, device=device, dtype=dtype)
            rows.append([m, n, k, chain([lambda w=w, x=x: matmul(x, w) for w in weights])])
        del weights
    return rows


def few_gemm_points(plan: KernelPlan) -> list[tuple[int, int, int]]:
    """The GEMM grid's points a few-row launch can reach: at most ``FEW_ROWS_MAX`` rows, and (n, k) pairs of
    a model no wider than ``FEW_ROWS_MAX_HIDDEN`` (its hidden size is one of the two)."""
    return [(m, n, k) for m, n, k in plan.gemm_points() if m <= FEW_ROWS_MAX and min(n, k) <= FEW_ROWS_MAX_HIDDEN]


def measure_few_gemm(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[m, n, k, t]``: the few-row matmul (:mod:`executor.few_rows`; ``F.linear`` on a CPU) of ``[m, k]`` by
    ``[n, k]``, chained under PDL as a layer runs it."""
    ops = Ops(_backend(chain.device), few_rows=FEW_ROWS_MAX)
    return _time_matmuls(few_gemm_points(plan), ops.linear, "few_gemm", chain, progress)


def few_swiglu_points(plan: KernelPlan) -> list[tuple[int, int, int]]:
    """``(m, I, h)`` of the few-row gate/up projections: the few-row points whose output is at least twice
    their input (a SwiGLU MLP's ``2I``: I is 2.5-3.5 times the hidden size in the shapes calibrated), halved."""
    return [(m, n // 2, k) for m, n, k in few_gemm_points(plan) if n >= 2 * k and n % 2 == 0]


def measure_few_swiglu(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[m, I, k, t]``: the few-row matmul of the fused gate/up weight ``[2I, k]`` with SwiGLU in its epilogue, as
    a layer runs it (its own launch configuration; ``silu_mul(F.linear)`` on a CPU)."""
    ops = Ops(_backend(chain.device), few_rows=FEW_ROWS_MAX)
    return _time_matmuls(few_swiglu_points(plan), ops.linear_swiglu, "few_swiglu", chain, progress, weight_rows=2)


def gemv_points(plan: KernelPlan) -> list[tuple[str, int, int]]:
    """``(op, n, k)`` of the chained kernels a layer can launch: it runs on models no wider than
    :data:`~cdbsim.latency.gpu_work.CHAINED_MAX_HIDDEN`, so the ops whose input is the hidden state (the QKV and
    gate/up projections, with their norm or residual prologue) take ``k`` up to that width, and the plain one
    (O and down, whose output is the hidden state) ``n`` up to it. Points past those would never be read; on
    the H200 they took more than half of the family's 134 s."""
    out = []
    for op in GEMV_OPS:
        for n, k in itertools.product(plan.gemv_n, plan.gemv_k):
            if (k if op != "gemv" else n) <= CHAINED_MAX_HIDDEN:
                out.append((op, n, k))
    return out


def measure_gemv(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[op, rows, n, k, t]``: the chained kernels (:mod:`executor.chain`) at every row count the chained path
    takes (:data:`~cdbsim.latency.gpu_work.CHAINED_ROWS`), at :func:`gemv_points`."""
    device, dtype = chain.device, _dtype(chain.device)
    ops = Ops(_backend(device), fuse_rows=CHAINED_ROWS)
    out = []
    for (op, n, k), rows in itertools.product(gemv_points(plan), range(1, CHAINED_ROWS + 1)):
        code = GEMV_OPS[op]
        width = 2 * n if op == "swiglu" else n
        progress(f"gemv {op} rows={rows} n={n} k={k}")
        count = chain_length(2 * width * k)
        ws = [torch.randn(width, k, device=device, dtype=dtype) * 0.02 for _ in range(count)]
        x, branch = (torch.randn(rows, k, device=device, dtype=dtype) for _ in range(2))
        norm = torch.ones(k, device=device, dtype=dtype)
        calls = [_gemv_call(ops, op, w, x, branch, norm) for w in ws]
        out.append([code, rows, n, k, chain(calls)])
    return out


def _gemv_call(ops: Ops, op: str, w: torch.Tensor, x: torch.Tensor, branch: torch.Tensor,
               norm: torch.Tensor) -> Callable[[], object]:
    if op == "gemv":
        return lambda: ops.gemv(x, w)
    if op == "rmsnorm":
        return lambda: ops.gemv_rmsnorm(x, norm, 1e-6, w)
    return lambda: ops.gemv_residual(branch, x, norm, norm, 1e-6, True, w, swiglu=op == "swiglu")


def attention_unit(heads: int, group: int, head_dim: int, layers: int = 8) -> ArchSpec:
    """A model whose only role is to hold a KV cache of ``layers`` layers with this head layout."""
    layer = LayerShape(hidden=heads * head_dim, intermediate=64, heads=heads, kv_heads=max(1, heads // group),
                       head_dim=head_dim, style=LayerStyle.OURO)
    return ArchSpec(name=f"attention-{heads}x{head_dim}-g{group}", layer=layer, vocab=256, prelude=0,
                    core=layers, coda=0, r_max=1)


class AttentionBench:
    """The executor's RoPE/KV-write and attention kernels on a cache of eight layers (so a chain reads
    distinct KV, as a step's layers do), with metadata the engine prepares for synthetic launches."""

    def __init__(self, heads: int, group: int, head_dim: int, max_rows: int, max_context: int,
                 max_positions: int, device: torch.device, timer: Timer) -> None:
        self.arch = attention_unit(heads, group, head_dim)
        self.bench = UnitBench(self.arch, max_rows, max_context + 1, max_positions, KVLayout.SHARED, device, timer)
        self.engine = self.bench.engine
        self.device, self.dtype = device, self.engine.model.dtype
        self.ops = Ops(_backend(device))
        self.chained = Ops(_backend(device), fuse_rows=1)
        s = self.arch.layer
        self.qkv_width = (s.heads + 2 * s.kv_heads) * s.head_dim

    def _views(self, rows: int, contexts: list[int]):
        """Metadata of a launch of ``rows`` rows in the graph, the first ``len(contexts)`` of them real (the
        rest padding, as the engine pads a graph)."""
        launch = decode_launch(Stage.CORE, list(range(len(contexts))), [c - 1 for c in contexts],
                               self.bench.blocks_for(contexts), rows)
        prepared = self.engine.prepare(launch, self.bench.graphs.width)
        meta = torch.from_numpy(prepared.meta).to(self.device)
        return self.engine.views(Stage.CORE, meta, rows, prepared.width)

    def calls(self, kind: str, rows: int, contexts: list[int]) -> list[Callable[[], object]]:
        m, e = self._views(rows, contexts), self.engine
        qkv = torch.randn(rows, self.qkv_width, device=self.device, dtype=self.dtype)
        s = self.arch.layer
        q = torch.randn(rows, s.heads, s.head_dim, device=self.device, dtype=self.dtype)
        out = []
        for layer in range(self.arch.core):
            if kind == "rope_kv":
                out.append(lambda layer=layer: self.ops.rope_write_kv(qkv, None, None, m.pos, e.rope, e.cache, m.row0,
                                                                       m.layer_base, layer, m.fill, 0))
            elif kind == "decode_attention":
                out.append(lambda layer=layer: self.ops.decode_attention(q, e.cache, m.block_table, m.layer_base,
                                                                          layer, m.seq_len, e.scale))
            else:
                out.append(lambda layer=layer: self.chained.rope_decode_attention(
                    qkv, None, None, m.pos, e.rope, e.cache, m.row0, m.layer_base, layer, m.fill, 0,
                    m.block_table, m.seq_len, e.scale))
        return out

    def _prefill_views(self, tokens: int, chunks: int, prefix: int):
        per = tokens // chunks
        launch = prefill_launch(list(range(chunks)), [prefix] * chunks, [per] * chunks,
                                self.bench.blocks_for([prefix + per] * chunks), tokens)
        prepared = self.engine.prepare(launch, self.bench.graphs.width)
        return self.engine.views(Stage.PREFILL, torch.from_numpy(prepared.meta).to(self.device), tokens,
                                 prepared.width)

    def prefill_calls(self, tokens: int, chunks: int, prefix: int) -> list[Callable[[], object]]:
        e, s = self.engine, self.arch.layer
        meta = self._prefill_views(tokens, chunks, prefix)
        q = torch.randn(tokens, s.heads, s.head_dim, device=self.device, dtype=self.dtype)
        return [lambda layer=layer: self.ops.prefill_attention(q, e.cache, meta, layer, e.scale)
                for layer in range(self.arch.core)]

    def prefill_rope_calls(self, tokens: int) -> list[Callable[[], object]]:
        """``rope_write_kv`` of a one-chunk prefill launch of ``tokens`` tokens, as the prefill stage calls it."""
        e = self.engine
        m = self._prefill_views(tokens, 1, 0)
        qkv = torch.randn(tokens, self.qkv_width, device=self.device, dtype=self.dtype)
        return [lambda layer=layer: self.ops.rope_write_kv(qkv, None, None, m.pos, e.rope, e.cache, m.row0, m.zeros,
                                                           layer, m.zeros, 0)
                for layer in range(self.arch.core)]

    def close(self) -> None:
        self.bench.close()


ROPE_CONTEXT = 64  # positions before the one a rope_kv point writes (its time does not depend on them)


def measure_attention(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]
                      ) -> dict[str, list[list[float]]]:
    """The RoPE/KV-write, decode-attention and chained-attention tables."""
    tables: dict[str, list[list[float]]] = {"rope_kv": [], "decode_attention": [], "chained_attention": []}
    h8 = plan.attention_heads
    longest = max(*plan.attention_lengths, ROPE_CONTEXT)
    for d, g in itertools.product(plan.head_dims, plan.groups):
        progress(f"attention d={d} group={g}: building")
        bench = AttentionBench(h8, g, d, max(plan.attention_rows), longest, plan.max_positions, chain.device,
                               chain.timer)
        for rows in plan.attention_rows:
            progress(f"rope_kv rows={rows} d={d} g={g}")
            tables["rope_kv"].append([rows * h8, g, d, chain(bench.calls("rope_kv", rows, [ROPE_CONTEXT] * rows))])
        for rows, length in itertools.product(plan.attention_rows, plan.attention_lengths):
            if rows * length <= plan.max_positions:
                progress(f"decode_attention rows={rows} L={length} d={d} g={g}")
                tables["decode_attention"].append(
                    [rows * h8, g, d, length, chain(bench.calls("decode_attention", rows, [length] * rows))])
        if h8 in plan.chained_heads:
            for length in plan.attention_lengths:
                progress(f"chained_attention heads={h8} L={length} d={d} g={g}")
                tables["chained_attention"].append([h8, g, d, length, chain(bench.calls("chained", 1, [length]))])
        bench.close()
    for heads in plan.chained_heads:
        if heads == h8:
            continue
        for d, g in itertools.product(plan.head_dims, plan.groups):
            progress(f"chained attention heads={heads} d={d} g={g}")
            bench = AttentionBench(heads, g, d, 1, max(plan.attention_lengths), max(plan.attention_lengths) + 64,
                                   chain.device, chain.timer)
            for length in plan.attention_lengths:
                tables["chained_attention"].append([heads, g, d, length, chain(bench.calls("chained", 1, [length]))])
            bench.close()
    return tables


def measure_prefill_attention(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]
                              ) -> tuple[list[list[float]], list[list[float]]]:
    """``[tokens, chunks, prefix, heads, group, head_dim, t]``: the packed prefill attention kernel; and
    ``rope_kv`` rows ``[tokens x heads, group, head_dim, t]`` of prefill launches larger than the decode
    grid's largest (:func:`measure_attention` stops at its rows x heads; a 2,048-token prefill of 55 heads
    is 14 times that)."""
    rows, rope = [], []
    longest = max(plan.prefill_prefix) + max(plan.prefill_tokens)
    chunks_max = max(plan.prefill_chunks)
    for heads, d, g in itertools.product(plan.prefill_heads, plan.head_dims, plan.prefill_groups):
        progress(f"prefill attention heads={heads} d={d} g={g}: building")
        bench = AttentionBench(heads, g, d, chunks_max, longest, chunks_max * (longest + 64), chain.device,
                               chain.timer)
        for tokens, chunks, prefix in itertools.product(plan.prefill_tokens, plan.prefill_chunks, plan.prefill_prefix):
            if tokens % chunks:
                continue
            progress(f"prefill_attention T={tokens} chunks={chunks} prefix={prefix} heads={heads} d={d} g={g}")
            rows.append([tokens, chunks, prefix, heads, g, d, chain(bench.prefill_calls(tokens, chunks, prefix))])
        for tokens in plan.prefill_tokens:
            if tokens * heads > plan.decode_units:
                progress(f"rope_kv prefill T={tokens} heads={heads} d={d} g={g}")
                rope.append([tokens * heads, g, d, chain(bench.prefill_rope_calls(tokens))])
        bench.close()
    return rows, rope


def merge_prefill_rope(table: list[list[float]], rope: list[list[float]], decode_units: int) -> list[list[float]]:
    """The ``rope_kv`` table with its rows beyond the decode grid (``decode_units``) replaced by ``rope``."""
    return [r for r in table if r[0] <= decode_units] + rope


def measure_skew(plan: KernelPlan, chain: ChainTimer, uniform: list[list[float]], progress: Callable[[str], None]
                 ) -> dict[str, dict[str, dict]]:
    """Per head size and GQA group, decode attention over rows that attend different contexts
    (``plan.skew_points`` on ``plan.skew_heads`` heads), and the attention width and sharpness fitted on them
    against the uniform-context table ``uniform`` (:func:`calibration.fit.fit_attention_width`)."""
    heads = plan.skew_heads
    points = plan.mixed_points()
    positions = max(sum(c) + 64 * len(c) for _, c in points)
    fits: dict[str, dict[str, dict]] = {}
    for d, group in itertools.product(plan.head_dims, plan.skew_groups):
        progress(f"attention width d={d} group={group}: building")
        bench = AttentionBench(heads, group, d, max(b for b, _ in points), max(max(c) for _, c in points),
                               positions, chain.device, chain.timer)
        rows = []
        for b, contexts in points:
            progress(f"attention width d={d} group={group}: {len(contexts)} of {b} rows, "
                     f"{min(contexts)}-{max(contexts)} positions")
            rows.append([b, *contexts, chain(bench.calls("decode_attention", b, contexts))])
        bench.close()
        fits.setdefault(str(d), {})[str(group)] = fit_attention_width(rows, uniform, heads, group, d)
    return fits


def measure_elementwise(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]
                        ) -> dict[str, list[list[float]]]:
    """``[rows, width, t]`` of the Triton RMSNorm, residual+norm and SwiGLU kernels."""
    device, dtype = chain.device, _dtype(chain.device)
    ops = Ops(_backend(device))
    out: dict[str, list[list[float]]] = {"rms_norm": [], "residual_norm": [], "silu_mul": []}
    for rows, width in itertools.product(plan.rows, plan.widths):
        progress(f"elementwise rows={rows} width={width}")
        count = chain_length(6 * rows * width)
        w = torch.ones(width, device=device, dtype=dtype)
        xs = [torch.randn(rows, width, device=device, dtype=dtype) for _ in range(count)]
        bs = [torch.randn(rows, width, device=device, dtype=dtype) for _ in range(count)]
        gu = [torch.randn(rows, 2 * width, device=device, dtype=dtype) for _ in range(count)]
        out["rms_norm"].append([rows, width, chain([lambda x=x, w=w: ops.rms_norm(x, w, 1e-6) for x in xs])])
        out["residual_norm"].append([rows, width, chain([lambda x=x, b=b, w=w: ops.residual_norm(b, x, w, w, 1e-6, True)
                                                         for x, b in zip(xs, bs, strict=True)])])
        out["silu_mul"].append([rows, width, chain([lambda g=g: ops.silu_mul(g) for g in gu])])
        del xs, bs, gu
    return out


def glue_unit(style: LayerStyle, hidden: int, vocab: int, core: int) -> ArchSpec:
    """A model of this style, hidden size and vocabulary whose ``core`` layers are tiny: its stages are the
    glue around the layers (embedding, hidden-state bank, head and sampling)."""
    layer = LayerShape(hidden=hidden, intermediate=64, heads=2, kv_heads=2, head_dim=64, style=style)
    return ArchSpec(name=f"glue-{style}-h{hidden}-v{vocab}-c{core}", layer=layer, vocab=vocab, prelude=0,
                    core=core, coda=0, r_max=1, tied_head=style is LayerStyle.HUGINN)


def measure_glue(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]
                 ) -> dict[str, list[list[float]]]:
    """``prelude0``, ``coda0``, ``core_glue`` and ``prefill_glue``: the engine's stages on glue units."""
    out: dict[str, list[list[float]]] = {"prelude0": [], "coda0": [], "core_glue": [], "prefill_glue": []}
    timer, device = chain.timer, chain.device
    longest = max(t for t, _ in plan.glue_prefill)
    batch = max(max(plan.glue_batches), max(c for _, c in plan.glue_prefill))
    context = min(64, longest)  # short: the glue does not attend
    for style, hidden in itertools.product(LayerStyle, plan.glue_hidden):
        code = STYLE_CODE[style]
        for vocab in plan.glue_vocab:
            progress(f"glue {style} h={hidden} V={vocab}")
            one = UnitBench(glue_unit(style, hidden, vocab, 1), batch, longest + 1, batch * (longest + 1),
                            KVLayout.SHARED, device, timer)
            for b in plan.glue_batches:
                out["coda0"].append([code, hidden, vocab, b, one.stage(Stage.CODA, b, context)])
            if vocab != plan.glue_vocab[0]:
                one.close()
                continue
            two = UnitBench(glue_unit(style, hidden, vocab, 2), batch, longest + 1, batch * (longest + 1),
                            KVLayout.SHARED, device, timer)
            for b in plan.glue_batches:
                out["prelude0"].append([code, hidden, b, one.stage(Stage.PRELUDE, b, context)])
                t1, t2 = one.stage(Stage.CORE, b, context), two.stage(Stage.CORE, b, context)
                out["core_glue"].append([code, hidden, b, max(2 * t1 - t2, 1e-7)])
            for tokens, chunks in plan.glue_prefill:
                t1, t2 = one.prefill(tokens // chunks, chunks), two.prefill(tokens // chunks, chunks)
                out["prefill_glue"].append([code, hidden, tokens, chunks, max(2 * t1 - t2, 1e-7)])
            one.close()
            two.close()
    return out


def measure_adapter_table(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[hidden, rows, t]``: Huginn's adapter, ``cat(s, e) @ W`` with ``W`` ``[h, 2h]``."""
    device, dtype = chain.device, _dtype(chain.device)
    rows = []
    for hidden in plan.glue_hidden:
        count = chain_length(4 * hidden * hidden)
        weights = [torch.randn(hidden, 2 * hidden, device=device, dtype=dtype) * 0.02 for _ in range(count)]
        for b in plan.glue_batches:
            progress(f"adapter h={hidden} B={b}")
            s, e = (torch.randn(b, hidden, device=device, dtype=dtype) for _ in range(2))
            rows.append([hidden, b, chain([lambda w=w, s=s, e=e: F.linear(torch.cat((s, e), dim=-1), w)
                                           for w in weights])])
    return rows


def _probe_layers(plan: KernelPlan, chain: ChainTimer, batch: int, context: int, positions: int
                  ) -> Iterator[tuple[int, dict[int, int], Callable[..., float]]]:
    """Per probe shape: its index, the padded rows of each batch, and the seconds of one decode layer over a
    batch (``layer(rows, length, contexts=None)``: a two-layer core step less the one-layer one); the benches
    are closed once the next shape is asked for."""
    for index, shape in enumerate(plan.probes):
        units = [ArchSpec(name=f"probe{index}-c{core}", layer=shape, vocab=4096, prelude=0, core=core, coda=0,
                          r_max=1) for core in (1, 2)]
        benches = [UnitBench(u, batch, context + 1, positions, KVLayout.SHARED, chain.device, chain.timer)
                   for u in units]

        def layer(rows: int, length: int, contexts: list[int] | None = None, benches: list = benches) -> float:
            one, two = (bench.stage(Stage.CORE, rows, length, contexts=contexts) for bench in benches)
            return two - one

        yield index, benches[0].pad, layer
        for bench in benches:
            bench.close()


def measure_probes(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[probe, rows, length, t]``: one real decode layer of each probe shape (two-layer core step less
    the one-layer one), for the per-kernel gap."""
    rows = []
    points = [(b, n) for b, n in itertools.product(plan.probe_batches, plan.probe_lengths)
              if b * n <= plan.probe_positions]
    batch = max(plan.probe_batches)
    for index, _, layer in _probe_layers(plan, chain, batch, max(plan.probe_lengths), plan.probe_positions + batch):
        for b, length in points:
            progress(f"probe {index} B={b} L={length}")
            rows.append([index, b, length, layer(b, length)])
    return rows


def measure_mixed_probes(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]
                         ) -> list[list[float]]:
    """``[probe, padded rows, context of each real row..., t]``: one decode layer of each probe shape (as
    :func:`measure_probes`) whose rows attend a spread of contexts (``plan.mixed_probe_points``)."""
    points = [(b, spread_contexts(b, shortest, longest)) for b, shortest, longest in plan.mixed_probe_points]
    batch = max(b for b, _ in points)
    positions = max(sum(c) for _, c in points) + 64 * batch
    rows = []
    for index, pad, layer in _probe_layers(plan, chain, batch, max(max(c) for _, c in points), positions):
        for b, contexts in points:
            progress(f"mixed probe {index} B={b} L={min(contexts)}-{max(contexts)}")
            rows.append([index, pad[b], *contexts, layer(b, 0, contexts)])
    return rows


def measure_sustained(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> dict:
    """The power limit a long prefill runs into (:mod:`cdbsim.latency.power`): a four-layer model of one probe
    shape rests, runs decode-type load (its 64-row core step) as a serving run does before a prefill, then
    replays one prefill back to back. Each replay's time against the work done so far at the rested
    board's pace (its first replays) gives the onset and the slowdown; the replays are kept."""
    shape = plan.probes[plan.sustained_probe]
    arch = ArchSpec(name=f"probe{plan.sustained_probe}-sustained", layer=shape, vocab=4096, prelude=0, core=4,
                    coda=0, r_max=1)
    rows, context, half = 64, 1024, plan.sustained_tokens // 2
    bench = UnitBench(arch, rows, max(context, half) + 1, rows * (context + 1) + 2 * (half + 1), KVLayout.SHARED,
                      chain.device, chain.timer)
    try:
        decode, prefill = bench.graph(Stage.CORE, rows, context), bench.prefill_graph(half, 2)
        prefill()  # captured and warm before the rest
        progress(f"sustained: {plan.sustained_s:.1f} s of {plan.sustained_tokens}-token prefills")
        time.sleep(plan.sustained_rest_s)
        back_to_back(decode, plan.sustained_lead_s, chain.device)
        replays = back_to_back(prefill, plan.sustained_s, chain.device, min_calls=4 * RESTED_REPLAYS)
    finally:
        bench.close()
    stored = [[round(t, 6), round(s, 7)] for t, s in replays]  # fitted as stored, so a refit gives the same
    fit, rested = fit_replays([s for _, s in stored])
    return {"onset_s": fit.onset_s, "slowdown": fit.slowdown, "rested_s": rested, "probe": plan.sustained_probe,
            "tokens": plan.sustained_tokens, "replays": stored}


def copy_bandwidth(device: torch.device, gib: float = 2.0) -> float:
    """Bytes read + written per second by a large device-to-device copy."""
    n = int(gib * 2 ** 30) // 2 if device.type == "cuda" else 1 << 20
    src = torch.randn(n, device=device, dtype=_dtype(device))
    dst = torch.empty_like(src)
    seconds = Timer(device, 5, 2)(lambda: dst.copy_(src))
    return 2 * n * src.element_size() / seconds


def _backend(device: torch.device) -> str:
    from executor.ops import default_backend

    return default_backend(device)


# ----- the whole calibration -------------------------------------------------------------------------------
FAMILIES = ("copy", "gemm", "few_gemm", "few_swiglu", "elementwise", "gemv", "attention", "skew", "prefill", "glue",
            "adapter", "probes", "mixed_probes", "sustained", "host")


def calibrate_kernels(out: Path, device: str = "cuda", quick: bool = False, plan: KernelPlan | None = None,
                      progress: Callable[[str], None] = lambda _: None, name: str | None = None,
                      families: tuple[str, ...] = FAMILIES, base: Profile | None = None) -> Profile:
    """Measure every family (or ``families`` only, on top of ``base``'s record), fit the gaps and the
    attention widths, and write the kernel profile (``<device>-kernels.json``); a partial record is
    written after each family."""
    from calibration.run import device_tag, torch_device

    dev = torch_device(device)
    plan = plan or (KernelPlan.quick() if quick else KernelPlan())
    chain = ChainTimer(dev, plan)
    info, versions = environment(dev)
    name = name or f"{device_tag(info['name'])}-kernels"
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    measured_on = {"bandwidth": H200.bandwidth, "flops": H200.matmul_flops, "launch": H200.launch_s}
    record: dict = {"tables": {}, "device": measured_on,
                    "glue_vocab": plan.glue_vocab[0], "seconds": {}}
    components = {}
    if base is not None:
        record = {**base.kernels, "tables": dict(base.kernels["tables"]), "seconds": dict(base.kernels["seconds"])}
        record.pop("failed", None)
        components = dict(base.components)

    def save() -> Profile:
        record["wall_s"] = time.perf_counter() - started
        profile = Profile(name=name, kind=ProfileKind.KERNELS, device=info, components=dict(components),
                          versions=versions, date=dt.date.today().isoformat(),
                          notes=f"cdbsim calibrate --kernels{' --quick' if quick else ''}; "
                                f"{record['wall_s']:.0f} s", kernels=record)
        profile.save(out / f"{name}.json")
        return profile

    def family(label: str, fn: Callable[[], None]) -> None:
        if label not in families and label not in ("gaps", "sharpness"):  # fits of what the record holds
            return
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # keep what the other families measure; the record says what failed
            record.setdefault("failed", {})[label] = f"{type(exc).__name__}: {exc}"
        record["seconds"][label] = round(time.perf_counter() - t0, 1)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        save()

    tables = record["tables"]
    family("copy", lambda: record.update(copy_bandwidth=copy_bandwidth(dev)))
    family("gemm", lambda: tables.update(gemm=measure_gemm(plan, chain, progress)))

    def few_gemm() -> None:
        tables["few_gemm"] = measure_few_gemm(plan, chain, progress)
        record["few_rows"] = {"rows": FEW_ROWS_MAX, "hidden": FEW_ROWS_MAX_HIDDEN}  # the build's rule (cdbsim.latency.gpu_work)

    family("few_gemm", few_gemm)
    family("few_swiglu", lambda: tables.update(few_swiglu=measure_few_swiglu(plan, chain, progress)))
    family("elementwise", lambda: tables.update(measure_elementwise(plan, chain, progress)))
    def gemv() -> None:
        tables["gemv"] = measure_gemv(plan, chain, progress)
        record["chained_rows"] = {"rows": CHAINED_ROWS, "hidden": CHAINED_MAX_HIDDEN}  # the build's rule (cdbsim.latency.gpu_work)

    family("gemv", gemv)

    def attention() -> None:
        measured = {k: v for k, v in measure_attention(plan, chain, progress).items() if v}
        if "rope_kv" in measured:  # the prefill family's rows beyond the decode grid stay (an --update of this one)
            beyond = [row for row in tables.get("rope_kv", []) if row[0] > plan.decode_units]
            measured["rope_kv"] = merge_prefill_rope(measured["rope_kv"], beyond, plan.decode_units)
        tables.update(measured)

    family("attention", attention)
    family("skew", lambda: record.update(attention_record(
        measure_skew(plan, chain, tables["decode_attention"], progress), plan.skew_heads)))
    def prefill() -> None:
        attention_rows, rope = measure_prefill_attention(plan, chain, progress)
        tables["prefill_attention"] = attention_rows
        tables["rope_kv"] = merge_prefill_rope(tables.get("rope_kv", []), rope, plan.decode_units)

    family("prefill", prefill)
    family("glue", lambda: tables.update(measure_glue(plan, chain, progress)))
    family("adapter", lambda: tables.update(adapter=measure_adapter_table(plan, chain, progress)))
    family("probes", lambda: record.update(probes=measure_probes(plan, chain, progress)))
    family("mixed_probes", lambda: record.update(mixed_probes=measure_mixed_probes(plan, chain, progress)))
    family("gaps", lambda: record.update(gaps=fit_gaps(record, plan.probes)))
    if record.get("mixed_probes") and record.get("attention_points") and ({"skew", "mixed_probes"} & set(families)):
        family("sharpness", lambda: record.update(fit_mixed_sharpness(record, plan.probes)))

    family("sustained", lambda: record.update(sustained=measure_sustained(plan, chain, progress)))

    def host() -> None:
        probe = ArchSpec(name="probe-host", layer=plan.probes[0], vocab=4096, prelude=0, core=4, coda=0, r_max=4)
        points = {**measure_host(probe, dev, progress=progress),
                  **measure_meta_copy(dev, Timer(dev, plan.repeats, plan.warmup, spin_s=2e-3))}
        for key, rows in points.items():
            components[key] = fit_points(np.asarray(rows, dtype=float), with_context=False)

    family("host", host)
    return save()


def kernel_tables_complete(record: dict) -> list[str]:
    """The tables :mod:`cdbsim.latency.kernels` needs that a record lacks (``few_gemm`` and ``few_swiglu`` are optional:
    a profile of a build before the few-row matmul composes without them)."""
    return [t for t in TABLE_DIMS if t not in record.get("tables", {}) and t not in ("few_gemm", "few_swiglu")]


def summary_rows(profile: Profile) -> list[dict]:
    """Per family: points, seconds spent; and the fitted gaps and attention widths."""
    record = profile.kernels
    rows = [{"table": name, "points": len(points)} for name, points in record["tables"].items()]
    for style, gaps in record.get("gaps", {}).items():
        for path, gap in gaps.items():
            label = f"gap {style} {path} (share of the GEMMs)" if path.endswith("_gemm") else \
                f"gap {style} {path} (us per kernel)"
            rows.append({"table": label, "points": gap if path.endswith("_gemm") else 1e6 * gap})
    for label, key in (("width", "attention_slots"), ("sharpness", "attention_sharpness")):
        for d, value in record.get(key, {}).items():
            for g, number in (value.items() if isinstance(value, dict) else [("1", value)]):
                rows.append({"table": f"attention {label} d={d} group={g}", "points": number})
    return rows

