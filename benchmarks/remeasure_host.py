"""Re-measure the host's time per launch of measured profiles on the serving path, in place.

A profile's host component (``host``: seconds per launch against items) is what the simulator charges
the host before every launch. It is measured by :func:`calibration.measure.measure_host` from a short
serving run; this script runs that measurement alone for each given whole-model profile and replaces its
host points and fit, leaving every device component as it was (a full ``cdbsim calibrate`` of a model
takes minutes; this takes seconds). The kernel-level profile has its own way:
``cdbsim calibrate --kernels --families host --update calibration/profiles/h200-kernels.json``.

    python benchmarks/remeasure_host.py calibration/profiles/h200-ouro-1.4b.json \\
        calibration/profiles/h200-huginn-3.5b.json --out DIR      # on a CUDA GPU, ~30 s per model
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from calibration.measure import measure_host
from cdbsim.arch import PRESETS
from cdbsim.profile import ProfileKind, fit_points, load_profile_file
from cdbsim.recipes import Component


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", nargs="+", type=Path, help="measured profiles named <device>-<preset>.json")
    parser.add_argument("--out", type=Path, required=True, help="where the updated profiles are written")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("remeasure_host: needs a CUDA GPU, and none is available", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.profiles:
        profile = load_profile_file(path)
        preset = profile.name.split("-", 1)[1]
        if profile.kind is not ProfileKind.MEASURED or preset not in PRESETS:
            print(f"remeasure_host: {path} is not a measured profile of a preset "
                  f"({', '.join(sorted(PRESETS))})", file=sys.stderr)
            return 2
        arch = PRESETS[preset]
        points = measure_host(arch, torch.device("cuda"), progress=print)[Component.HOST.key(arch)]
        old = profile.components[Component.HOST.key(arch)]
        new = fit_points(np.asarray(points, dtype=float), with_context=False)
        updated = replace(profile, components={**profile.components, Component.HOST.key(arch): new},
                          notes=f"{profile.notes}; host re-measured on the serving path "
                                "(benchmarks/remeasure_host.py)")
        updated.save(args.out / path.name)
        print(f"{profile.name}: host {1e6 * old.delta:.1f} us + {1e6 * old.gamma:.2f} us/item -> "
              f"{1e6 * new.delta:.1f} us + {1e6 * new.gamma:.2f} us/item ({len(points)} item counts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
