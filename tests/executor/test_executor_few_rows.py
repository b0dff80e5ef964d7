"""The few-row matmul of :mod:`executor.few_rows` agrees with ``F.linear`` (and SwiGLU after it).

Like the chained kernels' checks, these run under Triton's CPU interpreter in a fresh process (float32, IEEE
products) on shapes that are not multiples of the blocks; on a GPU the same checks run in bfloat16, with
programmatic dependent launch, eagerly and replayed from a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from .helpers import replayed  # noqa: E402
from .triton_interpreter import report_checks, run_interpreted  # noqa: E402


def check_linear(m: int, n: int, k: int, swiglu: bool, config, device: str, dtype, atol: float, rtol: float,
                 graph: bool = False) -> None:
    """One shape and config (``None``: the table/default) against ``F.linear`` (then ``silu_mul``); with
    ``graph``, the result replayed from a CUDA graph after the activation changed."""
    import torch.nn.functional as F

    from executor import few_rows
    from executor.ops import silu_mul

    gen = torch.Generator(device=device).manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen, device=device).to(dtype)
    w = (torch.randn((2 if swiglu else 1) * n, k, generator=gen, device=device) * k**-0.5).to(dtype)
    before = [x.clone(), w.clone()]
    got = few_rows.linear(x, w, swiglu, config)
    if graph:
        def change() -> None:
            x.mul_(-0.5)
            before[:] = [x.clone(), w.clone()]

        got = replayed(lambda: few_rows.linear(x, w, swiglu, config), change)
    want = F.linear(x, w)
    want = silu_mul(want) if swiglu else want
    what = f"M={m} N={n} K={k} swiglu={swiglu} {config}"
    assert got.shape == (m, n), what
    diff = (got.float() - want.float()).abs()
    if not bool((diff <= atol + rtol * want.float().abs()).all()):
        raise AssertionError(f"{what}: max difference {float(diff.max()):.3e}")
    if not (torch.equal(x, before[0]) and torch.equal(w, before[1])):
        raise AssertionError(f"{what}: modified its inputs")


def checks(device: str = "cpu", dtype=None, atol: float = 1e-4, rtol: float = 1e-5,
           graph: bool = False) -> dict[str, Callable]:
    """Per kind (plain, SwiGLU): one, a few and the most rows; N not a multiple of the columns per program;
    K in one chunk, in several with a ragged last one; the default config."""
    from executor import few_rows as f

    dtype = dtype or torch.float32
    C = f.FewRowsConfig  # (block_n, block_k, num_warps, stages)
    out = {}
    for kind, swiglu in (("plain", False), ("swiglu", True)):
        # three chunks, the last ragged; row tiles of 16, 32 and 64
        cases = [(m, 40, 72, C(16, 32, 4, 2)) for m in (1, 3, 16, 17, 40, f.MAX_ROWS)]
        cases += [(5, 48, 64, C(32, 64, 4, 3)), (2, 24, 40, None)]  # one chunk; the default
        out[kind] = lambda cases=cases, swiglu=swiglu: [
            check_linear(m, n, k, swiglu, cfg, device, dtype, atol, rtol, graph) for m, n, k, cfg in cases]
    return out


def _main() -> int:
    return report_checks(checks())


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str]:
    return run_interpreted("tests.executor.test_executor_few_rows")


@pytest.mark.parametrize("name", ["plain", "swiglu"])
def test_kernel_under_the_interpreter(interpreted: dict[str, str], name: str) -> None:
    assert interpreted.get(name) == "ok", interpreted.get(name, "not run")


def test_every_check_is_collected() -> None:
    assert sorted(checks()) == ["plain", "swiglu"]


def test_bad_inputs_are_refused_before_any_launch() -> None:
    from executor import few_rows as f

    x, w = torch.zeros(2, 8), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="does not fit"):
        f.linear(x, torch.zeros(4, 6))
    with pytest.raises(ValueError, match=f"1..{f.MAX_ROWS} rows"):
        f.linear(torch.zeros(f.MAX_ROWS + 1, 8), w)
    with pytest.raises(ValueError, match="even row count"):
        f.linear(x, torch.zeros(5, 8), swiglu=True)
    with pytest.raises(ValueError, match="contiguous"):
        f.linear(torch.zeros(8, 2).t(), w)


def test_ops_dispatch_by_rows() -> None:
    """``Ops.linear`` / ``linear_swiglu`` take the few-row matmul up to ``few_rows`` rows; the default models
    take it up to the shared limit if no wider than 2,048; a limit past the kernel's rows is refused."""
    import torch.nn.functional as F

    from cdbsim.latency.gpu_work import FEW_ROWS_MAX
    from cdbsim.model.arch import PRESETS
    from executor.model import ModelConfig, default_ops
    from executor.ops import Ops, silu_mul

    calls: list[bool] = []
    ops = Ops("torch", few_rows=4)
    ops._few_linear = lambda x, w, swiglu=False: calls.append(swiglu) or F.linear(x, w)
    w = torch.randn(6, 8)
    for rows in (1, 4, 5):
        ops.linear(torch.randn(rows, 8), w)
    assert calls == [False, False]
    torch.testing.assert_close(Ops("torch").linear_swiglu(x := torch.randn(5, 8), w), silu_mul(F.linear(x, w)))
    for name, rows in (("ouro-1.4b", FEW_ROWS_MAX), ("ouro-2.6b", FEW_ROWS_MAX), ("huginn-3.5b", 0)):
        config = ModelConfig.from_arch(PRESETS[name])
        assert default_ops(config, "triton").few_rows == rows  # measured: Huginn-3.5B's cuBLAS GEMMs win
        assert default_ops(config, "torch").few_rows == 0
    from executor.few_rows import MAX_ROWS

    assert Ops("triton", few_rows=MAX_ROWS).few_rows == MAX_ROWS  # the kernel takes more rows than the rule gives
    with pytest.raises(ValueError, match="few_rows"):
        Ops("triton", few_rows=MAX_ROWS + 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_kernel_on_the_gpu_in_bfloat16(graph: bool) -> None:
    for fn in checks("cuda", torch.bfloat16, atol=2e-2, rtol=2e-2, graph=graph).values():
        fn()


def test_trigger(monkeypatch: pytest.MonkeyPatch) -> None:
    """The few-row matmul lets its successor launch after its K loop (``late``), every other kernel right after its
    wait; without PDL neither."""
    from executor import chain

    assert chain.pdl_mode(torch.zeros(5, 8), late=True) == 0
    monkeypatch.setattr(chain, "pdl_enabled", lambda t: True)
    assert chain.pdl_mode(torch.zeros(5, 8), late=True) == chain.LATE
    assert chain.pdl_mode(torch.zeros(5, 8)) == chain.EARLY


if __name__ == "__main__":
    import sys

    sys.exit(_main())
