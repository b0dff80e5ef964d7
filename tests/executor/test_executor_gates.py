"""Exit rules and trace recording from live gates."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cdbsim.model.arch import KVLayout  # noqa: E402
from executor.gates import (  # noqa: E402
    depths_from_values,
    hazard_depth,
    latent_diff_depth,
    record_exit_trace,
    record_gate_values,
)
from executor.reference import ReferenceDecoder  # noqa: E402
from executor.tokens import prompt_ids  # noqa: E402
from traces import read_trace, write_trace  # noqa: E402
from traces.request import Request  # noqa: E402

from .helpers import tiny_arch, tiny_model  # noqa: E402


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_hazard_rule_uses_cumulative_exit_probability() -> None:
    lambdas = [logit(0.1), logit(0.5), logit(0.5), logit(0.9)]
    # pdf: 0.1, 0.45, 0.225, remaining 0.225 -> cdf 0.1, 0.55, 0.775, 1.0
    assert hazard_depth(lambdas, 0.05) == 1
    assert hazard_depth(lambdas, 0.1) == 1
    assert hazard_depth(lambdas, 0.5) == 2
    assert hazard_depth(lambdas, 0.7) == 3
    assert hazard_depth(lambdas, 0.9) == 4
    assert hazard_depth(lambdas, 1.0) == 4  # the last step takes all remaining mass


def test_latent_difference_rule() -> None:
    assert latent_diff_depth([1.0, 0.5, 0.2, 0.1], 0.3) == 3
    assert latent_diff_depth([1.0, 0.5, 0.2, 0.1], 0.0) == 4
    assert depths_from_values(np.array([[1.0, 0.1], [1.0, 0.9]]), 0.5, "latent-diff").tolist() == [2, 2]
    with pytest.raises(ValueError):
        depths_from_values(np.zeros((1, 2)), 0.5, "entropy")


def test_ouro_gate_values_equal_a_teacher_forced_forward() -> None:
    """Row j - 1 holds the gate logits of the loop states at position prompt_len + j - 1, as one full-depth
    forward over prompt + output computes them."""
    arch = tiny_arch("ouro", r_max=3)
    model = tiny_model(arch)
    request = Request(0, 6, 4)
    values, tokens = record_gate_values(model, request)
    assert values.shape == (3, arch.r_max) and len(tokens) == 4
    states: dict[int, torch.Tensor] = {}

    def keep(positions: range, step: int, state: torch.Tensor) -> None:
        if step >= 0:
            states[step] = state.clone()

    sequence = [*prompt_ids(0, 6, arch.vocab), *tokens[:-1]]
    ReferenceDecoder(model, KVLayout.DEPTH).generate(sequence, 1, [], observer=keep)
    for j in range(1, 4):
        for step in range(arch.r_max):
            want = float(model.gate_logit(states[step][6 + j - 1: 6 + j])[0])
            assert values[j - 1, step] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_record_exit_trace_round_trips_through_trace_files(tmp_path, style: str) -> None:
    arch = tiny_arch(style, r_max=4)
    model = tiny_model(arch)
    requests = [Request(0, 7, 5, 0.0), Request(1, 3, 1, 0.5), Request(2, 12, 6, 1.0)]
    q = 0.6 if style == "ouro" else 0.9
    recorded = record_exit_trace(model, requests, q)
    for r, orig in zip(recorded, requests, strict=True):
        assert (r.request_id, r.prompt_len, r.output_len, r.arrival) == (orig.request_id, orig.prompt_len,
                                                                      orig.output_len, orig.arrival)
        assert len(r.depths) == r.output_len - 1
        assert ((r.depths >= 1) & (r.depths <= arch.r_max)).all()
    never = record_exit_trace(model, requests, 0.0 if style == "huginn" else 1.0 + 1e-9)
    assert all((r.depths == arch.r_max).all() for r in never)
    path = write_trace(recorded, tmp_path / "exits.csv")
    back = read_trace(path, r_max=arch.r_max)
    assert [b.depths.tolist() for b in back] == [r.depths.tolist() for r in recorded]


@pytest.mark.parametrize("style", [pytest.param("ouro", marks=pytest.mark.slow), "huginn"])
def test_batched_recording_equals_per_request_recording(style: str) -> None:
    """Greedy outputs from one batched executor run give the same gate values and depths as decoding
    each request on its own."""
    from executor.gates import greedy_outputs

    arch = tiny_arch(style, r_max=4)
    model = tiny_model(arch)
    requests = [Request(0, 7, 5, 0.0), Request(1, 3, 1, 0.5), Request(2, 12, 6, 1.0), Request(3, 30, 9, 0.0)]
    outputs = greedy_outputs(model, arch, requests, width=2)
    for r, out in zip(requests, outputs, strict=True):
        alone, tokens = record_gate_values(model, r)
        batched, _ = record_gate_values(model, r, outputs=out)
        assert out.tolist() == tokens
        np.testing.assert_allclose(batched, alone, atol=1e-5)
    q = 0.6 if style == "ouro" else 0.9
    fast = record_exit_trace(model, requests, q, arch=arch)
    slow = record_exit_trace(model, requests, q)
    assert [r.depths.tolist() for r in fast] == [r.depths.tolist() for r in slow]
    with pytest.raises(ValueError, match="output tokens"):
        record_gate_values(model, requests[0], outputs=[1, 2])
