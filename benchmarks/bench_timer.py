"""How calibration's timer reads a stage: with and without a spin kernel queued before the start event.

A CUDA event recorded on an idle device fires at once, so a single graph replay bracketed by two events
also measures the host's time to launch the graph, and its jitter. Calibration queues each replay
behind a spin kernel (``calibration.measure.Timer``, ``spin_s``) so the events bracket device work only,
as in a serving run whose next launch is queued while one runs. This script times a few stages of a
whole model (the bench calibration measures models with): the graph replay alone without the spin and
with two spin lengths (equal medians for the two show the shorter one already covers the launch), and
the launch as the executor makes it (the copy of the launch's metadata into the graph's input buffer,
then the replay; calibration times that copy on its own, per byte, since its size depends on the run).
Per variant it prints the median and the spread (p25-p75) of ``--repeats`` calls.

    python benchmarks/bench_timer.py --out timer.json            # on a CUDA GPU, about 20 s
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from calibration.measure import Timer, UnitBench
from cdbsim.arch import PRESETS
from cdbsim.kvlayout import KVLayout
from cdbsim.launch import Stage

POINTS = ((Stage.PRELUDE, 1, 128), (Stage.PRELUDE, 64, 128), (Stage.CODA, 1, 128), (Stage.CODA, 64, 128),
          (Stage.CORE, 1, 128), (Stage.CORE, 64, 128), (Stage.CORE, 256, 128))
SPINS_S = (0.0, 2e-4, 1e-3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="ouro-1.4b", choices=sorted(PRESETS))
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: bench_timer.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    arch = PRESETS[args.arch]
    bench = UnitBench(arch, max(b for _, b, _ in POINTS), 256, 65536, KVLayout.SHARED, device,
                      Timer(device, args.repeats, 3))
    rows = []
    for stage, batch, context in POINTS:
        replay = bench.graph(stage, batch, context)
        launch = bench.graph(stage, batch, context, with_copy=True)
        row = {"stage": stage.value, "B": batch, "L": context}
        for name, fn, spin in [*((f"replay, spin {s * 1e3:g} ms", replay, s) for s in SPINS_S),
                               ("launch, spin 0.2 ms", launch, 2e-4)]:
            t = np.asarray(Timer(device, args.repeats, 3, spin_s=spin).samples(fn)) * 1e6
            p25, p50, p75 = np.percentile(t, [25, 50, 75])
            row[f"{name}: median us"] = round(float(p50), 2)
            row[f"{name}: p25-p75 us"] = round(float(p75 - p25), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"arch": arch.name, "repeats": args.repeats, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
