"""The few-row tensor-core matmul of :mod:`executor.skinny` agrees with ``F.linear``.

The checks run under Triton's CPU interpreter in a fresh process (``TRITON_INTERPRET`` must be set before
Triton is imported; see ``test_executor_chain``), on float32 shapes that are not multiples of the blocks;
on a GPU the same checks run in bfloat16.
"""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from .triton_interpreter import report_checks, run_interpreted  # noqa: E402

# (rows, N, K, config or None for the default): ragged N and K, one and several K steps, rows below and
# above the tensor cores' 16, the largest row count
CASES = [(2, 40, 72, (16, 32)), (5, 48, 64, None), (17, 33, 100, (32, 64)), (32, 64, 48, (16, 16)),
         (1, 20, 24, None), (8, 130, 200, (64, 32))]


def check(m: int, n: int, k: int, config, device: str, dtype, atol: float) -> None:
    import torch.nn.functional as F

    from executor.skinny import SkinnyConfig, skinny_linear

    gen = torch.Generator(device=device).manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen, device=device).to(dtype)
    w = (torch.randn(n, k, generator=gen, device=device) * k**-0.5).to(dtype)
    before = (x.clone(), w.clone())
    got = skinny_linear(x, w, SkinnyConfig(*config) if config else None)
    want = F.linear(x.float(), w.float())
    diff = float((got.float() - want).abs().max())
    if got.shape != (m, n) or got.dtype != dtype or diff > atol:
        raise AssertionError(f"M={m} N={n} K={k} {config}: shape {tuple(got.shape)}, max difference {diff:.3e}")
    if not (torch.equal(x, before[0]) and torch.equal(w, before[1])):
        raise AssertionError(f"M={m} N={n} K={k}: modified its inputs")


def _main() -> int:
    """Every case under the interpreter (see :func:`triton_interpreter.report_checks`)."""
    return report_checks({str(case): lambda case=case: check(*case, "cpu", torch.float32, atol=1e-4)
                          for case in CASES})


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str]:
    return run_interpreted("tests.executor.test_executor_skinny")


@pytest.mark.parametrize("case", CASES, ids=[f"M{m}-N{n}-K{k}" for m, n, k, _ in CASES])
def test_matches_linear_under_the_interpreter(interpreted: dict[str, str], case) -> None:
    assert interpreted.get(str(case)) == "ok", interpreted.get(str(case), "not run")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_matches_linear_on_cuda_in_bf16() -> None:
    for case in CASES:
        check(*case, "cuda", torch.bfloat16, atol=2e-2)


def test_default_config_gives_every_sm_a_program() -> None:
    from executor.skinny import default_config

    for n, k in [(2048, 2048), (6144, 2048), (11264, 2048), (2048, 5632), (15840, 5280), (35840, 5280)]:
        cfg = default_config(n, k, sms=132)
        assert cfg.block_n in (16, 32, 64) and cfg.block_k == 256
        assert -(-n // cfg.block_n) >= 128  # 2,048 columns in blocks of 16: 128 programs
    assert default_config(64, 40).block_k == 64  # never a step much wider than K


def test_bad_inputs_are_refused_before_any_launch() -> None:
    from executor.skinny import skinny_linear

    w = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="do not fit"):
        skinny_linear(torch.zeros(2, 6), w)
    with pytest.raises(ValueError, match=r"1\.\.32 rows"):
        skinny_linear(torch.zeros(33, 8), w)
    with pytest.raises(ValueError, match="dtype"):
        skinny_linear(torch.zeros(2, 8, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="contiguous"):
        skinny_linear(torch.zeros(8, 2).t(), w)


if __name__ == "__main__":
    sys.exit(_main())
