"""One decode layer's kernels as the executor serves them, against the kernel profile that composes them (GPU).

A core step of ``--layers`` layers of each shape (random weights, a CUDA graph as served) is replayed under the
PyTorch profiler. Per layer it reports the period (start of one layer's first kernel to the next one's), the sum of
the layer's kernel times and each kernel's mean time, beside the composed layer of the GPU's kernel profile (its
tables, and its tables plus the fitted gap): where a layer runs faster or slower than its kernels measured apart.

    python benchmarks/layer_kernels.py --arch ouro-1.4b,calibration/archs/unseen-ouro-1024.json --rows 1 8 32 \
        --out FILE.csv
"""

# ruff: noqa: E402  (the imports follow the sys.path line that picks this checkout)
from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd

from cdbsim.errors import ConfigError
from cdbsim.model.arch import ArchSpec, KVLayout, load_arch

REPLAYS = 20


@dataclass(frozen=True)
class Kernel:
    """One kernel of a profiled replay: its name, start and duration (microseconds)."""

    name: str
    start: float
    duration: float


@dataclass(frozen=True)
class LayerTimes:
    """A layer's period, the sum of its kernels' times and each kernel's mean time (microseconds)."""

    period: float
    kernel_sum: float
    kernels: dict[str, float]


def layer_times(kernels: list[Kernel], layers: int, replays: int) -> LayerTimes:
    """The steady layer of ``replays`` replays of a ``layers``-layer step: kernels that run a multiple of ``layers``
    times a replay are the layer's (the others the step's glue); the period is measured between the first kernel's
    second and last run in each replay, so the glue at either end stays out of it."""
    if not kernels or len(kernels) % replays:
        raise ValueError(f"{len(kernels)} kernels do not split into {replays} replays")
    kernels = sorted(kernels, key=lambda k: k.start)
    per_replay = len(kernels) // replays
    counts = Counter(k.name for k in kernels[:per_replay])
    own = {name for name, count in counts.items() if count % layers == 0}
    if layers < 3 or not own:
        raise ValueError(f"no kernel runs a multiple of {layers} times a replay (at least 3 layers are needed)")
    first = next(k.name for k in kernels[:per_replay] if k.name in own)
    periods = []
    for r in range(replays):
        starts = [k.start for k in kernels[r * per_replay:(r + 1) * per_replay] if k.name == first]
        per_layer = len(starts) // layers
        periods.append((starts[-per_layer] - starts[per_layer]) / (layers - 2))
    total = Counter()
    for k in kernels:
        if k.name in own:
            total[k.name] += k.duration
    means = {name: t / (replays * layers) for name, t in total.items()}
    return LayerTimes(period=sorted(periods)[len(periods) // 2], kernel_sum=sum(means.values()), kernels=means)


def profiled_kernels(replay, replays: int = REPLAYS) -> list[Kernel]:
    """The device kernels of ``replays`` calls of ``replay`` (a CUDA graph's), from the PyTorch profiler."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    return [Kernel(e.name, e.time_range.start, e.time_range.end - e.time_range.start) for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]


def measure(arch: ArchSpec, rows: list[int], context: int, layers: int, profile_name: str) -> list[dict]:
    """Rows of the CSV for one shape: per batch, the measured layer and kernels and the composed ones."""
    import torch

    from calibration.measure import Timer, UnitBench
    from cdbsim.latency.kernels import KernelModel
    from cdbsim.latency.shipped import shipped_profiles
    from cdbsim.serving.launch import Stage

    unit = ArchSpec(name=f"{arch.name}-layers", layer=arch.layer, vocab=4096, prelude=0, core=layers, coda=0,
                    r_max=1)
    model = KernelModel(shipped_profiles()[profile_name].kernels)
    bench = UnitBench(unit, max(rows), context + 1, max(rows) * (context + 1) + 64, KVLayout.SHARED,
                      torch.device("cuda"), Timer(torch.device("cuda"), 5, 2))
    out = []
    try:
        for batch in rows:
            measured = layer_times(profiled_kernels(bench.graph(Stage.CORE, batch, context)), layers, REPLAYS)
            composed, path = model.layer_kernels(arch, batch, float(context))
            key = {"shape": arch.name, "rows": batch, "context": context}
            out.append({**key, "what": "measured period", "name": "", "us": measured.period})
            out.append({**key, "what": "measured kernels", "name": "", "us": measured.kernel_sum})
            out.append({**key, "what": "composed with gap", "name": path, "us": 1e6 * model.layer(arch, batch,
                                                                                                 float(context))})
            out.append({**key, "what": "composed kernels", "name": path, "us": 1e6 * sum(t for _, t in composed)})
            out += [{**key, "what": "measured kernel", "name": name[:60], "us": t}
                    for name, t in measured.kernels.items()]
            out += [{**key, "what": "composed kernel", "name": table, "us": 1e6 * t} for table, t in composed]
    finally:
        bench.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", required=True, help="comma-separated presets or architecture files")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--context", type=int, default=128, help="positions each row attends")
    parser.add_argument("--layers", type=int, default=8, help="layers of the step profiled (at least 3)")
    parser.add_argument("--profile", help="kernel profile to compose from (default: this GPU's)")
    parser.add_argument("--out", type=Path, required=True, help="CSV, rewritten after each shape")
    args = parser.parse_args(argv)
    try:
        archs = [load_arch(name) for name in args.arch.split(",")]
        if args.layers < 3 or min(args.rows) < 1 or args.context < 1:
            raise ConfigError("--layers must be at least 3, --rows and --context at least 1")
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("layer_kernels.py profiles CUDA graphs: it needs a CUDA GPU")
        from cdbsim.latency.devices import device_tag
        from cdbsim.latency.shipped import shipped_profiles

        profile = args.profile or f"{device_tag(torch.cuda.get_device_name(0))}-kernels"
        kernel_profiles = [name for name, p in shipped_profiles().items() if p.kernels]
        if profile not in kernel_profiles:
            raise ConfigError(f"no kernel profile {profile!r}; give --profile, one of: {', '.join(kernel_profiles)}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows: list[dict] = []
    for arch in archs:
        try:
            rows += measure(arch, args.rows, args.context, args.layers, profile)
        except ValueError as exc:  # the profiler's kernels did not form whole replays of whole layers
            print(f"error: {arch.name}: {exc}", file=sys.stderr)
            return 1
        pd.DataFrame(rows).to_csv(args.out, index=False)
    frame = pd.DataFrame(rows)
    summary = frame[~frame["what"].str.endswith("kernel")].pivot_table(index=["shape", "rows"], columns="what",
                                                                        values="us")
    print(summary.round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
