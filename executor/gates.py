"""Live exit gates: record per-token exit depths from a model, to save as a trace and replay.

Replaying recorded exits is how the CDB paper (and cdbsim) serve: the exit decision of every generated
token is computed once, offline, from a full-depth run, then replayed by the scheduler. Two criteria:

* ``hazard`` (Ouro): after loop t the exit gate gives lambda_t = sigmoid(gate(normed state_t)); the exit
  distribution is p_t = lambda_t * prod_{j<t}(1 - lambda_j) for t < T and the remaining mass at T; the
  token exits at the first t where the CDF reaches q (reference/cdb-engine-spec.md section 3).
* ``latent-diff`` (Huginn): value_r = ||s_r - s_{r-1}|| / ||s_r|| of the loop state (before ``ln_f``; s_0 is
  the initial state); the token exits at the first r with value_r < q (q = 0: never).

Recording runs each request at full depth on the reference decoder (depth-indexed KV, greedy), i.e.
teacher-forced on its own greedy output: with every loop computed and every slot written, incremental
decoding equals one forward over prompt + output. Output token j >= 1 takes the gate values of the step
whose input sits at position prompt_len + j - 1, as the paper's recorder does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from cdbsim.kvlayout import KVLayout
from executor.model import LoopedLM
from executor.reference import ReferenceDecoder
from executor.tokens import prompt_ids
from traces.request import Request

CRITERIA = ("hazard", "latent-diff")


def default_criterion(model: LoopedLM) -> str:
    return "hazard" if model.config.style == "ouro" else "latent-diff"


def hazard_depth(gate_logits: Sequence[float], q: float) -> int:
    """1-indexed exit depth from per-loop gate logits under the cumulative-hazard rule."""
    total = len(gate_logits)
    cdf, survive = 0.0, 1.0
    for t, logit in enumerate(gate_logits):
        lam = 1.0 / (1.0 + math.exp(-float(logit)))
        cdf += lam * survive if t < total - 1 else survive
        survive *= 1.0 - lam
        if cdf >= q:
            return t + 1
    return total


def latent_diff_depth(values: Sequence[float], q: float) -> int:
    """1-indexed exit depth: the first loop whose relative state change is below ``q``."""
    for r, value in enumerate(values):
        if value < q:
            return r + 1
    return len(values)


def depths_from_values(values: np.ndarray, q: float, criterion: str) -> np.ndarray:
    """Exit depths (int16) from a ``[tokens, r_max]`` array of gate logits or latent differences."""
    if criterion not in CRITERIA:
        raise ValueError(f"unknown exit criterion {criterion!r}; expected one of {CRITERIA}")
    rule = hazard_depth if criterion == "hazard" else latent_diff_depth
    return np.asarray([rule(row, q) for row in values], dtype=np.int16)


def record_gate_values(model: LoopedLM, request: Request, *, criterion: str | None = None,
                       prompt_seed: int = 0) -> tuple[np.ndarray, list[int]]:
    """Per decoded token (output tokens 1 ..), the gate signal of every loop, ``[output_len - 1, r_max]``.

    Hazard: the gate logit of each loop's normed state. Latent-diff: ||s_r - s_{r-1}|| / ||s_r||.
    Also returns the greedy output tokens of the full-depth run.
    """
    criterion = criterion or default_criterion(model)
    if criterion == "hazard" and model.gate_w is None:
        raise ValueError("the hazard criterion needs an Ouro-style exit gate")
    cfg = model.config
    prompt = prompt_ids(request.request_id, request.prompt_len, cfg.vocab, prompt_seed)
    first = request.prompt_len  # input position of the step that produces output token 1
    values = np.zeros((max(request.output_len - 1, 0), cfg.r_max), dtype=np.float32)
    previous: dict[int, torch.Tensor] = {}

    def observe(positions: range, step: int, state: torch.Tensor) -> None:
        if len(positions) != 1 or positions[0] < first:
            return
        row = positions[0] - first
        s = state[-1].float()
        if step >= 0 and criterion == "hazard":
            values[row, step] = float(model.gate_logit(state[-1:])[0])
        elif step >= 0:
            values[row, step] = float((s - previous[row]).norm() / s.norm().clamp_min(1e-30))
        previous[row] = s

    decoder = ReferenceDecoder(model, KVLayout.DEPTH)
    out = decoder.generate(prompt, request.output_len, [cfg.r_max] * max(request.output_len - 1, 0),
                           observer=observe)
    return values, out.tokens


def record_exit_trace(model: LoopedLM, requests: Sequence[Request], q: float, *, criterion: str | None = None,
                      prompt_seed: int = 0) -> list[Request]:
    """``requests`` with exit depths from the model's live gate at threshold ``q`` (``traces.write_trace``
    saves them)."""
    criterion = criterion or default_criterion(model)
    out = []
    for r in requests:
        values, _ = record_gate_values(model, r, criterion=criterion, prompt_seed=prompt_seed)
        out.append(Request(r.request_id, r.prompt_len, r.output_len, r.arrival,
                           depths_from_values(values, q, criterion)))
    return out
