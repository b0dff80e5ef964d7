"""The layers part of benchmarks/bench_executor.py: a served layer's period and kernel shares from a profiled step,
and the kernel families by which benchmarks/tables.py sets served shares beside composed kernels."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from benchmarks.bench_executor import Kernel, layer_times


def step(layers: int, replays: int, period: float, overlap: float = 0.0, glue: str = "fill") -> list[Kernel]:
    """``replays`` steps of a 1 us ``glue`` kernel, ``layers`` layers of a 4 us GEMM, a 2 us attention and a 4 us GEMM,
    and a head; each layer kernel starting ``overlap`` before the one before it ends, the rest of the period spread
    between them."""
    kernels, t = [], 0.0
    idle = (period - 10.0 + 3 * overlap) / 3
    for _ in range(replays):
        kernels.append(Kernel(glue, t, 1.0))
        t += 1.0
        for _ in range(layers):
            for name, duration in (("gemm", 4.0), ("attn", 2.0), ("gemm", 4.0)):
                kernels.append(Kernel(name, t, duration))
                t += duration - overlap + idle
        kernels.append(Kernel("head", t, 3.0))
        t += 53.0
    return kernels


def test_the_steady_layer_leaves_the_glue_out_and_its_shares_add_up_to_its_period() -> None:
    times = layer_times(step(layers=8, replays=5, period=12.0), layers=8, replays=5)
    assert times.period == pytest.approx(12.0)
    assert sum(times.shares.values()) == pytest.approx(12.0 - (2 / 3) / 6)  # less the idle after the last steady layer
    assert set(times.shares) == {"gemm", "attn"}


def test_a_layer_kernel_that_also_runs_in_the_glue_keeps_its_share() -> None:
    alone = layer_times(step(layers=8, replays=5, period=12.0), layers=8, replays=5)
    shared = layer_times(step(layers=8, replays=5, period=12.0, glue="gemm"), layers=8, replays=5)
    assert shared.period == pytest.approx(alone.period)
    assert set(shared.shares) == {"gemm", "attn"}
    assert sum(shared.shares.values()) == pytest.approx(sum(alone.shares.values()))


def test_overlapping_kernels_share_the_period_not_their_durations() -> None:
    times = layer_times(step(layers=6, replays=3, period=9.0, overlap=1.0), layers=6, replays=3)
    assert times.period == pytest.approx(9.0)
    assert times.shares["attn"] < 2.0  # it started 1 us before the GEMM before it ended


def test_a_profile_that_does_not_split_into_replays_or_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="do not split into 4 replays"):
        layer_times(step(layers=8, replays=5, period=12.0), layers=8, replays=4)
    with pytest.raises(ValueError, match="at least 3 layers"):
        layer_times(step(layers=2, replays=2, period=12.0), layers=2, replays=2)


@pytest.mark.parametrize(("name", "family"), [
    ("_rope_decode_attn_kernel", "attention"), ("chained_attention", "attention"), ("_decode_attn_merge", "attention"),
    ("_residual_norm_kernel", "norms"), ("residual_norm", "norms"),
    ("_few_rows_kernel", "matmul"), ("_chain_gemv_kernel", "matmul"), ("nvjet_sm90_tst_64x32_64x6", "matmul"),
    ("void cublasLt::splitKreduce_kernel<32, 16>", "matmul"), ("gemm", "matmul"),
    ("_rope_kv_kernel", "elementwise"), ("silu_mul", "elementwise"), ("fill", "other")])
def test_served_and_composed_kernels_fall_in_the_same_family(name: str, family: str) -> None:
    from benchmarks.tables import kernel_family

    assert kernel_family(name) == family
