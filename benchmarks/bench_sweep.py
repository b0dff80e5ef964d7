"""Speed and memory of ``cdbsim sweep``: a 1,000-point grid of 500-request Alpaca runs with ``--jobs 2`` and on
a Dask LocalCluster of 2 workers, and the sweep process's memory through the run (and in a 100-point run).
Run time: about 6 min on two cores (CPU only); ``--points 100 --quick`` under a minute.

Each sweep is the real command (``cli.app``) in a fresh process, without the results cache, so every point is
simulated; wall time includes starting the workers. CPU time (the sweep process and its workers) divided by
the cores is what the wall time would be on an otherwise idle machine; the load averages before and after
say how idle it was. The two 1,000-point results must be identical.

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


def rss_mb() -> float:
    """This process's resident memory now, in MB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_cli(args: list[str], report: Path) -> None:
    """Run ``cdbsim`` in this process and record its wall time, the CPU time of it and its workers, and its
    memory (this process only: the workers are other processes) sampled every second through the run."""
    import threading

    sys.path.insert(0, str(ROOT))
    from cli import app

    samples: list[tuple[float, float]] = []
    done = threading.Event()
    start = time.perf_counter()

    def sample() -> None:
        while not done.wait(1.0):
            samples.append((time.perf_counter() - start, rss_mb()))

    threading.Thread(target=sample, daemon=True).start()
    code = 0
    try:
        app(args, standalone_mode=False)
    except SystemExit as exc:
        code = exc.code or 0
    wall = time.perf_counter() - start
    done.set()
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime
    early = [mb for t, mb in samples if t <= 0.1 * wall] or [float("nan")]
    report.write_text(json.dumps({"wall_s": wall, "cpu_s": cpu, "exit": code,
                                  "rss_mb_first_tenth": max(early), "rss_mb_end": samples[-1][1] if samples else 0,
                                  "peak_rss_mb": own.ru_maxrss / 1024}))  # KiB on Linux


def sweep(mode: str, points: int, requests: int, folder: Path) -> dict:
    out = folder / f"{mode}-{points}.parquet"
    parallel = ["--jobs", "2"] if mode == "jobs2" else ["--dask", "local", "--jobs", "2"]
    args = ["sweep", "--workload", "alpaca", "--requests", str(requests), *grid_options(points), *parallel,
            "--no-cache", "--no-plots", "--out", str(out), "--json"]
    report = folder / f"{mode}-{points}.json"
    load_before = [round(x, 2) for x in os.getloadavg()]  # 1, 5, 15-minute load: other work on the machine
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, __file__, "--run-cli", str(report), "--", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL, cwd=folder)
    measured = json.loads(report.read_text())
    if measured["exit"] != 0:
        raise SystemExit(f"{mode} sweep failed with exit code {measured['exit']}")
    cores = os.cpu_count() or 1
    row = {"mode": mode, "points": points, "requests": requests, "wall_s": round(measured["wall_s"], 1),
           "cpu_s": round(measured["cpu_s"], 1), "cpu_s_over_cores": round(measured["cpu_s"] / cores, 1),
           "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
           "rss_mb_first_tenth": round(measured["rss_mb_first_tenth"], 1),
           "rss_mb_end": round(measured["rss_mb_end"], 1), "peak_rss_mb": round(measured["peak_rss_mb"], 1),
           "rows": str(out)}
    print(f"{mode:6} {points:5} points: wall {row['wall_s']:.1f} s, CPU {row['cpu_s']:.1f} s (/{cores} cores = "
          f"{row['cpu_s_over_cores']:.1f} s), load {load_before[0]} -> {row['load_after'][0]}; sweep process RSS "
          f"{row['rss_mb_first_tenth']:.0f} MB in the first tenth, {row['rss_mb_end']:.0f} MB at the end, peak "
          f"{row['peak_rss_mb']:.0f} MB", flush=True)
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
        frames = [pq.read_table(run["rows"]).to_pandas() for run in runs]
        identical = bool(frames[0].equals(frames[1]))  # NaN where NaN, every other value equal
        if not args.quick and args.points > 100:
            runs.append(sweep("jobs2", 100, args.requests, folder))
        for run in runs:
            run.pop("rows")
    ratio = runs[1]["wall_s"] / runs[0]["wall_s"]
    cpu_ratio = runs[1]["cpu_s"] / runs[0]["cpu_s"]
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              "command": "python benchmarks/bench_sweep.py" + (" --quick" if args.quick else ""),
              "grid": " ".join(grid_options(args.points)), "runs": runs,
              "dask_over_jobs2_wall": round(ratio, 3), "dask_over_jobs2_cpu": round(cpu_ratio, 3),
              "identical_rows": identical}
    print(f"dask / --jobs 2: wall time {ratio:.3f}, CPU time {cpu_ratio:.3f}; rows identical: {identical}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
