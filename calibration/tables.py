"""Committed result tables read back: the summary figures of a validation run and the executor's targets, derived
from the tables themselves (``cdbsim validate``'s ``summary.csv``; the executor benchmark's ``stages.csv``,
``attention.csv`` and ``throughput.csv``), so a re-measured table changes them. Only pandas and JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

MAX_X_ROOFLINE = 1.3  # every core and CB decode step, against the weights + KV roofline
MIN_ATTENTION = 0.85  # decode attention's share of copy bandwidth at B = 64, L = 4,096
MIN_PREFILL = 0.65  # a replayed full-depth prefill's weight flops against the fastest GEMM, >= 2,048 tokens
MIN_K1 = 0.97  # refill at K = 1 without exits against CB, for K1_MODEL
K1_MODEL = "huginn-3.5b"
MAX_MEDIAN, MAX_WORST = 1.0, 4.0  # validation after recalibration: offline tok/s |error| %


def read_table(path: Path, what: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """``path`` as a CSV ``what`` table holding ``columns``, or a one-line ValueError naming the file."""
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as exc:  # pandas' parse errors are ValueErrors
        raise ValueError(f"{path} is not a readable {what} table ({exc})") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)} column: not a {what} table")
    return table


def matrix_errors(summary: pd.DataFrame) -> dict[str, float]:
    """A ``cdbsim validate`` summary's headline figures: |signed error| median and worst of the offline runs'
    output tok/s and of the online runs' normalized latency p50 (online runs are those with the latter)."""
    online = summary["norm p50 error %"].notna()
    offline_tps = summary.loc[~online, "tok/s error %"].abs()
    online_p50 = summary.loc[online, "norm p50 error %"].abs()
    return {"configs": len(summary), "offline_median": float(offline_tps.median()),
            "offline_worst": float(offline_tps.max()), "online_median": float(online_p50.median()),
            "online_worst": float(online_p50.max())}


def gemm_peak_tflops(profile: Path) -> float:
    """The fastest GEMM a kernel-level profile measured, TFLOP/s: the matmul rate prefill is held against."""
    try:
        tables = json.loads(Path(profile).read_text())["kernels"]["tables"]
        return max(2 * m * n * k / seconds for m, n, k, seconds in tables["gemm"]) / 1e12
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{profile} is not a kernel-level profile with a gemm table ({exc})") from None


@dataclass(frozen=True)
class Verdict:
    """One target: what it asks, what the tables hold, and whether that meets it."""

    target: str
    measured: str
    met: bool


def worst_steps(stages: pd.DataFrame, stage: str) -> Verdict:
    """Every ``stage`` row (``core``, or ``decode``: the CB step) against :data:`MAX_X_ROOFLINE`."""
    rows = stages[stages["stage"] == stage]
    if rows.empty:
        raise ValueError(f"the stage table has no {stage} rows")
    parts = []
    for model, g in rows.groupby("model", sort=False):
        worst = g.loc[g["x_roofline_weights_kv"].idxmax()]
        parts.append(f"{model} {g['x_roofline_weights_kv'].min():.2f}-{worst['x_roofline_weights_kv']:.2f}x "
                     f"(worst B={int(worst['batch'])} L={int(worst['context'])})")
    return Verdict(f"{'core' if stage == 'core' else 'CB'} step <= {MAX_X_ROOFLINE}x weights + KV, every B and L",
                   "; ".join(parts),
                   bool((rows["x_roofline_weights_kv"] <= MAX_X_ROOFLINE).all()))


def attention(table: pd.DataFrame) -> Verdict:
    """The shipped decode attention (``triton`` rows) at B = 64, L = 4,096, every head shape."""
    rows = table[(table["impl"] == "triton") & (table["batch"] == 64) & (table["length"] == 4096)]
    if rows.empty:
        raise ValueError("the attention table has no triton rows at B = 64, L = 4,096")
    measured = "; ".join(f"{r.shape} {r.fraction_of_copy_bw:.0%}" for r in rows.itertuples())
    return Verdict(f"decode attention >= {MIN_ATTENTION:.0%} of copy bandwidth, B = 64, L = 4,096", measured,
                   bool((rows["fraction_of_copy_bw"] >= MIN_ATTENTION).all()))


def prefill(stages: pd.DataFrame, peak_tflops: float) -> Verdict:
    """Each replayed prefill (one chunk of ``batch`` >= 2,048 tokens at full depth) at 2 flops per weight per token
    (bf16: ``weight_bytes`` / 2 weights) against ``peak_tflops``."""
    rows = stages[(stages["stage"] == "prefill") & (stages["batch"] >= 2048)]
    if rows.empty:
        raise ValueError("the stage table has no prefill of 2,048 tokens or more")
    of_peak = rows["batch"] * rows["weight_bytes"] / rows["ms"] / 1e9 / peak_tflops
    measured = "; ".join(f"{model} {tokens}: {share:.0%}"
                         for model, tokens, share in zip(rows["model"], rows["batch"], of_peak, strict=True))
    return Verdict(f"prefill >= {MIN_PREFILL:.0%} of the fastest GEMM ({peak_tflops:.0f} TFLOP/s), replayed, "
                   ">= 2,048 tokens", measured, bool((of_peak >= MIN_PREFILL).all()))


def refill_k1(table: pd.DataFrame) -> Verdict:
    """Refill at K = 1 without exits against CB: every model shown, :data:`K1_MODEL` decides."""
    rows = table[(table["policy"] == "refill") & (table["K"] == 1) & (table["exits"] == "none")]
    if K1_MODEL not in set(rows["model"]):
        raise ValueError(f"the throughput table has no {K1_MODEL} refill run at K = 1 without exits")
    measured = "; ".join(f"{r.model} {r.speedup_vs_cb:.1%}" for r in rows.itertuples())
    return Verdict(f"{K1_MODEL} refill at K = 1, no exits, >= {MIN_K1:.0%} of CB", measured,
                   bool((rows.loc[rows["model"] == K1_MODEL, "speedup_vs_cb"] >= MIN_K1).all()))


def validation(errors: dict[str, float]) -> Verdict:
    """A summary's offline tok/s errors (:func:`matrix_errors`) against :data:`MAX_MEDIAN` and :data:`MAX_WORST`."""
    median, worst = errors["offline_median"], errors["offline_worst"]
    return Verdict(f"validation median <= {MAX_MEDIAN:g}%, worst <= {MAX_WORST:g}% ({errors['configs']} configs)",
                   f"{median:.2f}% / {worst:.2f}%", median <= MAX_MEDIAN and worst <= MAX_WORST)


def verdicts(stages: Path, attention_table: Path, throughput: Path, profile: Path, summary: Path) -> list[Verdict]:
    """Every executor target's verdict from the tables at these paths: the executor benchmark's ``stages.csv``,
    ``attention.csv`` and ``throughput.csv`` (K = 1, no exits), the kernel-level profile whose fastest GEMM prefill is
    held against, and the validation ``summary.csv``. A missing or malformed table is a ValueError naming it."""
    steps = read_table(stages, "stage", ("model", "stage", "batch", "context", "ms", "weight_bytes",
                                         "x_roofline_weights_kv"))
    return [worst_steps(steps, "core"), worst_steps(steps, "decode"),
            attention(read_table(attention_table, "attention", ("shape", "impl", "batch", "length",
                                                                 "fraction_of_copy_bw"))),
            prefill(steps, gemm_peak_tflops(profile)),
            refill_k1(read_table(throughput, "throughput", ("model", "policy", "K", "exits", "speedup_vs_cb"))),
            validation(matrix_errors(read_table(summary, "validation summary",
                                                ("config", "tok/s error %", "norm p50 error %"))))]
