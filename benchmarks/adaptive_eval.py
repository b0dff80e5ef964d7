"""The adaptive CDB policy against every fixed choice, in the simulator on the shipped H200 profiles.

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
    python benchmarks/adaptive_eval.py --quick              # a few points, to check the script

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

from cdbsim.experiment import Experiment  # noqa: E402
from cdbsim.study import run_one  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "adaptive"
ARCHS = {"ouro-1.4b": ("ouro-1.4b", None), "huginn-2-4-2": ("huginn-3.5b", "2-4-2"),
         "huginn-1-4-1": ("huginn-3.5b", "1-4-1"), "huginn-0-4-0": ("huginn-3.5b", "0-4-0")}
DEPTHS = {"ouro-1.4b": (2.5, 3.5), "huginn": (5.0, 10.0)}
WIDTHS = (16, 64, 256)
WORKLOADS = ("alpaca", "sharegpt", "arxiv")
LOAD = 0.8  # online runs: this share of the best fixed choice's offline request rate
PER_SLOT = {"alpaca": 3.0, "sharegpt": 1.5, "arxiv": 1.0}  # requests per resident slot W
MIN_REQUESTS = 48


@dataclass(frozen=True)
class Point:
    arch: str
    width: int
    workload: str
    mean_depth: float

    @property
    def requests(self) -> int:
        return max(MIN_REQUESTS, int(PER_SLOT[self.workload] * self.width))

    def experiment(self, rate: float | None = None) -> Experiment:
        name, split = ARCHS[self.arch]
        return Experiment(arch={"name": name, "split": split}, serve={"width": self.width},
                          workload={"name": self.workload, "requests": self.requests, "rate": rate, "seed": 7},
                          exits={"mean_depth": self.mean_depth})

    def choices(self) -> dict[str, dict]:
        """Label -> serve fields: the fixed choices, then adaptive."""
        ks = sorted({1, max(1, self.width // 4), self.width})
        return {"norefill": {"policy": "norefill"},
                **{f"refill K={k}": {"policy": "refill", "coda_batch": k} for k in ks},
                "adaptive": {"policy": "adaptive"}}

    def paper_rule(self) -> str:
        return "refill K=1" if self.arch.startswith("ouro") else f"refill K={max(1, self.width // 4)}"


def points(quick: bool) -> list[Point]:
    out = []
    for arch, width, workload in itertools.product(ARCHS, WIDTHS, WORKLOADS):
        for depth in DEPTHS["ouro-1.4b" if arch.startswith("ouro") else "huginn"]:
            out.append(Point(arch, width, workload, depth))
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
SHIFT = {"arch": "huginn-2-4-2", "width": 64, "workload": "sharegpt", "per_phase": 96,
         "phases": [{"rate": 1.0, "mean_depth": 4.0}, {"rate": None, "mean_depth": 12.0}]}


def shifting_load() -> tuple[list, dict]:
    """Every fixed choice and adaptive on one trace whose load shifts half-way (see ``SHIFT``)."""
    from cdbsim.experiment import Experiment
    from cdbsim.plots import plot_coda_batch
    from traces import ExitModel, write_trace
    from traces.shift import Phase, shifting_trace

    name, split = ARCHS[SHIFT["arch"]]
    base = Experiment(arch={"name": name, "split": split}, serve={"width": SHIFT["width"]})
    setup = base.build()
    phases = [Phase(SHIFT["per_phase"], p["rate"], ExitModel(mean=p["mean_depth"])) for p in SHIFT["phases"]]
    requests = shifting_trace(SHIFT["workload"], phases, setup.arch.r_max, setup.config.r_min(setup.arch), seed=7,
                              max_total_len=16384)
    trace = write_trace(requests, OUT / "shift-trace.csv")
    point = Point(SHIFT["arch"], SHIFT["width"], SHIFT["workload"], 0.0)
    results, logs = {}, {}
    for label, fields in point.choices().items():
        config = replace(setup.config, **{"coda_batch": 1, **fields})
        run = run_one(setup.arch, config, requests, setup.latency, setup.kv)
        report = run.report
        results[label] = {"output_tps": report.output_tps, "makespan_s": report.makespan_s,
                          "normalized_s_mean": report.normalized_s.mean, "tpot_p50_s": report.tpot_s.p50,
                          "mean_coda": float(run.log.launches.query("stage == 'coda'")["size"].mean())}
        logs[label] = run.log.launches
    plot_coda_batch({k: logs[k] for k in ("adaptive", "refill K=1", "refill K=16")}, OUT / "shift-coda-batch.png",
                    f"{setup.arch.name} {setup.arch.split} W={SHIFT['width']} {SHIFT['workload']}: "
                    f"{SHIFT['phases']}")
    return [str(trace.relative_to(ROOT))], results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every 12th point only")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    grid = points(args.quick)
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = [row for part in pool.map(evaluate, grid) for row in part]
    grid_s = time.perf_counter() - start
    import pandas as pd

    frame = pd.DataFrame(rows)
    summary = summarise(rows)
    start = time.perf_counter()
    trace, shift = shifting_load()
    fixed = [v for k, v in shift.items() if k != "adaptive"]
    mine = shift["adaptive"]
    shift_summary = {
        "setup": SHIFT, "trace": trace, "runs": shift,
        "adaptive_vs_best_fixed_tps": mine["output_tps"] / max(v["output_tps"] for v in fixed) - 1,
        "adaptive_vs_best_fixed_latency": min(v["normalized_s_mean"] for v in fixed) / mine["normalized_s_mean"] - 1}
    command = "python benchmarks/adaptive_eval.py" + (" --quick" if args.quick else "")
    suffix = "-quick" if args.quick else ""
    frame.to_csv(OUT / f"grid{suffix}.csv", index=False)
    (OUT / f"summary{suffix}.json").write_text(json.dumps(
        {"command": command, "machine": f"{platform.machine()} {os.cpu_count()} cores", "grid_wall_s": grid_s,
         "shift_wall_s": time.perf_counter() - start, "grid": summary, "shift": shift_summary}, indent=2,
        default=float))
    print(f"{summary['points']} points in {grid_s:.0f} s: adaptive within 1% of the best fixed choice at "
          f"{summary['within_1pct_of_best']:.0%} (offline {summary['within_1pct_by_load']['offline']:.0%}, online "
          f"{summary['within_1pct_by_load']['online']:.0%}); worst {summary['worst_vs_best']:+.1%}, median "
          f"{summary['median_vs_best']:+.1%} against the best")
    gain = summary["median_gain_over_paper_where_not_best"]
    print(f"the paper's rule is not the best at {summary['paper_rule_not_best']} points; there adaptive's median "
          f"gain over it is {gain:+.1%}" if gain is not None else "the paper's rule is best everywhere")
    print("shifting load:", ", ".join(f"{k} {v['output_tps']:.0f} tok/s / {v['normalized_s_mean'] * 1e3:.1f} ms"
                                      for k, v in shift.items()))


if __name__ == "__main__":
    main()
