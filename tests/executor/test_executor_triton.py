"""The Triton kernels, run by Triton's CPU interpreter, agree with the torch backend and the reference.

``TRITON_INTERPRET`` must be set before Triton is imported, so each check runs in a fresh interpreter;
one test per check lets pytest-xdist spread them over the cores. The shapes are the smallest that take
every kernel path (``kernel_checks.PATHS``). No time limit: a slow machine is not a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ["ops", "prefill", "norm-rounding", "end-to-end-0", "end-to-end-1", "end-to-end-2", "end-to-end-3"]


@pytest.mark.parametrize("check", CHECKS)
def test_triton_kernels_under_the_interpreter(check: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "tests.executor.kernel_checks", check], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_every_check_is_run() -> None:
    from tests.executor.kernel_checks import CHECKS as DEFINED

    assert sorted(DEFINED) == sorted(CHECKS)
