"""Every results table of README and docs, printed from the committed result files (no GPU, seconds).

A table in a Markdown file sits between ``<!-- table NAME -->`` and ``<!-- end table -->``; this script makes each
NAME from ``benchmarks/results/`` (and, for the memory tables, the shipped profiles), so no results number is typed
by hand. ``--check`` exits 1 naming each table a file holds that differs from what this prints (CI runs it);
``--write`` puts the printed tables into the files.

    python benchmarks/tables.py            # print every table
    python benchmarks/tables.py --check    # README and docs agree with the results?
    python benchmarks/tables.py --write    # make them agree
"""

# ruff: noqa: E402  (the imports follow the sys.path line that picks this checkout)
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd

from calibration.tables import verdicts

RESULTS = ROOT / "benchmarks" / "results"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def markdown(header: list[str], rows: list[list[object]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "".join(f"| {' | '.join(str(cell) for cell in line)} |\n" for line in lines)


def errors(folder: str) -> dict:
    """The ``errors`` of a committed ``cdbsim validate`` summary."""
    return json.loads((RESULTS / folder / "summary.json").read_text())["errors"]


def pct(value: float | None, digits: int = 2) -> str:
    return "" if value is None or pd.isna(value) else f"{value:.{digits}f}%"


def validation_row(label: str, folder: str, target: str) -> list[object]:
    e = errors(folder)
    tails = [e.get(f"online {m} p99 |error| worst %") for m in ("TTFT", "TPOT")]
    offline = f"{pct(e['offline tok/s |error| median %'])} / {pct(e['offline tok/s |error| worst %'])}"
    return [label, e["configs"], offline,
            pct(e.get("online norm p50 |error| worst %"), 1),
            " / ".join(pct(t, 1) for t in tails) if None not in tails else "", target]


OWN_TARGET = "1% / 3%; 3%; 10% / 10%"  # a GPU's own profiles: offline median / worst; online p50; TTFT / TPOT p99


def validation() -> str:
    """The validation matrices re-predicted from their committed executor logs."""
    header = ["runs (profiles)", "configs", "offline tok/s \\|error\\| median / worst", "online norm. p50 worst",
              "online TTFT / TPOT p99 worst", "target"]
    return markdown(header, [
        validation_row("H200 (its own)", "validation", OWN_TARGET),
        validation_row("H100 80GB (its own)", "validation-h100", OWN_TARGET),
        validation_row("H100 80GB (the H200's, `--profile h200`)", "validation-h100/from-h200", "5% / 10%"),
        validation_row("H100 80GB (its kernels, `--profile h100-kernels`)", "validation-h100/from-h100-kernels",
                       "1.5% / 4%"),
        validation_row("H100 80GB (the H200's kernels, `--profile h200-kernels`)", "validation-h100/from-h200-kernels",
                       ""),
        validation_row("H200, Huginn per-step launches (`paper-huginn-h200.json`)", "paper/gpu", ""),
    ])


def unseen() -> str:
    """Shapes no per-model profile measured, from the kernel-level profile alone."""
    e = errors("unseen")
    summary = pd.read_csv(RESULTS / "unseen" / "summary.csv")
    online = int(summary["norm p50 error %"].notna().sum())
    return markdown(["from the kernel profile alone (H200)", "result", "target"], [
        [f"{len(summary) - online} offline runs: tok/s \\|error\\| median / worst",
         f"{pct(e['offline tok/s |error| median %'], 1)} / {pct(e['offline tok/s |error| worst %'], 1)}", "3% / 6%"],
        [f"{online} online runs: normalized latency p50 worst", pct(e["online norm p50 |error| worst %"], 1), "8%"]])



def unseen_h100() -> str:
    """The grid's new shapes on the H100 from its kernel profile alone, per shape, signed (predicted against
    measured): offline throughput, and the time of the decode-step stage (core, or decode under CB) over all its
    launches and of the online runs' normalized latency p50 (+: predicted slower)."""
    folder = RESULTS / "unseen-h100"
    summary = pd.concat([pd.read_csv(part / "summary.csv") for part in sorted(folder.glob("part*"))])
    stages = pd.concat([pd.read_csv(part / "stages.csv") for part in sorted(folder.glob("part*"))])
    steps = stages[stages["stage"].isin(["core", "decode"]) & (stages["batch"] == "all")].set_index("config")
    shape = summary["config"].str.replace(r"-(alpaca|sharegpt)-.*", "", regex=True)
    rows = []
    for name, runs in summary.groupby(shape, sort=False):
        offline = runs[runs["norm p50 error %"].isna()]
        online = runs["norm p50 error %"].dropna()
        step = 100 * steps.loc[runs["config"], "error"]
        rows.append([name, shape_facts(f"unseen-{name}"), len(offline),
                     f"{offline['tok/s error %'].min():+.1f}% to {offline['tok/s error %'].max():+.1f}%",
                     f"{step.min():+.1f}% to {step.max():+.1f}%",
                     " / ".join(f"{v:+.1f}%" for v in online)])
    return markdown(["shape (H100, `h100-kernels`)", "hidden, GQA, head size, vocab", "offline runs",
                     "offline tok/s", "decode-step time", "online norm. p50"],
                    rows)


def shape_facts(name: str) -> str:
    """Hidden, GQA, head size and vocabulary of ``calibration/archs/NAME.json``."""
    from cdbsim.model.arch import load_arch

    arch = load_arch(str(ROOT / "calibration" / "archs" / f"{name}.json"))
    s = arch.layer
    return f"{s.hidden:,}, {s.heads // s.kv_heads}:1, {s.head_dim}, {arch.vocab / 1000:.0f}k"


def composed_layers() -> str:
    """One decode layer of each calibrated model on the H100 at 128 positions: measured (the model profile's layer
    points: a two-layer core step less a one-layer one) against composed from the kernel profile's tables."""
    from cdbsim.latency.kernels import KernelModel
    from cdbsim.latency.shipped import shipped_profiles
    from cdbsim.model.arch import PRESETS

    profiles = shipped_profiles()
    kernels = KernelModel(profiles["h100-kernels"].kernels)
    models = ("ouro-1.4b", "huginn-3.5b")
    measured = {}
    for model in models:
        layer = next(fit for name, fit in profiles[f"h100-{model}"].components.items() if name.startswith("layer/"))
        measured[model] = {int(rows): t for rows, context, t in layer.points if context == 128 * rows}
    rows = []
    for batch in (1, 2, 4, 8, 16, 32, 64):
        cells = []
        for model in models:
            t, composed = measured[model][batch], kernels.layer(PRESETS[model], batch, 128.0)
            cells.append(f"{1e6 * t:.1f} / {1e6 * composed:.1f} ({100 * (composed / t - 1):+.0f}%)")
        rows.append([batch, *cells])
    return markdown(["rows", "Ouro-1.4B layer, µs: measured / composed", "Huginn-3.5B layer, µs: measured / composed"],
                    rows)


def served_layers() -> str:
    """One decode layer as served on the H100, against the kernel profile's composition and the two-layer less
    one-layer step (``python benchmarks/bench_executor.py --parts layers``), per shape and path."""
    frame = pd.read_csv(RESULTS / "executor" / "layers.csv.gz")
    wide = frame[frame["what"].isin(["served layer", "composed layer", "two-layer less one-layer step"])].pivot_table(
        index=["shape", "path", "rows", "context"], columns="what", values="us").reset_index()
    rows = []
    for (shape, path), group in wide.groupby(["shape", "path"], sort=False):
        composed = 100 * (group["composed layer"] / group["served layer"] - 1)
        added = 100 * (group["two-layer less one-layer step"] / group["served layer"] - 1)
        rows.append([shape, path, f"{group['rows'].min()}–{group['rows'].max()}", len(group),
                     f"{composed.median():+.1f}% ({composed.min():+.1f} to {composed.max():+.1f})",
                     f"{added.median():+.1f}% ({added.min():+.1f} to {added.max():+.1f})"])
    return markdown(["shape", "path", "rows", "points", "composed vs served: median (range)",
                     "two-layer less one-layer step vs served"], rows)


KERNEL_FAMILIES = (  # (family, name fragments of served and composed kernels), matched in this order
    ("attention", ("attn", "attention")), ("norms", ("norm",)),
    ("matmul", ("gemv", "gemm", "few_rows", "nvjet", "cublas")), ("elementwise", ("rope_kv", "silu")))


def kernel_family(name: str) -> str:
    """The family of a served or composed kernel's name; ``other`` when none matches."""
    return next((family for family, parts in KERNEL_FAMILIES if any(p in name.lower() for p in parts)), "other")


def served_kernels() -> str:
    """The served layer's kernels by family against the composed ones (the same file's ``served kernel`` and
    ``composed kernel`` rows): median over rows and contexts of composed / served - 1, per shape and path."""
    frame = pd.read_csv(RESULTS / "executor" / "layers.csv.gz")
    kernels = frame[frame["what"].isin(["served kernel", "composed kernel"])].copy()
    kernels["family"] = kernels["name"].map(kernel_family)
    sums = kernels.pivot_table(index=["shape", "path", "rows", "context", "family"], columns="what", values="us",
                               aggfunc="sum").reset_index()
    sums["error"] = 100 * (sums["composed kernel"] / sums["served kernel"] - 1)
    families = [f for f, _ in KERNEL_FAMILIES]
    rows = []
    for (shape, path), group in sums.groupby(["shape", "path"], sort=False):
        median = group.groupby("family")["error"].median()
        rows.append([shape, path, *(f"{round(median[f]):+d}%" if f in median and pd.notna(median[f]) else ""
                                    for f in families)])
    return markdown(["shape", "path", *(f"{f}: composed vs served" for f in families)], rows)


def paper() -> str:
    """The paper's findings against cdbsim on the shipped profiles."""
    rows = json.loads((RESULTS / "paper" / "findings.json").read_text())["rows"]
    table = []
    for row in rows:
        closers = [f"{name}: {s['value']}" for name, s in row["switches"].items() if s["agrees"]]
        table.append([row["finding"], row["paper"], f"{row['cdbsim']} {'✓' if row['agrees'] else '✗'}",
                      "; ".join(closers) or row["closed_by"]])
    return markdown(["finding", "paper", "cdbsim", "closed by"], table)


PAPER_OFFLINE = {"ouro-1.4b": "refill / CB 1.32–1.58", "huginn-3.5b": "no-refill / CB 1.30–1.37, refill <= no-refill"}
PAPER_DELTA_MS = {"ouro-1.4b": ("CB step", 5.4), "huginn-3.5b": ("core step", 2.3)}


def paper_h100() -> str:
    """The paper's H100 settings: this executor and the simulator on the H100 beside the authors' engine."""
    from benchmarks.paper_findings import KNEE_CASES, KNEE_POLICIES, knees
    from cdbsim.model.arch import load_arch
    from cdbsim.planner.experiment import LatencySection
    from cdbsim.serving.launch import Stage

    folder = RESULTS / "paper" / "h100"
    knee = knees(pd.read_csv(folder / "curves.csv"))
    gpu = pd.read_csv(folder / "summary.csv").set_index("config") if (folder / "summary.csv").exists() else None
    rows = []
    for case in KNEE_CASES:
        model, workload = case.model, case.workload
        name = f"{model.split('-')[0].capitalize()} {'ShareGPT' if workload == 'sharegpt' else 'Alpaca'} q={case.q:g}"
        if gpu is not None:
            keys = [f"{model.split('-')[0]}-{workload}-{p}" for p in KNEE_POLICIES]
            measured = [gpu.loc[k, "measured tok/s"] for k in keys]
            predicted = [gpu.loc[k, "predicted tok/s"] for k in keys]
            ratios = [" / ".join(f"{v[i] / v[0]:.2f}" for i in (1, 2)) for v in (measured, predicted)]
            rows.append([f"{name}: offline tok/s, CB / no-refill / refill", "",
                         " / ".join(f"{v:,.0f}" for v in measured), " / ".join(f"{v:,.0f}" for v in predicted)])
            rows.append([f"{name}: offline no-refill / CB, refill / CB", PAPER_OFFLINE[model], *ratios])
        of = knee[knee["case"] == case.name].groupby("policy")["knee"]
        mean, low, high = of.mean(), of.min(), of.max()
        sim = " / ".join(f"{mean[p]:.3g}" for p in KNEE_POLICIES)
        spread = max((high[p] - low[p]) / mean[p] for p in KNEE_POLICIES)
        rows.append([f"{name}: knee req/s, CB / no-refill / refill", " / ".join(f"{k:g}" for k in case.paper),
                     "", f"{sim} (3 seeds within {100 * spread:.0f}%)"])
        rows.append([f"{name}: knee no-refill / CB, refill / CB",
                     f"{case.paper[1] / case.paper[0]:.2f} / {case.paper[2] / case.paper[0]:.2f}", "",
                     f"{mean['norefill'] / mean['cb']:.2f} / {mean['refill'] / mean['cb']:.2f}"])
    for model, (what, paper_ms) in PAPER_DELTA_MS.items():
        costs = LatencySection(device="h100-sxm").model(load_arch(model)).costs
        ours = costs[Stage.DECODE if what == "CB step" else Stage.CORE].delta * 1e3
        rows.append([f"δ {model}, {what} (ms)", f"{paper_ms:g}", f"{ours:.2f} (H100 profile)", ""])
    if gpu is None:
        rows.append(["offline runs", "", "`bash benchmarks/gpu_session.sh paper` on an H100 measures them", ""])
    return markdown(["quantity", "paper (authors' engine, H100)", "this executor (H100)", "simulator (H100 profiles)"],
                    rows)


def adaptive_grid() -> str:
    """Adaptive against every fixed (policy, K) on the held-out grid."""
    g = json.loads((RESULTS / "adaptive" / "grid-summary-seed19.json").read_text())
    by_load = " and ".join(f"{load} {share:.0%}" for load, share in g["within_1pct_by_load"].items())
    return markdown([f"held-out grid, {g['points']} points", "result", "target"], [
        ["within 1% of the best fixed (policy, K)", f"{g['within_1pct_of_best']:.0%} ({by_load})", "90%"],
        ["worst against the best fixed", f"{100 * g['worst_vs_best']:+.1f}%", ""],
        ["median against the best fixed", f"{100 * g['median_vs_best']:+.1f}%", ""],
        ["points where the paper's rule (K = W/4) is not best", f"{g['paper_rule_not_best']}; there adaptive gains a "
         f"median {100 * g['median_gain_over_paper_where_not_best']:.1f}% over it", ""]])


def adaptive_gpu() -> str:
    """Each adaptive run on the H200 against the best fixed choice measured beside it (same requests)."""
    runs = pd.read_csv(RESULTS / "adaptive" / "gpu" / "summary.csv").set_index("config")["measured tok/s"]
    rows = []
    for name in [c for c in runs.index if c.endswith("-adaptive")]:
        group = name.removesuffix("-adaptive")
        fixed = runs[[c for c in runs.index if c.startswith(f"{group}-") and c != name]]
        best = fixed.idxmax()
        rows.append([f"{group} (best fixed: {best.removeprefix(group + '-')})", f"{fixed[best]:,.0f}",
                     f"{runs[name]:,.0f}", f"{100 * (runs[name] / fixed[best] - 1):+.1f}%"])
    return markdown(["configuration", "best fixed, tok/s", "adaptive, tok/s", "adaptive gain"], rows)


def executor_targets() -> str:
    """The executor's speed targets, met or not, from the benchmark tables, the kernel profile and validation."""
    rows = verdicts(RESULTS / "executor" / "stages.csv", RESULTS / "executor" / "attention.csv",
                    RESULTS / "executor" / "throughput.csv", ROOT / "calibration" / "profiles" / "h200-kernels.json",
                    RESULTS / "validation" / "summary.csv")
    return markdown(["target", "measured (H200)", "met"], [[r.target, r.measured, "yes" if r.met else "no"]
                                                             for r in rows])


def checkpoint() -> str:
    """``cdbsim record`` on full-size checkpoints in the authors' layout, and bf16 against float32 logits."""
    path = RESULTS / "executor" / "checkpoint.csv"
    header = ["model", "checkpoint GB", "open s", "record tok/s (prompts x new tokens)", "mean exit depth",
              "bf16 vs fp32: first-logit rel. L2", "same first token", "greedy tokens alike (median)"]
    if not path.exists():
        return markdown(header, [["none yet", "`bash benchmarks/gpu_session.sh checkpoint` measures it",
                                  *[""] * 6]])
    runs = pd.read_csv(path)
    nudged = "fp32_perturbed_first_logit_rel_l2" in runs  # a float32 run with nudged embeddings, where measured
    rows = [[f"{r.model} ({r.device})", f"{r.checkpoint_gb:.1f}", f"{r.open_s:.1f}",
             f"{r.record_tok_s:,.0f} ({r.prompts} x {r.max_new_tokens})", f"{r.mean_exit_depth:.2f} (q = {r.q:g})",
             f"{r.vs_fp32_first_logit_rel_l2:.2e}", f"{100 * r.vs_fp32_first_token_agree:.0f}%",
             f"{r.vs_fp32_greedy_tokens_before_divergence:g} of {r.vs_fp32_compared_tokens}",
             *([f"{r.fp32_perturbed_first_logit_rel_l2:.2e}"] if nudged else [])] for r in runs.itertuples()]
    return markdown(header + ([f"fp32, embeddings x (1 + {runs.perturbation[0]:g} N): rel. L2"] if nudged else []),
                    rows)


SIM_TARGETS = {"refill": "10", "norefill": "10", "cb": "15"}  # µs per launch


def sim_speed() -> str:
    """The simulator's CPU time per launch, compiled and pure Python, and its memory at 100,000 requests."""
    compiled, pure = (json.loads((RESULTS / f"{name}.json").read_text()) for name in ("sim_speed", "sim_speed_pure"))
    slow = {r["case"]: r["us_per_launch"] for r in pure["results"]}
    rows = [[r["case"], f"{r['us_per_launch']:.1f}", f"{slow[r['case']]:.1f}", SIM_TARGETS[r["policy"]]]
            for r in compiled["results"]]
    memory = compiled["memory"]
    rows.append([f"{memory['requests']:,} requests: peak memory", f"{memory['peak_rss_mb']:,.0f} MB", "", "600 MB"])
    host = compiled["host_reference"]
    rows.append([f"the host: `{host['code']}`, µs", f"{host['us']:.1f}", "", ""])
    return markdown(["case (µs per launch, CPU)", "compiled", "pure Python", "target"], rows)


def sweep_speed() -> str:
    """A 1,000-point sweep's wall time and memory, with two local jobs and on a local Dask cluster."""
    runs = json.loads((RESULTS / "sweep_speed.json").read_text())["runs"]
    return markdown(["sweep", "points x requests", "wall s", "peak memory"],
                    [[r["mode"], f"{r['points']:,} x {r['requests']}", f"{r['wall_s']:.0f}",
                      f"{r['peak_rss_mb']:.0f} MB"] for r in runs])


CODESIGN = RESULTS / "codesign"
LIMITS_MS = (40, 50, 75, 100)
FAMILY = {"huginn-3.5b": "Huginn-style h5280", "ouro-2.6b": "Ouro-style h2048"}
MODEL = ["family", "arch.split", "arch.r_max"]


def study(name: str = "study.parquet") -> pd.DataFrame:
    """The co-design sweep's answered points (``cdbsim sweep --config benchmarks/results/codesign/study.toml``)."""
    rows = pd.read_parquet(CODESIGN / name)
    rows = rows[rows["status"] == "ok"].copy()
    rows["family"] = rows["arch.name"].map(FAMILY)
    rows["tpot_ms"] = rows["tpot_s_p99"] * 1e3
    return rows


def best_per_model(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.loc[rows.groupby(MODEL, sort=False)["output_tps"].idxmax()]


def codesign_best() -> str:
    """The co-design study: per model, split and r_max, the best throughput per GPU over policy and W."""
    rows = study()
    table = []
    for _, r in best_per_model(rows).iterrows():
        same = rows[(rows[MODEL] == r[MODEL]).all(axis=1)]
        gain = (same[same["serve.policy"] == "refill"]["output_tps"].max()
                / same[same["serve.policy"] == "cb"]["output_tps"].max())
        table.append([r["family"], r["arch.split"], r["arch.r_max"], f"{r['params'] / 1e9:.2f}",
                      f"{r['output_tps']:,.0f}", f"{r['serve.policy']} W={r['serve.width']}", f"{r['tpot_ms']:.1f}",
                      f"{r['layers_per_token']:.1f}", f"{gain:.2f}x"])
    return markdown(["model", "split", "r_max", "params (B)", "best tok/s per GPU", "at", "p99 TPOT ms",
                     "layers/token", "refill/CB"], table)


def codesign_limits() -> str:
    """The co-design study: the best point under each p99 TPOT limit."""
    rows = study()
    table = []
    for limit in LIMITS_MS:
        within = rows[rows["tpot_ms"] <= limit]
        if within.empty:
            table.append([f"{limit} ms", "none", "", "", "", "", ""])
            continue
        r = within.loc[within["output_tps"].idxmax()]
        table.append([f"{limit} ms", f"{r['output_tps']:,.0f}", r["family"], r["arch.split"], r["arch.r_max"],
                      f"{r['serve.policy']}, W={r['serve.width']}", f"{r['tpot_ms']:.1f}"])
    return markdown(["p99 TPOT limit", "best tok/s per GPU", "model", "split", "r_max", "policy, W", "p99 TPOT ms"],
                    table)


def codesign_kernels() -> str:
    """The co-design study on the kernel-level profile alone: does it pick each model's best policy and W?"""
    shipped, kernels = (best_per_model(study(name)).set_index(MODEL) for name in ("study.parquet",
                                                                                  "study-kernels.parquet"))
    kernel_rows = study("study-kernels.parquet").set_index([*MODEL, "serve.policy", "serve.width"])["output_tps"]
    table = []
    for key, r in shipped.iterrows():
        k = kernels.loc[key]
        pick = (r["serve.policy"], r["serve.width"])
        loss = 1 - kernel_rows.loc[(*key, *pick)] / k["output_tps"]  # the shipped pick, priced by the kernel profile
        table.append([key[0], key[1], key[2], f"{pick[0]} W={pick[1]}", f"{k['serve.policy']} W={k['serve.width']}",
                      "yes" if pick == (k["serve.policy"], k["serve.width"]) else f"no ({100 * loss:.2f}% apart)"])
    return markdown(["model", "split", "r_max", "shipped profiles pick", "kernel profile picks", "same"], table)


def memory_measured() -> str:
    """The executor's peak memory against the plan, from ``bash benchmarks/gpu_session.sh memory``."""
    from benchmarks.memory import report

    header = ["GPU", "configuration", "peak GiB", "plan GiB", "error %", "run time GiB", "plan run time GiB"]
    rows = []
    for path in sorted((RESULTS / "memory").glob("memory-*.csv")):
        gpu = path.stem.removeprefix("memory-")
        for r in report(path, ROOT / "calibration" / "matrices" / f"validation-{gpu}.json").itertuples():
            rows.append([gpu.upper(), r.entry, f"{r[2]:.2f}", f"{r[3]:.2f}", f"{r[4]:+.1f}", f"{r[5]:.2f}",
                         f"{r[6]:.2f}"])
    return markdown(header, rows or [["none yet", "`bash benchmarks/gpu_session.sh memory` measures it", *[""] * 5]])


def memory_full() -> str:
    """Largest KV cache of each model, r_max and layout on each GPU at W = 64 and 256."""
    from benchmarks.memory import fit_table

    frame = fit_table()
    return markdown(list(frame.columns), frame.astype(str).values.tolist())


def memory() -> str:
    """Largest KV cache of each model at its shipped r_max, by layout, on each GPU at W = 64."""
    from benchmarks.memory import FIT_MODELS, fit_table

    frame = fit_table(widths=(64,))
    frame = frame[frame["r_max"] == frame["model"].map(lambda m: FIT_MODELS[m][0])]
    wide = frame.pivot(index="model", columns="layout", values=["H100 W=64", "H200 W=64"])
    layouts = ("depth", "first-shared", "shared")
    rows = [[f"{model} (r_max {FIT_MODELS[model][0]})", *(wide.loc[model, (gpu, layout)] for gpu in
                                                          ("H100 W=64", "H200 W=64") for layout in layouts)]
            for model in FIT_MODELS]
    return markdown(["model", *(f"{gpu[:4]} {layout}" for gpu in ("H100", "H200") for layout in layouts)], rows)


TABLES: dict[str, Callable[[], str]] = {
    "validation": validation, "unseen": unseen, "unseen-h100": unseen_h100,
    "composed-layers": composed_layers, "served-layers": served_layers, "served-kernels": served_kernels,
    "paper": paper, "paper-h100": paper_h100,
    "adaptive-grid": adaptive_grid, "adaptive-gpu": adaptive_gpu, "executor-targets": executor_targets,
    "sim-speed": sim_speed, "sweep-speed": sweep_speed, "codesign-best": codesign_best,
    "codesign-limits": codesign_limits, "codesign-kernels": codesign_kernels, "memory": memory,
    "memory-full": memory_full, "memory-measured": memory_measured, "checkpoint": checkpoint}


def blocks(path: Path) -> list[tuple[str, str]]:
    """The (name, body) of each table block in ``path``; an unknown name is a one-line error."""
    found = [(m["name"], m["body"]) for m in BLOCK.finditer(path.read_text())]
    for name, _ in found:
        if name not in TABLES:
            raise SystemExit(f"error: {path.relative_to(ROOT)}: unknown table {name!r}; known: {', '.join(TABLES)}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if a file's table differs from the results")
    mode.add_argument("--write", action="store_true", help="write the tables into README and docs")
    args = parser.parse_args(argv)
    made = {name: make() for name, make in TABLES.items()}
    if not (args.check or args.write):
        for name, text in made.items():
            print(f"<!-- table {name} -->  {TABLES[name].__doc__.splitlines()[0]}\n{text}")
        return 0
    stale = []
    for path in DOCUMENTS:
        for name, body in blocks(path):
            if body != made[name]:
                stale.append(f"{path.relative_to(ROOT)}: {name}")
        if args.write:
            path.write_text(BLOCK.sub(lambda m: f"{m[1]}{made[m['name']]}{m[4]}", path.read_text()))
    if args.check and stale:
        print(f"error: tables differ from the results: {', '.join(stale)}; run python benchmarks/tables.py --write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
