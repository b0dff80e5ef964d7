"""Speed and memory of ``cdbsim sweep``: a 1,000-point grid of 500-request Alpaca runs with ``--jobs 2`` and on
a Dask LocalCluster of 2 workers, and the sweep process's peak memory at 100 and 1,000 points.

Each sweep is the real command (``cli.app``) in a fresh process, without the results cache, so every point is
simulated; wall time includes starting the workers. The two 1,000-point results must be identical.

    python benchmarks/bench_sweep.py                       # writes benchmarks/results/sweep_speed.json
    python benchmarks/bench_sweep.py --points 100 --quick  # a smaller check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = [16, 24, 32, 48, 64, 96, 128, 160, 192, 256]
DEPTHS = [2.0, 2.2, 2.4, 2.6, 2.8, 3.0, 3.2, 3.4, 3.6, 3.8]  # ouro-1.4b: r_max 4, lookahead r_min 2


def grid_options(points: int) -> list[str]:
    """``--grid`` options for ``points`` points (100 or 1,000): width x mean depth (x seed)."""
    seeds = max(points // (len(WIDTHS) * len(DEPTHS)), 1)
    options = ["--grid", "serve.width=" + ",".join(map(str, WIDTHS)),
               "--grid", "exits.mean_depth=" + ",".join(map(str, DEPTHS))]
    if seeds > 1:
        options += ["--grid", "workload.seed=" + ",".join(map(str, range(seeds)))]
    return options


def run_cli(args: list[str], report: Path) -> None:
    """Run ``cdbsim`` in this process and record its wall time and peak memory (this process only: the
    workers are other processes)."""
    sys.path.insert(0, str(ROOT))
    from cli import app

    start = time.perf_counter()
    code = 0
    try:
        app(args, standalone_mode=False)
    except SystemExit as exc:
        code = exc.code or 0
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    report.write_text(json.dumps({"wall_s": wall, "peak_rss_mb": peak_mb, "exit": code}))


def sweep(mode: str, points: int, requests: int, folder: Path) -> dict:
    out = folder / f"{mode}-{points}.parquet"
    parallel = ["--jobs", "2"] if mode == "jobs2" else ["--dask", "local", "--jobs", "2"]
    args = ["sweep", "--workload", "alpaca", "--requests", str(requests), *grid_options(points), *parallel,
            "--no-cache", "--no-plots", "--out", str(out), "--json"]
    report = folder / f"{mode}-{points}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, __file__, "--run-cli", str(report), "--", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL, cwd=folder)
    measured = json.loads(report.read_text())
    if measured["exit"] != 0:
        raise SystemExit(f"{mode} sweep failed with exit code {measured['exit']}")
    row = {"mode": mode, "points": points, "requests": requests, "wall_s": round(measured["wall_s"], 1),
           "s_per_point": round(measured["wall_s"] / points, 3), "peak_rss_mb": round(measured["peak_rss_mb"], 1),
           "rows": str(out)}
    print(f"{mode:6} {points:5} points: {row['wall_s']:7.1f} s ({row['s_per_point']:.3f} s/point), "
          f"sweep process peak RSS {row['peak_rss_mb']:.0f} MB", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1000, choices=[100, 1000])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="Skip the 100-point memory runs.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sweep_speed.json")
    parser.add_argument("--run-cli", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.run_cli:
        run_cli(rest[1:] if rest[:1] == ["--"] else rest, args.run_cli)
        return

    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        runs = [sweep("jobs2", args.points, args.requests, folder), sweep("dask", args.points, args.requests, folder)]
        identical = pq.read_table(runs[0]["rows"]).equals(pq.read_table(runs[1]["rows"]))
        if not args.quick and args.points > 100:
            runs += [sweep("jobs2", 100, args.requests, folder), sweep("dask", 100, args.requests, folder)]
        for run in runs:
            run.pop("rows")
    ratio = runs[1]["wall_s"] / runs[0]["wall_s"]
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              "command": "python benchmarks/bench_sweep.py" + (" --quick" if args.quick else ""),
              "grid": " ".join(grid_options(args.points)), "runs": runs,
              "dask_over_jobs2": round(ratio, 3), "identical_rows": identical}
    print(f"dask / --jobs 2 wall time: {ratio:.3f}; rows identical: {identical}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
