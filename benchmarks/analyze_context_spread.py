"""Does the spread of contexts within a core launch explain the latency model's error on it?

The launch log keeps each launch's summed context, not its rows'. The scheduler is deterministic, so
replaying it on the validation entry's requests under the lookahead rule (no clock needed) gives every
launch's rows again; the script checks the replay matches the measured log launch for launch, then groups
core launches by max/mean context (quintiles) and prints the latency model's error in each group.
Runs anywhere (no GPU) on saved executor logs:

    python benchmarks/analyze_context_spread.py --config ouro-sharegpt-refill-W16 \\
        --logs benchmarks/results/validation-graphed-prefill/measured-logs.tgz \\
        --out benchmarks/results/validation-graphed-prefill/context-spread.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.validation import load_matrix, requests_for, unpacked_logs
from cdbsim.latency import LatencyModel
from cdbsim.launch import Stage
from cdbsim.logs import RunLog
from cdbsim.metadata import table_width
from cdbsim.profile import load_profile_file
from cdbsim.replay import drive
from cdbsim.scheduler import Scheduler


def spread_table(config: str, logs: Path, matrix: Path, profile: Path) -> pd.DataFrame:
    entry = {e.name: e for e in load_matrix(matrix)}[config]
    arch = entry.spec()
    model = LatencyModel(arch, load_profile_file(profile))
    requests, _ = requests_for(entry, model)
    launches = list(drive(Scheduler(arch, entry.config(), requests, entry.kv_blocks())))
    measured = RunLog.load(logs / config).launches
    same = len(launches) == len(measured) and all(
        a.stage.value == s and a.size == n and a.context == c
        for a, s, n, c in zip(launches, measured["stage"], measured["size"], measured["context"], strict=True))
    if not same:
        raise SystemExit(f"error: the replayed schedule of {config} differs from its measured log")
    rows, width = [], table_width(requests, entry.config().block_size)
    for launch, end, start in zip(launches, measured["end"], measured["start"], strict=True):
        if launch.stage is not Stage.CORE:
            continue
        attended = np.asarray(launch.positions) + 1
        rows.append({"padded": launch.padded, "mean_context": attended.mean(), "max_context": attended.max(),
                     "measured_s": end - start, "predicted_s": model.launch_time(launch, width)})
    core = pd.DataFrame(rows)
    core["spread"] = core["max_context"] / core["mean_context"]
    core["quintile"] = pd.qcut(core["spread"], 5)
    table = core.groupby("quintile", observed=True).agg(
        launches=("spread", "size"), mean_batch=("padded", "mean"), mean_context=("mean_context", "mean"),
        measured_s=("measured_s", "sum"), predicted_s=("predicted_s", "sum"))
    table["error %"] = 100 * (table["predicted_s"] / table["measured_s"] - 1)
    table.index = table.index.astype(str).rename("max/mean context")
    return table.reset_index()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="ouro-sharegpt-refill-W16")
    parser.add_argument("--logs", type=Path, default=Path(
        "benchmarks/results/validation-graphed-prefill/measured-logs.tgz"), help="directory or .tgz of logs")
    parser.add_argument("--matrix", type=Path, default=Path("calibration/matrices/validation-h200.json"))
    parser.add_argument("--profile", type=Path, default=Path("calibration/profiles/h200-ouro-1.4b.json"))
    parser.add_argument("--out", type=Path, help="write the table as CSV")
    args = parser.parse_args(argv)
    with unpacked_logs(args.logs, "--logs") as logs:
        table = spread_table(args.config, logs, args.matrix, args.profile)
    print(f"{args.config}: core launches by max/mean context (replayed schedule matches the log)")
    print(table.round(3).to_string(index=False))
    if args.out:
        table.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
