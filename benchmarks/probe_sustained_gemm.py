"""Does a GEMM run slower under sustained load than in the short bursts the kernel profile times it in?

The kernel profile times each GEMM shape as a CUDA graph of a chain of calls on distinct weights, a few
milliseconds of work queued behind a spin kernel. A full-depth prefill of Huginn-3.5B is 190 ms of
back-to-back matmuls, and its GEMMs took 11% longer in `benchmarks/profile_prefill.py` than their table
times. This times the same chains in a burst (as calibration does, weights scaled by 0.02), after two seconds
of back-to-back replays (``Timer(busy_s=2)``), in a burst again right after, and in a burst with weights of unit
scale (a GEMM's power, and so its clock, depends on the values it multiplies), beside the shipped kernel
profile's table time:

    python benchmarks/probe_sustained_gemm.py --out DIR       # on a CUDA GPU, about a minute

Writes ``DIR/sustained-gemm.csv`` (m, n, k and the microseconds of each).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from cdbsim.kernels import KernelModel  # noqa: E402
from cdbsim.profile import load_profile_file  # noqa: E402

# (m, n, k): Huginn-3.5B's four projections and Ouro-1.4B's three widest at a 2,048-token prefill, and one
# decode-sized GEMM for contrast
SHAPES = ((2048, 15840, 5280), (2048, 5280, 5280), (2048, 35840, 5280), (2048, 5280, 17920),
          (2048, 6144, 2048), (2048, 11264, 2048), (2048, 2048, 5632), (64, 35840, 5280))


def measure(shapes: tuple[tuple[int, int, int], ...], busy_s: float) -> list[dict]:
    import torch
    from probe_gemm_clock import gemm_chain

    from calibration.measure import Timer

    device = torch.device("cuda")
    kernels = KernelModel(load_profile_file(ROOT / "calibration" / "profiles" / "h200-kernels.json").kernels)
    rows = []
    for m, n, k in shapes:
        row = {"m": m, "n": n, "k": k, "table_us": kernels.time("gemm", m, n, k) * 1e6}
        for scale in (0.02, 1.0):
            graph, count, tensors = gemm_chain(m, n, k, scale, device)
            if scale != 1.0:
                row["burst_us"] = Timer(device, 7, 2)(graph.replay) / count * 1e6
                row["sustained_us"] = Timer(device, 7, 2, busy_s=busy_s)(graph.replay) / count * 1e6
                row["burst_after_us"] = Timer(device, 7, 2)(graph.replay) / count * 1e6
            else:
                row["unit_weights_burst_us"] = Timer(device, 7, 2)(graph.replay) / count * 1e6
            del graph, tensors
            torch.cuda.empty_cache()
        rows.append(row)
        print(", ".join(f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}"
                        for key, value in row.items()), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-s", type=float, default=2.0, help="seconds of back-to-back replays first")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: probe_sustained_gemm.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from calibration.measure import write_probe_table

    table = pd.DataFrame(measure(SHAPES, args.busy_s))
    write_probe_table(table, args.out / "sustained-gemm.csv", digits=3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
