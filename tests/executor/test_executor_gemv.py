"""The skinny-matmul kernels of :mod:`executor.gemv` agree with the torch reference.

The checks run under Triton's CPU interpreter, on small float32 shapes that are not multiples of the
block sizes. ``TRITON_INTERPRET`` must be set before Triton is imported (and setting it here would leak
into the GPU tests of the same session), so they run in a fresh interpreter: this file, run as a module,
reports each check as a JSON line, and the tests read it. On a GPU the same checks run in bfloat16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from .triton_interpreter import patch_loop_bounds  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EPS = 1e-6


# ----- the checks (run in the subprocess, or in-process on a GPU) ---------------------------------------------
def _close(got, want, atol: float, rtol: float, what: str) -> None:
    diff = (got.float() - want.float()).abs()
    bound = atol + rtol * want.float().abs()
    if not bool((diff <= bound).all()):
        raise AssertionError(f"{what}: max difference {float(diff.max()):.3e}")


def _inputs(m: int, n: int, k: int, device: str, dtype):
    gen = torch.Generator(device=device).manual_seed(m * 1000 + n + k)

    def randn(*shape: int, scale: float = 1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    return {"x": randn(m, k), "w": randn(n, k, scale=k**-0.5), "gu": randn(m, 2 * k), "branch": randn(m, k, scale=3),
            "w_post": 1 + randn(k, scale=0.1), "w_next": 1 + randn(k, scale=0.1)}


def check_op(op: str, m: int, n: int, k: int, config, device: str, dtype, atol: float, rtol: float) -> None:
    """One op at one shape and config (``None``: the table/default) against the torch path."""
    import torch.nn.functional as F

    from executor import gemv as g
    from executor import ops

    t = _inputs(m, n, k, device, dtype)
    what = f"{op} M={m} N={n} K={k} {config}"
    if op == "gemv":
        _close(g.gemv(t["x"], t["w"], config), F.linear(t["x"], t["w"]), atol, rtol, what)
    elif op == "silu":
        _close(g.gemv_silu(t["gu"], t["w"], config), F.linear(ops.silu_mul(t["gu"]), t["w"]), atol, rtol, what)
    elif op == "rmsnorm":
        want = F.linear(ops.rms_norm(t["x"], t["w_post"], EPS), t["w"])
        _close(g.gemv_rmsnorm(t["x"], t["w_post"], EPS, t["w"], config), want, atol, rtol, what)
    else:
        sandwich = op == "residual-sandwich"
        before = {name: v.clone() for name, v in t.items()}
        out, x_new = g.gemv_residual(t["branch"], t["x"], t["w_post"], t["w_next"], EPS, sandwich, t["w"], config)
        want_x, want_h = ops.residual_norm(t["branch"], t["x"], t["w_post"], t["w_next"], EPS, sandwich)
        _close(x_new, want_x, atol, rtol, what + " x_new")
        _close(out, F.linear(want_h, t["w"]), atol, rtol, what)
        changed = [name for name, v in t.items() if not torch.equal(v, before[name])]
        if changed or x_new.data_ptr() == t["x"].data_ptr():
            raise AssertionError(f"{what}: modified its inputs {changed} or returned x itself")


OPS = ("gemv", "silu", "rmsnorm", "residual-sandwich", "residual-plain")


def checks(device: str = "cpu", dtype=None, atol: float = 1e-4, rtol: float = 1e-5) -> dict[str, Callable]:
    """Named checks: each op at M = 1, 3, 16 on ragged shapes; the three modes and split-K; even tiles
    (no masks); multi-tile norm pre-passes; the table/default config."""
    from executor import gemv as g

    dtype = dtype or torch.float32
    C = g.GemvConfig  # (block_n, block_k, split_k, num_warps, num_stages, mode)

    def run(op: str, cases: list) -> Callable[[], None]:
        return lambda: [check_op(op, m, n, k, cfg, device, dtype, atol, rtol) for m, n, k, cfg in cases]

    out = {}
    for op in OPS:
        out[f"{op}-rows"] = run(op, [(m, 48, 40, C(16, 16, 1, 4, 2, 2)) for m in (1, 3, 16)])
        out[f"{op}-modes-split"] = run(op, [(3, 48, 40, C(16, 16, 1, 4, 2, 0)), (3, 48, 40, C(32, 16, 3, 4, 2, 1)),
                                            (3, 48, 40, C(16, 16, 3, 4, 2, 2))])
        out[f"{op}-even-default"] = run(op, [(1, 48, 32, C(16, 16, 2, 4, 2, 2)), (2, 48, 40, None)])

    def narrow_pre_passes() -> None:  # pre-pass tiles of 16 columns at 16 rows: 3 tiles over K = 40
        saved, g.PRE_ELEMENTS = g.PRE_ELEMENTS, 256
        try:
            for op in ("rmsnorm", "residual-sandwich", "residual-plain"):
                for m in (3, 16):
                    check_op(op, m, 48, 40, C(16, 16, 1, 4, 2, 2), device, dtype, atol, rtol)
        finally:
            g.PRE_ELEMENTS = saved

    out["norm-pre-pass-tiles"] = narrow_pre_passes
    return out


def _main() -> int:
    """Run every check under the interpreter; one JSON line: check name -> "ok" or the error."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("run with TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    patch_loop_bounds()
    results = {}
    for name, fn in checks().items():
        try:
            fn()
            results[name] = "ok"
        except Exception as exc:  # reported per check by the tests
            results[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(results))
    return 0


# ----- the tests -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def interpreted() -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "tests.executor.test_executor_gemv"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


CHECK_NAMES = [f"{op}-{kind}" for op in OPS for kind in ("rows", "modes-split", "even-default")]
CHECK_NAMES.append("norm-pre-pass-tiles")


@pytest.mark.parametrize("name", CHECK_NAMES)
def test_kernel_under_the_interpreter(interpreted: dict[str, str], name: str) -> None:
    assert interpreted.get(name) == "ok", interpreted.get(name, "not run")


def test_every_check_is_collected() -> None:
    assert sorted(checks()) == sorted(CHECK_NAMES)


def test_configs() -> None:
    from executor import gemv as g

    assert g.SMALL_M == 16 and g.use_gemv(1) and g.use_gemv(16) and not g.use_gemv(0) and not g.use_gemv(17)
    assert [g.m_bucket(m) for m in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]
    for (op, bucket, n, k), cfg in g.CONFIGS.items():
        assert op in g.OPS and bucket in (1, 2, 4, 8, 16) and isinstance(cfg, g.GemvConfig)
        assert g.config_for(op, bucket, n, k) == cfg
    (op, bucket, n, k), cfg = next((key, c) for key, c in g.CONFIGS.items() if key[0] == "gemv")
    if ("silu", bucket, n, k) not in g.CONFIGS:
        assert g.config_for("silu", bucket, n, k) == cfg  # falls back to the plain entry of the shape
    default = g.config_for("gemv", 3, 4096, 4096)
    assert default == g.default_config("gemv", 4, 4096, 4096)
    assert default.block_k * default.split_k <= 4096 and default.mode in (0, 1, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernels_on_the_gpu_in_bfloat16() -> None:
    for fn in checks("cuda", torch.bfloat16, atol=2e-2, rtol=2e-2).values():
        fn()


if __name__ == "__main__":
    sys.exit(_main())
