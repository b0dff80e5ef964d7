"""Predictions do not depend on which CPU computes them.

Fitting a line or a prefill curve solves a least-squares problem on the BLAS kernels the CPU selects, and
their last bits differ from one CPU to another. Unscaled columns let that reach the fitted coefficients (a
shipped profile's prefill curve differed from the 9th digit between two CPUs, and every golden log with it).
Here OpenBLAS is made to take four CPUs' kernels in turn (``OPENBLAS_CORETYPE``), each in a fresh process, and
the fits must agree to the bit: a shipped model's prefill curves and an unseen architecture's profile composed
from the kernel profile, whose lines are fitted at prediction time. A core type whose instructions this CPU
lacks (read from its flags) would die with SIGILL: it is skipped, and the skip names the missing flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORES = {"Prescott": {"pni"}, "Sandybridge": {"avx"}, "Haswell": {"avx2", "fma"},  # flags each needs ("pni": SSE3)
         "SkylakeX": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}

FITS = """
import json, sys
from pathlib import Path
from cdbsim.model.arch import load_arch
from cdbsim.latency.kernels import compose_profile
from cdbsim.latency.prefill import fit_curve
from cdbsim.latency.profile import load_profile_file
root = Path(sys.argv[1])
out = {}
for name in ("h200-huginn-3.5b.json", "h200-ouro-1.4b.json"):
    profile = load_profile_file(root / "tests" / "data" / "golden-profiles" / name)
    for key, fit in sorted(profile.components.items()):
        if fit.points and len(fit.points[0]) in (3, 4):
            c = fit_curve(fit.points)
            out[name + "/" + key] = [*c.values, c.alpha, c.kappa]
kernels = load_profile_file(root / "calibration" / "profiles" / "h200-kernels.json")
composed, _ = compose_profile(kernels, load_arch(str(root / "calibration" / "archs" / "unseen-huginn-3072.json")))
for key, fit in sorted(composed.components.items()):
    out["composed/" + key] = [fit.delta, fit.gamma, fit.alpha, fit.kappa]
print(json.dumps(out))
"""


def cpu_flags() -> set[str]:
    """This CPU's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())


def fits_on(core: str | None) -> dict[str, list[float]]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if core is not None:
        env["OPENBLAS_CORETYPE"] = core
    run = subprocess.run([sys.executable, "-c", FITS, str(ROOT)], check=True, capture_output=True, text=True, env=env)
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def own_fits() -> dict[str, list[float]]:
    """The fits with the kernels OpenBLAS picks for this CPU itself."""
    fits = fits_on(None)
    assert any(k.startswith("composed/") for k in fits) and any(k.startswith("h200-") for k in fits)
    return fits


@pytest.mark.parametrize("core", CORES)
def test_fitted_curves_and_composed_lines_are_the_same_on_every_cpu(core: str, own_fits: dict) -> None:
    missing = CORES[core] - cpu_flags()
    if missing:
        pytest.skip(f"this CPU cannot run OpenBLAS's {core} kernels (no {', '.join(sorted(missing))})")
    fits = fits_on(core)
    differ = sorted(k for k in own_fits if fits.get(k) != own_fits[k])
    assert not differ, f"{core} fits differently: {differ[:5]}"
