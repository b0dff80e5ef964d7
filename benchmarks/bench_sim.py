"""How fast the simulator runs on this machine (one core): CPU time per launch and simulated token loop
steps per second of CPU time, for ``simulate`` alone (trace building and the report excluded).
Run time: about 2 min on two cores with ``--repeat 5 --memory`` (CPU only).

    python benchmarks/bench_sim.py [--repeat 5] [--profile shipped|roofline] [--cases SUBSTRING]
                                   [--out benchmarks/results/sim_speed.json] [--memory [N]]

The header and the result file also give the CPU time of a fixed pure-Python loop (``sum(range(1000))``): the
cases' times follow the host's speed, and this says how fast the host was.

Each case is timed as CPU time (``time.process_time``: other processes on a busy machine do not count),
the minimum of ``--repeat`` runs. A "token loop step" is one token going through one application of the
looped core (the items of core launches; CB's fused steps count r_max each). ``--profile shipped`` (the
default) uses the measured H200 profiles of ``calibration/profiles`` (interpolated tables, the mixed-context
lookup and the metadata copy); ``roofline`` the analytic profile.

The header names the build: the hot modules compiled by ``pip install`` (:mod:`cdbsim.native`), or the pure
Python source (``CDBSIM_PURE=1 python benchmarks/bench_sim.py --out benchmarks/results/sim_speed_pure.json``).

``--memory N`` (default 100,000 requests) also simulates N Alpaca requests of ouro-1.4b under refill in a
fresh process and reports its peak resident memory (``ru_maxrss``: imports, trace, simulation and logs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cdbsim import native  # noqa: E402
from cdbsim.latency.model import LatencyModel, roofline_profile  # noqa: E402
from cdbsim.latency.shipped import resolve_profile  # noqa: E402
from cdbsim.model.arch import PRESETS  # noqa: E402
from cdbsim.serving.config import ServeConfig  # noqa: E402
from cdbsim.simulator.sim import simulate  # noqa: E402
from traces import ExitModel, build_trace  # noqa: E402

CASES = [
    # name, arch, workload, requests, mean depth, policy, K
    ("alpaca-10k ouro-1.4b refill W64", "ouro-1.4b", "alpaca", 10_000, 2.5, "refill", 1),
    ("alpaca-10k ouro-1.4b norefill W64", "ouro-1.4b", "alpaca", 10_000, 2.5, "norefill", 1),
    ("alpaca-10k ouro-1.4b cb W64", "ouro-1.4b", "alpaca", 10_000, 2.5, "cb", 1),
    ("sharegpt-2k ouro-1.4b refill W64", "ouro-1.4b", "sharegpt", 2_000, 2.5, "refill", 1),
    ("sharegpt-1k huginn-3.5b refill W64 K16", "huginn-3.5b", "sharegpt", 1_000, 8.0, "refill", 16),
]
TARGET_US = {"refill": 10.0, "norefill": 10.0, "cb": 15.0}  # CPU time per launch the simulator aims at
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sim_speed.json"


def machine() -> str:
    """The processor, core count and Python, as the result files record them."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


HOST_REFERENCE = "sum(range(1000))"  # a fixed pure-Python loop: how fast this host runs Python, beside the cases


def host_reference_us() -> float:
    """CPU microseconds of :data:`HOST_REFERENCE` (best of 5), so results from different hosts can be compared."""
    return min(timeit.repeat(HOST_REFERENCE, number=2000, repeat=5, timer=time.process_time)) / 2000 * 1e6


def loop_steps(log, r_max: int) -> int:
    launches = log.launches
    return int(launches.loc[launches["stage"] == "core", "size"].sum()
               + launches.loc[launches["stage"] == "decode", "size"].sum() * r_max)


def run_case(arch_name: str, workload: str, n: int, mean: float, policy: str, k: int, profile: str,
             repeat: int) -> dict:
    arch = PRESETS[arch_name]
    requests = build_trace(workload, n, arch.r_max, 2, ExitModel(mean=mean), seed=0)
    latency = LatencyModel(arch, roofline_profile(arch) if profile == "roofline" else resolve_profile("auto", arch))
    config = ServeConfig(policy=policy, width=64, coda_batch=k)
    times = []
    for _ in range(repeat):
        start = time.process_time()
        log = simulate(arch, config, requests, latency, kv_blocks=1_000_000)
        times.append(time.process_time() - start)
    cpu = min(times)
    steps = loop_steps(log, arch.r_max)
    return {"requests": n, "policy": policy, "launches": len(log.launches), "loop_steps": steps,
            "cpu_s": cpu, "cpu_s_runs": times, "us_per_launch": cpu / len(log.launches) * 1e6,
            "loop_steps_per_s": steps / cpu}


def memory_child(n: int) -> None:
    """Run in a fresh process: simulate ``n`` Alpaca requests and print peak RSS (MB) and times as JSON."""
    start = time.process_time()
    arch = PRESETS["ouro-1.4b"]
    requests = build_trace("alpaca", n, arch.r_max, 2, ExitModel(mean=2.5), seed=0)
    built = time.process_time()
    latency = LatencyModel(arch, resolve_profile("auto", arch))
    log = simulate(arch, ServeConfig(policy="refill", width=64), requests, latency, kv_blocks=1_000_000)
    done = time.process_time()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"requests": n, "launches": len(log.launches), "peak_rss_mb": peak_mb,
                      "trace_cpu_s": built - start, "simulate_cpu_s": done - built}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", choices=("shipped", "roofline"), default="shipped")
    parser.add_argument("--cases", default="", help="only the cases whose name contains this")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results (default: %(default)s)")
    parser.add_argument("--memory", type=int, nargs="?", const=100_000, default=None, metavar="N",
                        help="also measure the peak memory of an N-request run (default N: 100,000)")
    parser.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child is not None:
        memory_child(args.memory_child)
        return
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load = os.getloadavg()[0]  # other processes on the machine slow a core down even in CPU time
    build = "compiled (mypyc)" if native.compiled() else "pure Python"
    reference = host_reference_us()
    print(f"simulator speed on {machine()}, {when}, load average {load:.1f}, {build} build; "
          f"host reference {HOST_REFERENCE}: {reference:.1f} us")
    print(f"CPU time of simulate, min of {args.repeat} runs, {args.profile} profile, one core")
    print(f"{'case':40s} {'launches':>9s} {'loop steps':>11s} {'CPU s':>7s} {'us/launch':>9s} {'target':>6s} "
          f"{'steps/s':>11s}")
    results = []
    for name, arch_name, workload, n, mean, policy, k in CASES:
        if args.cases not in name:
            continue
        r = {"case": name, **run_case(arch_name, workload, n, mean, policy, k, args.profile, args.repeat)}
        results.append(r)
        print(f"{name:40s} {r['launches']:9,d} {r['loop_steps']:11,d} {r['cpu_s']:7.2f} {r['us_per_launch']:9.1f} "
              f"{TARGET_US[policy]:6.0f} {r['loop_steps_per_s']:11,.0f}", flush=True)
    memory = None
    if args.memory is not None:
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(args.memory)], check=True,
                             capture_output=True, text=True).stdout
        memory = json.loads(out.strip().splitlines()[-1])
        print(f"peak memory of {memory['requests']:,} Alpaca requests (ouro-1.4b refill W64, {memory['launches']:,} "
              f"launches): {memory['peak_rss_mb']:,.0f} MB resident (target 600); trace {memory['trace_cpu_s']:.1f} s, "
              f"simulate {memory['simulate_cpu_s']:.1f} s CPU")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine(), "date": when, "load_average": load,
                                        "host_reference": {"code": HOST_REFERENCE, "us": reference},
                                        "build": build, "profile": args.profile,
                                        "repeat": args.repeat, "clock": "process_time (CPU), min of repeats",
                                        "results": results, "memory": memory}, indent=2) + "\n")
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
