"""The few-row matmul with weights loaded straight into MMA registers (:mod:`executor.few_rows_direct`): its input
rules and split choice anywhere, its CUDA source compiled for sm_90a without spills where ``nvcc`` is, and its
results against ``F.linear`` on a Hopper GPU (plain, SwiGLU, a K and an N tail, every split count, deterministic,
PDL-chained in a CUDA graph, served end to end)."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from executor import cuda_driver, few_rows  # noqa: E402
from executor import few_rows_direct as direct  # noqa: E402

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


@given(blocks=st.integers(1, 2000), steps=st.integers(1, 600), sms=st.integers(1, 200))
def test_splits_fill_the_sms_within_one_wave(blocks: int, steps: int, sms: int) -> None:
    splits = direct.splits_for(blocks, steps, sms)
    assert 1 <= splits <= direct.DEFAULT_MAX_SPLITS
    if splits > 1:  # split only to fill the SMs' CTA slots, never past them, and never below two steps a warp
        assert blocks * splits <= direct.CTAS_PER_SM * sms
        assert steps >= 8 * direct.MIN_WARP_STEPS * splits
    if blocks * 2 <= direct.CTAS_PER_SM * sms and steps >= 8 * direct.MIN_WARP_STEPS * 2:
        assert splits >= 2  # a projection that fills half the slots or less is split


@pytest.mark.parametrize("rows,n,k,swiglu,want", [
    (4, 6144, 2048, False, 2), (4, 2048, 2048, False, 4), (4, 2048, 5632, False, 6), (4, 5632, 2048, True, 1),
    (4, 49152, 2048, False, 1), (16, 2048, 2048, False, 4)],
    ids=["ouro.wqkv", "ouro.wo", "ouro.down", "ouro.gate_up", "ouro.head", "ouro.wo-16-rows"])
def test_ouros_projections_split_as_measured(rows: int, n: int, k: int, swiglu: bool, want: int) -> None:
    blocks = n // direct.block_cols(rows, swiglu)
    assert direct.splits_for(blocks, k // direct.STEP, 132) == want


def test_splits_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDBSIM_DIRECT_SPLITS", raising=False)
    assert direct.splits_from_env() is None
    monkeypatch.setenv("CDBSIM_DIRECT_SPLITS", "3")
    assert direct.splits_from_env() == 3
    for bad in ("0", "9", "two"):
        monkeypatch.setenv("CDBSIM_DIRECT_SPLITS", bad)
        with pytest.raises(ValueError, match=r"CDBSIM_DIRECT_SPLITS must be 1\.\.8"):
            direct.splits_from_env()
    monkeypatch.setenv("CDBSIM_FEW_ROWS_KERNEL", "cutlass")
    with pytest.raises(ValueError, match="triton, tma, direct, direct-all"):
        few_rows.kernel_choice()


def test_a_cuda_default_falls_back_to_triton_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDBSIM_FEW_ROWS_KERNEL", raising=False)
    assert few_rows.kernel_choice() == few_rows.DEFAULT_KERNEL == "triton"  # the shipped profiles' kernel
    monkeypatch.setattr(few_rows, "DEFAULT_KERNEL", "direct")
    monkeypatch.setattr(cuda_driver, "available", lambda: False)
    assert few_rows.kernel_choice() == "triton"
    monkeypatch.setattr(cuda_driver, "available", lambda: True)
    assert few_rows.kernel_choice() == "direct"
    monkeypatch.setenv("CDBSIM_FEW_ROWS_KERNEL", "tma")
    assert few_rows.kernel_choice() == "tma"


def test_direct_takes_only_the_shapes_it_measured_faster_on() -> None:
    assert direct.faster(4, 2048, 2048, False) and direct.faster(8, 2048, 5632, False)
    assert not direct.faster(9, 2048, 2048, False)  # its 16-row build was slower
    assert not direct.faster(4, 5632, 2048, True) and not direct.faster(4, 6144, 2048, False)


@pytest.mark.parametrize("m,n,k,swiglu,why", [
    (0, 2048, 2048, False, "rows"), (17, 2048, 2048, False, "rows"), (4, 2048, 2056, False, "K a multiple of 32"),
    (4, 2056, 2048, False, "N a multiple of 16"), (4, 2056, 2048, True, "N a multiple of 16 per half")])
def test_shapes_the_kernel_cannot_take_are_named(m: int, n: int, k: int, swiglu: bool, why: str) -> None:
    assert why in direct.shape_problem(m, n, k, swiglu)


@pytest.mark.parametrize("m,n,k,swiglu", [(1, 2048, 2048, False), (16, 5632, 2048, True), (9, 2048, 5632, False),
                                          (16, 15840, 5280, False), (4, 8960, 5280, True)])
def test_ouros_and_huginns_shapes_fit(m: int, n: int, k: int, swiglu: bool) -> None:
    assert direct.shape_problem(m, n, k, swiglu) is None


def test_cpu_tensors_are_refused_with_the_reason() -> None:
    assert_cpu_tensors_refused(direct)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_source_compiles_for_sm90a_without_spills(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    spills, registers = ptxas_report(direct.SOURCE, tmp_path)
    assert len(spills) == len(direct.NAMES) and all(a == b == "0" for a, b in spills)
    assert max(registers) <= 65536 // direct.THREADS  # one CTA per SM at least
    monkeypatch.setenv("CDBSIM_CACHE", str(tmp_path / "cache"))
    cubin = cuda_driver.compile_cubin(direct.SOURCE)
    assert cubin.parent == tmp_path / "cache" and cubin.name.startswith("few_rows_direct-")
    assert cuda_driver.compile_cubin(direct.SOURCE) == cubin  # cached by the source's hash




def _inputs(m: int, n: int, k: int, swiglu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(2 * n if swiglu else n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k**-0.5
    return x, w


SHAPES = pytest.mark.parametrize("n,k,swiglu", [
    (6144, 2048, False), (5632, 2048, True), (2048, 5632, False), (528, 5280, False), (272, 5280, True)],
    ids=["qkv", "gate-up", "down", "n-and-k-tail", "swiglu-tails"])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@SHAPES
def test_matches_linear_on_hopper(m: int, n: int, k: int, swiglu: bool) -> None:
    x, w = _inputs(m, n, k, swiglu)
    assert_close(direct.linear(x, w, swiglu), reference(x, w, swiglu))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("splits", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("m", [4, 16])
@SHAPES
def test_every_split_matches_linear_and_repeats_exactly(m: int, n: int, k: int, swiglu: bool, splits: int) -> None:
    x, w = _inputs(m, n, k, swiglu)
    first = direct.linear(x, w, swiglu, 0, splits)
    assert_close(first, reference(x, w, swiglu))
    assert torch.equal(first, direct.linear(x, w, swiglu, 0, splits))  # a fixed order of sums: no atomics


@pytest.mark.gpu
@hopper
def test_pdl_chain_in_a_cuda_graph_waits_for_each_input() -> None:
    assert_pdl_chain_waits(lambda y, w, trigger: direct.linear(y, w, False, trigger))


@pytest.mark.gpu
@hopper
def test_served_run_on_the_direct_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    launch = direct.linear
    monkeypatch.setattr(direct, "linear", lambda *a, **kw: calls.append(a[0].shape[0]) or launch(*a, **kw))
    monkeypatch.setenv("CDBSIM_FEW_ROWS_KERNEL", "direct-all")
    assert_served_run_completes()
    assert calls and max(calls) <= direct.MAX_ROWS  # the launches of up to 16 rows took this kernel
