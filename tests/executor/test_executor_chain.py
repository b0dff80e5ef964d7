"""The chained skinny-matmul kernels of :mod:`executor.chain` agree with the torch composition.

The checks run under Triton's CPU interpreter, on small float32 shapes that are not multiples of the
block sizes. ``TRITON_INTERPRET`` must be set before Triton is imported (and setting it here would leak
into the GPU tests of the same session), so they run in a fresh interpreter: this file, run as a module,
reports each check as a JSON line, and the tests read it. On a GPU the same checks run in bfloat16, with
programmatic dependent launch, eagerly and replayed from a CUDA graph.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from .helpers import replayed  # noqa: E402
from .triton_interpreter import report_checks, run_interpreted  # noqa: E402

EPS = 1e-6
OPS = ("gemv", "rmsnorm", "residual-sandwich", "residual-plain", "swiglu-sandwich", "swiglu-plain")


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

    return {"x": randn(m, k), "w": randn(n, k, scale=k**-0.5), "w2": randn(2 * n, k, scale=k**-0.5),
            "branch": randn(m, k, scale=3), "w_post": 1 + randn(k, scale=0.1), "w_next": 1 + randn(k, scale=0.1)}


def _calls(op: str, t: dict, config) -> tuple[Callable, Callable]:
    """``(kernel call, torch reference call)`` of one op on the inputs ``t``; both return a tuple."""
    import torch.nn.functional as F

    from executor import chain as c
    from executor import ops

    if op == "gemv":
        return (lambda: (c.gemv(t["x"], t["w"], config),), lambda: (F.linear(t["x"], t["w"]),))
    if op == "rmsnorm":
        return (lambda: (c.gemv_rmsnorm(t["x"], t["w_post"], EPS, t["w"], config),),
                lambda: (F.linear(ops.rms_norm(t["x"], t["w_post"], EPS), t["w"]),))
    kind, style = op.split("-")
    sandwich, swiglu = style == "sandwich", kind == "swiglu"
    w = t["w2"] if swiglu else t["w"]

    def reference():
        out, x_new = ops.gemv_residual(t["branch"], t["x"], t["w_post"], t["w_next"], EPS, sandwich, w, swiglu)
        return out, x_new

    return (lambda: c.gemv_residual(t["branch"], t["x"], t["w_post"], t["w_next"], EPS, sandwich, w, swiglu,
                                    config), reference)


def check_op(op: str, m: int, n: int, k: int, config, device: str, dtype, atol: float, rtol: float,
             graph: bool = False) -> None:
    """One op at one shape and config (``None``: the table/default) against the torch path; with
    ``graph``, the kernel's result replayed from a CUDA graph (the inputs changed after capture)."""
    t = _inputs(m, n, k, device, dtype)
    what = f"{op} M={m} N={n} K={k} {config}"
    before = {name: v.clone() for name, v in t.items()}
    kernel, reference = _calls(op, t, config)
    got = kernel()
    if graph:
        def change() -> None:
            for name in ("x", "branch"):
                t[name].mul_(-0.5)
            before.update({name: v.clone() for name, v in t.items()})

        got = replayed(kernel, change)
    for name, a, b in zip(("out", "x_new"), got, reference(), strict=False):
        _close(a, b, atol, rtol, f"{what} {name}")
    changed = [name for name, v in t.items() if not torch.equal(v, before[name])]
    if changed or (len(got) > 1 and got[1].data_ptr() == t["x"].data_ptr()):
        raise AssertionError(f"{what}: modified its inputs {changed} or returned x itself")


def checks(device: str = "cpu", dtype=None, atol: float = 1e-4, rtol: float = 1e-5,
           graph: bool = False) -> dict[str, Callable]:
    """Named checks per op on a ragged shape (K split into two register pieces, N not a multiple of the
    columns per tile), with one, two and three tiles per program (the last program's tiles partly or
    wholly past N); K a power of two (one piece); the table/default config."""
    from executor import chain as c

    dtype = dtype or torch.float32
    C = c.ChainConfig  # (block_n, num_warps, tiles)

    def run(op: str, cases: list) -> Callable[[], None]:
        return lambda: [check_op(op, m, n, k, cfg, device, dtype, atol, rtol, graph) for m, n, k, cfg in cases]

    out = {}
    for op in OPS:
        out[f"{op}-tiles"] = run(op, [(1, 40, 72, C(16, 4, tiles)) for tiles in (1, 2, 3)])
        out[f"{op}-one-piece-default"] = run(op, [(1, 48, 64, C(8, 4, 2)), (1, 48, 40, None)])
        out[f"{op}-rows"] = run(op, [(m, 40, 72, C(16, 4, 2)) for m in range(2, c.MAX_ROWS + 1)])
    return out


def _main() -> int:
    """Run every check under the interpreter (see :func:`triton_interpreter.report_checks`)."""
    return report_checks(checks())


# ----- the tests -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def interpreted() -> dict[str, str]:
    return run_interpreted("tests.executor.test_executor_chain")


CHECK_NAMES = [f"{op}-{kind}" for op in OPS for kind in ("tiles", "one-piece-default", "rows")]


@pytest.mark.parametrize("name", CHECK_NAMES)
def test_kernel_under_the_interpreter(interpreted: dict[str, str], name: str) -> None:
    assert interpreted.get(name) == "ok", interpreted.get(name, "not run")


def test_every_check_is_collected() -> None:
    assert sorted(checks()) == sorted(CHECK_NAMES)


def test_register_pieces_and_configs() -> None:
    from executor import chain as c

    assert [c.split_k(k) for k in (32, 40, 2048, 5632, 5280, 17920)] == [
        (32, 0), (32, 8), (2048, 0), (4096, 2048), (4096, 2048), (16384, 2048)]
    for k in (40, 2048, 5632, 10560):
        k1, k2 = c.split_k(k)
        assert k1 <= k <= k1 + k2 or (k2 == 0 and k1 == k)
    cfg = c.default_config(6144, 2048, sms=132)
    assert cfg.block_n * 2048 <= c.TILE_ELEMENTS and cfg.num_warps in (4, 8)
    programs = -(-6144 // (cfg.block_n * cfg.tiles))
    assert c.PROGRAMS_PER_SM * 132 / 2 <= programs <= 2 * c.PROGRAMS_PER_SM * 132  # about the target
    swiglu = c.default_config(5632, 2048, swiglu=True)
    assert swiglu.block_n * 2 * 2048 <= c.TILE_ELEMENTS  # both halves' tiles fit the same budget
    assert c.default_config(4, 64).block_n == 4 and c.default_config(4, 64).tiles == 1  # never wider than N
    two = c.default_config(6144, 2048, rows=2)  # two rows: half the tile, more programs per SM
    assert two.block_n * 2048 <= c.TILE_ELEMENTS // 2 and -(-6144 // (two.block_n * two.tiles)) > programs
    for (op, n, k, rows), entry in c.CONFIGS.items():
        assert op in (*c.OPS, "swiglu") and 1 <= rows <= c.MAX_ROWS
        assert c.config_for(op, n, k, op == "swiglu", rows=rows) == entry
    # a gate/up projection whose (N, K) has only a plain entry takes the default: its tile holds twice the weights
    for rows in (1, 2):
        assert ("swiglu", 6144, 2048, rows) not in c.CONFIGS and ("gemv", 6144, 2048, rows) in c.CONFIGS
        assert c.config_for("residual", 6144, 2048, True, rows=rows) == c.default_config(6144, 2048, True, rows=rows)
        assert c.config_for("residual", 6144, 2048, False, rows=rows) == c.CONFIGS[("gemv", 6144, 2048, rows)]


def test_the_chained_path_is_on_for_the_fewest_rows_of_narrow_models_only() -> None:
    from cdbsim.model.arch import PRESETS
    from executor import chain as c
    from executor.model import ModelConfig, chained_rows
    from executor.ops import Ops

    configs = {name: ModelConfig.from_arch(PRESETS[name]) for name in ("ouro-1.4b", "ouro-2.6b", "huginn-3.5b")}
    assert [chained_rows(m, "triton") for m in configs.values()] == [c.MAX_ROWS, c.MAX_ROWS, 0]
    assert all(chained_rows(m, "torch") == 0 for m in configs.values())
    assert Ops("torch").fuse_rows == 0
    with pytest.raises(ValueError, match="fuse_rows"):
        Ops("triton", fuse_rows=c.MAX_ROWS + 1)


def test_bad_inputs_are_refused_before_any_launch() -> None:
    from executor import chain as c

    x, w = torch.zeros(1, 8), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="does not fit"):
        c.gemv(x, torch.zeros(4, 6))
    with pytest.raises(ValueError, match=r"takes 1\.\.2 rows"):
        c.gemv(torch.zeros(c.MAX_ROWS + 1, 8), w)
    with pytest.raises(ValueError, match="norm weights"):
        c.gemv_rmsnorm(x, torch.zeros(7), 1e-6, w)
    with pytest.raises(ValueError, match="even row count"):
        c.gemv_residual(x, x, torch.ones(8), torch.ones(8), 1e-6, True, torch.zeros(5, 8), swiglu=True)


def test_pdl_is_off_without_a_gpu() -> None:
    from executor import chain as c

    assert not c.pdl_enabled(torch.zeros(1))
    assert c.launch_options(False) == {} and c.launch_options(True) == {"launch_pdl": True}


def test_pdl_is_kept_off_behind_cublas() -> None:
    """A launch whose projections run on cuBLAS PDL-launches none of its Triton kernels; the chained and
    few-row paths do."""
    from executor import chain as c
    from executor.ops import Ops

    ops = Ops("triton", fuse_rows=1, few_rows=16)
    assert c.pdl_allowed_here()
    with ops.pdl_scope(64):
        assert not c.pdl_allowed_here()
        with ops.pdl_scope(8):  # a nested block decides for itself
            assert c.pdl_allowed_here()
        assert not c.pdl_allowed_here()
    assert c.pdl_allowed_here()
    with ops.pdl_scope(1), Ops("triton").pdl_scope(1):  # chained rows of one Ops, cuBLAS rows of another
        assert not c.pdl_allowed_here()
    with Ops("torch").pdl_scope(256):  # the torch backend launches no PDL kernels: nothing to scope
        assert c.pdl_allowed_here()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_kernels_on_the_gpu_in_bfloat16(graph: bool) -> None:
    for fn in checks("cuda", torch.bfloat16, atol=2e-2, rtol=2e-2, graph=graph).values():
        fn()


if __name__ == "__main__":
    sys.exit(_main())
