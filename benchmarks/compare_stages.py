"""Stage times of executor builds or settings side by side, against a base.

``bench_executor.py --parts stages`` writes one ``stages.csv`` per run; a candidate (an environment setting, a
kernel change) is judged by every stage it moves, not one. This prints, per (model, stage, rows, context), the
base's milliseconds and each candidate's change in percent, and each candidate's median and extreme change per
stage kind::

    python benchmarks/compare_stages.py BASE_DIR CANDIDATE_DIR... [--stages core cb] [--csv OUT]

A folder with a ``measured/`` folder of served runs' launch logs (``cdbsim validate --out DIR``) stands for those
runs instead: per (run, stage, padded rows) the mean launch time as served, and each run's makespan as stage
``span`` (rows 0). Why: replayed stages and served launches can disagree (the few-row matmul's early trigger took
4% off replayed 4-row core steps and added 6.6% to served ones on the H200, docs/executor.md), so a kernel change
is checked served too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

KEYS = ["model", "stage", "batch", "context"]


def load(folder: Path) -> pd.Series:
    """``ms`` per stage point of the ``stages.csv`` in ``folder`` (or the file itself), or of the served runs in
    ``folder/measured``."""
    if (folder / "measured").is_dir():
        return served(folder / "measured")
    path = folder / "stages.csv" if folder.is_dir() else folder
    if not path.is_file():
        raise SystemExit(f"error: no stages.csv at {path}")
    table = pd.read_csv(path)
    return table.set_index(KEYS)["ms"]


def served(measured: Path) -> pd.Series:
    """Mean launch ``ms`` per (run, stage, padded rows) of the launch logs under ``measured`` (one folder per run),
    context ``"served"``, and each run's makespan as stage ``span``."""
    points = []
    for path in sorted(measured.glob("*/launches.parquet")):
        launches = pd.read_parquet(path, columns=["stage", "padded", "start", "end"])
        ms = (launches["end"] - launches["start"]) * 1e3
        for (stage, padded), mean in ms.groupby([launches["stage"], launches["padded"]]).mean().items():
            points.append((path.parent.name, stage, int(padded), "served", mean))
        points.append((path.parent.name, "span", 0, "served", (launches["end"].max() - launches["start"].min()) * 1e3))
    if not points:
        raise SystemExit(f"error: no launch logs (*/launches.parquet) under {measured}")
    return pd.DataFrame(points, columns=[*KEYS, "ms"]).set_index(KEYS)["ms"]


def compare(base: Path, candidates: list[Path], stages: list[str] | None = None) -> pd.DataFrame:
    """Base ms and each candidate's change against it in percent, on the points both measured."""
    frame = pd.DataFrame({"base_ms": load(base)})
    for folder in candidates:
        frame[folder.name] = (load(folder) / frame["base_ms"] - 1.0) * 100.0
    frame = frame.dropna()
    if stages:
        frame = frame[frame.index.get_level_values("stage").isin(stages)]
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("candidates", type=Path, nargs="+")
    parser.add_argument("--stages", nargs="+", help="stage kinds to keep (default: all)")
    parser.add_argument("--csv", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    frame = compare(args.base, args.candidates, args.stages)
    display = ("display.max_rows", None, "display.max_columns", None, "display.width", 250,
               "display.float_format", "{:.2f}".format)
    with pd.option_context(*display):
        print(frame)
        print("\nchange in percent per stage kind (median / min / max):")
        summary = frame.drop(columns="base_ms").groupby(level="stage").agg(["median", "min", "max"])
        print(summary)
    if args.csv:
        frame.to_csv(args.csv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
