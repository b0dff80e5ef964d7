"""Kernel-level calibration: every family of kernel tables (:data:`FAMILIES`) measured in turn, fitted and written as
a profile: the single-kernel tables (:mod:`calibration.kernel_chains`), the engine's glue stages on unit models (glue =
2 x one-layer - two-layer), whole probe layers (per-kernel gap, attention sharpness), the host, and ``sustained`` (the
power limit, :mod:`cdbsim.latency.power`). Each family is saved as it finishes: a run cut short keeps what it measured.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from calibration.fit import attention_record, fit_gaps, fit_mixed_sharpness
from calibration.kernel_chains import (
    ChainTimer,
    KernelPlan,
    chain_length,
    measure_attention,
    measure_elementwise,
    measure_few_gemm,
    measure_few_swiglu,
    measure_gemm,
    measure_gemv,
    measure_prefill_attention,
    measure_skew,
    merge_prefill_rope,
    tensor_dtype,
)
from calibration.measure import (
    Timer,
    UnitBench,
    back_to_back,
    environment,
    measure_host,
    spread_contexts,
)
from cdbsim.latency.devices import H200, device_preset, device_tag, preset_of
from cdbsim.latency.gpu_work import CHAINED_MAX_HIDDEN, CHAINED_ROWS, FEW_ROWS_MAX, FEW_ROWS_MAX_HIDDEN
from cdbsim.latency.kernels import STYLE_CODE, speeds_of
from cdbsim.latency.power import RESTED_REPLAYS, fit_replays
from cdbsim.latency.profile import Profile, ProfileKind, fit_points
from cdbsim.model.arch import ArchSpec, KVLayout, LayerShape, LayerStyle
from cdbsim.serving.launch import Stage
from executor.build import current_build


def glue_unit(style: LayerStyle, hidden: int, vocab: int, core: int) -> ArchSpec:
    """A model of this style, hidden size and vocabulary with tiny ``core`` layers: its stages are the glue."""
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
    device, dtype = chain.device, tensor_dtype(chain.device)
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
    """Per probe shape: its index, the padded rows per batch, and ``layer(rows, length, contexts=None)``, one decode
    layer's seconds (two-layer core step less one-layer); benches close when the next shape is asked for."""
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
    """``[probe, rows, length, t]``: one decode layer of each probe shape, for the per-kernel gap."""
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
    """``[probe, padded rows, context of each real row..., t]``: probe layers over a spread of contexts."""
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
    """The power limit a long prefill runs into (:mod:`cdbsim.latency.power`): after a rest and decode-type load, one
    prefill of a probe shape replayed back to back; the replays and the fitted onset and slowdown."""
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
    src = torch.randn(n, device=device, dtype=tensor_dtype(device))
    dst = torch.empty_like(src)
    seconds = Timer(device, 5, 2)(lambda: dst.copy_(src))
    return 2 * n * src.element_size() / seconds


FAMILIES = ("copy", "gemm", "few_gemm", "few_swiglu", "elementwise", "gemv", "attention", "skew", "prefill", "glue",
            "adapter", "probes", "mixed_probes", "sustained", "host")


HEAD_DIM_COLUMN = {"rope_kv": 2, "decode_attention": 2, "chained_attention": 2, "prefill_attention": 5}


def calibrate_kernels(out: Path, device: str = "cuda", quick: bool = False, plan: KernelPlan | None = None,
                      progress: Callable[[str], None] = lambda _: None, name: str | None = None,
                      families: tuple[str, ...] = FAMILIES, base: Profile | None = None,
                      head_dims: tuple[int, ...] | None = None) -> Profile:
    """Measure every family (or ``families`` on top of ``base``'s record), fit gaps and attention widths and write
    the kernel profile (``<device>-kernels.json``), saved after each family. ``head_dims``: the attention families
    at those head sizes only, ``base``'s rows of the others kept (a family too long for one sitting, in parts)."""
    from calibration.run import torch_device

    dev = torch_device(device)
    plan = plan or (KernelPlan.quick() if quick else KernelPlan())
    if head_dims is not None:
        plan = replace(plan, head_dims=head_dims)
    chain = ChainTimer(dev, plan)
    info, versions = environment(dev)
    build = current_build(dev).to_dict()  # an --update records the build of its latest measurement
    name = name or f"{device_tag(info['name'])}-kernels"
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    preset = preset_of(info["name"])  # the figures carrying starts from; a GPU without a preset is not carried
    figures = asdict(speeds_of(device_preset(preset) if preset else H200))
    record: dict = {"tables": {}, "device": figures, "glue_vocab": plan.glue_vocab[0], "seconds": {}}
    components = {}
    if base is not None:
        record = {**base.kernels, "tables": dict(base.kernels["tables"]), "seconds": dict(base.kernels["seconds"])}
        record.pop("failed", None)
        components = dict(base.components)

    def save() -> Profile:
        record["wall_s"] = time.perf_counter() - started
        profile = Profile(name=name, kind=ProfileKind.KERNELS, device=info, components=dict(components),
                          versions=versions, build=build, date=dt.date.today().isoformat(),
                          notes=f"cdbsim calibrate --kernels{' --quick' if quick else ''}; "
                                f"{sum(record['seconds'].values()):.0f} s over its families", kernels=record)
        profile.save(out / f"{name}.json")
        return profile

    def family(label: str, fn: Callable[[], None], **rule: dict) -> None:
        if label not in families and label not in ("gaps", "sharpness"):  # fits of what the record holds
            return
        t0 = time.perf_counter()
        try:
            fn()
            record.update(rule)  # the build's rule the table was measured under
        except Exception as exc:  # keep what the other families measure; the record says what failed
            record.setdefault("failed", {})[label] = f"{type(exc).__name__}: {exc}"
        record["seconds"][label] = round(time.perf_counter() - t0, 1)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        save()

    tables = record["tables"]

    def with_other_heads(table: str, rows: list[list[float]], keep: Callable[[list[float]], bool] = lambda _: True
                         ) -> list[list[float]]:
        """``rows`` just measured, after the record's rows of ``table`` (those ``keep`` holds) at other head sizes."""
        if head_dims is None:
            return rows
        column = HEAD_DIM_COLUMN[table]
        return [r for r in tables.get(table, []) if r[column] not in head_dims and keep(r)] + rows

    family("copy", lambda: record.update(copy_bandwidth=copy_bandwidth(dev)))
    family("gemm", lambda: tables.update(gemm=measure_gemm(plan, chain, progress)))
    family("few_gemm", lambda: tables.update(few_gemm=measure_few_gemm(plan, chain, progress)),
           few_rows={"rows": FEW_ROWS_MAX, "hidden": FEW_ROWS_MAX_HIDDEN})
    family("few_swiglu", lambda: tables.update(few_swiglu=measure_few_swiglu(plan, chain, progress)))
    family("elementwise", lambda: tables.update(measure_elementwise(plan, chain, progress)))
    family("gemv", lambda: tables.update(gemv=measure_gemv(plan, chain, progress)),
           chained_rows={"rows": CHAINED_ROWS, "hidden": CHAINED_MAX_HIDDEN})

    def attention() -> None:
        measured = {k: with_other_heads(k, v) for k, v in measure_attention(plan, chain, progress).items() if v}
        if "rope_kv" in measured:  # the prefill family's rows beyond the decode grid stay (an --update of this one)
            beyond = [row for row in tables.get("rope_kv", []) if row[0] > plan.decode_units]
            measured["rope_kv"] = merge_prefill_rope(measured["rope_kv"], beyond, plan.decode_units)
        tables.update(measured)

    family("attention", attention)

    def skew() -> None:
        fits = attention_record(measure_skew(plan, chain, tables["decode_attention"], progress), plan.skew_heads)
        if head_dims is not None:  # keyed by head size: the other sizes' fits stay
            for key in ("attention_slots", "attention_sharpness", "attention_points"):
                fits[key] = {**record.get(key, {}), **fits[key]}
        record.update(fits)

    family("skew", skew)

    def prefill() -> None:
        attention_rows, rope = measure_prefill_attention(plan, chain, progress)
        tables["prefill_attention"] = with_other_heads("prefill_attention", attention_rows)
        beyond = with_other_heads("rope_kv", rope, keep=lambda r: r[0] > plan.decode_units)
        tables["rope_kv"] = merge_prefill_rope(tables.get("rope_kv", []), beyond, plan.decode_units)

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
        for key, rows in measure_host(probe, dev, plan.repeats, plan.warmup, progress=progress).items():
            components[key] = fit_points(np.asarray(rows, dtype=float), with_context=False)

    family("host", host)
    return save()


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

