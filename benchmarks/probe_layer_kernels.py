"""The kernels of one Ouro-1.4B decode layer, each launched once, for a hardware-counter profiler to read.

Why: a few-row core step's kernels take 1.7x their weight reads (docs/executor.md), the gaps between them are
0.35 us, and prefetching their weights into L2 before the PDL wait did not help. What is left is inside each
kernel: its DRAM throughput while it runs, its occupancy and what its warps wait on. This script only launches
the kernels (warm-up outside the profiled range, then one launch each inside ``cudaProfilerStart/Stop``); run it
under Nsight Compute::

    ncu --clock-control none --profile-from-start off --csv --page details \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        python benchmarks/probe_layer_kernels.py --rows 1 2 4 8 16 > ncu.csv

(`--clock-control none` leaves the GPU's clocks as they are.) Per row count: the four projections on the path the
executor takes at that many rows (chained at one and two rows with their norm prologues, the few-row matmul above),
and the residual-norm kernel that the few-row path runs between them. ``--summarize ncu.csv`` prints one line per
kernel from that output: duration, DRAM throughput (% of peak), achieved occupancy, grid, registers;
``--summarize-raw ncu.csv`` one line per few-row projection of a ``--page raw`` output of one row count (the metrics
in benchmarks/results/few-row-tma/README.md): duration, DRAM throughput, instructions, the main stall reasons.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pandas as pd
import torch

from cdbsim.paths import chained_rows
from executor import chain, few_rows
from executor import triton_kernels as tk

HIDDEN, INTERMEDIATE, QKV = 2048, 5632, 6144  # Ouro-1.4B


def launch_layer(rows: int, weights: dict[str, torch.Tensor], norm: torch.Tensor) -> None:
    """The layer's projections (and, on the few-row path, its two residual norms) at ``rows`` rows."""
    gen = torch.Generator(device="cuda").manual_seed(rows)

    def act(width: int) -> torch.Tensor:
        return torch.randn(rows, width, generator=gen, device="cuda").to(torch.bfloat16)

    x, branch = act(HIDDEN), act(HIDDEN)
    if rows <= chained_rows(HIDDEN):
        chain.gemv_residual(branch, x, norm, norm, 1e-6, True, weights["wqkv"])
        chain.gemv(act(HIDDEN), weights["wo"])
        chain.gemv_residual(branch, x, norm, norm, 1e-6, True, weights["gate_up"], swiglu=True)
        chain.gemv(act(INTERMEDIATE), weights["down"])
        return
    few_rows.linear(act(HIDDEN), weights["wqkv"])
    few_rows.linear(act(HIDDEN), weights["wo"])
    tk.residual_norm(branch, x, norm, norm, 1e-6, True)
    few_rows.linear(act(HIDDEN), weights["gate_up"], swiglu=True)
    few_rows.linear(act(INTERMEDIATE), weights["down"])
    tk.residual_norm(branch, x, norm, norm, 1e-6, True)


KERNELS = ("_chain_gemv_kernel", "_few_rows_kernel", "_residual_norm_kernel",
           *(f"few_rows_{kind}{swiglu}_{rows}" for kind in ("tma", "direct") for swiglu in ("", "_swiglu")
             for rows in (8, 16)))  # the CUDA C++ ones: CDBSIM_FEW_ROWS_KERNEL=tma or direct
METRICS = {"Duration": "us", "DRAM Throughput": "dram_pct", "Achieved Occupancy": "occupancy_pct",
           "Grid Size": "grid", "Block Size": "threads", "Registers Per Thread": "registers"}
LAYER = {"chain": ("qkv", "o", "gate_up", "down"), "few": ("qkv", "o", "norm", "gate_up", "down", "norm")}


def summarize(path: Path, rows: list[int]) -> pd.DataFrame:
    """One line per profiled kernel of this script, in launch order, named by row count and projection."""
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"error: {path} holds no Nsight Compute CSV table (a line starting with \"ID\")")
    table = pd.read_csv(io.StringIO("\n".join(lines[start:])))
    table = table[table["Kernel Name"].isin(KERNELS) & table["Metric Name"].isin(METRICS)].copy()
    table["Metric Value"] = pd.to_numeric(table["Metric Value"].astype(str).str.replace(",", ""), errors="coerce")
    wide = table.pivot_table(index=["ID", "Kernel Name"], columns="Metric Name", values="Metric Value",
                             aggfunc="first").rename(columns=METRICS).reset_index()
    names = [(m, part) for m in rows for part in LAYER["chain" if m <= chained_rows(HIDDEN) else "few"]]
    if len(names) != len(wide):
        raise SystemExit(f"error: {path} has {len(wide)} kernels of this probe, expected {len(names)} for rows {rows}")
    wide.insert(0, "rows", [m for m, _ in names])
    wide.insert(1, "kernel", [part for _, part in names])
    wide["us"] /= 1000.0
    return wide.drop(columns="ID")


RAW = {"gpu__time_duration.sum": "us", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
       "smsp__inst_executed.sum": "instructions"}
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def summarize_raw(path: Path) -> pd.DataFrame:
    """One line per few-row projection of an ``ncu --page raw --metrics ...`` output of this probe at one row count
    (the four projections, in launch order): duration, DRAM throughput, instructions and the main stall reasons."""
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"error: {path} holds no Nsight Compute CSV table (a line starting with \"ID\")")
    table = pd.read_csv(io.StringIO("\n".join(lines[start:])), skiprows=[1])  # the second line holds the units
    table = table[table["Kernel Name"].str.contains("few_rows")].reset_index(drop=True)
    stalls = {STALL.format(s): f"stall_{s}" for s in ("wait", "long_scoreboard", "short_scoreboard", "barrier")}
    out = table[["Kernel Name", *RAW, *stalls]].rename(columns={**RAW, **stalls})
    for column in out.columns[1:]:
        out[column] = pd.to_numeric(out[column].astype(str).str.replace(",", ""), errors="coerce")
    out["us"] /= 1000.0
    out.insert(1, "projection", ["qkv", "o", "gate_up", "down"][:len(out)])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--summarize", type=Path, help="print the kernels of this Nsight Compute CSV output instead")
    parser.add_argument("--summarize-raw", type=Path, help="the same for a `--page raw` output of one row count "
                        "(duration, DRAM %%, instructions, stall reasons per projection)")
    args = parser.parse_args(argv)
    if args.summarize_raw:
        print(summarize_raw(args.summarize_raw).to_string(index=False, float_format="{:.2f}".format))
        return 0
    if args.summarize:
        print(summarize(args.summarize, args.rows).to_string(index=False, float_format="{:.2f}".format))
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("error: this probe launches CUDA kernels; no CUDA device here")
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = {"wqkv": (QKV, HIDDEN), "wo": (HIDDEN, HIDDEN), "gate_up": (2 * INTERMEDIATE, HIDDEN),
              "down": (HIDDEN, INTERMEDIATE)}
    weights = {name: (torch.randn(*shape, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
               for name, shape in shapes.items()}
    norm = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
    for rows in args.rows:  # compile and warm up outside the profiled range
        launch_layer(rows, weights, norm)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for rows in args.rows:
        launch_layer(rows, weights, norm)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
