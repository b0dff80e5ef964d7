"""Theoretical limits reported beside the numbers (CDB paper, Schwethelm et al., arXiv 2608.09444).

* ``S_dec = (F_0 + r_max F_r) / (F_0 + d F_r)``: the decode bound, ``d`` the mean requested depth per output token,
  first tokens at ``r_max``.
* ``S_e2e = 1 / (a + (1 - a) w)``, ``w = (1/S_dec - f1) / (1 - f1)``: with prefill share ``a`` and prefill-made token
  fraction ``f1``.
* ``B*(L) = delta / (gamma + alpha L)``: the batch at which a step stops being bound by its weight reads.

:func:`e2e_bound` makes S_e2e a bound on a run's time: its ideal run takes the cheaper prefill, the cheaper
full-depth decode and the larger loop share of the run and its CB baseline, so no run can beat it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cdbsim.errors import require
from cdbsim.model.arch import ArchSpec
from traces.request import Request


def mean_depth(requests: Sequence[Request], r_max: int, r_min: int = 1) -> float:
    """d-bar: mean requested depth per output token, first tokens at ``r_max``, others clamped."""
    total = sum(r.output_len for r in requests)
    require(total > 0, "no output tokens")
    loops = len(requests) * r_max + sum(int(np.clip(r.depths, r_min, r_max).sum()) for r in requests if len(r.depths))
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


@dataclass(frozen=True)
class DeviceTimes:
    """Where a run's device time went: ``per_token`` (prelude and coda), ``per_loop`` (core launches, ``loop_tokens``
    token-loops for ``decoded_tokens`` tokens; both 0 for CB, whose decode time is ``decode``)."""

    makespan: float
    prefill: float
    decode: float
    per_token: float = 0.0
    per_loop: float = 0.0
    decoded_tokens: int = 0
    loop_tokens: int = 0

    def full_depth_decode(self, r_max: int) -> float:
        """Decode-type time had every decoded token run all ``r_max`` loops at this run's costs."""
        if self.loop_tokens <= 0 or self.decoded_tokens <= 0:
            return self.decode
        return self.per_token + r_max * self.decoded_tokens * self.per_loop / self.loop_tokens

    def loop_share(self, r_max: int) -> float:
        """Share of a full-depth decoded token's time that is its loops, at this run's costs (0 unknown)."""
        if self.loop_tokens <= 0 or self.decoded_tokens <= 0:
            return 0.0
        loops = r_max * self.decoded_tokens * self.per_loop / self.loop_tokens
        return loops / (loops + self.per_token) if loops > 0 else 0.0

    def depth(self) -> float:
        """Mean loops run per decoded token (0 without split stages)."""
        return self.loop_tokens / self.decoded_tokens if self.decoded_tokens > 0 else 0.0


def parameter_loop_share(arch: ArchSpec) -> float:
    """The loops' share of a full-depth token's work in parameters: ``r_max F_r / (F_0 + r_max F_r)``."""
    return arch.r_max * arch.fr / (arch.f0 + arch.r_max * arch.fr)


def decoded_depth(dbar: float, f1: float, r_max: int) -> float:
    """Mean requested depth of the tokens decode produces, from d-bar (first tokens counted at r_max)."""
    return (dbar - f1 * r_max) / (1.0 - f1) if f1 < 1.0 else float(r_max)


def e2e_bound(run: DeviceTimes, baseline: DeviceTimes, r_max: int, parameter_share: float, depth: float) -> float:
    """S_e2e of ``run`` against the CB ``baseline``: CB's makespan over the ideal run's device time, so that
    ``speed-up / S_e2e <= 1``; ``depth`` is the decoded tokens' mean requested depth (:func:`decoded_depth`)."""
    share = max(parameter_share, run.loop_share(r_max), baseline.loop_share(r_max))
    ran = run.depth()
    depth = min(depth, ran) if ran > 0 else depth
    w = 1.0 - share * (1.0 - max(depth, 0.0) / r_max)
    ideal = (min(baseline.prefill, run.prefill)
             + min(baseline.full_depth_decode(r_max), run.full_depth_decode(r_max)) * w)
    return baseline.makespan / ideal if ideal > 0 else math.inf
