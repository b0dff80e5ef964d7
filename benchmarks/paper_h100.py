"""The CDB paper's H100 settings in cdbsim's simulator: capacity knees measured the paper's way, and delta.

The paper (Schwethelm, Rueckert, Kaissis, arXiv 2608.09444) finds each policy's capacity knee from Poisson arrivals
over 600 s on one H100 80GB. This runs the same protocol on the H100's measured profiles (``--device h100-sxm``):
W = 64, M = 8,192, the paper's KV memory (327,680 tokens of physical layers), ``--exits paper --q Q``, Ouro-1.4B
K = 1, Huginn-3.5B 2-4-2 K = 16. Every rate of a grid around CB's offline request rate gets 600 s of arrivals (so
``600 x rate`` requests); a policy's knee is the rate at which its mean normalized latency first reaches ten times its
value at the lowest rate, where queues start to grow without bound (twice that value is reached well before: CDB
refill's light-load latency doubles as its batches fill, long before it saturates). Three seeds show how stable each
knee is; every point of every curve is kept, so another definition is a change of ``KNEE_FACTOR``. The offline side
(this executor on the H100 against the simulator) is the GPU matrix ``calibration/matrices/paper-h100.json``;
``benchmarks/tables.py`` joins both into README's table.

    python benchmarks/paper_h100.py [--jobs 2] [--out benchmarks/results/paper/h100/curves.csv]
"""

# ruff: noqa: E402  (the imports follow the sys.path line that picks this checkout)
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's packages, not an installed copy
    sys.path.insert(0, str(ROOT))

import pandas as pd
from rich.progress import Progress

import cdbsim
from cdbsim.planner.study import latency_knee

DURATION_S = 600.0  # the paper's Poisson arrivals last 600 s
RATE_FACTORS = (0.2, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0,
                2.2)  # x CB's offline request rate
KNEE_FACTOR = 10.0  # a knee: mean normalized latency this many times its value at the lowest rate
OFFLINE_REQUESTS = 1024  # requests of the CB run that sets the rate grid
SEEDS = (1, 2, 3)
POLICIES = ("cb", "norefill", "refill")
OUT = ROOT / "benchmarks/results/paper/h100/curves.csv"


@dataclass(frozen=True)
class Case:
    """One of the paper's knee experiments and its reported knees (req/s, CB / no-refill / refill)."""

    model: str
    workload: str
    q: float
    coda_batch: int
    kv_tokens: int  # the paper's 327,680 tokens of physical layers, held at r_max in a depth-indexed cache
    paper: tuple[float, float, float]

    @property
    def name(self) -> str:
        return f"{self.model} {self.workload} q={self.q:g}"

    def point(self, policy: str, seed: int, requests: int, rate: float | None) -> dict[str, object]:
        return {"arch.name": self.model, "workload.name": self.workload, "workload.requests": requests,
                "workload.seed": seed, "workload.rate": rate, "exits.model": "paper", "exits.q": self.q,
                "serve.policy": policy, "serve.coda_batch": self.coda_batch if policy == "refill" else 1,
                "serve.width": 64, "serve.prefill_budget": 8192, "serve.kv_tokens": self.kv_tokens,
                "latency.device": "h100-sxm"}


CASES = (Case("ouro-1.4b", "sharegpt", 0.2, 1, 81_920, (4.7, 5.7, 7.2)),
         Case("ouro-1.4b", "alpaca", 0.2, 1, 81_920, (34.9, 39.5, 53.9)),
         Case("huginn-3.5b", "sharegpt", 0.28, 16, 38_544, (1.84, 2.44, 2.43)))


def curves(jobs: int) -> pd.DataFrame:
    """One row per case, seed, policy and rate: the requests of its 600 s and their mean normalized latency."""
    base = cdbsim.Experiment()
    rows = []
    with Progress() as progress:
        task = progress.add_task("load curves",
                                 total=len(CASES) * len(SEEDS) * (1 + len(POLICIES) * len(RATE_FACTORS)))
        for case in CASES:
            for seed in SEEDS:
                offline = cdbsim.sweep(base, points=[case.point("cb", seed, OFFLINE_REQUESTS, None)])
                progress.advance(task)
                rate0 = float(offline["request_rate"].iloc[0])
                for policy in POLICIES:
                    points = [case.point(policy, seed, max(64, math.ceil(DURATION_S * f * rate0)), f * rate0)
                              for f in RATE_FACTORS]
                    done = progress.tasks[0].completed
                    frame = cdbsim.sweep(base, points=points, jobs=jobs,
                                         progress=lambda n, _, d=done: progress.update(task, completed=d + n))
                    bad = frame[frame["status"] != "ok"]
                    if len(bad):
                        raise SystemExit(f"error: {case.name} {policy}: {bad['reason'].iloc[0]}")
                    rows += [{"case": case.name, "policy": policy, "seed": seed, "cb_offline_rate": rate0,
                              "rate": p["workload.rate"], "requests": p["workload.requests"],
                              "normalized_s_mean": y}
                             for p, y in zip(points, frame["normalized_s_mean"], strict=True)]
    return pd.DataFrame(rows)


def knees(curves: pd.DataFrame) -> pd.DataFrame:
    """Each case, policy and seed's knee (req/s; NaN where the latency never reaches ``KNEE_FACTOR`` x)."""
    rows = []
    for (case, policy, seed), curve in curves.groupby(["case", "policy", "seed"], sort=False):
        knee = latency_knee(list(curve["rate"]), list(curve["normalized_s_mean"]), KNEE_FACTOR)
        rows.append({"case": case, "policy": policy, "seed": seed, "knee": math.nan if knee is None else knee})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    frame = curves(args.jobs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False, float_format="%.5g")
    summary = knees(frame).groupby(["case", "policy"], sort=False)["knee"].agg(["mean", "min", "max"])
    print(summary.round(3).to_string())


if __name__ == "__main__":
    main()
