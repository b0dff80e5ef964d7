"""Kernels timed as chains on distinct inputs: the calibration grid and the single-kernel families. Each kernel runs
through the executor's own code (``F.linear``, :class:`executor.ops.Ops`) as a CUDA graph of a chain of calls on
distinct weights or KV layers, so launch gaps and L2 misses are a stage's (:class:`ChainTimer`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from calibration.fit import fit_attention_width
from calibration.measure import SKEW_POINTS, Timer, UnitBench, spread_contexts
from cdbsim.latency.gpu_work import CHAINED_MAX_HIDDEN, CHAINED_ROWS, FEW_ROWS_MAX, FEW_ROWS_MAX_HIDDEN
from cdbsim.latency.kernels import GEMV_OPS, PROBE_SHAPES
from cdbsim.model.arch import ArchSpec, KVLayout, LayerShape, LayerStyle
from cdbsim.serving.launch import Launch, Stage, decode_launch, prefill_launch
from executor.graphs import capture
from executor.ops import Ops, default_backend

L2_BYTES = 50 * 2 ** 20  # an H200's L2 is 50 MB: a chain reads at least twice that before it repeats
MAX_CHAIN = 32


@dataclass(frozen=True)
class KernelPlan:
    """The grid. ``quick()`` keeps a few points per family (a smoke run)."""

    gemm_m: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048,
                               4096, 8192)
    gemm_n: tuple[int, ...] = (512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5280, 6144, 8192, 11264, 12288, 15840,
                               16384, 17920, 24576, 35840, 49152, 65536)
    gemm_k: tuple[int, ...] = (512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5280, 5632, 6144, 8192, 11008, 12288,
                               17920, 24576, 32768)
    gemm_max_weight: int = 65536 * 8192       # the gate/up of an 8,192-wide layer at 4x; n x k beyond is no layer
    gemv_n: tuple[int, ...] = (512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 11264, 16384)
    gemv_k: tuple[int, ...] = (512, 1024, 1536, 2048, 3072, 4096, 5632, 8192)
    attention_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    attention_heads: int = 8                  # rows x heads is what the kernels' grids follow (more for a wider group)
    attention_lengths: tuple[int, ...] = (32, 128, 512, 2048, 8192, 16384)
    head_dims: tuple[int, ...] = (64, 80, 96, 128, 256)
    groups: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_positions: int = 2 ** 20              # rows x context per decode-attention point
    chained_heads: tuple[int, ...] = (8, 16, 32, 64)
    prefill_tokens: tuple[int, ...] = (16, 64, 256, 1024, 4096, 8192)
    prefill_chunks: tuple[int, ...] = (1, 8, 32)
    prefill_prefix: tuple[int, ...] = (0, 2048)
    prefill_heads: tuple[int, ...] = (8, 16, 32, 64)  # 64: Huginn-3.5B's 55 heads inside the grid
    prefill_groups: tuple[int, ...] = (1, 4, 16)      # and each heads' widest group (see prefill_group_grid)
    rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    widths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384, 24576, 32768)
    glue_hidden: tuple[int, ...] = (1024, 2048, 4096, 8192)
    glue_vocab: tuple[int, ...] = (32768, 131072, 262144)
    glue_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    glue_prefill: tuple[tuple[int, int], ...] = ((16, 1), (64, 1), (256, 1), (1024, 1), (4096, 1), (8192, 1),
                                                 (128, 8), (512, 8), (2048, 8), (512, 32), (2048, 32))
    probes: tuple[LayerShape, ...] = PROBE_SHAPES
    probe_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    probe_lengths: tuple[int, ...] = (128, 2048)
    probe_positions: int = 2 ** 18            # batch x context per probe point (keeps the probes' KV small)
    skew_points: tuple[tuple[int, int, int, int], ...] = SKEW_POINTS
    # served batches (padded, rows, shortest, longest): contexts spread evenly in log length, padding as the engine's
    spread_points: tuple[tuple[int, int, int, int], ...] = (
        (2, 2, 600, 6000), (4, 4, 400, 6000), (8, 8, 300, 6000), (16, 16, 300, 6000), (32, 32, 200, 4000),
        (64, 64, 100, 2000), (12, 9, 300, 6000), (24, 17, 300, 6000), (16, 13, 2500, 2500), (24, 17, 2500, 2500),
        (64, 40, 1000, 1000))
    # whole probe layers at such mixtures (real rows, shortest, longest): they choose the attention sharpness
    mixed_probe_points: tuple[tuple[int, int, int], ...] = (
        (2, 600, 6000), (4, 400, 6000), (8, 300, 6000), (13, 300, 6000), (16, 300, 6000), (24, 300, 6000),
        (32, 200, 4000), (13, 2500, 2500), (17, 2500, 2500))
    skew_heads: int = 32
    skew_groups: tuple[int, ...] = (1, 4)
    # the power limit: after a rest and decode-type load, a prefill of this probe shape replayed back to back
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

    def decode_heads(self, group: int) -> int:
        """Query heads of the decode grid at a GQA ``group``: at least the group, so that one KV head serves it."""
        return max(self.attention_heads, group)

    def prefill_group_grid(self, heads: int) -> tuple[int, ...]:
        """The prefill grid's groups at ``heads``: those it holds, and its widest within the grid (one KV head, or the
        widest group), so that a lookup capped at ``heads`` stays inside."""
        return tuple(sorted({g for g in self.prefill_groups if g <= heads} | {min(heads, max(self.prefill_groups))}))

    def decode_rows(self, group: int) -> tuple[int, ...]:
        """The decode grid's rows at ``group``: those whose rows x heads stay within :attr:`decode_units`."""
        return tuple(r for r in self.attention_rows if r * self.decode_heads(group) <= self.decode_units)

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

    def gemm_points(self) -> list[tuple[int, int, int]]:
        return [(m, n, k) for n in self.gemm_n for k in self.gemm_k if n * k <= self.gemm_max_weight
                for m in self.gemm_m]


class ChainTimer:
    """Seconds per call of a CUDA graph that runs ``calls`` one after another (eagerly on a CPU)."""

    def __init__(self, device: torch.device, plan: KernelPlan) -> None:
        self.device, self.cuda = device, device.type == "cuda"
        self.timer = Timer(device, plan.repeats, plan.warmup)

    def __call__(self, calls: list[Callable[[], object]]) -> float:
        def run() -> None:
            for call in calls:
                call()

        with torch.inference_mode():
            if not self.cuda:
                return self.timer(run) / len(calls)
            graph, _ = capture(run)  # a private pool, freed with the graph
            return self.timer(graph.replay) / len(calls)


def chain_length(bytes_per_call: float) -> int:
    """Calls per chain: enough distinct inputs that the chain reads twice the L2 before repeating."""
    return int(min(MAX_CHAIN, max(1, -(-2 * L2_BYTES // max(bytes_per_call, 1)))))


def tensor_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def measure_gemm(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[m, n, k, t]``: ``F.linear`` of ``[m, k]`` by ``[n, k]`` (cuBLAS)."""
    return _time_matmuls(plan.gemm_points(), F.linear, "gemm", chain, progress)


def _time_matmuls(points: list[tuple[int, int, int]], matmul: Callable[[torch.Tensor, torch.Tensor], object],
                  label: str, chain: ChainTimer, progress: Callable[[str], None],
                  weight_rows: int = 1) -> list[list[float]]:
    """``[m, n, k, t]`` of ``matmul(x [m, k], w [weight_rows * n, k])`` at ``points``, over distinct weights."""
    device, dtype = chain.device, tensor_dtype(chain.device)
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
    """The GEMM grid's points a few-row launch reaches (``FEW_ROWS_MAX`` rows, models ``FEW_ROWS_MAX_HIDDEN`` wide)."""
    return [(m, n, k) for m, n, k in plan.gemm_points() if m <= FEW_ROWS_MAX and min(n, k) <= FEW_ROWS_MAX_HIDDEN]


def measure_few_gemm(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[m, n, k, t]``: the few-row matmul (:mod:`executor.few_rows`; ``F.linear`` on a CPU), chained as in a layer."""
    ops = Ops(default_backend(chain.device), few_rows=FEW_ROWS_MAX)
    return _time_matmuls(few_gemm_points(plan), ops.linear, "few_gemm", chain, progress)


def few_swiglu_points(plan: KernelPlan) -> list[tuple[int, int, int]]:
    """``(m, I, h)`` of few-row gate/up projections: the few-row points whose output is at least twice their input."""
    return [(m, n // 2, k) for m, n, k in few_gemm_points(plan) if n >= 2 * k and n % 2 == 0]


def measure_few_swiglu(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[m, I, k, t]``: the few-row matmul of the fused gate/up weight ``[2I, k]`` with SwiGLU in its epilogue."""
    ops = Ops(default_backend(chain.device), few_rows=FEW_ROWS_MAX)
    return _time_matmuls(few_swiglu_points(plan), ops.linear_swiglu, "few_swiglu", chain, progress, weight_rows=2)


def gemv_points(plan: KernelPlan) -> list[tuple[str, int, int]]:
    """``(op, n, k)`` of the chained kernels a layer can launch (models up to
    :data:`~cdbsim.latency.gpu_work.CHAINED_MAX_HIDDEN` wide: ``k`` for hidden-state inputs, ``n`` for outputs)."""
    return [(op, n, k) for op in GEMV_OPS for n, k in itertools.product(plan.gemv_n, plan.gemv_k)
            if (k if op != "gemv" else n) <= CHAINED_MAX_HIDDEN]


def measure_gemv(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]) -> list[list[float]]:
    """``[op, rows, n, k, t]``: the chained kernels (:mod:`executor.chain`) at :func:`gemv_points`, every row count."""
    device, dtype = chain.device, tensor_dtype(chain.device)
    ops = Ops(default_backend(device), fuse_rows=CHAINED_ROWS)
    out = []
    for (op, n, k), rows in itertools.product(gemv_points(plan), range(1, CHAINED_ROWS + 1)):
        width = 2 * n if op == "swiglu" else n
        progress(f"gemv {op} rows={rows} n={n} k={k}")
        ws = [torch.randn(width, k, device=device, dtype=dtype) * 0.02 for _ in range(chain_length(2 * width * k))]
        x, branch = (torch.randn(rows, k, device=device, dtype=dtype) for _ in range(2))
        norm = torch.ones(k, device=device, dtype=dtype)
        out.append([GEMV_OPS[op], rows, n, k, chain([_gemv_call(ops, op, w, x, branch, norm) for w in ws])])
    return out


def _gemv_call(ops: Ops, op: str, w: torch.Tensor, x: torch.Tensor, branch: torch.Tensor,
               norm: torch.Tensor) -> Callable[[], object]:
    if op == "gemv":
        return lambda: ops.gemv(x, w)
    if op == "rmsnorm":
        return lambda: ops.gemv_rmsnorm(x, norm, 1e-6, w)
    return lambda: ops.gemv_residual(branch, x, norm, norm, 1e-6, True, w, swiglu=op == "swiglu")


ATTENTION_CACHE_BYTES = 32 * 2 ** 30  # an attention bench's KV cache at most (each layer far beyond the L2)


def cache_layers(positions: int, kv_heads: int, head_dim: int) -> int:
    """Layers of an attention bench's cache: eight, or as many (two at least) as fit :data:`ATTENTION_CACHE_BYTES`
    in bf16 keys and values."""
    per_layer = positions * 2 * kv_heads * head_dim * 2
    return max(2, min(8, ATTENTION_CACHE_BYTES // per_layer))


class AttentionBench:
    """The executor's RoPE/KV-write and attention kernels on a cache of up to eight layers (fewer where eight would
    pass :data:`ATTENTION_CACHE_BYTES`), with engine-prepared metadata."""

    def __init__(self, heads: int, group: int, head_dim: int, max_rows: int, max_context: int,
                 max_positions: int, device: torch.device, timer: Timer) -> None:
        kv_heads = max(1, heads // group)
        layer = LayerShape(hidden=heads * head_dim, intermediate=64, heads=heads, kv_heads=kv_heads,
                           head_dim=head_dim, style=LayerStyle.OURO)
        layers = cache_layers(max_positions, kv_heads, head_dim)
        self.arch = ArchSpec(name=f"attention-{heads}x{head_dim}-g{group}", layer=layer, vocab=256, prelude=0,
                             core=layers, coda=0, r_max=1)  # a model whose only role is to hold the KV cache
        self.bench = UnitBench(self.arch, max_rows, max_context + 1, max_positions, KVLayout.SHARED, device, timer)
        self.engine = self.bench.engine
        self.device, self.dtype = device, self.engine.model.dtype
        self.ops = Ops(default_backend(device))
        self.chained = Ops(default_backend(device), fuse_rows=1)
        s = self.arch.layer
        self.qkv_width = (s.heads + 2 * s.kv_heads) * s.head_dim

    def _views(self, launch: Launch, rows: int):
        """The engine's metadata of ``launch`` as a graph launch of ``rows`` rows (or tokens), on the device."""
        prepared = self.engine.prepare(launch, self.bench.graphs.width)
        return self.engine.views(launch.stage, torch.from_numpy(prepared.meta).to(self.device), rows, prepared.width)

    def calls(self, kind: str, rows: int, contexts: list[int]) -> list[Callable[[], object]]:
        """``kind``'s calls on a ``rows``-row launch whose first ``len(contexts)`` rows are real (the rest padding)."""
        launch = decode_launch(Stage.CORE, list(range(len(contexts))), [c - 1 for c in contexts],
                               self.bench.blocks_for(contexts), rows)
        m, e = self._views(launch, rows), self.engine
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
        return self._views(prefill_launch(list(range(chunks)), [prefix] * chunks, [per] * chunks,
                                          self.bench.blocks_for([prefix + per] * chunks), tokens), tokens)

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
    longest = max(*plan.attention_lengths, ROPE_CONTEXT)
    for d, g in itertools.product(plan.head_dims, plan.groups):
        progress(f"attention d={d} group={g}: building")
        heads, grid_rows = plan.decode_heads(g), plan.decode_rows(g)
        bench = AttentionBench(heads, g, d, max(grid_rows), longest, plan.max_positions, chain.device, chain.timer)
        for rows in grid_rows:
            progress(f"rope_kv rows={rows} d={d} g={g}")
            tables["rope_kv"].append([rows * heads, g, d, chain(bench.calls("rope_kv", rows, [ROPE_CONTEXT] * rows))])
        for rows, length in itertools.product(grid_rows, plan.attention_lengths):
            if rows * length <= plan.max_positions:
                progress(f"decode_attention rows={rows} L={length} d={d} g={g}")
                tables["decode_attention"].append(
                    [rows * heads, g, d, length, chain(bench.calls("decode_attention", rows, [length] * rows))])
        if heads in plan.chained_heads:
            for length in plan.attention_lengths:
                progress(f"chained_attention heads={heads} L={length} d={d} g={g}")
                tables["chained_attention"].append([heads, g, d, length, chain(bench.calls("chained", 1, [length]))])
        bench.close()
    for heads, d, g in itertools.product(plan.chained_heads, plan.head_dims, plan.groups):
        if heads == plan.decode_heads(g) or heads < g:  # measured above, or no whole KV head
            continue
        progress(f"chained attention heads={heads} d={d} g={g}")
        bench = AttentionBench(heads, g, d, 1, max(plan.attention_lengths), max(plan.attention_lengths) + 64,
                               chain.device, chain.timer)
        for length in plan.attention_lengths:
            tables["chained_attention"].append([heads, g, d, length, chain(bench.calls("chained", 1, [length]))])
        bench.close()
    return tables


def measure_prefill_attention(plan: KernelPlan, chain: ChainTimer, progress: Callable[[str], None]
                              ) -> tuple[list[list[float]], list[list[float]]]:
    """``[tokens, chunks, prefix, heads, group, head_dim, t]`` of the packed prefill attention kernel, and
    ``rope_kv`` rows ``[tokens x heads, group, head_dim, t]`` of prefill launches beyond the decode grid."""
    rows, rope = [], []
    longest = max(plan.prefill_prefix) + max(plan.prefill_tokens)
    chunks_max = max(plan.prefill_chunks)
    shapes = [(t, k, p) for t, k, p in itertools.product(plan.prefill_tokens, plan.prefill_chunks,
                                                         plan.prefill_prefix) if t % k == 0]
    positions = max(k * (p + t // k + 64) for t, k, p in shapes)  # the largest launch's cache, not the grid's corner
    combos = [(heads, d, g) for heads, d in itertools.product(plan.prefill_heads, plan.head_dims)
              for g in plan.prefill_group_grid(heads)]
    for heads, d, g in combos:
        progress(f"prefill attention heads={heads} d={d} g={g}: building")
        bench = AttentionBench(heads, g, d, chunks_max, longest, positions, chain.device, chain.timer)
        for tokens, chunks, prefix in shapes:
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
    """Per head size and GQA group: decode attention on rows of mixed contexts, fit by :func:`fit_attention_width`."""
    heads = plan.skew_heads
    # (padded rows, context of each real row) of the mixed-context points within max_positions
    points = [(b, [long] * n_long + [short] * (b - n_long)) for b, short, long, n_long in plan.skew_points]
    points += [(padded, spread_contexts(rows, shortest, longest))
               for padded, rows, shortest, longest in plan.spread_points]
    points = [(b, contexts) for b, contexts in points if sum(contexts) <= plan.max_positions]
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
    device, dtype = chain.device, tensor_dtype(chain.device)
    ops = Ops(default_backend(device))
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

