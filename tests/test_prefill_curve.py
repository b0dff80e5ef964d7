"""The prefill curve (cdbsim.latency.prefill): fitted back to known curves, monotone, and summed as its parts."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdbsim.latency.prefill import PrefillCost, PrefillCurve, fit_curve, summed

TOKENS = (16, 64, 256, 1024, 2048, 8192)


def _points(curve: PrefillCurve, packs: tuple[int, ...] = (1, 4)) -> list[list[float]]:
    rows = []
    for n in TOKENS:
        for k in packs:
            per = n // k
            pairs = k * per * (per + 1) // 2
            rows.append([n, pairs, k, curve(n, pairs, k)])
    return rows


def test_a_curve_is_fitted_back_from_its_own_points() -> None:
    """A bend in tokens (flat, then steep, then steeper) with a pairs and a chunk term comes back whole."""
    truth = PrefillCurve(knots=(16, 64, 256, 1024, 2048, 8192), values=(5e-3, 5e-3, 6e-3, 1.5e-2, 3e-2, 1.5e-1),
                         alpha=3e-9, kappa=2e-5)
    fitted = fit_curve(_points(truth, packs=(1, 2, 8)))
    for n in (16, 100, 700, 3000, 8192, 12000):
        for pairs, chunks in ((0, 1), (n * n // 4, 2)):
            assert fitted(n, pairs, chunks) == pytest.approx(truth(n, pairs, chunks), rel=1e-4)
    assert fitted.alpha == pytest.approx(truth.alpha, rel=1e-3)


def test_the_curve_is_flat_below_its_first_point_and_extends_its_last_slope() -> None:
    curve = PrefillCurve(knots=(16.0, 512.0, 2048.0), values=(1.0, 2.0, 5.0))
    assert curve(1) == curve(16) == 1.0
    assert curve(264) == pytest.approx(1.5)
    assert curve(3584) == pytest.approx(8.0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e-4, 1e-1), min_size=len(TOKENS), max_size=len(TOKENS)),
       st.floats(0, 1e-8), st.floats(0, 1e-4))
def test_a_fitted_curve_never_falls_in_tokens_and_has_no_negative_term(noise: list[float], alpha: float,
                                                                        kappa: float) -> None:
    """Whatever the measured times (here: noise, which can fall with tokens), the fitted G does not fall and
    its per-pair and per-chunk costs are >= 0, so a bigger prefill is never predicted faster."""
    rows = []
    for (n, t) in zip(TOKENS, noise, strict=True):
        for k in (1, 4):
            pairs = k * (n // k) ** 2 / 2
            rows.append([n, pairs, k, t + alpha * pairs + kappa * k])
    curve = fit_curve(rows)
    assert all(b >= a for a, b in pairwise(curve.values))
    assert curve.alpha >= 0 and curve.kappa >= 0
    grid = np.geomspace(1, 16384, 60)
    times = [curve(float(n)) for n in grid]
    assert all(b >= a - 1e-15 for a, b in pairwise(times))


def test_curves_add_as_their_parts_and_a_cost_adds_its_samples() -> None:
    a = PrefillCurve(knots=(16.0, 1024.0), values=(1.0, 3.0), alpha=1e-9, kappa=1e-5)
    b = PrefillCurve(knots=(64.0, 4096.0), values=(2.0, 2.5), alpha=2e-9)
    total = summed([(1, a), (3, b), (0, a)])
    for n in (8, 16, 40, 64, 500, 1024, 3000, 4096, 9000):
        assert total(n, 1e6, 4) == pytest.approx(a(n, 1e6, 4) + 3 * b(n, 1e6, 4))
    cost = PrefillCost(a, sample=1e-3)
    assert cost(1024, 0, samples=2, chunks=1) == pytest.approx(a(1024, 0, 1) + 2e-3)


def test_a_per_row_component_without_chunks_is_fitted_on_its_rows() -> None:
    """Huginn's adapter enters a prefill as rows ``[rows, context, t]``: a curve in rows alone."""
    rows = [[b, 0.0, 1e-5 + 1e-8 * b] for b in (1, 8, 64, 512, 1024)]
    curve = fit_curve(rows)
    assert curve.alpha == curve.kappa == 0.0
    assert curve(256) == pytest.approx(1e-5 + 1e-8 * 256, rel=1e-6)
    assert curve(4096) == pytest.approx(1e-5 + 1e-8 * 4096, rel=1e-6)
