"""Running the Triton kernels under Triton's CPU interpreter (``TRITON_INTERPRET=1``) in the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def patch_loop_bounds() -> None:
    """Triton 3.6's interpreter passes scalars as 1-element arrays and calls ``int()`` on them for loop
    bounds, which numpy >= 2.4 refuses; index through the first element instead. A no-op when not
    interpreting."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def report_checks(checks: dict[str, Callable[[], None]]) -> int:
    """Run named checks under the interpreter (the ``__main__`` of a test module run in a fresh process)
    and print one JSON line: check name -> "ok" or the error."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("run with TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    patch_loop_bounds()
    results = {}
    for name, check in checks.items():
        try:
            check()
            results[name] = "ok"
        except Exception as exc:  # reported per check by the tests
            results[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(results))
    return 0


def run_interpreted(module: str, timeout_s: float = 300) -> dict[str, str]:
    """Run ``python -m module`` under the interpreter in a fresh process (``TRITON_INTERPRET`` must be set
    before Triton is imported, and setting it here would leak into the GPU tests of the same session) and
    return its :func:`report_checks` line."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=timeout_s)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
