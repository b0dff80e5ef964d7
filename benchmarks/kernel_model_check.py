"""How well the kernel-level profile predicts stages measured whole: every stage point of the shipped
whole-model profiles, predicted from the kernels alone (as if those models had never run).

    python benchmarks/kernel_model_check.py [--kernels calibration/profiles/h200-kernels.json] [--out CSV]
                                           [--points CSV]

Prints, per model and stage, the median and worst signed error of the composed stage time against each
measured point, and the same for the roofline, so a reader sees what kernel-level calibration buys; ``--points``
writes every point's error (model, stage, profile, rows or tokens, context, measured seconds, error %), to see
where by rows a median comes from.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdbsim.arch import PRESETS
from cdbsim.latency import LatencyModel, roofline_profile
from cdbsim.launch import Launch, Stage
from cdbsim.profile import load_profile_file
from cdbsim.recipes import model_stage_name
from cdbsim.shipped import shipped_profiles


def point_launch(stage: Stage, point: list[float]) -> Launch:
    """The launch a measured stage point stands for (uniform context: [B, B*L, t]; prefill [T, pairs, k, t])."""
    if stage is Stage.PREFILL:
        tokens, pairs, chunks = int(point[0]), int(point[1]), int(point[2])
        return Launch(0, stage, requests=list(range(chunks)), positions=[0] * chunks, size=tokens, padded=tokens,
                      context=pairs, chunk_lens=[tokens // chunks] * chunks, finishes=[True] * chunks)
    b, context = int(point[0]), int(point[1])
    return Launch(0, stage, requests=list(range(b)), positions=[context // b - 1] * b, size=b, padded=b,
                  context=context, longest=context // b, steps=[0] * b, exits=[False] * b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="calibration/profiles/h200-kernels.json")
    parser.add_argument("--out", default=None)
    parser.add_argument("--points", default=None, help="also write every point's error to this CSV")
    args = parser.parse_args()
    kernels = load_profile_file(args.kernels)
    rows, points = [], []
    for profile in shipped_profiles().values():
        if profile.kind != "measured":
            continue
        for arch in PRESETS.values():
            if model_stage_name(arch, Stage.CORE) not in profile.components:
                continue
            models = {"kernels": LatencyModel(arch, kernels), "roofline": LatencyModel(arch, roofline_profile(arch))}
            for stage in Stage:
                fit = profile.components.get(model_stage_name(arch, stage))
                if fit is None:
                    continue
                for name, model in models.items():
                    errors = [model.launch_time(point_launch(stage, p)) / p[-1] - 1 for p in fit.points]
                    points += [{"model": arch.name, "stage": stage.value, "profile": name, "rows": int(p[0]),
                                "context": p[1], "measured_s": p[-1], "error %": 100 * e}
                               for p, e in zip(fit.points, errors, strict=True)]
                    rows.append({"model": arch.name, "stage": stage.value, "profile": name, "points": len(errors),
                                 "median %": 100 * statistics.median(errors),
                                 "median |%|": 100 * statistics.median(abs(e) for e in errors),
                                 "worst %": 100 * max(errors, key=abs)})
    print(f"{'model':12s} {'stage':8s} {'profile':9s} {'points':>6s} {'median %':>9s} {'med |%|':>8s} {'worst %':>8s}")
    for r in rows:
        print(f"{r['model']:12s} {r['stage']:8s} {r['profile']:9s} {r['points']:6d} {r['median %']:9.1f} "
              f"{r['median |%|']:8.1f} {r['worst %']:8.1f}")
    if args.out or args.points:
        import pandas as pd

        if args.out:
            pd.DataFrame(rows).to_csv(args.out, index=False)
        if args.points:
            pd.DataFrame(points).to_csv(args.points, index=False)


if __name__ == "__main__":
    main()
