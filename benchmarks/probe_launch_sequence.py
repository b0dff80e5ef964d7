"""Does a stage run slower inside a serving sequence than when calibration replays it alone?

Calibration times each stage as one graph replay behind a spin kernel (``calibration.measure.Timer``). A
serving run queues prelude, core and coda launches back to back, each its metadata copy and its graph
between two events. This script times the same launches of one architecture both ways:

``alone``      the calibration timer: each launch (copy + replay) by itself, median of ``--repeats``
``sequence``   prelude, core, coda, prelude, core, coda, ... queued ahead behind one spin kernel, each
               launch between its own two events, as the executor does; the median per stage
``same``       each stage's launch queued ``--rounds`` times in a row the same way (no other graph between)

so a difference between ``sequence`` and ``same`` is what switching between graphs costs, and between
``same`` and ``alone`` what running back to back costs. ``--core-batch N`` makes the core launch N rows
wide while prelude and coda keep ``--batch`` (as served, a prelude follows a core step of the whole batch).

    python benchmarks/probe_launch_sequence.py --arch calibration/archs/unseen-huginn-2048.json \\
        --batch 1 --context 3072 --out sequence.json                  # on a CUDA GPU, under a minute
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from calibration.measure import Timer, UnitBench, probe_arch
from cdbsim.kvlayout import KVLayout
from cdbsim.launch import Stage

STAGES = (Stage.PRELUDE, Stage.CORE, Stage.CODA)


def queued(launches: list[tuple[Stage, object]], rounds: int) -> dict[str, float]:
    """Median device seconds per stage of ``launches`` queued ``rounds`` times, each between two events."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(0.02 * Timer.CLOCK_HZ))  # the host queues ahead while the device spins
    marks = []
    for _ in range(rounds):
        for stage, launch in launches:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch()
            end.record()
            marks.append((stage, start, end))
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for stage, start, end in marks[len(launches):]:  # the first round waits behind the spin: left out
        times.setdefault(stage.value, []).append(start.elapsed_time(end) / 1e3)
    return {stage: statistics.median(t) for stage, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="ouro-1.4b", help="a preset or an architecture JSON file")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=3072)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--table-context", type=int, default=None,
                        help="positions the block tables are sized for (a serving run: its longest request; "
                             "default: --context)")
    parser.add_argument("--core-batch", type=int, default=None,
                        help="rows of the core launch (default: --batch): a served prelude or coda follows a core "
                             "step of another batch, whose data leaves the caches as they are")
    parser.add_argument("--exiting", action="store_true",
                        help="every core token exits, so the core launch also fills its later KV slots")
    parser.add_argument("--out", help="write the times as JSON")
    args = parser.parse_args(argv)
    arch = probe_arch("probe_launch_sequence", args.arch)
    if arch is None:
        return 2
    device = torch.device("cuda")
    timer = Timer(device, args.repeats, 3)
    table_context = max(args.table_context or 0, args.context) + 1
    core_batch = args.core_batch or args.batch
    rows = max(args.batch, core_batch)
    bench = UnitBench(arch, rows, table_context, max(65536, rows * table_context), KVLayout.DEPTH, device, timer,
                      scatter=True)
    launches = [(s, bench.graph(s, core_batch if s is Stage.CORE else args.batch, args.context,
                                exiting=args.exiting and s is Stage.CORE, mixed_steps=s is Stage.CORE,
                                with_copy=True)) for s in STAGES]
    t0 = time.perf_counter()
    results = {"alone": {s.value: timer(fn) for s, fn in launches},
               "sequence": queued(launches, args.rounds)}
    results["same"] = {s.value: queued([(s, fn)], args.rounds)[s.value] for s, fn in launches}
    width = bench.graphs.width
    bench.close()
    print(f"{arch.name}, B = {args.batch} (core {core_batch}), L = {args.context}"
          f"{', core tokens exiting' if args.exiting else ''}, "
          f"tables {width} blocks wide: "
          f"median us per launch ({time.perf_counter() - t0:.0f} s)")
    print(f"{'':<10}" + "".join(f"{s.value:>12}" for s in STAGES))
    for way, times in results.items():
        print(f"{way:<10}" + "".join(f"{1e6 * times[s.value]:>12.1f}" for s in STAGES))
    if args.out:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "arch": arch.name,
                "batch": args.batch, "core_batch": core_batch, "context": args.context, "repeats": args.repeats,
                "rounds": args.rounds, "exiting": args.exiting, "table_blocks": width}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "seconds": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
