"""Turn measured points into a profile: one fit per component, the fit quality, B*(L), and a figure (no torch)."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from cdbsim.errors import ConfigError, require
from cdbsim.latency.gpu_work import equivalent_length, least_splits, padded_mean
from cdbsim.latency.interp import Surface
from cdbsim.latency.kernel_table import KernelTable
from cdbsim.latency.kernels import EARLY_LAUNCH_PATHS, MANY_KERNELS, PROBE_SHAPES, KernelModel
from cdbsim.latency.model import LatencyModel
from cdbsim.latency.power import fit_replays
from cdbsim.latency.profile import Fit, Profile, ProfileKind, fit_points
from cdbsim.latency.recipes import Component, fitted_on_differences, interpolated
from cdbsim.model.arch import ArchSpec, LayerShape
from cdbsim.serving.launch import Stage

CONTEXTS = (128, 512, 2048, 8192)


def attention_skew_name(arch: ArchSpec) -> str:
    """Raw points of core steps with mixed context lengths: ``[padded rows, context of each row..., t]``."""
    return f"attention_skew/{arch.name}-{arch.split}-r{arch.r_max}"


SLOT_GRID = 2.0 ** np.arange(5, 16.01, 0.125)  # 32 .. 65536 programs
SHARPNESS_GRID = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, math.inf)  # p of the p-norm of the two attention bounds


def fit_attention_slots(arch: ArchSpec, core: Fit, rows: list[list[float]]) -> dict:
    """:func:`fit_slots` for a model's core stage measured at uniform lengths (its ``Fit`` points)."""
    return fit_slots(arch.layer.heads, arch.layer.head_dim, Surface(core), rows)


def fit_slots(heads: int, head_dim: int, stage_time: Callable[[float, float], float], rows: list[list[float]],
              sharpnesses: tuple[float, ...] = SHARPNESS_GRID) -> dict:
    """The decode-attention width (programs run at once) and sharpness (p-norm p) that best predict core steps of
    mixed contexts ``rows`` from the uniform ``stage_time`` (:func:`~cdbsim.latency.gpu_work.equivalent_length`), by
    grid search: the ``attention`` record, each point's error both ways; no slots if the mean length does as well."""
    measured = np.array([r[-1] for r in rows])
    least = least_splits(head_dim)

    def errors(slots: float | None, sharpness: float = math.inf) -> np.ndarray:
        predicted = []
        for r in rows:
            padded, contexts = int(r[0]), [int(c) for c in r[1:-1]]
            mean = sum(contexts) / len(contexts)
            length = (padded_mean(sum(contexts), len(contexts), padded) if slots is None else equivalent_length(
                mean, max(contexts), len(contexts), padded, heads, least, slots, sharpness))
            predicted.append(stage_time(padded, length))
        return np.asarray(predicted) / measured - 1

    def loss(pair: tuple[float | None, float]) -> float:
        return float(np.mean(np.log1p(errors(*pair)) ** 2))

    best = min(((float(s), p) for p in sharpnesses for s in SLOT_GRID), key=loss)
    slots, sharpness = best if loss(best) < loss((None, math.inf)) else (None, math.inf)
    return {"slots": slots, "sharpness": None if sharpness == math.inf else sharpness, "heads": heads,
            "head_dim": head_dim, "points": [list(map(float, r)) for r in rows],
            "error_with_mean_length_pct": (100 * errors(None)).round(2).tolist(),
            "error_with_slots_pct": (100 * errors(slots, sharpness)).round(2).tolist()}


def fit_attention_width(rows: list[list[float]], uniform: list[list[float]], heads: int, group: int,
                        head_dim: int, sharpnesses: tuple[float, ...] = SHARPNESS_GRID) -> dict:
    """:func:`fit_slots` for the kernel profile: ``heads`` heads in groups of ``group`` against ``decode_attention``."""
    points = [[p[0], p[3], p[4]] for p in uniform if p[1] == group and p[2] == head_dim]
    require(len(points) >= 4, f"decode_attention has no uniform points at group {group}, head size {head_dim}")
    table = KernelTable("decode_attention", ("units", "length"), points, proxy=lambda q: q[0] * q[1])
    return fit_slots(heads, head_dim, lambda padded, length: table(padded * heads, max(length, 1.0)), rows, sharpnesses)


def attention_record(fits: dict[str, dict[str, dict]], heads: int) -> dict:
    """The kernel record's attention entries from :func:`fit_attention_width`'s fits by head size and group."""
    return {"attention_slots": {d: {g: float(fit["slots"] or 0.0) for g, fit in by_group.items()}
                                for d, by_group in fits.items()},
            "attention_sharpness": {d: {g: fit["sharpness"] for g, fit in by_group.items() if fit["sharpness"]}
                                    for d, by_group in fits.items()},
            "attention_points": {d: {g: fit["points"] for g, fit in by_group.items()} for d, by_group in fits.items()},
            "attention_layout": {"heads": heads}}


def refit_attention_width(record: dict, sharpnesses: tuple[float, ...] = SHARPNESS_GRID) -> dict:
    """A kernel record's attention width and sharpness refitted per head size and group (8 MHA heads if unsaid)."""
    layout = record.get("attention_layout", {})
    heads, group = int(layout.get("heads", 8)), str(layout.get("group", 1))
    points = {d: rows if isinstance(rows, dict) else {group: rows}
              for d, rows in record.get("attention_points", {}).items()}
    uniform = record["tables"]["decode_attention"]
    fits = {d: {g: fit_attention_width(rows, uniform, heads, int(g), int(d), sharpnesses)
                for g, rows in by_group.items()} for d, by_group in points.items()}
    return attention_record(fits, heads) if fits else {}


def fit_mixed_sharpness(record: dict, probes: tuple[LayerShape, ...] = PROBE_SHAPES) -> dict:
    """The attention record whose sharpness and width scale best predict the mixed-context probe layers (relative to
    uniform ones of their shape and rows); ``attention_mixed_probes`` keeps the best error per sharpness."""
    points = [(probe_arch(probes[int(index)]), int(index), int(padded), [int(c) for c in contexts], t)
              for index, padded, *contexts, t in record["mixed_probes"]]
    bias = _uniform_probe_error(record, probes)
    candidates = {}
    for p in SHARPNESS_GRID:
        attention = refit_attention_width(record, (p,))
        for scale in WIDTH_SCALES:
            scaled = {**attention, "attention_slots": {d: {g: w * scale for g, w in by_group.items()}
                                                       for d, by_group in attention["attention_slots"].items()}}
            model = KernelModel({**record, **scaled})
            errors = []
            for arch, index, padded, contexts, t in points:
                slots = model.attention_slots(arch)
                length = (padded_mean(sum(contexts), len(contexts), padded) if slots is None else equivalent_length(
                    sum(contexts) / len(contexts), max(contexts), len(contexts), padded, arch.layer.heads,
                    least_splits(arch.layer.head_dim), slots, p))
                errors.append(math.log(model.layer(arch, padded, length) / t) - bias(index, padded))
            candidates[(p, scale)] = (float(np.mean(np.square(errors))), scaled, errors)
    best = min(candidates, key=lambda key: candidates[key][0])
    by_sharpness = {p: min((c for key, c in candidates.items() if key[0] == p), key=lambda c: c[0])
                    for p in SHARPNESS_GRID}
    return {**candidates[best][1], "attention_mixed_probes": {
        "sharpness": None if best[0] == math.inf else best[0], "width_scale": best[1],
        "rms_error_pct": {("inf" if p == math.inf else str(p)): round(100 * math.sqrt(c[0]), 2)
                          for p, c in by_sharpness.items()},
        "error_pct": [round(100 * math.expm1(e), 2) for e in candidates[best][2]]}}


WIDTH_SCALES = tuple(float(x) for x in 2.0 ** np.arange(-1.0, 1.51, 0.125))  # of the chain's fitted width


def probe_arch(shape: LayerShape) -> ArchSpec:
    """A one-layer model of ``shape``: how a probe layer is timed and composed."""
    return ArchSpec(name="probe", layer=shape, vocab=4096, prelude=0, core=1, coda=0, r_max=1)


def _uniform_probe_error(record: dict, probes: tuple[LayerShape, ...]) -> Callable[[int, int], float]:
    """``(probe, rows) -> log(composed / measured)`` of the longest uniform probe layers, log-interpolated."""
    model = KernelModel(record)
    longest = max((p[2] for p in record.get("probes", [])), default=0)
    by_probe: dict[int, list[tuple[float, float]]] = {}
    for index, rows, length, t in record.get("probes", []):
        if length == longest:
            error = math.log(model.layer(probe_arch(probes[int(index)]), int(rows), float(length)) / t)
            by_probe.setdefault(int(index), []).append((math.log(rows), error))

    def error(index: int, rows: int) -> float:
        points = sorted(by_probe.get(index, []))
        if not points:
            return 0.0
        return float(np.interp(math.log(rows), [x for x, _ in points], [e for _, e in points]))

    return error


def attention_rows(profile: Profile) -> list[dict]:
    """The mixed-length core steps of a profile's attention fit: contexts, time, errors both ways."""
    record = profile.attention
    rows = []
    for point, plain, fitted in zip(record["points"], record["error_with_mean_length_pct"],
                                    record["error_with_slots_pct"], strict=True):
        contexts = point[1:-1]
        rows.append({"rows": int(point[0]), "mean L": sum(contexts) / len(contexts), "max L": max(contexts),
                     "measured ms": 1e3 * point[-1], "error at mean L %": plain, "error fitted %": fitted})
    return rows


def launch_gaps(launches: pd.DataFrame) -> np.ndarray:
    """Seconds from each launch's end to the next one's start, in start order (a launch log's rows)."""
    ordered = launches.sort_values("start")
    return ordered["start"].to_numpy(float)[1:] - ordered["end"].to_numpy(float)[:-1]


BACK_TO_BACK_S = 10e-6  # a longer gap is the device waiting for the host or for arrivals, not the stream


def fit_launch_gap(logs: list[pd.DataFrame]) -> float:
    """``device.launch_gap_s``: the mean gap of launches back to back (< :data:`BACK_TO_BACK_S`) in executor logs."""
    gaps = np.concatenate([launch_gaps(log) for log in logs] or [np.zeros(0)])
    gaps = gaps[gaps < BACK_TO_BACK_S]
    require(gaps.size > 0, "no consecutive launches to measure the gap between")
    return float(gaps.mean())


def with_launch_gap(profile: Profile, logs: list[pd.DataFrame]) -> Profile:
    """``profile`` with ``device.launch_gap_s`` fitted over executor launch logs of its own board and build."""
    return replace(profile, device={**profile.device, "launch_gap_s": round(fit_launch_gap(logs), 12)})


HUBER_SCALE_S = 2e-6  # residuals beyond this count linearly: a probe layer whose attention is off by tens of us


def fit_gaps(record: dict, probes: tuple[LayerShape, ...] = PROBE_SHAPES) -> dict:
    """What whole probe layers on the cuBLAS path take beyond their kernels' tables, per layer style: a time per
    kernel (``many``) and a GEMM share (``many_gemm``), by a Huber loss. Layers on the early-launch paths (chained,
    few-row) take their kernels' sum (:meth:`KernelModel.layer`), so their probes are not fitted."""
    from scipy.optimize import least_squares

    model = KernelModel({**record, "gaps": {}})
    many: list[tuple[float, float]] = []
    for index, rows, length, t in record["probes"]:
        kernels, path = model.layer_kernels(probe_arch(probes[int(index)]), int(rows), float(length))
        if path not in EARLY_LAUNCH_PATHS:
            many.append((sum(seconds for name, seconds in kernels if name == "gemm"),
                         t - sum(seconds for _, seconds in kernels)))
    require(len(many) >= 2, "a line needs two probe layers on the cuBLAS path at least")
    gemm, beyond = map(np.array, zip(*many, strict=True))
    design = np.column_stack([gemm, np.ones(len(gemm))])
    share, per_layer = least_squares(lambda p: design @ p - beyond, np.zeros(2), loss="huber", f_scale=HUBER_SCALE_S,
                                     x_scale=[1.0, HUBER_SCALE_S]).x.tolist()
    return {style: {"many": per_layer / MANY_KERNELS, "many_gemm": share}
            for style in sorted({shape.style.value for shape in probes})}


def fit_components(points: dict[str, list[list[float]]]) -> dict[str, Fit]:
    """A fit per component from its ``[x, c, t]`` rows; components without a context term fit delta+gamma."""
    fits = {}
    for name, rows in points.items():
        pts = np.asarray(rows, dtype=float)
        if len(pts) == 1:  # a constant (e.g. a launch term measured once)
            fits[name] = Fit(delta=float(pts[0, 2]), r2=None, max_rel_residual=0.0, points=pts.tolist())
            continue
        try:
            fits[name] = fit_points(pts, with_context=bool(np.ptp(pts[:, 1]) > 0),
                                    relative=not fitted_on_differences(name))
        except ConfigError as exc:
            raise ConfigError(f"components.{name}: {exc}") from None
    return fits


def build_profile(name: str, device: dict, versions: dict, points: dict[str, list[list[float]]],
                  notes: str = "", extra: dict[str, Fit] | None = None, build: dict | None = None) -> Profile:
    """A measured profile from raw points (plus any fits made elsewhere, e.g. stage residuals), with the record of
    the executor build that measured them (:class:`cdbsim.latency.build.Build`)."""
    components = {**fit_components(points), **(extra or {})}
    return Profile(name=name, kind=ProfileKind.MEASURED, device=device, components=components, versions=versions,
                   date=dt.date.today().isoformat(), notes=notes, build=dict(build or {}))


def refit_sustained(entry: dict) -> dict:
    """A kernel record's ``sustained`` entry with its onset and slowdown fitted again from its replays."""
    replays = entry.get("replays")
    require(isinstance(replays, list) and all(isinstance(r, list) and len(r) == 2 for r in replays),
            "kernels.sustained.replays ([start, seconds] per replay) is needed to refit the power limit")
    try:
        fit, rested = fit_replays([float(seconds) for _, seconds in replays])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"kernels.sustained.replays: {exc}") from None
    return {**entry, "onset_s": fit.onset_s, "slowdown": fit.slowdown, "rested_s": rested}


def _attention_head_dim(attention: dict, components: dict[str, Fit]) -> int:
    """The head width of a profile's mixed-context points: recorded, or read from the layer's name (``-a55x96-``)."""
    if isinstance(attention.get("head_dim"), int):
        return attention["head_dim"]
    widths = {int(m.group(2)) for name in components for m in [re.search(r"-a(\d+)x(\d+)-", name)] if m}
    require(len(widths) == 1, "attention.head_dim (a whole number) is needed to refit the attention width from "
                              "attention.points")
    return widths.pop()


def refit_profile(profile: Profile) -> Profile:
    """The profile with every component, the attention width, and (kernel profiles) the layer gaps and power limit
    fitted afresh from its raw points; device, versions and date kept."""
    require(profile.kind in (ProfileKind.MEASURED, ProfileKind.KERNELS),
            f"profile {profile.name} is {profile.kind}: only measured and kernel profiles have raw points to refit")
    try:  # a malformed point names the file it came from
        require(profile.kind is not ProfileKind.KERNELS or bool(profile.kernels.get("probes")),
                "kernels.probes (the probe layers) is needed to refit the layer gaps")
        # a fit made elsewhere (no raw points of its own) is kept as it is
        components = {**profile.components,
                      **fit_components({name: fit.points for name, fit in profile.components.items() if fit.points})}
        if profile.kind is ProfileKind.KERNELS:
            kernels = {**profile.kernels, **(fit_mixed_sharpness(profile.kernels) if profile.kernels.get("mixed_probes")
                                             else refit_attention_width(profile.kernels))}
            if kernels.get("sustained"):
                kernels["sustained"] = refit_sustained(kernels["sustained"])
            return replace(profile, components=components, kernels={**kernels, "gaps": fit_gaps(kernels)})
        attention = profile.attention
        core = [fit for name, fit in components.items() if name.startswith(f"{Stage.CORE.value}/")]
        if attention.get("points") and len(core) == 1 and core[0].points:
            require(isinstance(attention.get("heads"), int), "attention.heads (a whole number) is needed to refit "
                                                             "the attention width from attention.points")
            attention = fit_slots(attention["heads"], _attention_head_dim(attention, components),
                                  Surface(core[0]), attention["points"])
    except ConfigError as exc:
        raise ConfigError(f"{profile.source or profile.name}: {exc}") from None
    return replace(profile, components=components, attention=attention)


def quality_rows(profile: Profile) -> list[dict]:
    """Per component: the linear fit, R^2, worst residual, and interpolation's held-out errors."""
    rows = []
    for name, fit in sorted(profile.components.items()):
        predicted = held_out_predictions(fit) if interpolated(name) else np.zeros(0)
        t = np.array([p[-1] for p in fit.points]) if predicted.size else predicted
        held_out = np.abs(predicted - t) / np.where(t > 0, t, 1.0)
        rows.append({"component": name, "points": len(fit.points), "delta us": fit.delta * 1e6,
                     "gamma us": fit.gamma * 1e6, "alpha ns": fit.alpha * 1e9,
                     "R2": fit.r2 if fit.r2 is not None else float("nan"),
                     "worst residual %": 100 * (fit.max_rel_residual or 0.0),
                     "interp. held-out median %": 100 * float(np.median(held_out)) if held_out.size else float("nan"),
                     "interp. held-out worst %": 100 * float(held_out.max()) if held_out.size else float("nan"),
                     "interp. held-out R2": r2(t, predicted) if predicted.size else float("nan")})
    return rows


def held_out_predictions(fit: Fit) -> np.ndarray:
    """The surface's time at each ``[B, B*L, t]`` point with that point left out; empty for prefill or < 3 points."""
    pts = fit.points
    if len(pts) < 3 or len(pts[0]) != 3:
        return np.zeros(0)
    predicted = []
    for i, (batch, context, _) in enumerate(pts):
        rest = Fit(delta=fit.delta, gamma=fit.gamma, alpha=fit.alpha, points=pts[:i] + pts[i + 1:])
        predicted.append(Surface(rest)(batch, context / batch if batch > 0 else 0.0))
    return np.asarray(predicted)


def r2(measured: np.ndarray, predicted: np.ndarray) -> float:
    """Coefficient of determination of ``predicted`` against ``measured`` (NaN when the times do not vary)."""
    spread = float(np.sum((measured - measured.mean()) ** 2))
    return 1.0 - float(np.sum((measured - predicted) ** 2)) / spread if spread > 0 else float("nan")


def saturation_rows(profile: Profile, arch: ArchSpec, contexts: tuple[int, ...] = CONTEXTS) -> list[dict]:
    """delta, gamma, alpha of the core stage and B*(L) at each context length."""
    model = LatencyModel(arch, profile)
    core = model.costs[Stage.CORE]
    return [{"arch": arch.name, "core delta ms": core.delta * 1e3, "core gamma us": core.gamma * 1e6,
             "core alpha ns": core.alpha * 1e9, **{f"B*({n})": model.saturation_batch(n) for n in contexts}}]


def plot_profile(profile: Profile, arch: ArchSpec, path: str | Path) -> Path:
    """Measured layer points against the fit (latency vs batch, one line per context) and B*(L)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layer_key = Component.LAYER.key(arch)
    fit = profile.components[layer_key]
    pts = np.asarray(fit.points)
    fig, (ax, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for length in sorted({round(c / x) for x, c, _ in pts if x > 0}):
        sel = np.array([round(c / x) == length for x, c, _ in pts])
        batch = pts[sel, 0]
        order = np.argsort(batch)
        (line,) = ax.plot(batch[order], pts[sel, 2][order] * 1e6, "o", label=f"L = {length}")
        grid = np.geomspace(max(batch.min(), 1), batch.max(), 50)
        ax.plot(grid, [fit(b, b * length) * 1e6 for b in grid], "-", color=line.get_color(), lw=1)
    ax.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="one layer (us)",
           title=f"{layer_key}: points and fit (R² {fit.r2:.4f})")
    ax.legend(fontsize=8)
    model = LatencyModel(arch, profile)
    contexts = np.geomspace(64, 16384, 60)
    saturation = np.array([model.saturation_batch(c) for c in contexts])
    # a fit without per-token cost or floor has B* infinite or zero: only finite, positive B* are drawn
    shown = np.isfinite(saturation) & (saturation > 0)
    ax_b.plot(contexts[shown], saturation[shown])
    if not shown.any():
        ax_b.text(0.5, 0.5, "B*(L) is 0 or unbounded at every L\n(the fit has no floor or no per-token cost)",
                  ha="center", va="center", transform=ax_b.transAxes, fontsize=8)
    ax_b.set(xscale="log", yscale="log" if shown.any() else "linear", xlabel="context length L",
             ylabel="B*(L) of the core stage", title=f"{arch.name}: saturation batch")
    for ax_ in (ax, ax_b):
        ax_.grid(alpha=0.3)
    fig.suptitle(profile.label(), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
