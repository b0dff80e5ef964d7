"""Where served stages run longer than the latency model says: measured over predicted device time, grouped.

A launch in a serving run can differ from the same launch in calibration by what ran before it (another
stage, a KV fill), by an idle gap before it (the device waited for the host), by its padded batch, by the
share of its rows that are padding (a graph of 24 rows serving 17), by its context and how unevenly its rows
share it (longest over mean), by exiting rows (and their KV copies) or by how many loop steps it mixes.
Grouping the measured/predicted ratio of every decode-type launch of saved executor logs by each of these
shows which one the error follows. Runs anywhere (no GPU):

    python benchmarks/analyze_served_gap.py --config huginn-2048-sharegpt-refill \\
        --matrix calibration/matrices/unseen-h200.json --logs benchmarks/results/unseen/measured-logs.tgz

The latency model is the one ``cdbsim validate`` uses for that configuration (``--profile``: the matrix
entry's, by default ``auto``), with the run's block-table width. ``--padded P`` keeps the launches of one
graph size (so the length groups compare like with like). ``--config`` takes several configurations
(comma-separated): their launches are pooled, and ``--within-padded`` groups each feature within padded-batch
ranges, so a size's own ratio does not pass for the feature's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.validation import load_matrix, unpacked_logs
from cdbsim.latency import LatencyModel
from cdbsim.logs import RunLog
from cdbsim.metadata import table_width
from cdbsim.shipped import resolve_profile
from cdbsim.validate import launch_from_row
from traces.errors import InputError

IDLE_S = 2e-6          # a start more than this after the previous launch's end: the device waited
LENGTH_BINS = [0, 32, 64, 128, 256, 1024, 2048, 4096, 1 << 20]
PADDING_BINS = [-0.01, 0.001, 0.15, 0.3, 1.0]  # share of a launch's rows that are padding
PADDING_LABELS = ["none", "up to 15%", "15-30%", "over 30%"]
SPREAD_BINS = [0, 1.2, 1.5, 2, 3, 5, 1e9]  # longest context over the mean of a launch's rows
PADDED_RANGES = [0, 1, 4, 16, 32, 64, 1 << 20]  # padded-batch ranges --within-padded groups by


def ratios(config: str, logs: Path, matrix: Path, profile: str) -> pd.DataFrame:
    """Every decode-type launch of ``config``'s log with its measured and predicted seconds and the
    features the ratio is grouped by."""
    d = launch_ratios(config, logs, matrix, profile)
    return d[d["stage"] != "prefill"]


def launch_ratios(config: str, logs: Path, matrix: Path, profile: str) -> pd.DataFrame:
    """Every launch of ``config``'s log with its measured and predicted seconds and the features the ratio is
    grouped by."""
    entries = {e.name: e for e in load_matrix(matrix)}
    if config not in entries:
        raise InputError(f"{matrix}: no configuration '{config}'; it has: {', '.join(entries)}")
    entry = entries[config]
    arch = entry.spec()
    model = LatencyModel(arch, resolve_profile(profile, arch))
    log = RunLog.load(logs / config)
    width = table_width(log.requests.itertuples(index=False), entry.config().block_size)
    d = log.launches.copy()
    d["predicted_s"] = [model.launch_time(launch_from_row(r), width) for r in d.itertuples(index=False)]
    d["measured_s"] = d["end"] - d["start"]
    d["after"] = d["stage"].shift(1).fillna("-")
    d["idle_before"] = (d["start"] - d["end"].shift(1)).fillna(0.0) > IDLE_S
    d["length"] = pd.cut(d["context"] / d["size"], LENGTH_BINS).astype(str)
    d["padding"] = pd.cut((d["padded"] - d["size"]) / d["padded"].clip(lower=1), PADDING_BINS,
                          labels=PADDING_LABELS).astype(str)
    d["spread"] = pd.cut(d["longest"] / (d["context"] / d["size"]).clip(lower=1e-9), SPREAD_BINS).astype(str)
    d["exiting"] = d["exits"] > 0
    d["loop_steps"] = d["step_mix"].fillna("").str.count(":")
    d["sizes"] = pd.cut(d["padded"], PADDED_RANGES).astype(str)
    d["all"] = "all"
    return d


FEATURES = (("all", "every launch"), ("padded", "by padded batch"), ("after", "by the launch before"),
            ("idle_before", f"by an idle gap (> {IDLE_S * 1e6:g} us) before"),
            ("length", "by attended length per row"), ("padding", "by the share of padded rows"),
            ("spread", "by longest over mean context"), ("exiting", "by exiting rows"),
            ("loop_steps", "by loop steps mixed"))


def grouped(d: pd.DataFrame, by: str, within: str | None = None) -> pd.DataFrame:
    """Launches and measured/predicted (summed seconds) per stage and ``by`` (and ``within``, first)."""
    keys = ["stage", *([within] if within else []), by]
    table = d.groupby(keys, observed=True).agg(
        launches=("measured_s", "size"), measured_s=("measured_s", "sum"), predicted_s=("predicted_s", "sum"))
    table["measured/predicted"] = table["measured_s"] / table["predicted_s"]
    return table.drop(columns=["measured_s", "predicted_s"]).reset_index().rename(columns={by: "group"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True,
                        help="configurations of the matrix with saved logs (comma-separated: pooled)")
    parser.add_argument("--matrix", type=Path, default=Path("calibration/matrices/unseen-h200.json"))
    parser.add_argument("--logs", type=Path, default=Path("benchmarks/results/unseen/measured-logs.tgz"),
                        help="directory or .tgz of saved logs")
    parser.add_argument("--profile", default="auto", help="profile name or file (default: auto)")
    parser.add_argument("--padded", type=int, help="only launches of this padded batch size")
    parser.add_argument("--within-padded", action="store_true",
                        help=f"group every feature within padded-batch ranges ({PADDED_RANGES[1:-1]} bounds)")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.config.split(",") if c.strip()]
    try:
        with unpacked_logs(args.logs, "--logs") as logs:
            d = pd.concat([ratios(config, logs, args.matrix, args.profile) for config in configs])
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.padded is not None:
        d = d[d["padded"] == args.padded]
        if d.empty:
            print(f"error: {args.config} has no decode-type launch of padded size {args.padded}", file=sys.stderr)
            return 2
    print(f"{', '.join(configs)}: measured over predicted device time ({args.profile} profile"
          + (f", padded batch {args.padded}" if args.padded is not None else "")
          + (", within padded-batch ranges" if args.within_padded else "") + ")")
    within = "sizes" if args.within_padded else None
    for by, title in FEATURES:
        print(f"{title}")
        print(grouped(d, by, within if by not in ("all", "padded") else None).round(3).to_string(index=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
