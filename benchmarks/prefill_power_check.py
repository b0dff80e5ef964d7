"""Served prefills against the latency model, grouped by how long the model says they take.

A prefill priced from kernels timed in short bursts (the kernel profile) runs into the board's power limit once
it lasts about a tenth of a second (:mod:`cdbsim.power`). This prints, for every prefill launch of saved
executor logs, measured over predicted device time grouped by the predicted time, with the profile's
``sustained`` stretch and without it. Runs anywhere (no GPU):

    python benchmarks/prefill_power_check.py \\
        --run calibration/matrices/unseen-h200.json benchmarks/results/unseen/measured-logs.tgz \\
        --run calibration/matrices/validation-h200.json benchmarks/results/kernels/shipped/measured-logs.tgz
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyze_served_gap import launch_ratios

from calibration.validation import load_matrix, unpacked_logs

BINS_S = [0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 1.0, 10.0]


def prefills(matrix: Path, logs: Path, profile: str) -> pd.DataFrame:
    """Every prefill launch of every configuration of ``matrix`` with a log in ``logs``."""
    rows = []
    with unpacked_logs(logs, "--run") as folder:
        for entry in load_matrix(matrix):
            if (folder / entry.name).is_dir():
                d = launch_ratios(entry.name, folder, matrix, profile)
                rows.append(d[d["stage"] == "prefill"].assign(config=entry.name))
    return pd.concat(rows, ignore_index=True)


def grouped(d: pd.DataFrame, by: pd.Series) -> pd.DataFrame:
    table = d.groupby(pd.cut(by, BINS_S), observed=True).agg(
        launches=("measured_s", "size"), measured_s=("measured_s", "sum"), predicted_s=("predicted_s", "sum"))
    return (table["measured_s"] / table["predicted_s"]).round(3).rename("measured/predicted").to_frame().join(
        table["launches"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs=2, action="append", metavar=("MATRIX", "LOGS"), required=True,
                        type=Path, help="a matrix and its saved logs (directory or .tgz); repeatable")
    parser.add_argument("--profile", type=Path, default=Path("calibration/profiles/h200-kernels.json"),
                        help="a kernel-level profile file (default: the shipped one)")
    args = parser.parse_args(argv)
    record = json.loads(args.profile.read_text())
    sustained = record["kernels"].pop("sustained", None) or {}
    with tempfile.TemporaryDirectory() as tmp:  # the same profile without the stretch
        rested = Path(tmp) / args.profile.name
        rested.write_text(json.dumps(record))
        without = pd.concat([prefills(m, logs, str(rested)) for m, logs in args.run], ignore_index=True)
    stretched = pd.concat([prefills(m, logs, str(args.profile)) for m, logs in args.run], ignore_index=True)
    print(f"prefill launches of {len(args.run)} matrices: measured over predicted device time, by the time the "
          f"rested tables predict (s); {args.profile}: onset {sustained.get('onset_s')} s, "
          f"slowdown {sustained.get('slowdown')}")
    table = grouped(without, without["predicted_s"]).rename(columns={"measured/predicted": "rested tables"})
    table["with the power limit"] = grouped(stretched, without["predicted_s"])["measured/predicted"]
    print(table[["launches", "rested tables", "with the power limit"]].to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
