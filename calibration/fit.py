"""Turn measured points into a profile: one fit per component, the fit quality, B*(L), and a figure.

Pure Python (no torch), so profiles can be refitted and plotted on any machine from their raw points.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from cdbsim.arch import ArchSpec
from cdbsim.interp import Surface
from cdbsim.latency import LatencyModel, layer_name
from cdbsim.launch import Stage
from cdbsim.profile import Fit, Profile, fit_points

CONTEXTS = (128, 512, 2048, 8192)
# components a measured profile predicts by interpolating their points (cdbsim.latency, _tabulate);
# the others (prefill, host, KV copy, adapter) predict from the linear fit
INTERPOLATED = {"layer", "core1", "prelude0", "coda0", "prelude", "core", "coda", "decode"}


def fit_components(points: dict[str, list[list[float]]]) -> dict[str, Fit]:
    """A fit per component from its ``[x, c, t]`` rows; components without a context term fit delta+gamma."""
    fits = {}
    for name, rows in points.items():
        pts = np.asarray(rows, dtype=float)
        if len(pts) == 1:  # a constant (e.g. a launch term measured once)
            fits[name] = Fit(delta=float(pts[0, 2]), r2=None, max_rel_residual=0.0, points=pts.tolist())
            continue
        fits[name] = fit_points(pts, with_context=bool(np.ptp(pts[:, 1]) > 0))
    return fits


def build_profile(name: str, device: dict, versions: dict, points: dict[str, list[list[float]]],
                  notes: str = "", extra: dict[str, Fit] | None = None) -> Profile:
    """A measured profile from raw points (plus any fits made elsewhere, e.g. stage residuals)."""
    components = fit_components(points)
    components.update(extra or {})
    return Profile(name=name, kind="measured", device=device, components=components, versions=versions,
                   date=dt.date.today().isoformat(), notes=notes)


def quality_rows(profile: Profile) -> list[dict]:
    """Per component: the linear fit, its R^2 and worst relative residual, and how well interpolation
    (what a measured profile predicts decode-type stages with) predicts each point left out of it."""
    rows = []
    for name, fit in sorted(profile.components.items()):
        held_out = held_out_errors(fit) if name.split("/")[0] in INTERPOLATED else np.zeros(0)
        rows.append({"component": name, "points": len(fit.points), "delta us": fit.delta * 1e6,
                     "gamma us": fit.gamma * 1e6, "alpha ns": fit.alpha * 1e9,
                     "R2": fit.r2 if fit.r2 is not None else float("nan"),
                     "worst residual %": 100 * (fit.max_rel_residual or 0.0),
                     "interp. held-out median %": 100 * float(np.median(held_out)) if held_out.size else float("nan"),
                     "interp. held-out worst %": 100 * float(held_out.max()) if held_out.size else float("nan")})
    return rows


def held_out_errors(fit: Fit) -> np.ndarray:
    """|relative error| of the interpolating surface (:class:`cdbsim.interp.Surface`) at each ``[B, B*L,
    t]`` point when that point is left out (at the grid's edges that is extrapolation); empty for 4-column
    points (prefill) or fewer than three points."""
    pts = fit.points
    if len(pts) < 3 or len(pts[0]) != 3:
        return np.zeros(0)
    errors = []
    for i, (batch, context, t) in enumerate(pts):
        rest = Fit(delta=fit.delta, gamma=fit.gamma, alpha=fit.alpha, points=pts[:i] + pts[i + 1:])
        length = context / batch if batch > 0 else 0.0
        errors.append(abs(Surface(rest)(batch, length) - t) / t if t > 0 else 0.0)
    return np.asarray(errors)


def saturation_rows(profile: Profile, arch: ArchSpec, contexts: tuple[int, ...] = CONTEXTS) -> list[dict]:
    """delta, gamma, alpha of the core stage and B*(L) at each context length."""
    model = LatencyModel(arch, profile)
    core = model.costs[Stage.CORE]
    row = {"arch": arch.name, "core delta ms": core.delta * 1e3, "core gamma us": core.gamma * 1e6,
           "core alpha ns": core.alpha * 1e9}
    for length in contexts:
        row[f"B*({length})"] = model.saturation_batch(length)
    return [row]


def plot_profile(profile: Profile, arch: ArchSpec, path: str | Path) -> Path:
    """Measured layer points against the fit (latency vs batch, one line per context) and B*(L)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fit = profile.components[layer_name(arch.layer)]
    pts = np.asarray(fit.points)
    fig, (ax, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    lengths = sorted({round(c / x) for x, c, _ in pts if x > 0})
    for length in lengths:
        sel = np.array([round(c / x) == length for x, c, _ in pts])
        batch = pts[sel, 0]
        order = np.argsort(batch)
        (line,) = ax.plot(batch[order], pts[sel, 2][order] * 1e6, "o", label=f"L = {length}")
        grid = np.geomspace(max(batch.min(), 1), batch.max(), 50)
        ax.plot(grid, [fit(b, b * length) * 1e6 for b in grid], "-", color=line.get_color(), lw=1)
    ax.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="one layer (us)",
           title=f"{layer_name(arch.layer)}: points and fit (R² {fit.r2:.4f})")
    ax.legend(fontsize=8)
    model = LatencyModel(arch, profile)
    contexts = np.geomspace(64, 16384, 60)
    ax_b.plot(contexts, [model.saturation_batch(c) for c in contexts])
    ax_b.set(xscale="log", yscale="log", xlabel="context length L", ylabel="B*(L) of the core stage",
             title=f"{arch.name}: saturation batch")
    for ax_ in (ax, ax_b):
        ax_.grid(alpha=0.3)
    fig.suptitle(profile.label(), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
