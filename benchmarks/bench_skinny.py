"""Time the few-row tensor-core matmul of :mod:`executor.skinny` against cuBLAS at 2-32 rows.

For each projection of Ouro-1.4B and Huginn-3.5B (QKV, output, fused gate/up, down) and each row count,
every candidate ``(BLOCK_N, BLOCK_K, stages)`` config is checked against ``F.linear`` and timed, and cuBLAS
``F.linear`` beside it, the way the kernel calibration times its GEMM table: a CUDA graph of a chain of
calls on distinct weight copies (at least twice the L2 before one repeats), queued behind a spin kernel,
median of replays, per call (:class:`calibration.kernels.ChainTimer`).

    python benchmarks/bench_skinny.py --out DIR [--quick]

Writes ``DIR/skinny.csv`` (every point: microseconds, weight bandwidth, speed-up over cuBLAS) and prints the
best config per shape and row count. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from calibration.kernels import ChainTimer, KernelPlan, chain_length  # noqa: E402
from cdbsim.arch import PRESETS  # noqa: E402
from cdbsim.progress import progress_display  # noqa: E402
from executor.skinny import SkinnyConfig, skinny_linear  # noqa: E402

ROWS = (2, 4, 8, 16, 32)
CANDIDATES = [SkinnyConfig(n, k, 4, s) for n, k, s in itertools.product((16, 32, 64), (128, 256), (3, 5))]


def projections(model: str) -> dict[str, tuple[int, int]]:
    """``{name: (N, K)}`` of one layer of a shipped model, as the executor fuses them."""
    s = PRESETS[model].layer
    return {"qkv": ((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden), "o": (s.hidden, s.heads * s.head_dim),
            "gate_up": (2 * s.intermediate, s.hidden), "down": (s.hidden, s.intermediate)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="two shapes, rows 2 and 16, four configs")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: bench_skinny needs a CUDA GPU", file=sys.stderr)
        return 2
    device, dtype = torch.device("cuda"), torch.bfloat16
    chain = ChainTimer(device, KernelPlan())
    shapes = [(model, name, nk) for model in ("ouro-1.4b", "huginn-3.5b") for name, nk in projections(model).items()]
    rows_list, candidates = ROWS, CANDIDATES
    if args.quick:
        shapes, rows_list, candidates = shapes[:2], (2, 16), CANDIDATES[:4]
    points = []
    with progress_display() as progress:
        advance = progress("skinny shapes x rows", len(shapes) * len(rows_list))
        for (model, name, (n, k)), m in itertools.product(shapes, rows_list):
            weights = [torch.randn(n, k, device=device, dtype=dtype) * k**-0.5
                       for _ in range(chain_length(2 * n * k))]
            x = torch.randn(m, k, device=device, dtype=dtype)
            want = F.linear(x.float(), weights[0].float())
            cublas = chain([lambda w=w, x=x: F.linear(x, w) for w in weights])
            for cfg in candidates:
                error = float((skinny_linear(x, weights[0], cfg).float() - want).abs().max())
                seconds = chain([lambda w=w, x=x, cfg=cfg: skinny_linear(x, w, cfg) for w in weights])
                points.append({"model": model, "projection": name, "m": m, "n": n, "k": k,
                               "block_n": cfg.block_n, "block_k": cfg.block_k, "stages": cfg.num_stages,
                               "us": 1e6 * seconds, "cublas_us": 1e6 * cublas, "max_error": error,
                               "weight_TBps": 2 * n * k / seconds / 1e12, "speedup": cublas / seconds})
            del weights
            advance(1)
    table = pd.DataFrame(points)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "skinny.csv", index=False)
    best = table.loc[table.groupby(["model", "projection", "m"])["us"].idxmin()]
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}: best config per shape and rows")
    print(best[["model", "projection", "m", "n", "k", "block_n", "block_k", "stages", "us", "cublas_us",
                "weight_TBps", "speedup", "max_error"]].round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
