"""The executor's speed targets against the latest committed measurements, each marked met or not.

The targets (docs/executor.md, "Where it falls short") are read off five result tables measured by different
commands; this derives the verdicts from the tables themselves, so a re-measured table changes them without
anyone retyping a number. Runs anywhere:

    python benchmarks/executor_targets.py               # the committed results
    python benchmarks/executor_targets.py --json        # the same as JSON
    python benchmarks/executor_targets.py --stages DIR/stages.csv --attention DIR/attention.csv ...

Inputs (defaults: the committed ones): a ``bench_executor.py --parts stages attention`` run's ``stages.csv`` and
``attention.csv``; ``profile_prefill.py``'s ``prefill-profile.csv`` (replayed prefills) and the kernel profile
whose fastest GEMM is the matmul rate; a ``bench_executor.py --parts throughput --exits none --k 1`` run's
``throughput.csv``; a ``cdbsim validate`` run's ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import pandas as pd  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEFAULTS = {"stages": RESULTS / "executor-table" / "stages" / "stages.csv",
            "attention": RESULTS / "executor-table" / "stages" / "attention.csv",
            "prefill": RESULTS / "prefill-profile" / "prefill-profile.csv",
            "profile": ROOT / "calibration" / "profiles" / "h200-kernels.json",
            "k1": RESULTS / "throughput-noexit" / "k1" / "throughput.csv",
            "validation": RESULTS / "validation" / "summary.json"}
MAX_X_ROOFLINE = 1.3  # every core and CB decode step, weights + KV roofline
MIN_ATTENTION = 0.85  # decode attention's share of copy bandwidth at B = 64, L = 4,096
MIN_PREFILL = 0.65  # replayed prefill's weight flops against the fastest GEMM, at >= 2,048 tokens
MIN_K1 = 0.97  # refill at K = 1 without exits against CB (the issue names Huginn-3.5B)
K1_MODEL = "huginn-3.5b"
MAX_MEDIAN, MAX_WORST = 1.0, 4.0  # validation, offline tok/s |error| %


@dataclass(frozen=True)
class Verdict:
    """One target: what it asks, what the tables hold, and whether that meets it."""

    target: str
    measured: str
    met: bool


def worst_steps(stages: pd.DataFrame, stage: str) -> Verdict:
    """Every ``stage`` row (``core`` or ``decode``, the CB step) against :data:`MAX_X_ROOFLINE`."""
    rows = stages[stages["stage"] == stage]
    if rows.empty:
        raise ValueError(f"the stage table has no {stage} rows")
    parts = []
    for model, g in rows.groupby("model", sort=False):
        worst = g.loc[g["x_roofline_weights_kv"].idxmax()]
        parts.append(f"{model} {g['x_roofline_weights_kv'].min():.2f}-{worst['x_roofline_weights_kv']:.2f}x "
                     f"(worst B={int(worst['batch'])} L={int(worst['context'])})")
    name = "core step" if stage == "core" else "CB step"
    return Verdict(f"{name} <= {MAX_X_ROOFLINE}x weights + KV, every B and L", "; ".join(parts),
                   bool((rows["x_roofline_weights_kv"] <= MAX_X_ROOFLINE).all()))


def attention(table: pd.DataFrame) -> Verdict:
    """The shipped decode attention (``triton`` rows) at B = 64, L = 4,096, every head shape."""
    rows = table[(table["impl"] == "triton") & (table["batch"] == 64) & (table["length"] == 4096)]
    if rows.empty:
        raise ValueError("the attention table has no triton rows at B = 64, L = 4,096")
    measured = "; ".join(f"{r.shape} {r.fraction_of_copy_bw:.0%}" for r in rows.itertuples())
    return Verdict(f"decode attention >= {MIN_ATTENTION:.0%} of copy bandwidth, B = 64, L = 4,096", measured,
                   bool((rows["fraction_of_copy_bw"] >= MIN_ATTENTION).all()))


def prefill(table: pd.DataFrame, peak_tflops: float) -> Verdict:
    """Each replayed prefill of >= 2,048 tokens, weight flops against ``peak_tflops``."""
    rows = table[table["tokens"] >= 2048].drop_duplicates(["model", "tokens"])
    if rows.empty:
        raise ValueError("the prefill table has no launch of 2,048 tokens or more")
    share = rows["weight_tflops_replay"] / peak_tflops
    measured = "; ".join(f"{r.model} {r.tokens}: {s:.0%}" for r, s in zip(rows.itertuples(), share, strict=True))
    return Verdict(f"prefill >= {MIN_PREFILL:.0%} of the fastest GEMM ({peak_tflops:.0f} TFLOP/s), replayed, "
                   ">= 2,048 tokens", measured, bool((share >= MIN_PREFILL).all()))


def refill_k1(table: pd.DataFrame) -> Verdict:
    """Refill at K = 1 without exits against CB: every model shown, :data:`K1_MODEL` decides."""
    rows = table[(table["policy"] == "refill") & (table["K"] == 1) & (table["exits"] == "none")]
    if K1_MODEL not in set(rows["model"]):
        raise ValueError(f"the throughput table has no {K1_MODEL} refill run at K = 1 without exits")
    measured = "; ".join(f"{r.model} {r.speedup_vs_cb:.1%}" for r in rows.itertuples())
    return Verdict(f"{K1_MODEL} refill at K = 1, no exits, >= {MIN_K1:.0%} of CB", measured,
                   bool((rows.loc[rows["model"] == K1_MODEL, "speedup_vs_cb"] >= MIN_K1).all()))


def validation(errors: dict) -> Verdict:
    """The validation matrix's offline tok/s errors against :data:`MAX_MEDIAN` and :data:`MAX_WORST`."""
    median, worst = errors["offline tok/s |error| median %"], errors["offline tok/s |error| worst %"]
    return Verdict(f"validation median <= {MAX_MEDIAN:g}%, worst <= {MAX_WORST:g}% ({errors['configs']} configs)",
                   f"{median:.2f}% / {worst:.2f}%", median <= MAX_MEDIAN and worst <= MAX_WORST)


def verdicts(paths: dict[str, Path]) -> list[Verdict]:
    """Every target's verdict from the tables at ``paths`` (keys of :data:`DEFAULTS`); a missing or malformed
    table is a ValueError naming it."""
    from probe_step_clock import read_table
    from profile_prefill import gemm_peak_tflops

    def read(key: str, columns: tuple[str, ...]) -> pd.DataFrame:
        return read_table(paths[key], key, columns)

    stages = read("stages", ("model", "stage", "batch", "context", "x_roofline_weights_kv"))
    out = [worst_steps(stages, "core"), worst_steps(stages, "decode"),
           attention(read("attention", ("shape", "impl", "batch", "length", "fraction_of_copy_bw")))]
    try:
        peak = gemm_peak_tflops(paths["profile"])
        errors = json.loads(paths["validation"].read_text())["errors"]
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{exc} (the kernel profile {paths['profile']} or validation {paths['validation']})") from None
    out.append(prefill(read("prefill", ("model", "tokens", "weight_tflops_replay")), peak))
    out.append(refill_k1(read("k1", ("model", "policy", "K", "exits", "speedup_vs_cb"))))
    out.append(validation(errors))
    return out


def show(rows: list[Verdict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="executor targets against the committed measurements")
    for column in ("target", "measured", "met"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row.target, row.measured, "yes" if row.met else "[red]no[/red]")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for key, default in DEFAULTS.items():
        parser.add_argument(f"--{key}", type=Path, default=default, help=f"default: {default.relative_to(ROOT)}")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    args = parser.parse_args(argv)
    try:
        rows = verdicts({key: getattr(args, key) for key in DEFAULTS})
    except ValueError as exc:
        print(f"error: executor_targets.py: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        show(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
