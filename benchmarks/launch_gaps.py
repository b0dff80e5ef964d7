"""Device gaps between consecutive launches in saved executor logs: what device idle time is made of.

    python benchmarks/launch_gaps.py DIR [DIR ...]     # directories of saved logs (launches.parquet or .csv), searched

For each run: launches, the mean and largest gap between one launch's end and the next one's start, how
many gaps exceed 10 us (the device waited for the host or for arrivals), the idle share, and the host's
own time per launch (p50, p99.9); then the mean back-to-back gap over all runs
(:func:`calibration.fit.fit_launch_gap`, the latency model's ``launch_gap``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.fit import BACK_TO_BACK_S, fit_launch_gap, launch_gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    logs = []
    print(f"{'run':36} {'launches':>8} {'gap mean us':>11} {'gap max us':>10} {'> 10 us':>7} {'idle %':>7} "
          f"{'host p50 us':>11} {'host p99.9 us':>13}")
    paths = sorted(p for d in args.dirs for p in d.rglob("launches.*") if p.suffix in (".parquet", ".csv"))
    for path in paths:
        launches = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        gaps = launch_gaps(launches)
        span = launches["end"].max() - launches["start"].min()
        idle = 1 - (launches["end"] - launches["start"]).sum() / span
        host = launches["host_s"].to_numpy(float) * 1e6
        print(f"{path.parent.name[:36]:36} {len(launches):8d} {1e6 * gaps.mean():11.3f} {1e6 * gaps.max():10.1f} "
              f"{int((gaps >= BACK_TO_BACK_S).sum()):7d} {100 * idle:7.3f} {np.percentile(host, 50):11.0f} "
              f"{np.percentile(host, 99.9):13.0f}")
        logs.append(launches)
    print(f"back-to-back launch gap, mean over {len(logs)} runs: {1e6 * fit_launch_gap(logs):.3f} us")


if __name__ == "__main__":
    main()
