"""Where the latency model's straight lines miss the shipped profiles' measurements, and why.

For every component of the shipped H200 profiles this prints the R^2 of three line fits to the same
points, weighted as calibration fits them (``cdbsim.profile.fit_points``: by 1/t, except differences
that can come out at zero, ``cdbsim.recipes.Component.fitted_on_differences``):

``plane``         t = delta + gamma B + alpha C over every point: what the profile ships
``lines per L``   t = floor + slope B at each context length on its own (the CDB paper's procedure)
``plane, B >= 2`` the plane without single-row launches, which the Ouro models run on their own kernel
                  path (``executor.chain``)

and, for the components measured profiles predict by interpolation, the R^2 of the interpolating
surface's held-out predictions (each point predicted with that point left out). A figure shows four
components where the line misses: the LM head's weight-read floor, the prelude's step at 32 rows, the
layer's single-row path and the host's jitter.

    python benchmarks/fit_forms.py --out benchmarks/results/fit-forms
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from calibration.fit import held_out_predictions, r2
from cdbsim.profile import Fit, fit_points, load_profile_file
from cdbsim.recipes import fitted_on_differences, interpolated

PROFILES = Path(__file__).resolve().parent.parent / "calibration" / "profiles"
MODELS = ("ouro-1.4b", "ouro-2.6b", "huginn-3.5b")


def lines_per_length(pts: np.ndarray, relative: bool = True) -> np.ndarray:
    """Each point's time on the line fitted to the points of its own context length."""
    lengths = np.round(pts[:, 1] / np.maximum(pts[:, 0], 1))
    predicted = np.full(len(pts), np.nan)
    for length in np.unique(lengths):
        sel = lengths == length
        if sel.sum() >= 2:
            fit = fit_points(np.column_stack([pts[sel, 0], np.zeros(sel.sum()), pts[sel, 2]]), relative=relative)
            predicted[sel] = fit.delta + fit.gamma * pts[sel, 0]
    return predicted


def component_rows(model: str, fits: dict[str, Fit]) -> list[dict]:
    rows = []
    for name, fit in sorted(fits.items()):
        pts = np.asarray(fit.points, dtype=float)
        if pts.ndim != 2 or pts.shape[1] != 3 or len(pts) < 4:
            continue
        t = pts[:, 2]
        relative = not fitted_on_differences(name)
        per_length = lines_per_length(pts, relative)
        many = pts[:, 0] >= 2
        many_fit = fit_points(pts[many], relative=relative).r2 if many.sum() >= 4 and not many.all() else float("nan")
        held = held_out_predictions(fit) if interpolated(name) else np.zeros(0)
        rows.append({
            "model": model, "component": name, "points": len(pts),
            "plane": fit.r2,
            "lines per L": r2(t[~np.isnan(per_length)], per_length[~np.isnan(per_length)]),
            "plane, B >= 2": many_fit,
            "interpolation, held out": r2(t, held) if held.size else float("nan"),
            "spread of t %": 100 * float(t.std() / t.mean()),
        })
    return rows


def plot_misses(fits: dict[str, Fit], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = [next(n for n in fits if n.startswith(p)) for p in ("coda0/", "prelude0/", "layer/", "host")]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.9))
    for ax, name in zip(axes, picks, strict=True):
        fit = fits[name]
        pts = np.asarray(fit.points, dtype=float)
        lengths = np.round(pts[:, 1] / np.maximum(pts[:, 0], 1))
        for length in np.unique(lengths)[:3] if name.startswith("layer/") else [None]:
            sel = lengths == length if length is not None else np.ones(len(pts), bool)
            order = np.argsort(pts[sel, 0])
            b, t = pts[sel, 0][order], pts[sel, 2][order]
            label = f"L = {length:g}" if length is not None else "measured"
            (line,) = ax.plot(b, t * 1e6, "o", ms=4, label=label)
            ax.plot(b, [fit(x, x * (length or 0)) * 1e6 for x in b], "-", lw=1, color=line.get_color())
        ax.set(xscale="log", xlabel="batch (items for host)", ylabel="us",
               title=f"{name.split('/')[0]}: R² {fit.r2:.3f}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Ouro-1.4B on the H200: measured points (dots) and the profile's line fit", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write fit_forms.json/.csv and misses.png here")
    args = parser.parse_args()
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    rows, fits = [], {}
    for model in MODELS:
        profile = load_profile_file(PROFILES / f"h200-{model}.json")
        fits[model] = profile.components
        rows += component_rows(model, profile.components)
    frame = pd.DataFrame(rows)
    table = Table(title="R² of line fits to the shipped H200 profiles")
    for column in frame.columns:
        table.add_column(column, justify="left" if column in ("model", "component") else "right")
    for row in frame.itertuples(index=False):
        table.add_row(*(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row))
    Console(width=200).print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(args.out / "fit_forms.csv", index=False)
        (args.out / "fit_forms.json").write_text(json.dumps(rows, indent=1))
        plot_misses(fits["ouro-1.4b"], args.out / "misses.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
