"""The adaptive CDB policy against every fixed choice, in the simulator on the shipped H200 profiles.
Run time (two cores): ``--part grid`` about 3.5 min, ``--part shift`` seconds; ``--part matrix``: GPU, 9 min.

Grid: Ouro-1.4B and Huginn-3.5B re-split 2-4-2, 1-4-1, 0-4-0 x W in {16, 64, 256} x Alpaca, ShareGPT, ArXiv x
two mean depths per model x offline and online. Per point the fixed choices are no-refill and refill with
K in {1, W/4, W}, and adaptive runs on the same requests. Offline the figure of merit is output tokens/s;
online (Poisson arrivals at 80% of the best fixed choice's offline request rate on the same lengths and depths)
it is mean normalized latency (s per output token, lower is better), since every policy then serves the same
rate. The paper's rule is refill with K = 1 for Ouro and K = W/4 for Huginn.

Printed: the share of points where adaptive is within 1% of the best fixed choice, its worst shortfall, and
its median gain over the paper's rule at the points where that rule is not the best. Then a shifting load
(:mod:`traces.shift`) where every fixed choice and adaptive serve the same trace.

    python benchmarks/adaptive_eval.py                      # writes benchmarks/results/adaptive/
    python benchmarks/adaptive_eval.py --part grid --quick  # a few points, to check the script
    python benchmarks/adaptive_eval.py --part grid --seed 17  # the held-out grid: the same points, new draws
    python benchmarks/adaptive_eval.py --part grid --only "W=256 alpaca"  # a subset, rows printed, nothing written
    python benchmarks/adaptive_eval.py --part shift         # the shifting loads alone
    python benchmarks/adaptive_eval.py --part matrix        # the GPU matrix (after --part shift)

Request counts scale with W (a width is only exercised when enough requests are resident) and are small so
the grid runs in minutes on two cores; a point's figures are therefore those of short runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cdbsim.latency.shipped import PROFILES_ENV  # noqa: E402
from cdbsim.planner.experiment import Experiment  # noqa: E402
from cdbsim.planner.study import run_one  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "adaptive"
ARCHS = {"ouro-1.4b": ("ouro-1.4b", None), "huginn-2-4-2": ("huginn-3.5b", "2-4-2"),
         "huginn-1-4-1": ("huginn-3.5b", "1-4-1"), "huginn-0-4-0": ("huginn-3.5b", "0-4-0")}
DEPTHS = {"ouro-1.4b": (2.5, 3.5), "huginn": (5.0, 10.0)}
WIDTHS = (16, 64, 256)
WORKLOADS = ("alpaca", "sharegpt", "arxiv")
LOAD = 0.8  # online runs: this share of the best fixed choice's offline request rate
PER_SLOT = {"alpaca": 2.0, "sharegpt": 1.0, "arxiv": 0.75}  # requests per resident slot W
MIN_REQUESTS = 40


@dataclass(frozen=True)
class Point:
    arch: str
    width: int
    workload: str
    mean_depth: float
    seed: int = 7

    @property
    def label(self) -> str:
        return f"{self.arch} W={self.width} {self.workload} d={self.mean_depth:g}"

    @property
    def requests(self) -> int:
        return max(MIN_REQUESTS, int(PER_SLOT[self.workload] * self.width))

    def experiment(self, rate: float | None = None) -> Experiment:
        name, split = ARCHS[self.arch]
        return Experiment(arch={"name": name, "split": split}, serve={"width": self.width},
                          workload={"name": self.workload, "requests": self.requests, "rate": rate, "seed": self.seed},
                          exits={"mean_depth": self.mean_depth})

    def choices(self) -> dict[str, dict]:
        """Label -> serve fields: the fixed choices, then adaptive."""
        ks = sorted({1, max(1, self.width // 4), self.width})
        return {"norefill": {"policy": "norefill"},
                **{f"refill K={k}": {"policy": "refill", "coda_batch": k} for k in ks},
                "adaptive": {"policy": "adaptive"}}

    def paper_rule(self) -> str:
        return "refill K=1" if self.arch.startswith("ouro") else f"refill K={max(1, self.width // 4)}"


# the profiles the points ran on, as part of each result's command (another build's: $CDBSIM_PROFILES)
PROFILES_SET = f"{PROFILES_ENV}={os.environ[PROFILES_ENV]} " if os.environ.get(PROFILES_ENV) else ""


def points(quick: bool, seed: int = 7, only: str | None = None) -> list[Point]:
    """The grid (every 12th point if ``quick``; those whose label holds ``only``, e.g. "W=256 alpaca")."""
    out = []
    for arch, width, workload in itertools.product(ARCHS, WIDTHS, WORKLOADS):
        for depth in DEPTHS["ouro-1.4b" if arch.startswith("ouro") else "huginn"]:
            out.append(Point(arch, width, workload, depth, seed))
    if only is not None:
        out = [p for p in out if only in p.label]
    return out[::12] if quick else out


def run_choices(exp: Experiment, choices: dict[str, dict]) -> dict[str, dict]:
    """Each choice on the same requests: output tokens/s, request rate, mean normalized latency, mean coda."""
    setup = exp.build()
    out = {}
    for label, fields in choices.items():
        config = replace(setup.config, **{"coda_batch": 1, **fields})
        run = run_one(setup.arch, config, setup.requests, setup.latency, setup.kv)
        report, launches = run.report, run.log.launches
        coda = launches[launches["stage"] == "coda"]["size"]
        out[label] = {"output_tps": report.output_tps, "request_rate": report.request_rate,
                      "normalized_s": report.normalized_s.mean, "mean_coda": float(coda.mean())}
    return out


def gain(value: dict[str, float], other: str, higher: bool) -> float:
    """Adaptive against choice ``other`` as a relative gain (> 0: adaptive is better)."""
    return value["adaptive"] / value[other] - 1 if higher else value[other] / value["adaptive"] - 1


def evaluate(point: Point) -> list[dict]:
    """The offline row and the online row of one point."""
    choices = point.choices()
    offline = run_choices(point.experiment(), choices)
    fixed = [c for c in choices if c != "adaptive"]
    capacity = max(offline[c]["request_rate"] for c in fixed)
    online = run_choices(point.experiment(rate=LOAD * capacity), choices)
    rows = []
    for load, runs, key, higher in (("offline", offline, "output_tps", True),
                                    ("online", online, "normalized_s", False)):
        value = {c: runs[c][key] for c in choices}
        best = (max if higher else min)(fixed, key=value.get)
        rows.append({"arch": point.arch, "W": point.width, "workload": point.workload,
                     "mean_depth": point.mean_depth, "requests": point.requests, "load": load, "metric": key,
                     "best_fixed": best, "paper_rule": point.paper_rule(),
                     "vs_best": gain(value, best, higher), "vs_paper": gain(value, point.paper_rule(), higher),
                     "paper_is_best": value[point.paper_rule()] == value[best],
                     "adaptive_mean_coda": runs["adaptive"]["mean_coda"],
                     **{f"{key}[{c}]": value[c] for c in choices}})
    return rows


def summarise(rows: list[dict]) -> dict:
    vs_best = [r["vs_best"] for r in rows]
    not_best = [r["vs_paper"] for r in rows if not r["paper_is_best"]]
    by_load = {load: sum(r["vs_best"] >= -0.01 for r in rows if r["load"] == load) /
               max(1, sum(r["load"] == load for r in rows)) for load in ("offline", "online")}
    return {"points": len(rows), "within_1pct_of_best": sum(v >= -0.01 for v in vs_best) / len(rows),
            "within_1pct_by_load": by_load, "worst_vs_best": min(vs_best), "median_vs_best": statistics.median(vs_best),
            "paper_rule_not_best": len(not_best),
            "median_gain_over_paper_where_not_best": statistics.median(not_best) if not_best else None}


# ----- the shifting load -----------------------------------------------------------------------------------
# A light load of shallow tokens (Poisson arrivals), then a burst of deep ones, all arriving at once. The GPU
# matrix (calibration/matrices/adaptive-h200.json) replays the shorter Alpaca trace with fewer fixed choices.
SHIFTS = {
    "shift": {"arch": "huginn-2-4-2", "width": 64, "workload": "sharegpt", "per_phase": 96,
              "phases": [{"rate": 1.5, "mean_depth": 4.0}, {"rate": None, "mean_depth": 12.0}],
              "coda_batches": [1, 2, 4, 8, 16, 32, 64]},
    "shift-gpu": {"arch": "huginn-2-4-2", "width": 64, "workload": "alpaca", "per_phase": 64,
                  "phases": [{"rate": 5.0, "mean_depth": 4.0}, {"rate": None, "mean_depth": 12.0}],
                  "coda_batches": [1, 4, 16, 64]},
}


def shifting_load(name: str) -> dict:
    """Every fixed choice and adaptive on one trace whose load shifts half-way (``SHIFTS[name]``); writes the
    trace and a plot of the coda batch over time."""
    from cdbsim.report.plots import plot_coda_batch
    from traces import ExitModel, write_trace
    from traces.shift import Phase, shifting_trace

    spec = SHIFTS[name]
    arch, split = ARCHS[spec["arch"]]
    setup = Experiment(arch={"name": arch, "split": split}, serve={"width": spec["width"]}).build()
    phases = [Phase(spec["per_phase"], p["rate"], ExitModel(mean=p["mean_depth"])) for p in spec["phases"]]
    requests = shifting_trace(spec["workload"], phases, setup.arch.r_max, setup.config.r_min(setup.arch), seed=7,
                              max_total_len=16384)
    trace = write_trace(requests, OUT / f"{name}-trace.csv")
    choices = {"norefill": {"policy": "norefill"},
               **{f"refill K={k}": {"policy": "refill", "coda_batch": k} for k in spec["coda_batches"]},
               "adaptive": {"policy": "adaptive"}}
    runs, logs = {}, {}
    for label, fields in choices.items():
        config = replace(setup.config, **{"coda_batch": 1, **fields})
        run = run_one(setup.arch, config, requests, setup.latency, setup.kv)
        report = run.report
        runs[label] = {"output_tps": report.output_tps, "makespan_s": report.makespan_s,
                       "normalized_s_mean": report.normalized_s.mean, "tpot_p50_s": report.tpot_s.p50,
                       "mean_coda": float(run.log.launches.query("stage == 'coda'")["size"].mean())}
        logs[label] = run.log.launches
    shown = ("adaptive", "refill K=1", f"refill K={spec['width'] // 4}")
    plot_coda_batch({k: logs[k] for k in shown}, OUT / f"{name}-coda-batch.png",
                    f"{setup.arch.name} {setup.arch.split} W={spec['width']} {spec['workload']}: {spec['phases']}")
    fixed = [v for k, v in runs.items() if k != "adaptive"]
    mine = runs["adaptive"]
    return {"setup": spec, "trace": str(trace.relative_to(ROOT)), "runs": runs,
            "adaptive_vs_best_fixed_tps": mine["output_tps"] / max(v["output_tps"] for v in fixed) - 1,
            "adaptive_vs_best_fixed_latency":
                min(v["normalized_s_mean"] for v in fixed) / mine["normalized_s_mean"] - 1}


def run_grid(quick: bool, jobs: int, seed: int, only: str | None = None) -> None:
    """The grid's points in ``jobs`` processes; a subset (``only``) prints its rows and writes nothing."""
    grid = points(quick, seed, only)
    start = time.perf_counter()
    with ProcessPoolExecutor(jobs) as pool:
        rows = [row for part in pool.map(evaluate, grid) for row in part]
    grid_s = time.perf_counter() - start
    import pandas as pd

    summary = summarise(rows)
    if only is not None:
        for r in rows:
            print(f"{r['arch']} W={r['W']} {r['workload']} d={r['mean_depth']:g} {r['load']}: best {r['best_fixed']}, "
                  f"adaptive {r['vs_best']:+.1%} (mean coda {r['adaptive_mean_coda']:.1f})")
    else:
        suffix = f"-seed{seed}" + ("-quick" if quick else "")
        pd.DataFrame(rows).to_csv(OUT / f"grid{suffix}.csv", index=False)
        (OUT / f"grid-summary{suffix}.json").write_text(json.dumps(
            {"command": PROFILES_SET + f"python benchmarks/adaptive_eval.py --part grid --seed {seed}"
             + (" --quick" if quick else ""), "machine": MACHINE, "wall_s": grid_s, **summary}, indent=2,
            default=float))
    print(f"{summary['points']} points in {grid_s:.0f} s: adaptive within 1% of the best fixed choice at "
          f"{summary['within_1pct_of_best']:.0%} (offline {summary['within_1pct_by_load']['offline']:.0%}, online "
          f"{summary['within_1pct_by_load']['online']:.0%}); worst {summary['worst_vs_best']:+.1%}, median "
          f"{summary['median_vs_best']:+.1%} against the best")
    gain = summary["median_gain_over_paper_where_not_best"]
    print(f"the paper's rule is not the best at {summary['paper_rule_not_best']} points; there adaptive's median "
          f"gain over it is {gain:+.1%}" if gain is not None else "the paper's rule is best everywhere")


def run_shifts() -> None:
    start = time.perf_counter()
    shifts = {name: shifting_load(name) for name in SHIFTS}
    (OUT / "shift.json").write_text(json.dumps(
        {"command": PROFILES_SET + "python benchmarks/adaptive_eval.py --part shift", "machine": MACHINE,
         "wall_s": time.perf_counter() - start, **shifts}, indent=2, default=float))
    for name, shift in shifts.items():
        print(f"{name}: " + ", ".join(f"{k} {v['output_tps']:.1f} tok/s {v['normalized_s_mean'] * 1e3:.2f} ms"
                                      for k, v in shift["runs"].items()))
        print(f"{name}: adaptive against the best fixed choice: throughput {shift['adaptive_vs_best_fixed_tps']:+.2%}, "
              f"mean normalized latency {shift['adaptive_vs_best_fixed_latency']:+.2%} (> 0: adaptive better)")


# ----- the GPU matrix ----------------------------------------------------------------------------------------
MATRIX = ROOT / "calibration" / "matrices" / "adaptive-h200.json"
GPU_POINTS = [  # (name, arch key, W, workload, mean depth, requests): grid points, sized for a few seconds each
    ("ouro-alpaca-W64-d2.5", "ouro-1.4b", 64, "alpaca", 2.5, 256),
    ("ouro-alpaca-W256-d3.5", "ouro-1.4b", 256, "alpaca", 3.5, 512),
    ("huginn040-alpaca-W64-d5", "huginn-0-4-0", 64, "alpaca", 5.0, 160),
    ("huginn141-alpaca-W16-d5", "huginn-1-4-1", 16, "alpaca", 5.0, 96),
    ("huginn242-alpaca-W64-d10", "huginn-2-4-2", 64, "alpaca", 10.0, 160),  # last: the shifting load reuses its model
]
GPU_KV_TOKENS = {"ouro-1.4b": 65536, "huginn-3.5b": 32768}  # the validation matrix's: Huginn's depth KV is large


def write_matrix() -> None:
    """``calibration/matrices/adaptive-h200.json``: each GPU point under adaptive and under the fixed choice the
    simulator finds best on that entry's own requests; the short shifting-load trace under adaptive and each
    fixed choice of ``SHIFTS["shift-gpu"]`` (run ``--part shift`` first: it writes the trace)."""
    from calibration.validation import Entry, load_matrix
    from cdbsim.planner.experiment import LatencySection
    from cdbsim.report.metrics import summarize
    from cdbsim.simulator.sim import simulate

    def entry(name: str, sets: list[str]) -> Entry:
        return Entry(name, Experiment().override(MATRIX_SET + sets, source=None))

    def policy_set(policy: str, k: int | None) -> list[str]:
        return [f"serve.policy={policy}"] + ([] if k is None else [f"serve.coda_batch={k}"])

    configs = []
    for name, arch_key, width, workload, depth, n in GPU_POINTS:
        arch, split = ARCHS[arch_key]
        head = [f"arch.name={arch}"] + ([f"arch.split={split}"] if split else [])
        tail = [f"serve.width={width}", f"serve.kv_tokens={GPU_KV_TOKENS[arch]}", f"workload.name={workload}",
                f"workload.requests={n}", f"exits.mean_depth={depth}"]
        best, best_tps = None, 0.0
        for fields in Point(arch_key, width, workload, depth).choices().values():
            if fields["policy"] == "adaptive":
                continue
            sets = head + policy_set(fields["policy"], fields.get("coda_batch", 1)) + tail
            e = entry(name, sets)
            spec, config = e.spec(), e.config()
            requests = e.build_requests()
            log = simulate(spec, config, requests, LatencySection().model(spec), e.given_blocks())
            tps = summarize(log, spec, requests, config.r_min(spec)).output_tps
            if tps > best_tps:
                best, best_tps = (fields["policy"], fields.get("coda_batch", 1), sets), tps
        policy, k, sets = best
        label = policy + (f"-K{k}" if policy == "refill" else "")
        configs += [{"name": f"{name}-{label}", "set": sets},
                    {"name": f"{name}-adaptive", "set": head + policy_set("adaptive", None) + tail}]
    shift = SHIFTS["shift-gpu"]
    arch, split = ARCHS[shift["arch"]]
    trace = (OUT / "shift-gpu-trace.csv").relative_to(ROOT)
    head = [f"arch.name={arch}", f"arch.split={split}"]
    tail = [f"serve.width={shift['width']}", f"serve.kv_tokens={GPU_KV_TOKENS[arch]}", f"workload.trace={trace}"]
    shifted = [("norefill", "norefill", 1), *((f"refill-K{k}", "refill", k) for k in shift["coda_batches"]),
               ("adaptive", "adaptive", None)]
    configs += [{"name": f"shift-{label}", "set": head + policy_set(policy, k) + tail}
                for label, policy, k in shifted]
    rows = ",\n".join("  " + json.dumps(c) for c in configs)
    MATRIX.write_text(
        "{\n"
        f' "name": "adaptive-h200",\n'
        f' "notes": {json.dumps(NOTES)},\n'
        f' "set": {json.dumps(MATRIX_SET)},\n'
        f' "configs": [\n{rows}\n ]\n}}\n')
    served = 0.0
    for e in load_matrix(MATRIX):
        spec, requests = e.spec(), e.build_requests()
        log = simulate(spec, e.config(), requests, LatencySection().model(spec), e.given_blocks())
        served += log.launches["end"].max()
    print(f"{MATRIX.relative_to(ROOT)}: {len(configs)} configurations, {served:.0f} s of predicted serving in all")


MATRIX_SET = ["serve.kv_layout=depth", "serve.timing=lookahead", "workload.seed=7"]
NOTES = ("Adaptive CDB against the fixed choice the simulator finds best on the same requests (offline), and a "
         "load that shifts half-way (Poisson 5 req/s of shallow tokens, then a burst of deep ones) under adaptive "
         "and every fixed choice. Written by python benchmarks/adaptive_eval.py --part matrix; predicted from the "
         "shipped H200 profiles.")


MACHINE = f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["grid", "shift", "matrix", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="every 12th point of the grid only")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=7, help="the grid's request draws (7: the first evaluation's)")
    parser.add_argument("--only", metavar="TEXT", help='grid points whose label holds TEXT (e.g. "W=256 alpaca"): '
                        "printed per row, no files written")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.part in ("grid", "all"):
        run_grid(args.quick, args.jobs, args.seed, args.only)
    if args.part in ("shift", "all"):
        run_shifts()
    if args.part in ("matrix", "all"):
        write_matrix()


if __name__ == "__main__":
    main()
