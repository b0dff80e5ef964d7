"""GPU memory of the executor against the accounting of :mod:`cdbsim.serving.memory`.

``measure`` (GPU) runs every configuration of a validation matrix on the executor, each on its first ``--requests``
requests (memory depends on the requests only through their number and longest length, which the accounting takes),
and records what torch's caching allocator held after each phase: weights, engine (KV cache, token store, RoPE
table, loop-state bank), decode-type CUDA graphs, prefill graphs, the warm-up prefill and the run, with the peak
allocated and reserved bytes. ``report`` (CPU) prices each row with the accounting and prints both side by side.
``table`` (CPU) prints what fits: the largest KV cache of each model, r_max and layout on each GPU with measured
profiles (README's table).

    python benchmarks/memory.py measure --matrix calibration/matrices/validation-h200.json --out FILE.csv
    python benchmarks/memory.py report FILE.csv --matrix calibration/matrices/validation-h200.json
    python benchmarks/memory.py table
"""

# ruff: noqa: E402  (the imports follow the sys.path line that picks this checkout)
from __future__ import annotations

import argparse
import csv
import gc
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd

from calibration.validation import Entry, OneModel, load_matrix
from cdbsim.errors import ConfigError
from cdbsim.serving.memory import RequestShape


def measure(entries: list[Entry], out: Path, requests: int) -> None:
    """One row per entry in ``out`` (appended as each ends, so a cut run keeps what it measured)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    model_for = OneModel()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = None
        for entry in entries:
            row = measure_entry(entry, model_for(entry.spec()), requests, props)
            gc.collect()  # the engine and its captured graphs refer to each other: free the KV cache now
            torch.cuda.empty_cache()
            if writer is None:
                writer = csv.DictWriter(f, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
            f.flush()
            print(f"{entry.name}: peak {row['peak'] / 2**30:.2f} GiB, reserved {row['reserved_peak'] / 2**30:.2f} GiB",
                  flush=True)


def measure_entry(entry: Entry, model: object, requests: int, props: object) -> dict[str, object]:
    """What the allocator held after each phase of one entry's run; everything it built is garbage on return."""
    import torch

    from cdbsim.serving.config import Policy, prefill_graph_sizes
    from cdbsim.serving.launch import Stage
    from executor.driver import Executor

    arch, config = entry.spec(), entry.config()
    chosen = entry.build_requests()[:requests]
    blocks = entry.plan(props.name, props.total_memory).kv_blocks
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    row: dict[str, object] = {"entry": entry.name, "device": props.name, "device_bytes": props.total_memory,
                              "weights": torch.cuda.memory_allocated(), "requests": len(chosen),
                              "longest": max(r.prompt_len + r.output_len for r in chosen), "kv_blocks": blocks}
    executor = Executor(arch, config, chosen, blocks, model=model)
    graphs, engine = executor.graphs, executor.engine
    stages = (Stage.DECODE,) if config.policy is Policy.CB else (Stage.PRELUDE, Stage.CORE, Stage.CODA)
    steps = [("engine", lambda: None),
             ("decode_graphs", partial(graphs.capture_all, stages, config.decode_sizes())),
             ("prefill_graphs", partial(graphs.capture_prefill, prefill_graph_sizes(config.prefill_budget))),
             ("warmup_prefill", engine.warmup_prefill)]
    before = row["weights"]
    with torch.inference_mode():
        for phase, step in steps:
            step()
            torch.cuda.synchronize()
            now = torch.cuda.memory_allocated()
            row[phase], before = now - before, now
    row["after_warmup"] = before
    row["peak_warmup"] = torch.cuda.max_memory_allocated()
    executor.run()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    row.update(peak=torch.cuda.max_memory_allocated(), reserved_peak=torch.cuda.max_memory_reserved(),
               outside_torch=total - free - torch.cuda.memory_reserved())
    return row


def report(measured: Path, matrix: Path) -> pd.DataFrame:
    """Each measured row beside the plan for the same entry, KV capacity and requests."""
    from cdbsim.serving.memory import MemoryPlan

    rows = pd.read_csv(measured)
    entries = {e.name: e for e in load_matrix(matrix)}
    table = []
    for row in rows.itertuples():
        entry = entries[row.entry]
        plan = MemoryPlan.of(entry.spec(), entry.config(), int(row.kv_blocks),
                             RequestShape(int(row.requests), int(row.longest)), row.device, float(row.device_bytes))
        runtime = row.peak - plan.weights - plan.kv  # what the run held beyond weights and KV cache
        table.append({"entry": row.entry, "peak GiB": row.peak / 2**30, "plan GiB": plan.total / 2**30,
                      "error %": 100 * (plan.total / row.peak - 1), "run time GiB": runtime / 2**30,
                      "plan run time GiB": plan.runtime.total / 2**30, "reserved GiB": row.reserved_peak / 2**30})
    return pd.DataFrame(table)


FIT_MODELS = {"ouro-1.4b": (4, 8), "ouro-2.6b": (4, 8), "huginn-3.5b": (16, 32)}  # the shipped r_max and twice it
FIT_SHAPE = RequestShape(1000, 4096)  # a thousand requests of up to 4,096 tokens


def fit_table(widths: tuple[int, ...] = (64, 256), devices: tuple[str, ...] = ("h100-sxm", "h200")) -> pd.DataFrame:
    """Largest KV cache (thousands of tokens, sized as ``cdbsim predict`` sizes it) of each model, r_max and layout on
    each device at each width W (prefill budget 8,192, memory fraction 0.9)."""
    from cdbsim.model.arch import KVLayout, load_arch
    from cdbsim.planner.experiment import LatencySection
    from cdbsim.serving.config import ServeConfig
    from cdbsim.serving.memory import KVCapacity

    rows = []
    for name, r_maxes in FIT_MODELS.items():
        for r_max in r_maxes:
            arch = load_arch(name, r_max=r_max)
            for layout in KVLayout:
                row: dict[str, object] = {"model": name, "r_max": r_max, "layout": layout.value}
                for device in devices:
                    profile = LatencySection(device=device).model(load_arch(name)).profile
                    short = "H100" if "H100" in profile.device["name"] else "H200"
                    for width in widths:
                        try:
                            plan = KVCapacity().plan(arch, ServeConfig(width=width, layout=layout), FIT_SHAPE,
                                                     profile.device["name"], profile.memory_bytes)
                            row[f"{short} W={width}"] = f"{plan.kv_tokens / 1000:,.0f}k"
                        except ConfigError:
                            row[f"{short} W={width}"] = "none"
                rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("measure", help="run a matrix on the GPU and record its memory")
    run.add_argument("--matrix", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True, help="CSV file to write")
    run.add_argument("--requests", type=int, default=32)
    run.add_argument("--only", nargs="*")
    show = sub.add_parser("report", help="measured against planned memory")
    show.add_argument("measured", type=Path)
    show.add_argument("--matrix", type=Path, required=True)
    sub.add_parser("table", help="what fits on each GPU (markdown)")
    args = parser.parse_args()
    if args.command == "measure":
        entries = load_matrix(args.matrix, args.only)
        if args.only:  # in the order given
            entries.sort(key=lambda e: args.only.index(e.name))
        measure(entries, args.out, args.requests)
    elif args.command == "report":
        print(report(args.measured, args.matrix).round(3).to_string(index=False))
    else:
        table = fit_table()
        lines = [list(table.columns), ["---"] * len(table.columns), *table.astype(str).values.tolist()]
        print("\n".join(f"| {' | '.join(map(str, line))} |" for line in lines))


if __name__ == "__main__":
    main()
