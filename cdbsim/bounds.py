"""Theoretical limits every report shows next to its numbers (definitions: CDB paper, arXiv 2608.09444).

* ``S_dec = (F_0 + r_max F_r) / (F_0 + d F_r)``: the decode FLOP bound of skipping loops, with ``d`` the
  mean requested depth per generated token, each request's first token counted at ``r_max`` because
  prefill produces it at full depth.
* ``S_e2e = 1 / (a + (1 - a) w)`` with ``w = (1/S_dec - f1) / (1 - f1)``: the end-to-end bound once prefill
  (a share ``a`` of GPU time in the CB run) and the prefill-produced tokens (a fraction ``f1`` of output
  tokens) are accounted for. With ``f1 = 0`` it is Amdahl's ``1 / (a + (1 - a)/S_dec)``.
* ``B*(L) = delta / (gamma + alpha L)``: the batch size at which a step of latency
  ``delta + (gamma + alpha L) B`` stops being dominated by the weight-read floor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cdbsim.arch import ArchSpec
from cdbsim.errors import require
from traces.request import Request


def mean_depth(requests: Sequence[Request], r_max: int, r_min: int = 1) -> float:
    """d-bar: mean requested depth per output token, first tokens at ``r_max``, others clamped."""
    total = sum(r.output_len for r in requests)
    require(total > 0, "no output tokens")
    loops = len(requests) * r_max
    for r in requests:
        if len(r.depths):
            loops += int(np.clip(r.depths, r_min, r_max).sum())
    return loops / total


def first_token_fraction(requests: Sequence[Request]) -> float:
    """f1: the fraction of output tokens prefill produces (one per request)."""
    return len(requests) / sum(r.output_len for r in requests)


def s_dec(arch: ArchSpec, dbar: float) -> float:
    require(0 < dbar <= arch.r_max, f"mean depth must be in (0, r_max = {arch.r_max}], got {dbar}")
    return (arch.f0 + arch.r_max * arch.fr) / (arch.f0 + dbar * arch.fr)


def s_e2e(sdec: float, prefill_share: float, f1: float = 0.0) -> float:
    require(0.0 <= prefill_share < 1.0, f"prefill share must be in [0, 1), got {prefill_share}")
    require(0.0 <= f1 < 1.0, f"f1 must be in [0, 1), got {f1}")
    w = (1.0 / sdec - f1) / (1.0 - f1)
    return 1.0 / (prefill_share + (1.0 - prefill_share) * w)


def saturation_batch(delta: float, gamma: float, alpha: float, context: float) -> float:
    """B*(L) = delta / (gamma + alpha L)."""
    denominator = gamma + alpha * context
    return math.inf if denominator <= 0 else delta / denominator
