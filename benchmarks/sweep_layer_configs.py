"""The few-row matmul's launch configs for Ouro-1.4B's projections, chosen inside a whole layer.

Why: ``executor.few_rows.CONFIGS`` were picked per projection alone (a graph of 20 calls of one shape), while every
kernel still let its successor launch right after its wait. Since then the few-row matmul lets its successor launch
only after its K loop, so each projection starts behind a different kernel than the one it was tuned behind. This
times the shipped layer's kernels as served (24 layers of distinct weights in one CUDA graph: residual norm, QKV,
O, residual norm, gate/up with SwiGLU, down; attention left out, as ``bench_chain.py --parts layers``) and changes
one projection's config at a time (coordinate descent): first its tile (output columns x K chunk) at the shipped
warps and stages, then warps and stages around the best tile. A candidate replaces the current config only if its
mean time per layer over ``--sizes`` is more than ``--min-gain`` percent below that of the current configs timed just
before and after it (over one sweep the same configs' time drifted by 4% on the H200). Every candidate's output is
checked against ``F.linear`` first. Last, the shipped and the chosen configs are timed in alternation (``--rounds``).
``--trigger early`` runs the sweep with the successor let launch right after each matmul's wait (its configs are
``executor.few_rows.EARLY_CONFIGS``).

    python benchmarks/sweep_layer_configs.py --out sweep.json [--sizes 4 8 16] [--rounds 3]

Needs a CUDA GPU. Prints the chosen entries in the source format of ``executor.few_rows.CONFIGS``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_chain import DTYPE, few_layer_calls, ouro_layer_weights, set_pdl, time_graph  # noqa: E402
from bench_executor import copy_bandwidth  # noqa: E402

HIDDEN, INTER, LAYERS = 2048, 5632, 24
PROJECTIONS = {  # name -> (N per half, K, swiglu)
    "qkv": (3 * HIDDEN, HIDDEN, False), "o": (HIDDEN, HIDDEN, False),
    "gu": (INTER, HIDDEN, True), "down": (HIDDEN, INTER, False)}


def tile_candidates(swiglu: bool, k: int, warps: int, stages: int) -> list[tuple[int, int, int, int]]:
    halves = 2 if swiglu else 1
    return [(bn, bk, warps, stages) for bn in (16, 32, 64) for bk in (64, 128, 256, 512)
            if bn * bk * halves <= 32768 and bk <= k]


def shape_candidates(bn: int, bk: int) -> list[tuple[int, int, int, int]]:
    return [(bn, bk, w, s) for w in (2, 4, 8) for s in (3, 4, 6, 8)]


def fits(cfg: tuple[int, int, int, int], swiglu: bool) -> bool:
    """Whether Triton's ``stages + 1`` weight and row chunks fit a block's shared memory (16-row tile)."""
    from executor.few_rows import MIN_BLOCK_M, SHARED_BUDGET, FewRowsConfig, stage_bytes

    config = FewRowsConfig(*cfg)
    return (config.stages + 1) * stage_bytes(config, MIN_BLOCK_M, swiglu) <= SHARED_BUDGET


class Layers:
    """Ouro-1.4B's few-row layer kernels over 24 layers of distinct random weights, at any row count."""

    def __init__(self) -> None:
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.randn = lambda *s, scale=1.0: torch.randn(*s, device="cuda", dtype=DTYPE, generator=gen) * scale
        self.weights = ouro_layer_weights(LAYERS, self.randn, HIDDEN, INTER)
        self.norm = 1 + self.randn(HIDDEN, scale=0.1)
        self.weight_bytes = sum(w.numel() * 2 for w in self.weights[0].values())

    def calls(self, m: int, configs: dict, late: bool = True) -> list:
        x, branch, o, act = (self.randn(m, HIDDEN), self.randn(m, HIDDEN), self.randn(m, HIDDEN),
                             self.randn(m, INTER))
        return few_layer_calls(self.weights, self.norm, x, branch, o, act, late=late, configs=configs)

    def us_per_layer(self, configs: dict, sizes: list[int], late: bool = True) -> dict[int, float]:
        out = {}
        for m in sizes:
            calls = self.calls(m, configs, late)
            for call in calls[:4]:  # every kernel compiled for this row count before the capture
                call()
            torch.cuda.synchronize()
            out[m] = time_graph(calls, LAYERS)
        return out


def correct(name: str, cfg) -> bool:
    """The config's output at 8 rows against ``F.linear`` (and SwiGLU) in bf16."""
    from executor import few_rows as fr
    from executor.ops import silu_mul

    n, k, swiglu = PROJECTIONS[name]
    x = torch.randn(8, k, device="cuda", dtype=DTYPE)
    w = torch.randn(n * (2 if swiglu else 1), k, device="cuda", dtype=DTYPE) * k**-0.5
    want = F.linear(x, w)
    want = silu_mul(want) if swiglu else want
    got = fr.linear(x, w, swiglu, config=cfg)
    torch.cuda.synchronize()
    return bool(torch.allclose(got.float(), want.float(), atol=3e-2, rtol=3e-2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16], help="rows per launch (default 4 8 16)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating shipped/chosen timings at the end")
    parser.add_argument("--min-gain", type=float, default=1.0, help="percent a candidate must gain (default 1)")
    parser.add_argument("--trigger", choices=("late", "early"), default="late",
                        help="when the few-row matmul lets its successor launch while the sweep runs: after its K loop "
                             "(late, as shipped) or right after its wait (early); the last comparison is against the "
                             "shipped configs with the shipped (late) trigger")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: sweep_layer_configs needs a CUDA GPU", file=sys.stderr)
        return 2
    from executor.few_rows import FewRowsConfig, config_for

    set_pdl(True)
    layers = Layers()
    roof_us = layers.weight_bytes / copy_bandwidth()["bandwidth_Bps"] * 1e6
    shipped = {name: config_for(*shape) for name, shape in PROJECTIONS.items()}
    late = args.trigger == "late"
    current = dict(shipped)
    points = []

    def score(configs: dict) -> tuple[float, dict[int, float]]:
        per = layers.us_per_layer(configs, args.sizes, late)
        return statistics.fmean(per.values()), per

    base_us, per = score(current)
    points.append({"projection": None, "config": None, "us": base_us, "per_size": per})
    print(f"shipped: {base_us:.2f} us/layer ({per}); weight reads {roof_us:.2f} us", flush=True)
    for name, (_n, k, swiglu) in PROJECTIONS.items():
        for round_ in (0, 1):
            cfg0 = current[name]
            cands = (tile_candidates(swiglu, k, cfg0.num_warps, cfg0.stages) if round_ == 0
                     else shape_candidates(cfg0.block_n, cfg0.block_k))
            for cand in cands:
                cfg = FewRowsConfig(*cand)
                if cfg == current[name] or not fits(cand, swiglu):
                    continue
                try:
                    ok = correct(name, cfg)
                    if ok:  # the current configs timed just before and after: the GPU drifts over a sweep
                        before = score(current)[0]
                        us, per = score({**current, name: cfg})
                        ref = (before + score(current)[0]) / 2
                    else:
                        us, per, ref = float("nan"), {}, float("nan")
                except Exception as exc:  # a config Triton cannot build or launch: recorded, skipped
                    ok, us, ref = False, float("nan"), float("nan")
                    per = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                gain = (1 - us / ref) * 100
                points.append({"projection": name, "config": list(cfg), "ok": ok, "us": us, "current_us": ref,
                               "gain_percent": gain, "per_size": per})
                print(f"{name} {tuple(cfg)}: {us:.2f} us/layer against {ref:.2f} ({gain:+.1f}%)"
                      f"{'' if ok else ' (failed)'}", flush=True)
                save(args.out, shipped, current, points, roof_us, args.sizes)
                if ok and gain > args.min_gain:
                    current[name] = cfg
                    print(f"  -> {name} now {tuple(cfg)}", flush=True)
    ab = {"shipped": [], "chosen": []}
    for _ in range(args.rounds):
        for label, configs, trigger in (("shipped", shipped, True), ("chosen", current, late)):
            ab[label].append(layers.us_per_layer(configs, args.sizes, trigger))
    summary = {label: {m: statistics.median(r[m] for r in runs) for m in args.sizes} for label, runs in ab.items()}
    for m in args.sizes:
        s, c = summary["shipped"][m], summary["chosen"][m]
        print(f"M={m}: shipped {s:.2f} us/layer, chosen {c:.2f} ({(c / s - 1) * 100:+.1f}%), weight reads "
              f"{roof_us:.2f}", flush=True)
    print("\n".join(f"    ({n}, {k}, {sw}): FewRowsConfig{tuple(current[name])},  # ouro.{name}"
                    for name, (n, k, sw) in PROJECTIONS.items()))
    save(args.out, shipped, current, points, roof_us, args.sizes, trigger=args.trigger, alternating=ab,
         median=summary)
    return 0


def save(out: Path, shipped: dict, chosen: dict, points: list, roof_us: float, sizes: list[int], **extra) -> None:
    """Everything so far (written after every candidate: a call cut short keeps what it measured)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "sizes": sizes, "weight_read_us": roof_us,
                               "shipped": {k: list(v) for k, v in shipped.items()},
                               "chosen": {k: list(v) for k, v in chosen.items()}, "points": points, **extra},
                              indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
