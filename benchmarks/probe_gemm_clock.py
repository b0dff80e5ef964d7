"""How fast a GEMM's time grows once the GPU runs compute-bound work without a break, and how fast it recovers.

The kernel profile times every GEMM in a short burst on a rested GPU. A long prefill is hundreds of
milliseconds of compute-bound GEMMs back to back, and `benchmarks/probe_sustained_gemm.py` found such
GEMMs 15-27% slower after two seconds of load. Which clock a launch sees depends on how long the load has
lasted, so the latency model would need that curve, not one number. This replays a CUDA graph of a chain of
one GEMM shape back to back for a while and records each replay's time against the time since the load began,
in a fixed sequence of phases with rests between them (``PHASES``): a Huginn-3.5B projection from rest, the
same after a short rest, a memory-bound decode-sized GEMM then the Huginn one right after it, an Ouro-1.4B
projection from rest. ``nvidia-smi`` samples the SM clock, power and temperature alongside:

    python benchmarks/probe_gemm_clock.py --out DIR       # on a CUDA GPU, about 25 s
    python benchmarks/probe_gemm_clock.py --summarize DIR/gemm-clock.csv   # onset and slowdown per phase

Writes ``DIR/gemm-clock.csv`` (per phase and 10 ms of it: replays, microseconds per GEMM, and that over the
phase's first replays), ``DIR/smi.csv`` (after a line aligning its clock with the host's) and ``DIR/gemm-clock.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

SHAPES = {"huginn-qkv": (2048, 15840, 5280), "ouro-up": (2048, 11264, 2048), "decode": (64, 35840, 5280)}
# (phase, shape, rest before it in seconds, seconds of back-to-back replays)
PHASES = (("huginn from rest", "huginn-qkv", 4.0, 2.5), ("huginn after 0.5 s rest", "huginn-qkv", 0.5, 1.0),
          ("decode from rest", "decode", 4.0, 2.5), ("huginn after decode", "huginn-qkv", 0.0, 1.0),
          ("ouro from rest", "ouro-up", 4.0, 2.5))
FIRST = 3  # replays that stand for a phase's start
SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu"


def smi_offset_s() -> float:
    """Host ``time.time()`` minus ``nvidia-smi``'s timestamp read as UTC, so samples line up with host times."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=timestamp", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()[0]
    return time.time() - pd.Timestamp(out.replace("/", "-"), tz="UTC").timestamp()


@contextlib.contextmanager
def smi_sampling(path: Path) -> Iterator[None]:
    """``nvidia-smi`` writes :data:`SMI_FIELDS` to ``path`` every 50 ms while the block runs, after a first line
    holding :func:`smi_offset_s`."""
    with open(path, "w") as log:
        log.write(f"# host_minus_smi_s={smi_offset_s():.6f}\n")
        log.flush()
        sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,nounits", "-lms", "50"],
                                   stdout=log, stderr=subprocess.DEVNULL)
        try:
            yield
        finally:
            sampler.terminate()
            sampler.wait()


def ready_to_measure(parser: argparse.ArgumentParser, out: Path | None, prog: str) -> bool:
    """Whether a measuring run can start: ``--out`` given (else the parser's usage error) and a CUDA GPU present
    (else a one-line error and False); ``out`` is created."""
    if out is None:
        parser.error("--out or --summarize is needed")
    import torch

    if not torch.cuda.is_available():
        print(f"error: {prog} needs a CUDA GPU", file=sys.stderr)
        return False
    out.mkdir(parents=True, exist_ok=True)
    return True


def gemm_chain(m: int, n: int, k: int, scale: float, device: object) -> tuple[object, int, list]:
    """A CUDA graph of a chain of ``m x n x k`` GEMMs on distinct weights scaled by ``scale`` (as the kernel
    profile times a GEMM), the number of GEMMs in it, and the tensors it reads (a graph keeps none alive)."""
    import torch
    import torch.nn.functional as F

    from calibration.kernels import chain_length

    count = chain_length(2 * n * k)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * scale for _ in range(count)]

    def run() -> None:
        for w in weights:
            F.linear(x, w)

    with torch.inference_mode():
        run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
    return graph, count, [x, *weights]


def replay_for(graph: object, count: int, seconds: float) -> list[tuple[float, float]]:
    """``(seconds since the first replay began, microseconds per GEMM)`` of back-to-back replays for
    ``seconds`` (:func:`calibration.measure.back_to_back`)."""
    import torch

    from calibration.measure import back_to_back

    return [(t, s * 1e6 / count) for t, s in back_to_back(graph.replay, seconds, torch.device("cuda"))]


BIN_S = 0.01


def binned(table: pd.DataFrame, keys: tuple[str, ...] = ("phase", "shape"), value: str = "us_per_gemm"
           ) -> pd.DataFrame:
    """Every replay of a phase (a group of ``keys``) averaged over :data:`BIN_S` of it (each replay takes a few
    milliseconds): the replays, their mean ``value`` and ``over_start``."""
    table = table.assign(t_s=(table["t_s"] // BIN_S) * BIN_S)
    out = table.groupby([*keys, "t_s"], sort=False).agg(
        replays=(value, "size"), **{value: (value, "mean")}, over_start=("over_start", "mean"))
    return out.reset_index()


def plot(table: pd.DataFrame, path: Path, ylabel: str = "time per GEMM / its first replays", label: str = "phase"
         ) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, rows in table.groupby(label, sort=False):
        ax.plot(rows["t_s"], rows["over_start"], label=name, lw=1)
    ax.set_xlabel("seconds since the phase's load began")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def summary(table: pd.DataFrame, within_s: float = 1.0) -> pd.DataFrame:
    """Per compute-bound phase of a saved ``gemm-clock.csv``: the onset and slowdown of
    :func:`cdbsim.power.fit_sustained` over its first ``within_s`` seconds (the first replays as the rested pace)."""
    import numpy as np

    from cdbsim.power import fit_sustained

    rows = []
    for phase, g in table.groupby("phase", sort=False):
        if g["shape"].iloc[0] == "decode":
            continue  # memory-bound: no power limit to find
        rested = g["us_per_gemm"].iloc[:FIRST].mean()
        elapsed = np.cumsum(g["replays"] * g["us_per_gemm"]) / 1e6
        work = np.cumsum(g["replays"] * rested) / 1e6
        keep = elapsed <= within_s
        fit = fit_sustained(work[keep].to_numpy(), elapsed[keep].to_numpy())
        rows.append({"phase": phase, "onset_ms": 1e3 * fit.onset_s, "slowdown": fit.slowdown})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the run's tables go (needs a CUDA GPU)")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="CSV",
                        help="fit onset and slowdown to saved gemm-clock.csv files instead (no GPU)")
    args = parser.parse_args(argv)
    if args.summarize:
        for path in args.summarize:
            print(f"{path}:\n{summary(pd.read_csv(path)).round(4).to_string(index=False)}")
        return 0
    if not ready_to_measure(parser, args.out, "probe_gemm_clock.py"):
        return 2
    import torch

    device = torch.device("cuda")
    chains = {name: gemm_chain(m, n, k, 0.02, device) for name, (m, n, k) in SHAPES.items()}
    rows = []
    with smi_sampling(args.out / "smi.csv"):
        for phase, shape, rest, seconds in PHASES:
            time.sleep(rest)
            graph, count, _ = chains[shape]
            wall = time.time()
            times = replay_for(graph, count, seconds)
            start = sum(us for _, us in times[:FIRST]) / FIRST
            rows += [{"phase": phase, "shape": shape, "began_unix_s": wall, "t_s": t, "us_per_gemm": us,
                      "over_start": us / start} for t, us in times]
            late = [us for t, us in times if t > seconds - 0.3]
            print(f"{phase}: {start:.1f} us per GEMM at the start, {sum(late) / len(late):.1f} in its last "
                  "0.3 s", flush=True)
    table = binned(pd.DataFrame(rows))
    table.round(4).to_csv(args.out / "gemm-clock.csv", index=False)
    plot(table, args.out / "gemm-clock.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
