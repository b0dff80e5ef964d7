"""The few-row matmul on the bulk copy engine (:mod:`executor.few_rows_tma`): its input rules and launch arithmetic
anywhere, its CUDA source compiled for sm_90a without spills where ``nvcc`` is, and its results against ``F.linear``
on a Hopper GPU (plain, SwiGLU, a K tail, several units per CTA, PDL-chained in a CUDA graph, served end to end)."""

from __future__ import annotations

import math
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from executor import few_rows  # noqa: E402
from executor import few_rows_tma as tma  # noqa: E402

from .few_rows_checks import (  # noqa: E402
    HOPPER,
    assert_close,
    assert_cpu_tensors_refused,
    assert_pdl_chain_waits,
    assert_served_run_completes,
    ptxas_report,
    reference,
)

hopper = pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")


@given(units=st.integers(1, 5000), sms=st.integers(1, 200))
def test_grid_gives_every_cta_the_fewest_units_it_can(units: int, sms: int) -> None:
    grid = tma.grid_for(units, sms)
    per_cta = math.ceil(units / grid)
    assert grid <= min(units, sms)
    assert per_cta == math.ceil(units / sms)  # no CTA holds more units than with every SM in use
    assert (grid - 1) * per_cta < units  # and no CTA is left without one


@pytest.mark.parametrize("m,n,k,swiglu,why", [
    (0, 2048, 2048, False, "rows"), (17, 2048, 2048, False, "rows"), (4, 2048, 5280, False, "K a multiple of 64"),
    (4, 2056, 2048, False, "N a multiple of 16"), (4, 2056, 2048, True, "N a multiple of 16 per half")])
def test_shapes_the_kernel_cannot_take_are_named(m: int, n: int, k: int, swiglu: bool, why: str) -> None:
    assert why in tma.shape_problem(m, n, k, swiglu)


@pytest.mark.parametrize("m,n,k,swiglu", [(1, 2048, 2048, False), (16, 5632, 2048, True), (9, 2048, 5632, False)])
def test_ouros_shapes_fit(m: int, n: int, k: int, swiglu: bool) -> None:
    assert tma.shape_problem(m, n, k, swiglu) is None


def test_cpu_tensors_are_refused_with_the_reason() -> None:
    assert_cpu_tensors_refused(tma)


def test_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    envs = ("CDBSIM_TMA_RING_KB", "CDBSIM_TMA_SEGMENTS", "CDBSIM_TMA_WARPS", "CDBSIM_TMA_WARP_ARRIVE")
    for env in envs:
        monkeypatch.delenv(env, raising=False)
    assert tma.TmaSettings.from_env() == tma.TmaSettings()
    for env, value in zip(envs, ("48", "8", "8", "1"), strict=True):
        monkeypatch.setenv(env, value)
    assert tma.TmaSettings.from_env() == tma.TmaSettings(48, 8, 8, True)
    assert tma.TmaSettings(warp_arrive=True).options == 1
    assert tma.TmaSettings(consumer_warps=8).threads == 9 * 32
    for env, bad in (("CDBSIM_TMA_RING_KB", "8"), ("CDBSIM_TMA_RING_KB", str(tma.MAX_RING_KB + 1)),
                     ("CDBSIM_TMA_RING_KB", "lots"), ("CDBSIM_TMA_WARPS", "3"), ("CDBSIM_TMA_SEGMENTS", "2")):
        monkeypatch.setenv(env, bad)
        with pytest.raises(ValueError, match="CDBSIM_TMA"):
            tma.TmaSettings.from_env()
        monkeypatch.delenv(env)
    monkeypatch.setenv("CDBSIM_FEW_ROWS_KERNEL", "cutlass")
    with pytest.raises(ValueError, match="triton, tma"):
        few_rows.kernel_choice()


@pytest.mark.parametrize("rows", [1, 9, 16])
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("segments", [4, 8, 16])
def test_the_ring_fits_a_block_and_two_share_an_sm(rows: int, swiglu: bool, segments: int) -> None:
    """The largest ring fits a block; the default one leaves room for the next kernel's CTA beside it under PDL."""
    largest = tma.TmaSettings(tma.MAX_RING_KB, segments, 8)
    assert tma.shared_bytes(largest, rows, swiglu) <= tma.BLOCK_LIMIT
    assert 2 * tma.shared_bytes(tma.TmaSettings(), rows, swiglu) <= 228 * 1024
    assert tma.stages_for(tma.TmaSettings(16, segments), rows, swiglu) == 2  # two stages at least, whatever the ring


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_source_compiles_for_sm90a_without_spills(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    spills, _ = ptxas_report(tma.SOURCE, tmp_path)
    assert len(spills) == 4 and all(a == b == "0" for a, b in spills)
    monkeypatch.setenv("CDBSIM_CACHE", str(tmp_path / "cache"))
    cubin = tma.compile_cubin()
    assert cubin.parent == tmp_path / "cache" and cubin.stat().st_size > 0
    assert tma.compile_cubin() == cubin  # cached by the source's hash




SHAPES = pytest.mark.parametrize("n,k,swiglu", [(6144, 2048, False), (5632, 2048, True), (528, 5312, False),
                                                (272, 5312, True)], ids=["qkv", "gate-up", "k-tail", "swiglu-k-tail"])
SETTINGS = {"ring16k": tma.TmaSettings(16), "8seg-8warps-warp-arrive": tma.TmaSettings(segments=8, consumer_warps=8,
                                                                                        warp_arrive=True),
            "16seg-8warps": tma.TmaSettings(144, 16, 8), "16seg-4warps": tma.TmaSettings(segments=16)}


def _check_linear(m: int, n: int, k: int, swiglu: bool, settings) -> None:
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(2 * n if swiglu else n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k**-0.5
    assert_close(tma.linear(x, w, swiglu, 0, settings), reference(x, w, swiglu))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@SHAPES
def test_matches_linear_on_hopper(m: int, n: int, k: int, swiglu: bool) -> None:
    _check_linear(m, n, k, swiglu, tma.TmaSettings())


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("m", [3, 16])
@SHAPES
@pytest.mark.parametrize("name", SETTINGS)
def test_every_setting_matches_linear_on_hopper(m: int, n: int, k: int, swiglu: bool, name: str) -> None:
    _check_linear(m, n, k, swiglu, SETTINGS[name])


@pytest.mark.gpu
@hopper
def test_pdl_chain_in_a_cuda_graph_waits_for_each_input() -> None:
    assert_pdl_chain_waits(lambda y, w, trigger: tma.linear(y, w, False, trigger))


@pytest.mark.gpu
@hopper
def test_served_run_on_the_tma_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDBSIM_FEW_ROWS_KERNEL", "tma")
    assert_served_run_completes()
