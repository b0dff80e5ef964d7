"""Which of calibration's conditions makes decode steps time faster than they run in serving?

Validation on the H200 (``benchmarks/results/validation-graphed-prefill/stages.csv``) found Ouro-1.4B
core and CB steps at B = 129-256 20-32% slower in serving runs than the calibrated profile predicts, and
long-context core steps (ShareGPT, W = 16) 8% slower, while small batches ran 3-4% faster. Calibration
and a serving run differ in four ways; this script times the whole model's core stage (and CB step)
changing them one at a time, then all together:

``zeros``      the engine's KV cache and loop states left at zero (calibration before ``fill_random``)
``scatter``    each request's blocks drawn from a permutation of the cache, as a run's free list hands
               them out, instead of consecutive ids
``depth``      the depth-indexed layout with its four slots (a 3.4x larger cache), rows at mixed loop
               steps, as a refill run reads them; calibration measures the shared layout at step 0
``sustained``  2 s of back-to-back replays before timing, instead of a short burst
``run-like``   random data + scatter + depth + sustained
``served``     run-like, each replay preceded by its metadata copy, as the executor launches it
``after-prelude`` a core step queued right behind a prelude of the same rows, as a refill run launches most of
               its full-width core steps: the pair timed, less the prelude timed alone
``wide``       the bench calibration builds (512 rows, 8,192 positions a row) instead of one sized to the points
``queued``     replays queued back to back for 0.3 s, each timed by its own events, as a run's launches follow
               each other (the median), instead of one replay behind a spin kernel

``base`` is how calibration measures now (random data, consecutive blocks, shared layout, burst). The
table prints each variant's time and its ratio to ``base``; the JSON keeps everything. On the H200 every
variant came within 1% of ``base`` (``benchmarks/results/calibration-gap-probe``): the gap was the
executor's attention split, not a calibration condition (``cdbsim/attention.py``). Later, ``wide`` and ``queued``
against ``base`` and runs with ``CDBSIM_PDL=0`` showed Ouro-1.4B's 32-64-row core steps taking one of two times per
graph capture while its norm and attention kernels were PDL-launched behind cuBLAS
(``benchmarks/results/pdl-behind-cublas``).

    python benchmarks/probe_calibration_gap.py --out probe.json          # on a CUDA GPU, about a minute
    python benchmarks/probe_calibration_gap.py --arch calibration/archs/unseen-huginn-2048.json \
        --points core:1:3072,prelude:1:3072,coda:1:3072,core:8:3072 --out probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from calibration.measure import Plan, Timer, UnitBench, back_to_back, probe_arch
from cdbsim.arch import PRESETS, ArchSpec
from cdbsim.kvlayout import KVLayout
from cdbsim.launch import Stage

POINTS = ((Stage.CORE, 256, 128), (Stage.CORE, 64, 512), (Stage.CORE, 16, 2048), (Stage.DECODE, 256, 128))
POSITIONS = 65536  # the whole-model bench's KV positions (calibration's model_max_positions)


@dataclass(frozen=True)
class Variant:
    name: str
    zeros: bool = False
    scatter: bool = False
    depth: bool = False
    sustained: bool = False
    copy: bool = False
    after_prelude: bool = False
    wide: bool = False
    queued: bool = False


VARIANTS = (Variant("base"), Variant("zeros", zeros=True), Variant("scatter", scatter=True),
            Variant("depth", depth=True), Variant("sustained", sustained=True),
            Variant("run-like", scatter=True, depth=True, sustained=True),
            Variant("served", scatter=True, depth=True, sustained=True, copy=True),
            Variant("after-prelude", after_prelude=True), Variant("wide", wide=True), Variant("queued", queued=True))


def measure(variant: Variant, arch: ArchSpec, repeats: int, device: torch.device,
            points: tuple[tuple[Stage, int, int], ...] = POINTS) -> dict[str, float]:
    timer = Timer(device, repeats, 3, busy_s=2.0 if variant.sustained else 0.0)
    layout = KVLayout.DEPTH if variant.depth else KVLayout.SHARED
    max_batch = max(b for _, b, _ in points)
    max_context = max(c for _, _, c in points) + 1
    if variant.wide:
        plan = Plan()
        max_batch = max(max_batch, *plan.batches)
        max_context = max(max_context, *plan.model_contexts, *plan.decode_contexts, plan.longest_prompt)
    bench = UnitBench(arch, max_batch, max_context, POSITIONS, layout, device, timer, zeros=variant.zeros,
                      scatter=variant.scatter)
    out = {}
    for stage, batch, context in points:
        mixed = variant.depth and stage is Stage.CORE
        step = bench.graph(stage, batch, context, mixed_steps=mixed, with_copy=variant.copy)
        key = f"{stage.value} B={batch} L={context}"
        if variant.after_prelude and stage is Stage.CORE:
            prelude = bench.graph(Stage.PRELUDE, batch, context)

            def pair(prelude=prelude, step=step) -> None:
                prelude()
                step()

            out[key] = bench.timer(pair) - bench.timer(prelude)
        elif variant.queued:
            out[key] = statistics.median(t for _, t in back_to_back(step, 0.3, device, min_calls=repeats))
        else:
            out[key] = bench.timer(step)
    bench.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="ouro-1.4b", help=f"a preset ({', '.join(sorted(PRESETS))}) or an "
                        "architecture JSON file")
    parser.add_argument("--points", type=parse_points, default=POINTS,
                        help="stage:batch:context,... (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--variants", default=",".join(v.name for v in VARIANTS),
                        help="comma-separated variants to run, base always first (default: all)")
    parser.add_argument("--out", help="write the times as JSON")
    args = parser.parse_args(argv)
    arch = probe_arch("probe_calibration_gap", args.arch)
    if arch is None:
        return 2
    t0 = time.perf_counter()
    results: dict[str, dict[str, float]] = {}
    chosen = {name.strip() for name in args.variants.split(",")} | {"base"}
    unknown = chosen - {v.name for v in VARIANTS}
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(sorted(unknown))}; valid: {', '.join(v.name for v in VARIANTS)}")
    # each variant is printed and saved as it finishes: a cut-short run keeps them
    for variant in (v for v in VARIANTS if v.name in chosen):
        results[variant.name] = measure(variant, arch, args.repeats, torch.device("cuda"), args.points)
        print_row(variant.name, results[variant.name], results["base"], time.perf_counter() - t0)
        if args.out:
            meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "arch": args.arch,
                    "repeats": args.repeats, "wall_s": time.perf_counter() - t0}
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "seconds": results}, f, indent=2)
    return 0


def parse_points(text: str) -> tuple[tuple[Stage, int, int], ...]:
    """``core:1:3072,prelude:8:512`` -> ((Stage.CORE, 1, 3072), (Stage.PRELUDE, 8, 512))."""
    try:
        return tuple((Stage(stage), int(b), int(c)) for stage, b, c in (p.split(":") for p in text.split(",")))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"points must look like core:1:3072,prelude:8:512 ({exc})") from None


def print_row(name: str, times: dict[str, float], base: dict[str, float], elapsed_s: float) -> None:
    """One variant's times and their ratio to ``base`` (the header comes with the first row)."""
    if name == "base":
        print(f"{'variant':<10}" + "".join(f"{k:>24}" for k in times))
    cells = "".join(f"{1e3 * t:>13.3f} ms {t / base[k]:>5.2f}x" for k, t in times.items())
    print(f"{name:<10}{cells}   ({elapsed_s:.0f} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
