"""A decode stage's device time kernel by kernel, against the kernel model's composition of the same kernels.

The kernel-level latency model (``cdbsim.kernels``) predicts a core step as the sum of its kernels' table
times. Where a whole stage replays longer than composed, this says which kernels differ: it replays the
stage's CUDA graph under the PyTorch profiler (CUDA activity), sums the device time of each kernel family
per launch, and sets it beside the family's composed time (``KernelModel.layer_kernels`` times the core's
layers; glue and the gaps, with the GEMMs' share, on their own rows). The ``launch`` row is the whole graph replay
(timed as calibration times it) against the stage the latency model composes.

    python benchmarks/profile_decode.py --arch calibration/archs/unseen-huginn-2048.json \\
        --points 2:256,4:3072,16:3072 --out DIR          # on a CUDA GPU
    python benchmarks/profile_decode.py --summarize DIR/decode-profile.csv [--plot PNG]   # any machine

A point ``B:L:LONG:N`` gives ``N`` of its ``B`` rows ``LONG`` positions and the rest ``L`` (a served batch's
mixed contexts; the families are composed at the mean length, the launch by the latency model's rule for
mixed contexts), ``--mixed-steps`` puts the rows at loop steps 0, 1, .. as a refill run does, and
``--exiting`` makes every row leave the loop (writing its KV into the deeper slots, the last-exited fill).

Writes ``DIR/decode-profile.csv`` (arch, point, family, kernels per launch, measured and composed
microseconds). A kernel's profiled duration includes any time it waits on its predecessor under
programmatic dependent launch; ``CDBSIM_PDL=0`` removes that overlap when a family's own time matters.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from cdbsim.arch import ArchSpec, load_arch  # noqa: E402
from cdbsim.config import Policy, ServeConfig, padding_table  # noqa: E402
from cdbsim.errors import ConfigError  # noqa: E402
from cdbsim.kernels import STYLE_CODE, KernelModel  # noqa: E402
from cdbsim.kvlayout import KVLayout  # noqa: E402
from cdbsim.latency import LatencyModel  # noqa: E402
from cdbsim.launch import Stage, decode_launch  # noqa: E402
from cdbsim.profile import load_profile_file  # noqa: E402

KERNEL_PROFILE = ROOT / "calibration" / "profiles" / "h200-kernels.json"
# kernel-name fragments of each kernel table's family, first match wins (cuBLAS/CUTLASS GEMMs carry one of
# the first; the few-row matmul counts as a GEMM, as the kernel model names it); anything else is glue (copies,
# gathers, the adapter's cat)
FAMILIES = {"gemm": ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "_few_rows_kernel"),
            "chained_attention": ("_rope_decode_attn",),
            "decode_attention": ("_decode_attn",), "rope_kv": ("_rope_kv",), "residual_norm": ("_residual_norm",),
            "rms_norm": ("_rms_norm",), "silu_mul": ("_silu_mul",), "gemv": ("_chain_gemv",)}
POSITIONS = 65536  # KV positions of the bench's cache (calibration's), or what the points need if more
POINT_KEYS = ["batch", "context", "long", "n_long", "mixed_steps", "exiting"]


@dataclass(frozen=True)
class Point:
    """One core launch: ``batch`` rows at ``context`` positions, ``n_long`` of them at ``long`` instead."""

    batch: int
    context: int
    long: int = 0
    n_long: int = 0

    def contexts(self) -> list[int]:
        return [self.long] * self.n_long + [self.context] * (self.batch - self.n_long)

    @property
    def mean(self) -> float:
        return sum(self.contexts()) / self.batch


def family(name: str) -> str:
    low = name.lower()
    return next((f for f, keys in FAMILIES.items() if any(k in low for k in keys)), "glue")


def composed(arch: ArchSpec, batch: int, context: float, kernels: KernelModel) -> dict[str, float]:
    """Composed microseconds per family of one core launch of ``batch`` rows at ``context`` positions each:
    the core's layers' kernels, the glue (core glue with Huginn's adapter; the adapter's GEMM under
    ``gemm``, where the profiler finds it) and what the model adds to each layer beyond its kernels' tables
    (the per-kernel gaps and the GEMMs' share)."""
    out: dict[str, float] = {}
    layer, _ = kernels.layer_kernels(arch, batch, float(context))
    for name, seconds in layer:
        out[name] = out.get(name, 0.0) + arch.core * seconds * 1e6
    out["glue"] = kernels.time("core_glue", STYLE_CODE[arch.style], arch.layer.hidden, batch) * 1e6
    if arch.has_adapter:
        adapter = kernels.adapter(arch, batch) * 1e6
        out["gemm"] = out.get("gemm", 0.0) + adapter
        out["glue"] -= adapter
    # what the model adds to a layer beyond its kernels' tables, as KernelModel.layer adds it
    beyond = kernels.layer(arch, batch, float(context)) - sum(seconds for _, seconds in layer)
    out["gaps"] = arch.core * beyond * 1e6
    return out


def with_composed(table: pd.DataFrame, kernel_profile: Path = KERNEL_PROFILE) -> pd.DataFrame:
    """``table`` (measured rows) with the composed column filled from ``kernel_profile``."""
    kernels = KernelModel(load_profile_file(kernel_profile).kernels)
    pad = padding_table(ServeConfig(policy=Policy.REFILL, width=512).decode_sizes(), 512)
    table = table.copy()
    for key, default in (("long", 0), ("n_long", 0), ("mixed_steps", False), ("exiting", False)):
        table[key] = table[key].fillna(default).astype(type(default)) if key in table else default
    rows = []
    tags = ["table"] if "table" in table else []  # several saved tables: a point is one table's
    for (arch_name, *values), group in table.groupby(["arch", *POINT_KEYS, *tags], sort=False):
        arch = load_arch(arch_name)
        point = Point(*(int(v) for v in values[:4]))
        mixed, exiting = bool(values[4]), bool(values[5])
        parts = composed(arch, point.batch, point.mean, kernels)
        latency = LatencyModel(arch, load_profile_file(kernel_profile))
        contexts = point.contexts()
        steps = [i % arch.r_max if mixed else 0 for i in range(point.batch)]
        launch = decode_launch(Stage.CORE, list(range(point.batch)), [n - 1 for n in contexts],
                               [[] for _ in contexts], pad[point.batch], steps=steps, exits=[exiting] * point.batch)
        if exiting:  # every row leaves the loop: its KV copied into the deeper slots (last-exited fill)
            launch.kv_copies = sum(KVLayout.DEPTH.fill_copies(step, arch.r_max) for step in steps)
        parts["launch"] = latency.launch_time(launch) * 1e6
        measured = group.set_index("family")
        for name in dict.fromkeys([*measured.index, *parts]):
            rows.append({"arch": arch_name, **dict(zip(POINT_KEYS + tags, values, strict=True)), "family": name,
                         "kernels": measured["kernels"].get(name, 0),
                         "measured_us": measured["measured_us"].get(name, float("nan")),
                         "composed_us": parts.get(name, float("nan"))})
    out = pd.DataFrame(rows)
    out["measured/composed"] = out["measured_us"] / out["composed_us"]
    return out


def measure(arch_name: str, points: list[Point], repeats: int, mixed_steps: bool = False,
            device_name: str = "cuda", layout: str = "depth", exiting: bool = False) -> list[dict]:
    """Measured microseconds per kernel family of one core launch at each point (on a CPU the torch
    backend's ops, which says only that the script runs)."""
    import torch

    from calibration.measure import Timer, UnitBench
    device = torch.device(device_name)
    activity = torch.profiler.ProfilerActivity.CUDA if device.type == "cuda" else torch.profiler.ProfilerActivity.CPU
    arch = load_arch(arch_name)
    timer = Timer(device, repeats, 3)
    positions = max(POSITIONS, max(sum(p.contexts()) + 64 * p.batch for p in points))
    bench = UnitBench(arch, max(p.batch for p in points), max(max(p.contexts()) for p in points) + 1, positions,
                      KVLayout(layout), device, timer)
    rows: list[dict] = []
    for point in points:
        replay = bench.graph(Stage.CORE, point.batch, point.context, exiting=exiting, mixed_steps=mixed_steps,
                             contexts=point.contexts())
        launch_s = timer(replay)
        with torch.inference_mode(), torch.profiler.profile(
                activities=[activity]) as prof:
            for _ in range(repeats):
                replay()
            if device.type == "cuda":
                torch.cuda.synchronize()
        per_family: dict[str, list[float]] = {}
        for event in prof.key_averages():
            device_us = getattr(event, "self_device_time_total", 0.0) or getattr(event, "self_cuda_time_total", 0.0)
            if device.type != "cuda":
                device_us = event.self_cpu_time_total
            if device_us > 0 and (device.type != "cuda" or event.device_type == torch.autograd.DeviceType.CUDA):
                entry = per_family.setdefault(family(event.key), [0.0, 0.0])
                entry[0] += device_us / repeats
                entry[1] += event.count / repeats
        key = {"batch": point.batch, "context": point.context, "long": point.long, "n_long": point.n_long,
               "mixed_steps": mixed_steps, "exiting": exiting}
        rows += [{"arch": arch_name, **key, "family": name, "kernels": round(count), "measured_us": us}
                 for name, (us, count) in per_family.items()]
        rows.append({"arch": arch_name, **key, "family": "launch", "kernels": 0, "measured_us": launch_s * 1e6})
        print(f"{arch.name} {point}{' mixed steps' if mixed_steps else ''}{' exiting' if exiting else ''}: "
              f"{launch_s * 1e6:.1f} us, "
              f"{sum(c for _, c in per_family.values()):.0f} kernels", flush=True)
    bench.close()
    return rows


def plot(table: pd.DataFrame, path: Path) -> Path:
    """Composed against measured core-step time of every point (``with_composed``'s ``launch`` rows), one
    colour per architecture, filled for uniform contexts and hollow for mixed ones, with the +-5% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    launches = table[table.family == "launch"]
    fig, ax = plt.subplots(figsize=(6, 5.5))
    for colour, (arch, rows) in enumerate(launches.groupby("arch", sort=False)):
        for mixed, group in rows.groupby(rows["n_long"] > 0):
            ax.plot(group.measured_us, group.composed_us, "o", color=f"C{colour}", mfc="none" if mixed else None,
                    label=f"{Path(arch).stem}{', mixed contexts' if mixed else ''}")
    low = 0.9 * min(launches.measured_us.min(), launches.composed_us.min())
    high = 1.1 * max(launches.measured_us.max(), launches.composed_us.max())
    grid = pd.Series([low, high])
    ax.plot(grid, grid, "k-", lw=1)
    ax.fill_between(grid, grid * 0.95, grid * 1.05, color="grey", alpha=0.2, label="±5%")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel="replayed core step (µs)",
           ylabel="composed from kernels (µs)", title="core steps: kernel model against replays")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def parse_points(text: str) -> list[Point]:
    try:
        fields = [[int(x) for x in p.split(":")] for p in text.split(",")]
        points = [Point(*f) for f in fields if len(f) in (2, 4)]
    except (ValueError, TypeError):
        points = []
    if not points or len(points) != len(text.split(",")) or any(
            min(p.batch, p.context) < 1 or not 0 <= p.n_long <= p.batch or (p.n_long and p.long < 1) for p in points):
        raise argparse.ArgumentTypeError(f"points must look like 4:3072,16:256:2048:2 (batch:context[:long:rows]), "
                                         f"got {text!r}")
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=["calibration/archs/unseen-huginn-2048.json"],
                        help="presets or architecture JSON files")
    parser.add_argument("--points", type=parse_points, default=parse_points("2:256,4:3072,16:3072"),
                        help="batch:context,... (default: 2:256,4:3072,16:3072)")
    parser.add_argument("--mixed-steps", action="store_true", help="rows at loop steps 0, 1, .. (a refill run)")
    parser.add_argument("--exiting", action="store_true",
                        help="every row leaves the loop (its KV written into the deeper slots too)")
    parser.add_argument("--layout", choices=["depth", "shared"], default="depth",
                        help="KV layout of the bench's cache (depth: as refill serves; shared: r_max times smaller)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--kernel-profile", type=Path, default=KERNEL_PROFILE)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="CSV",
                        help="compose saved tables again (no GPU)")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also plot composed against measured core steps")
    args = parser.parse_args(argv)
    try:
        if args.summarize:
            table = pd.concat([pd.read_csv(path).assign(table=path.stem) for path in args.summarize],
                              ignore_index=True)
        else:
            import torch

            if args.out is None or not torch.cuda.is_available():
                print("error: profile_decode.py measures on a CUDA GPU into --out DIR (or --summarize CSV)",
                      file=sys.stderr)
                return 2
            for name in args.arch:
                load_arch(name)  # refuse a bad name before any GPU work
            args.out.mkdir(parents=True, exist_ok=True)
            rows: list[dict] = []
            for name in args.arch:  # the table is written after each architecture: a later failure keeps it
                rows += measure(name, args.points, args.repeats, args.mixed_steps, layout=args.layout,
                                exiting=args.exiting)
                pd.DataFrame(rows).to_csv(args.out / "decode-profile.csv", index=False)
            table = pd.DataFrame(rows)
            print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  PDL {os.environ.get('CDBSIM_PDL', '1')}")
        shown = with_composed(table, args.kernel_profile)
        if args.plot:
            plot(shown, args.plot)
        shown["arch"] = [Path(a).stem for a in shown["arch"]]
        print(shown.round(2).to_string(index=False))
    except (ConfigError, OSError, KeyError) as exc:
        print(f"error: profile_decode.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
