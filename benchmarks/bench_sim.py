"""How fast the simulator runs on this machine (one core): simulated token loop steps per second of wall
time, and wall time for 10,000 Alpaca requests of ouro-1.4b under refill, W = 64.

    python benchmarks/bench_sim.py [--profile roofline|shipped] [--cases SUBSTRING] [--out results.json]

A "token loop step" is one token going through one application of the looped core (the items of core
launches; CB's fused steps count r_max each). Times are the median of --repeat runs of ``simulate`` alone
(trace building and the report excluded). ``--profile shipped`` uses the H200 profiles of
``calibration/profiles`` (interpolated tables and the mixed-context lookup) instead of the roofline.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from cdbsim.arch import PRESETS
from cdbsim.config import ServeConfig
from cdbsim.latency import LatencyModel, roofline_profile
from cdbsim.shipped import resolve_profile
from cdbsim.sim import simulate
from traces import ExitModel, build_trace

CASES = [
    # name, arch, workload, requests, mean depth, policy, K
    ("alpaca-10k ouro-1.4b refill W64", "ouro-1.4b", "alpaca", 10_000, 2.5, "refill", 1),
    ("alpaca-10k ouro-1.4b norefill W64", "ouro-1.4b", "alpaca", 10_000, 2.5, "norefill", 1),
    ("alpaca-10k ouro-1.4b cb W64", "ouro-1.4b", "alpaca", 10_000, 2.5, "cb", 1),
    ("sharegpt-2k ouro-1.4b refill W64", "ouro-1.4b", "sharegpt", 2_000, 2.5, "refill", 1),
    ("sharegpt-1k huginn-3.5b refill W64 K16", "huginn-3.5b", "sharegpt", 1_000, 8.0, "refill", 16),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", choices=("roofline", "shipped"), default="roofline")
    parser.add_argument("--cases", default="", help="only the cases whose name contains this")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    for name, arch_name, workload, n, mean, policy, k in CASES:
        if args.cases not in name:
            continue
        arch = PRESETS[arch_name]
        requests = build_trace(workload, n, arch.r_max, 2, ExitModel(mean=mean), seed=0)
        profile = roofline_profile(arch) if args.profile == "roofline" else resolve_profile("auto", arch)
        latency = LatencyModel(arch, profile)
        config = ServeConfig(policy=policy, width=64, coda_batch=k)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            log = simulate(arch, config, requests, latency, kv_blocks=1_000_000)
            times.append(time.perf_counter() - start)
        launches = log.launches
        steps = int(launches.loc[launches["stage"] == "core", "size"].sum()
                    + launches.loc[launches["stage"] == "decode", "size"].sum() * arch.r_max)
        wall = statistics.median(times)
        results.append({"case": name, "requests": n, "launches": len(launches), "loop_steps": steps,
                        "wall_s": wall, "loop_steps_per_s": steps / wall})
    machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    print(f"simulator speed on {machine} (median of {args.repeat}, {args.profile} profile)")
    print(f"{'case':42s} {'launches':>9s} {'loop steps':>11s} {'wall s':>7s} {'steps/s':>11s}")
    for r in results:
        print(f"{r['case']:42s} {r['launches']:9,d} {r['loop_steps']:11,d} {r['wall_s']:7.2f} "
              f"{r['loop_steps_per_s']:11,.0f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"machine": machine, "profile": args.profile, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
