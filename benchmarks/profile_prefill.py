"""Where a full-depth prefill spends its device time, kernel by kernel (PyTorch profiler, CUDA activity).

A prefill chunk of ``T`` tokens runs every layer at r_max, so its matmul work is 2 flops per weight per
token; the issue's measure of prefill speed divides that by the whole launch. This splits the launch into
kernel families (cuBLAS GEMMs, the paged prefill-attention kernel, norms, SwiGLU, RoPE/KV write, the
rest) and gives each family's share, and the GEMMs' own rate, so it says how much of the gap to the
matmul peak is in the GEMMs and how much around them.

    python benchmarks/profile_prefill.py --models ouro-1.4b huginn-3.5b --tokens 2048 4096 --out DIR

Writes ``DIR/prefill-profile.csv`` (model, tokens, family, kernels, device ms, share, the launch replayed as a
CUDA graph, and the launch's rate counting weight flops, the GEMMs' own, the launch's counting causal
attention's flops too, and the replay's counting weight flops) and prints a
table; ``--summarize CSV`` prints a saved table with those rates on any machine. Measuring needs a CUDA
GPU; it runs the launch eagerly and sums its kernels' device times (the shares are what this is for), which
leaves out the gaps between kernels that a served launch, a graph replay, still has (some 1,200 kernels in
Ouro-1.4B's launch; ``replay_ms`` is that replay). The prefill speed a server gets is the replayed launch's:
``--stages STAGES_CSV`` reads the prefill rows of ``bench_executor.py --parts stages`` and gives their rates
against the fastest GEMM of the kernel profile (``--profile``), on any machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from bench_executor import build_model, time_fn  # noqa: E402

from calibration.measure import write_probe_table  # noqa: E402
from cdbsim.arch import PRESETS  # noqa: E402
from cdbsim.config import ServeConfig  # noqa: E402
from cdbsim.kv import need_blocks  # noqa: E402
from cdbsim.kvlayout import KVLayout  # noqa: E402
from cdbsim.launch import Stage, causal_pairs, prefill_launch  # noqa: E402
from executor.engine import Engine  # noqa: E402
from executor.graphs import StageGraphs  # noqa: E402
from traces.request import Request  # noqa: E402

# kernel-name fragments of each family, first match wins (cuBLAS/CUTLASS GEMMs carry one of the first)
FAMILIES = {"gemm": ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas"), "prefill attention": ("_prefill_attn",),
            "norms": ("_rms_norm", "_residual_norm"), "swiglu": ("_silu_mul",), "rope / kv write": ("rope",)}


def family(name: str) -> str:
    low = name.lower()
    return next((f for f, keys in FAMILIES.items() if any(k in low for k in keys)), "other")


def weight_flops(model_name: str, tokens: int) -> float:
    """2 flops per weight per token, every layer at r_max."""
    arch = PRESETS[model_name]
    return 2 * tokens * sum(arch.weight_bytes()[part] / arch.dtype_bytes * loops
                            for part, loops in (("prelude", 1), ("core", arch.r_max), ("coda", 1)))


def attention_flops(model_name: str, tokens: int) -> float:
    """Causal attention of one chunk without a cached prefix: two matmuls of 2 flops per (query, visible
    key, head column), in every layer the prefill runs."""
    arch = PRESETS[model_name]
    layers = arch.prelude + arch.core * arch.r_max + arch.coda
    return 4 * causal_pairs(tokens) * arch.layer.heads * arch.layer.head_dim * layers


def launch_flops(table: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Weight flops and causal attention flops of each row's launch (``model``, ``tokens``)."""
    pairs = list(zip(table.model, table.tokens, strict=True))
    return (pd.Series([weight_flops(m, t) for m, t in pairs], index=table.index, dtype=float),
            pd.Series([attention_flops(m, t) for m, t in pairs], index=table.index, dtype=float))


def with_rates(table: pd.DataFrame) -> pd.DataFrame:
    """The launch's rate counting weight flops only, the GEMMs' own, and the launch's counting attention's
    flops too (what a model-flops utilisation counts)."""
    table = table.copy()
    w, a = launch_flops(table)
    gemm = table[table.family == "gemm"].set_index(["model", "tokens"]).device_ms
    gemm_ms = [gemm.get((m, t), float("nan")) for m, t in zip(table.model, table.tokens, strict=True)]
    table["weight_tflops_launch"] = w / table.launch_device_ms / 1e9
    table["weight_tflops_gemm"] = w / pd.Series(gemm_ms, index=table.index) / 1e9
    table["model_tflops_launch"] = (w + a) / table.launch_device_ms / 1e9
    if "replay_ms" in table:  # tables measured before the replay was timed lack it
        table["weight_tflops_replay"] = w / table.replay_ms / 1e9
    return table


def profile(model_name: str, tokens: int, repeats: int = 3) -> list[dict]:
    """Device time per kernel family of one full-depth prefill launch of ``tokens`` tokens, and the same launch's
    time as a CUDA-graph replay (``replay_ms``: the kernels' device time plus the gaps between them)."""
    arch = PRESETS[model_name]
    model = build_model(arch, device=torch.device("cuda"), dtype=torch.bfloat16, seed=0)
    blocks = need_blocks(tokens, 2)
    config = ServeConfig(policy="refill", width=1, prefill_budget=tokens, layout=KVLayout.SHARED)
    engine = Engine(model, config, [Request(0, tokens, 2)], blocks)
    engine.admit([0])
    launch = prefill_launch([0], [0], [tokens], [list(range(blocks))], tokens)
    prepared = engine.prepare(launch)
    with torch.inference_mode():
        captured = StageGraphs(engine).get(Stage.PREFILL, tokens)  # the launch as served: one graph replay
        captured.meta.copy_(torch.from_numpy(engine.prepare(launch, engine.max_blocks).meta))
        replay_ms = time_fn(captured.replay, 1, 5)
        for _ in range(2):
            engine.run_eager(prepared)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                engine.run_eager(prepared)
            torch.cuda.synchronize()
    per_family: dict[str, list[float]] = {}
    others = []
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0.0) or getattr(event, "self_cuda_time_total", 0.0)
        if device_us > 0 and event.device_type == torch.autograd.DeviceType.CUDA:
            entry = per_family.setdefault(family(event.key), [0.0, 0.0])
            entry[0] += device_us / 1e3 / repeats
            entry[1] += event.count / repeats
            if family(event.key) == "other":
                others.append((device_us / 1e3 / repeats, event.count // repeats, event.key[:90]))
    for ms, count, name in sorted(others, reverse=True)[:8]:  # what "other" holds, in the log
        print(f"  {model_name} {tokens} other: {count:4d} x {name} ({ms:.3f} ms)")
    total = sum(ms for ms, _ in per_family.values())
    del engine, model
    torch.cuda.empty_cache()
    return [{"model": model_name, "tokens": tokens, "family": name, "kernels": round(count), "device_ms": ms,
             "share": ms / total, "launch_device_ms": total, "replay_ms": replay_ms}
            for name, (ms, count) in sorted(per_family.items(), key=lambda kv: -kv[1][0])]


def gemm_peak_tflops(profile: Path) -> float:
    """The fastest GEMM a kernel profile measured, TFLOP/s: the matmul rate prefill is held against."""
    tables = json.loads(profile.read_text())["kernels"]["tables"]
    return max(2 * m * n * k / seconds for m, n, k, seconds in tables["gemm"]) / 1e12


def stage_rates(stages: pd.DataFrame, peak_tflops: float) -> pd.DataFrame:
    """The prefill rows of a stage table (one chunk of ``batch`` tokens, replayed) with the launch's rate
    counting weight flops, its share of ``peak_tflops``, and the rate counting attention's flops too."""
    rows = stages[stages.stage == "prefill"]
    out = pd.DataFrame({"model": rows.model, "tokens": rows.batch, "ms": rows.ms})
    w, a = launch_flops(out)
    out["weight_tflops"] = w / out.ms / 1e9
    out["of_peak"] = out.weight_tflops / peak_tflops
    out["model_tflops"] = (w + a) / out.ms / 1e9
    out["model_of_peak"] = out.model_tflops / peak_tflops
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ouro-1.4b", "huginn-3.5b"], choices=sorted(PRESETS))
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--summarize", type=Path, metavar="CSV",
                        help="print a saved table with its rates (no GPU)")
    parser.add_argument("--stages", type=Path, metavar="STAGES_CSV",
                        help="the prefill rows of a bench_executor.py stage table with their rates (no GPU)")
    parser.add_argument("--profile", type=Path, default=ROOT / "calibration/profiles/h200-kernels.json",
                        help="kernel profile whose fastest GEMM is the peak (with --stages)")
    args = parser.parse_args(argv)
    if args.stages:
        for path in (args.stages, args.profile):
            if not path.is_file():
                print(f"error: {path} is not a file", file=sys.stderr)
                return 2
        stages = pd.read_csv(args.stages)
        if not {"model", "stage", "batch", "ms"} <= set(stages.columns) or not (stages.stage == "prefill").any():
            print(f"error: {args.stages} has no prefill rows of a bench_executor.py stage table", file=sys.stderr)
            return 2
        peak = gemm_peak_tflops(args.profile)
        print(f"peak: {peak:.0f} TFLOP/s, the fastest GEMM of {args.profile}")
        print(stage_rates(stages, peak).round(3).to_string(index=False))
        return 0
    if args.summarize:
        print(with_rates(pd.read_csv(args.summarize)).round(3).to_string(index=False))
        return 0
    if args.out is None:
        print("error: profile_prefill.py needs --out DIR (or --summarize CSV)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: profile_prefill.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = [row for m in args.models for t in args.tokens for row in profile(m, t)]
    table = with_rates(pd.DataFrame(rows))
    write_probe_table(table, args.out / "prefill-profile.csv", digits=3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
