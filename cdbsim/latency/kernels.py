"""Stage times composed from measured kernels, for architectures nobody has built yet.

The executor's kernels, timed over a grid spanning the design space (:mod:`calibration.kernels`), are summed into the
components of :mod:`cdbsim.latency.recipes` for any :class:`~cdbsim.model.arch.ArchSpec`, plus the per-kernel gap
and GEMM share fitted on whole probe layers (:func:`calibration.fit.fit_gaps`). Another GPU scales every kernel by
the ratio of its roofline times on the two devices; such predictions are labelled "not validated".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from cdbsim.latency.gpu_work import CHAINED_MAX_HIDDEN
from cdbsim.latency.interp import isotonic
from cdbsim.latency.kernel_table import KernelTable, Lookup
from cdbsim.latency.profile import Fit, Profile, fit_points
from cdbsim.latency.recipes import Component
from cdbsim.model.arch import ArchSpec, LayerShape, LayerStyle
from cdbsim.serving.config import decode_graph_sizes
from cdbsim.serving.launch import causal_pairs

if TYPE_CHECKING:
    from cdbsim.latency.devices import DeviceSpec

EARLY_LAUNCH_PATHS = frozenset({"chained", "few"})  # decode-layer paths whose kernels all launch early (no gap)
MANY_KERNELS = 9  # kernels of a many-row decode layer: four GEMMs, RoPE/KV write, attention, two norms, SwiGLU


# the probe layers a kernel profile measures whole (its ``probes`` name them by index), from which the per-kernel
# gap is fitted: one of each path and style, shapes no shipped or validation model has
PROBE_SHAPES = (
    LayerShape(hidden=1280, intermediate=3456, heads=10, kv_heads=5, head_dim=128, style=LayerStyle.OURO),
    LayerShape(hidden=1792, intermediate=4864, heads=28, kv_heads=7, head_dim=64, style=LayerStyle.OURO),
    LayerShape(hidden=3328, intermediate=8960, heads=26, kv_heads=26, head_dim=128, style=LayerStyle.OURO),
    LayerShape(hidden=1920, intermediate=5120, heads=20, kv_heads=4, head_dim=96, style=LayerStyle.HUGINN),
    LayerShape(hidden=3328, intermediate=9216, heads=26, kv_heads=26, head_dim=128, style=LayerStyle.HUGINN),
    LayerShape(hidden=4608, intermediate=12288, heads=36, kv_heads=12, head_dim=128, style=LayerStyle.HUGINN),
)


STYLE_CODE = {LayerStyle.OURO: 0.0, LayerStyle.HUGINN: 1.0}
GEMV_OPS = {"gemv": 0.0, "rmsnorm": 1.0, "residual": 2.0, "swiglu": 3.0}


@dataclass(frozen=True)
class Speeds:
    """The device figures a kernel's roofline proxy uses: bytes/s, FLOP/s, and a launch floor."""

    bandwidth: float = 4.3e12
    flops: float = 7.9e14
    launch: float = 2.5e-6


def speeds_of(device: DeviceSpec) -> Speeds:
    """The figures of ``device`` the kernels' rooflines use."""
    return Speeds(bandwidth=device.bandwidth, flops=device.matmul_flops, launch=device.launch_s)


def _proxies(s: Speeds) -> dict[str, Callable[[tuple[float, ...]], float]]:
    """Roofline time of each kernel at a query: what carries a measured value off the grid and to another device."""
    bw, fl, c = s.bandwidth, s.flops, s.launch

    def gemm(q):
        m, n, k = q
        return c + max(2 * (n * k + m * k + m * n) / bw, 2 * m * n * k / fl)

    def prefill_attention(q):
        tokens, chunks, prefix, heads, group, d = q
        t = tokens / chunks  # fractional between grid points: causal_pairs' arithmetic in floats
        pairs = chunks * (t * prefix + t * (t + 1) / 2)
        return c + max(4 * pairs * heads * d / (0.4 * fl), tokens * heads * d * 2 * (1 + 2 / group) / bw)

    return {
        "gemm": gemm,
        "few_gemm": gemm,
        "few_swiglu": lambda q: gemm((q[0], 2 * q[1], q[2])),  # n: the SwiGLU's outputs, 2n weight rows
        "gemv": lambda q: c + 2 * q[2] * q[3] / bw,
        "rope_kv": lambda q: c + q[0] * q[2] * 2 * (2 + 4 / q[1]) / bw,
        "decode_attention": lambda q: c + q[0] * q[3] * q[2] * 4 / q[1] / bw,
        "chained_attention": lambda q: c + q[0] * q[3] * q[2] * 4 / q[1] / bw,
        "prefill_attention": prefill_attention,
        "rms_norm": lambda q: c + q[0] * q[1] * 2 * 2 / bw,
        "residual_norm": lambda q: c + q[0] * q[1] * 2 * 5 / bw,
        "silu_mul": lambda q: c + q[0] * q[1] * 2 * 3 / bw,
        "prelude0": lambda q: c + q[2] * q[1] * 2 * 4 / bw,
        "coda0": lambda q: c + max(q[2] * q[1] * 2 / bw, 2 * q[3] * q[2] * q[1] / fl) + q[3] * q[2] * 8 / bw,
        "core_glue": lambda q: c + q[2] * q[1] * 2 * 6 / bw,
        "prefill_glue": lambda q: c + q[2] * q[1] * 2 * 4 / bw,
        "adapter": lambda q: gemm((q[1], q[0], 2 * q[0])),
    }


def _current(name: str, points: list) -> list:
    """A table's points in the current layout (a ``gemv`` table without ``rows`` was measured at one row)."""
    if name == "gemv" and points and len(points[0]) == 4:
        return [[op, 1.0, n, k, t] for op, n, k, t in points]
    return points


TABLE_DIMS: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k"),
    "few_gemm": ("m", "n", "k"),
    "few_swiglu": ("m", "n", "k"),
    "gemv": ("op", "rows", "n", "k"),
    "rope_kv": ("units", "group", "head_dim"),
    "decode_attention": ("units", "group", "head_dim", "length"),
    "chained_attention": ("units", "group", "head_dim", "length"),
    "prefill_attention": ("tokens", "chunks", "prefix", "heads", "group", "head_dim"),
    "rms_norm": ("rows", "width"),
    "residual_norm": ("rows", "width"),
    "silu_mul": ("rows", "width"),
    "prelude0": ("style", "hidden", "rows"),
    "coda0": ("style", "hidden", "vocab", "rows"),
    "core_glue": ("style", "hidden", "rows"),
    "prefill_glue": ("style", "hidden", "tokens", "chunks"),
    "adapter": ("hidden", "rows"),
}
EXACT_DIMS = frozenset({"op", "style"})  # matched exactly (variants); ``units`` is rows x heads
GROUP_CAPS: dict[str, dict[str, str]] = {  # a GQA group never exceeds the query heads (rows x heads) holding it
    "rope_kv": {"group": "units"}, "decode_attention": {"group": "units"}, "chained_attention": {"group": "units"},
    "prefill_attention": {"group": "heads"}}


@dataclass
class KernelModel:
    """The kernel tables of one calibration, read for any architecture (optionally on another device).

    ``record`` is a kernel profile's ``kernels`` section: ``tables`` ({name: points}), ``gaps`` (the cuBLAS path's),
    ``copy_bandwidth`` (bytes/s), ``attention_slots`` and ``attention_sharpness`` (per head size, or per head size
    and group), ``device`` (the measured GPU's figures) and ``glue_vocab``.
    """

    record: dict
    target: Speeds | None = None

    def __post_init__(self) -> None:
        self.measured_on = Speeds(**self.record.get("device", {}))
        proxies = _proxies(self.measured_on)
        self.scale = _proxies(self.target) if self.target is not None else None
        self.tables = {name: KernelTable(name, TABLE_DIMS[name], _current(name, points), proxies[name],
                                         exact=frozenset(TABLE_DIMS[name]) & EXACT_DIMS, caps=GROUP_CAPS.get(name, {}))
                       for name, points in self.record["tables"].items()}
        self.gaps = self.record.get("gaps", {})  # per layer style: {"many": s or [[rows, s], ...], "many_gemm": share}
        self.reach = 1.0           # the farthest any lookup so far went outside the grid
        self.reached: str = ""     # which table and query that was

    # ----- lookups -------------------------------------------------------------------------------
    def time(self, table: str, *query: float) -> float:
        found: Lookup = self.tables[table].lookup(*query)
        if found.reach > self.reach:
            self.reach = found.reach
            self.reached = f"{table}({', '.join(f'{x:g}' for x in query)})"
        if self.scale is None:
            return found.seconds
        q = tuple(map(float, query))
        return carried(found.seconds, self.tables[table].proxy(q), self.scale[table](q))

    def gap(self, style: LayerStyle, rows: float = 1.0) -> float:
        """Seconds per kernel a cuBLAS-path layer of ``style`` takes beyond its kernels' tables: a number, or
        ``[[rows, gap], ...]`` interpolated in log rows."""
        gap = self.gaps.get(str(style), {}).get("many", 0.0)
        if not isinstance(gap, list):
            return float(gap)
        points = sorted((float(r), float(g)) for r, g in gap)
        if rows <= points[0][0]:
            return points[0][1]
        for (r0, g0), (r1, g1) in itertools.pairwise(points):
            if rows <= r1:
                w = (math.log(rows) - math.log(r0)) / (math.log(r1) - math.log(r0))
                return (1 - w) * g0 + w * g1
        return points[-1][1]

    def gemm_share(self, style: LayerStyle) -> float:
        """The share of a many-row layer's GEMM time it takes beyond the tables (negative: less); 0 if not fitted."""
        return float(self.gaps.get(str(style), {}).get("many_gemm", 0.0))

    # ----- components ----------------------------------------------------------------------------
    def layer_kernels(self, arch: ArchSpec, rows: int, length: float) -> tuple[list[tuple[str, float]], str]:
        """The kernels of one decode layer of ``arch`` over ``rows`` padded rows at ``length`` positions, as
        ``(table, seconds)`` in launch order, and the build's path: ``chained``, ``few`` (the few-row matmul) or
        ``many`` (cuBLAS)."""
        s = arch.layer
        h, i, d, g = s.hidden, s.intermediate, s.head_dim, s.heads / s.kv_heads
        qkv = (s.heads + 2 * s.kv_heads) * d
        length = max(length, 1.0)
        if rows <= self.chained_rows(h):
            return [("gemv", self.time("gemv", GEMV_OPS["residual"], rows, qkv, h)),
                    ("chained_attention", self.time("chained_attention", s.heads * rows, g, d, length)),
                    ("gemv", self.time("gemv", GEMV_OPS["gemv"], rows, h, s.heads * d)),
                    ("gemv", self.time("gemv", GEMV_OPS["swiglu"], rows, i, h)),  # n: the intermediate size
                    ("gemv", self.time("gemv", GEMV_OPS["gemv"], rows, h, i))], "chained"
        units = rows * s.heads
        norm = ("residual_norm", self.time("residual_norm", rows, h))
        qkv_proj, o_proj, *mlp = self.projections(rows, s)
        return [qkv_proj, ("rope_kv", self.time("rope_kv", units, g, d)),
                ("decode_attention", self.time("decode_attention", units, g, d, length)), o_proj, norm, norm,
                *mlp], "few" if self.few(rows, h) else "many"

    def chained_rows(self, hidden: int) -> int:
        """Rows up to which the calibrated build ran a model ``hidden`` wide on the chained kernels (default: one)."""
        rule = self.record.get("chained_rows", {"rows": 1, "hidden": CHAINED_MAX_HIDDEN})
        return int(rule["rows"]) if hidden <= rule["hidden"] else 0

    def few(self, rows: int, hidden: int) -> bool:
        """Whether the calibrated build ran ``rows`` rows of a model ``hidden`` wide on the few-row matmul."""
        rule = self.record.get("few_rows")
        return bool(rule) and "few_gemm" in self.tables and rows <= rule["rows"] and hidden <= rule["hidden"]

    def projections(self, rows: int, s: LayerShape) -> list[tuple[str, float]]:
        """A layer's projections and SwiGLU: ``(qkv, o, gate/up [+ silu_mul], down)``, on the few-row matmul (SwiGLU
        in the gate/up epilogue) where the build ran it; all named ``gemm`` for the GEMM share."""
        h, i = s.hidden, s.intermediate
        qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
        table = "few_gemm" if self.few(rows, h) else "gemm"
        gate_up = (self.time("few_swiglu", rows, i, h) if table == "few_gemm" and "few_swiglu" in self.tables
                   else self.time(table, rows, 2 * i, h))
        out = [("gemm", self.time(table, rows, qkv, h)), ("gemm", self.time(table, rows, h, s.heads * s.head_dim)),
               ("gemm", gate_up), ("gemm", self.time(table, rows, h, i))]
        if table == "gemm":
            out.insert(3, ("silu_mul", self.time("silu_mul", rows, i)))
        return out

    def layer(self, arch: ArchSpec, rows: int, length: float) -> float:
        """One decode layer of ``arch``: its kernels' tables and, on the cuBLAS path (``many``), the gap per kernel
        and the GEMM share (:func:`calibration.fit.fit_gaps`). On the chained and few-row paths every kernel starts
        early (programmatic dependent launch) as it did in the chains its table timed, so the layer is their sum."""
        kernels, path = self.layer_kernels(arch, rows, length)
        total = sum(t for _, t in kernels)
        if path in EARLY_LAUNCH_PATHS:
            return total
        total += self.gemm_share(arch.layer.style) * sum(t for name, t in kernels if name == "gemm")
        return _with_gaps(total, MANY_KERNELS, self.gap(arch.layer.style, rows))  # fitted per layer

    def core1(self, arch: ArchSpec, rows: int, length: float) -> float:
        return self.layer(arch, rows, length) + self.time("core_glue", STYLE_CODE[arch.style], arch.layer.hidden,
                                                          rows)

    def prelude0(self, arch: ArchSpec, rows: int) -> float:
        return self.time("prelude0", STYLE_CODE[arch.style], arch.layer.hidden, rows)

    def coda0(self, arch: ArchSpec, rows: int) -> float:
        return self.time("coda0", STYLE_CODE[arch.style], arch.layer.hidden, arch.vocab, rows)

    def adapter(self, arch: ArchSpec, rows: int) -> float:
        return self.time("adapter", arch.layer.hidden, rows)

    def prefill_layer(self, arch: ArchSpec, tokens: int, chunks: int, prefix: int) -> float:
        """One layer of a prefill of ``chunks`` prompts of ``tokens / chunks`` tokens after ``prefix``."""
        s = arch.layer
        h, d, g = s.hidden, s.head_dim, s.heads / s.kv_heads
        kernels = (sum(t for _, t in self.projections(tokens, s)) + self.time("rope_kv", tokens * s.heads, g, d)
                   + self.time("prefill_attention", tokens, chunks, prefix, s.heads, g, d)
                   + 2 * self.time("residual_norm", tokens, h))
        return _with_gaps(kernels, MANY_KERNELS, self.gap(s.style, tokens))

    def prefill1(self, arch: ArchSpec, tokens: int, chunks: int, prefix: int) -> float:
        """A one-layer, one-loop prefill with embedding, head and sampling of each chunk's last token."""
        style, h = STYLE_CODE[arch.style], arch.layer.hidden
        glue = self.time("prefill_glue", style, h, tokens, chunks)
        vocab = float(self.record.get("glue_vocab", arch.vocab))
        if vocab != arch.vocab:  # the head over the sampled rows at this model's vocabulary
            glue += self.time("coda0", style, h, arch.vocab, chunks) - self.time("coda0", style, h, vocab, chunks)
        return self.prefill_layer(arch, tokens, chunks, prefix) + glue

    def kv_copy(self, arch: ArchSpec) -> float:
        """Seconds per (token, slot) last-exited fill copy in one core layer, at the measured copy bandwidth."""
        seconds = 2 * arch.layer.kv_bytes_per_slot / float(self.record["copy_bandwidth"])
        return seconds if self.target is None else seconds * self.measured_on.bandwidth / self.target.bandwidth

    def _by_head_dim(self, key: str, arch: ArchSpec, nearest: bool) -> dict[float, float]:
        g = arch.layer.heads / arch.layer.kv_heads
        values = {float(k): _by_group(v, g, nearest) for k, v in self.record.get(key, {}).items()}
        return {k: v for k, v in values.items() if v}

    def attention_slots(self, arch: ArchSpec) -> float | None:
        """Decode-attention programs the GPU runs at once for this head size and group, log-interpolated."""
        slots = self._by_head_dim("attention_slots", arch, nearest=False)
        return _log_interpolated(slots, float(arch.layer.head_dim)) if slots else None

    def attention_sharpness(self, arch: ArchSpec) -> float:
        """The p of the attention bounds' p-norm at the nearest measured head size and group (inf if not fitted)."""
        sharpness = self._by_head_dim("attention_sharpness", arch, nearest=True)
        if not sharpness:
            return math.inf
        d = float(arch.layer.head_dim)
        return sharpness[min(sharpness, key=lambda k: abs(k - d))]

    # ----- the component fits for one architecture ----------------------------------------------
    def components(self, arch: ArchSpec, max_batch: int = 1024) -> dict[str, Fit]:
        """Component fits of ``arch`` with points on the padded batch sizes and context lengths 16 .. 32,768."""
        batches = decode_graph_sizes(max_batch)
        lengths = [2 ** k for k in range(4, 16)]
        comps: dict[str, Fit] = {}

        def decode(fn: Callable[[int, float], float], with_context: bool) -> Fit:
            """Points at every batch and length, each length made non-decreasing in batch by isotonic regression."""
            rows = []
            for n in lengths if with_context else [0]:
                times = isotonic(np.asarray([fn(b, n) for b in batches]))
                rows.extend([b, b * n, float(t)] for b, t in zip(batches, times, strict=True))
            return fit_points(rows, with_context=with_context)

        comps[Component.LAYER.key(arch)] = decode(lambda b, n: self.layer(arch, b, n), True)
        comps[Component.CORE1.key(arch)] = decode(lambda b, n: self.core1(arch, b, n), True)
        comps[Component.PRELUDE0.key(arch)] = decode(lambda b, _: self.prelude0(arch, b), False)
        comps[Component.CODA0.key(arch)] = decode(lambda b, _: self.coda0(arch, b), False)
        if arch.has_adapter:
            comps[Component.ADAPTER.key(arch)] = decode(lambda b, _: self.adapter(arch, b), False)
        prefill = [(n, 1, 0) for n in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)]
        prefill += [(n, 1, p) for n in (64, 512) for p in (1024, 4096)]
        prefill += [(16, k, 0) for k in (4, 8, 16, 32, 64)] + [(64, 16, 0), (256, 8, 0), (128, 32, 0)]
        # long prompts packed as a serving run packs them, so the curve's pairs term is set where it weighs
        prefill += [(n // k, k, 0) for n in (2048, 8192) for k in (2, 4, 8)]
        layer_rows, first_rows = [], []
        for n, k, p in prefill:
            tokens = n * k
            pairs = k * causal_pairs(n, p)
            layer_rows.append([tokens, pairs, k, self.prefill_layer(arch, tokens, k, p)])
            first_rows.append([tokens, pairs, k, self.prefill1(arch, tokens, k, p)])
        comps[Component.PREFILL_LAYER.key(arch)] = fit_points(layer_rows)
        comps[Component.PREFILL1.key(arch)] = fit_points(first_rows)
        comps[Component.KV_COPY.key(arch)] = Fit(delta=0.0, gamma=self.kv_copy(arch))
        return comps


def carried(seconds: float, roofline: float, target_roofline: float) -> float:
    """A kernel's time on another device: the part its roofline explains scales to that device's roofline, the
    rest (launch, latency, synchronisation; the same on GPUs of one generation) stays as measured."""
    fixed = max(seconds - roofline, 0.0)
    return fixed + (seconds - fixed) * target_roofline / roofline


def _log_interpolated(values: dict[float, float], x: float) -> float:
    """``values`` (by a size) at ``x``: log-linear between the measured sizes around it, the nearest outside them."""
    keys = sorted(values)
    if x <= keys[0] or x >= keys[-1] or x in values:
        return values[min(keys, key=lambda k: abs(k - x))]
    lo = max(k for k in keys if k < x)
    hi = min(k for k in keys if k > x)
    w = (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return math.exp((1 - w) * math.log(values[lo]) + w * math.log(values[hi]))


def _by_group(value: float | dict | None, group: float, nearest: bool = False) -> float | None:
    """A per-head-size attention entry at a GQA group: a number as is, ``{group: number}`` interpolated in log group."""
    if not isinstance(value, dict):
        return float(value) if value else None
    by_group = {float(k): float(v) for k, v in value.items() if v}
    if not by_group:
        return None
    if nearest:
        return by_group[min(by_group, key=lambda k: abs(math.log(k) - math.log(group)))]
    return _log_interpolated(by_group, group)


def _with_gaps(kernels: float, count: int, gap: float) -> float:
    """The kernels' time plus ``count`` gaps; a negative gap never takes more than half of it away."""
    return max(kernels + count * gap, 0.5 * kernels)


def compose_profile(profile: Profile, arch: ArchSpec) -> tuple[Profile, list[str]]:
    """A kernel-level profile turned into ``arch``'s component fits, with a remark and user warnings on how far
    ``arch``'s kernels lie outside the calibrated grid."""
    record = profile.kernels
    target = Speeds(**record["target"]) if record.get("target") else None
    model = KernelModel(record, target)
    components = model.components(arch)
    model.reach, model.reached = 1.0, ""  # the shape's own reach, at a typical batch and context:
    for rows in (1, 64):
        model.core1(arch, rows, 1024.0)
    model.prelude0(arch, 64)
    model.coda0(arch, 64)
    model.prefill1(arch, 1024, 1, 0)
    components.update(profile.components)
    slots = model.attention_slots(arch)
    warnings = []
    remark = f"composed for {arch.layer.key}-v{arch.vocab}"
    if model.reach > 1.05:
        remark += f", {model.reach:.2f}x outside the kernel grid"
        warnings.append(f"{arch.name}: its kernels lie up to {model.reach:.2f}x outside the calibrated grid "
                        f"(at {model.reached}); those times are carried from the grid's edge by the kernels' "
                        "roofline")
    if target is not None:
        remark += f", carried from the {record.get('carried_from') or 'measured GPU'}: not validated"
    sharpness = model.attention_sharpness(arch)
    attention = {"slots": slots, "sharpness": None if sharpness == math.inf else sharpness} if slots else {}
    return replace(profile, components=components, attention=attention, remark=remark), warnings
