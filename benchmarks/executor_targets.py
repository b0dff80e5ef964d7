"""The executor's speed targets against the committed measurements, each marked met or not (docs/executor.md).

Reads the tables other commands wrote and derives every figure and verdict from them (``calibration.tables``),
so a re-measured table changes the verdicts without anyone retyping a number. No GPU; runs in about 2 s.

    python benchmarks/executor_targets.py               # the committed results
    python benchmarks/executor_targets.py --json        # the same as JSON
    python benchmarks/executor_targets.py --stages DIR/stages.csv --attention DIR/attention.csv

Inputs (defaults: the committed ones): ``stages.csv`` and ``attention.csv`` of ``bench_executor.py --parts stages
attention``; ``throughput.csv`` of ``bench_executor.py --parts throughput --exits none --k 1``; the kernel-level
profile, whose fastest GEMM is the matmul rate a prefill is held against; the validation matrix's ``summary.csv``
(``cdbsim validate --measured``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's packages, not an installed copy
    sys.path.insert(0, str(ROOT))

from calibration.tables import verdicts  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEFAULTS = {"stages": RESULTS / "executor" / "stages.csv",
            "attention": RESULTS / "executor" / "attention.csv",
            "throughput": RESULTS / "executor" / "throughput.csv",
            "profile": ROOT / "calibration" / "profiles" / "h200-kernels.json",
            "summary": RESULTS / "validation" / "summary.csv"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for key, default in DEFAULTS.items():
        parser.add_argument(f"--{key}", type=Path, default=default, help=f"default: {default.relative_to(ROOT)}")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    args = parser.parse_args(argv)
    try:
        rows = verdicts(args.stages, args.attention, args.throughput, args.profile, args.summary)
    except ValueError as exc:
        print(f"error: executor_targets.py: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="executor targets against the committed measurements")
    for column in ("target", "measured", "met"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row.target, row.measured, "yes" if row.met else "[red]no[/red]")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
