"""benchmarks/layer_kernels.py: a layer's period and kernels read from a profiled multi-layer step."""

from __future__ import annotations

import pytest

from benchmarks.layer_kernels import Kernel, layer_times, main


def step(layers: int, replays: int, period: float, overlap: float = 0.0) -> list[Kernel]:
    """``replays`` steps of glue, ``layers`` layers of a 4 us GEMM twice and a 2 us attention, glue; each kernel
    starting ``overlap`` before the one before it ends."""
    kernels, t = [], 0.0
    for _ in range(replays):
        for name, duration in [("fill", 1.0), *[(n, d) for _ in range(layers) for n, d in
                                                (("gemm", 4.0), ("attn", 2.0), ("gemm", 4.0))], ("head", 3.0)]:
            kernels.append(Kernel(name, t, duration))
            t += duration - overlap + (period - 10.0 + 3 * overlap) / 3 if name in ("gemm", "attn") else duration
        t += 50.0
    return kernels


def test_the_period_and_kernels_of_the_steady_layer_leave_the_glue_out() -> None:
    times = layer_times(step(layers=8, replays=5, period=12.0), layers=8, replays=5)
    assert times.period == pytest.approx(12.0)
    assert times.kernels == pytest.approx({"gemm": 8.0, "attn": 2.0}) and times.kernel_sum == pytest.approx(10.0)


def test_overlapping_kernels_give_a_period_below_their_sum() -> None:
    times = layer_times(step(layers=6, replays=3, period=9.0, overlap=1.0), layers=6, replays=3)
    assert times.period == pytest.approx(9.0) and times.period < times.kernel_sum


def test_a_profile_that_does_not_split_into_replays_or_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="do not split into 4 replays"):
        layer_times(step(layers=8, replays=5, period=12.0), layers=8, replays=4)
    with pytest.raises(ValueError, match="at least 3 layers"):
        layer_times(step(layers=2, replays=2, period=12.0), layers=2, replays=2)


def test_bad_settings_get_one_line_errors(capsys) -> None:
    assert main(["--arch", "no-such-model", "--out", "x.csv"]) == 2
    assert "unknown architecture" in capsys.readouterr().err
    assert main(["--arch", "ouro-1.4b", "--layers", "2", "--out", "x.csv"]) == 2
    assert "--layers must be at least 3" in capsys.readouterr().err


def test_without_a_gpu_it_says_so_in_one_line(capsys) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tests/executor/test_executor_gpu.py runs it")
    assert main(["--arch", "ouro-1.4b", "--out", "x.csv"]) == 2
    assert capsys.readouterr().err.strip() == "error: layer_kernels.py profiles CUDA graphs: it needs a CUDA GPU"
