"""The co-design study's answer, from the rows ``cdbsim sweep --config benchmarks/results/codesign/study.toml``
wrote: per model, split and r_max the best throughput per GPU (over policy and W), and the best point under p99
TPOT limits. Prints Markdown tables (docs/results.md quotes them). Reads a table only: about 2 s, no GPU.

    python benchmarks/codesign_table.py                                   # the committed study
    python benchmarks/codesign_table.py benchmarks/results/codesign/study-kernels.parquet
"""

from __future__ import annotations

import argparse

import pandas as pd

LIMITS_MS = (40, 50, 75, 100)


def main(path: str) -> None:
    rows = pd.read_parquet(path)
    rows = rows[rows["status"] == "ok"].copy()
    rows["family"] = rows["arch.name"].map({"huginn-3.5b": "Huginn-style h5280", "ouro-2.6b": "Ouro-style h2048"})
    rows["tpot_ms"] = rows["tpot_s_p99"] * 1e3
    best = rows.loc[rows.groupby(["family", "arch.split", "arch.r_max"], sort=False)["output_tps"].idxmax()]
    print("| model | split | r_max | params (B) | best tok/s per GPU | at | p99 TPOT ms | layers/token | refill/CB |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    for _, r in best.iterrows():
        same = rows[(rows["arch.name"] == r["arch.name"]) & (rows["arch.split"] == r["arch.split"])
                    & (rows["arch.r_max"] == r["arch.r_max"])]
        gain = same[same["serve.policy"] == "refill"]["output_tps"].max() / same[same["serve.policy"] == "cb"][
            "output_tps"].max()
        print(f"| {r['family']} | {r['arch.split']} | {r['arch.r_max']} | {r['params'] / 1e9:.2f} | "
              f"{r['output_tps']:,.0f} | {r['serve.policy']} W={r['serve.width']} | {r['tpot_ms']:.1f} | "
              f"{r['layers_per_token']:.1f} | {gain:.2f}x |")
    print()
    print("| p99 TPOT limit | best tok/s per GPU | model | split | r_max | policy, W | p99 TPOT ms |")
    print("|---:|---:|---|---|---:|---|---:|")
    for limit in LIMITS_MS:
        within = rows[rows["tpot_ms"] <= limit]
        if within.empty:
            print(f"| {limit} ms | none | | | | | |")
            continue
        r = within.loc[within["output_tps"].idxmax()]
        print(f"| {limit} ms | {r['output_tps']:,.0f} | {r['family']} | {r['arch.split']} | {r['arch.r_max']} | "
              f"{r['serve.policy']}, W={r['serve.width']} | {r['tpot_ms']:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", nargs="?", default="benchmarks/results/codesign/study.parquet",
                        help="the rows `cdbsim sweep` wrote (default: %(default)s)")
    main(parser.parse_args().study)
