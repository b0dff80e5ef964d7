"""Live exit gates: record per-token exit depths from a model, to save as a trace the scheduler replays (as the CDB
paper, Schwethelm, Rueckert, Kaissis, arXiv 2608.09444, serves recorded exits).

* ``hazard`` (Ouro): lambda_t = sigmoid(gate(normed state_t)), p_t = lambda_t * prod_{j<t}(1 - lambda_j) (the rest
  at the last loop); a token exits at the first t whose CDF reaches q.
* ``latent-diff`` (Huginn): ||s_r - s_{r-1}|| / ||s_r|| of the loop state before ``ln_f``; exit at the first r below q.

Each request's greedy full-depth output (reference decoder, or one batched CB executor run) is then run once
teacher-forced; output token j >= 1 takes the gate values at input position prompt_len + j - 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from cdbsim.model.arch import ArchSpec, KVLayout, LayerStyle
from cdbsim.serving.blocks import need_blocks
from cdbsim.serving.config import ServeConfig
from executor.driver import execute
from executor.live_gates import CRITERIA
from executor.model import LoopedLM
from executor.reference import ReferenceDecoder
from executor.tokens import prompt_ids
from traces.request import Request


def default_criterion(model: LoopedLM) -> str:
    return "hazard" if model.config.style is LayerStyle.OURO else "latent-diff"


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


def teacher_forced_values(model: LoopedLM, prompt: Sequence[int], outputs: Sequence[int],
                          criterion: str, request_id: int = 0) -> np.ndarray:
    """Gate signals of output tokens 1 .. from one full-depth forward over ``prompt + outputs[:-1]``: row ``j - 1``
    holds every loop's signal at input position ``len(prompt) + j - 1`` (what incremental decoding gives);
    ``request_id`` keys a random start state."""
    cfg = model.config
    first, rows = len(prompt), max(len(outputs) - 1, 0)
    values = np.zeros((rows, cfg.r_max), dtype=np.float32)
    if not rows:
        return values
    states: dict[int, torch.Tensor] = {}

    def keep(positions: range, step: int, state: torch.Tensor) -> None:
        states[step] = state[first: first + rows]

    ReferenceDecoder(model, KVLayout.DEPTH).generate([*prompt, *outputs[:-1]], 1, [], observer=keep,
                                                     request_id=request_id)
    for step in range(cfg.r_max):
        if criterion == "hazard":
            values[:, step] = model.gate_logit(states[step]).cpu().numpy()
        else:
            s, before = states[step].float(), states[step - 1].float()
            values[:, step] = ((s - before).norm(dim=-1) / s.norm(dim=-1).clamp_min(1e-30)).cpu().numpy()
    return values


def record_gate_values(model: LoopedLM, request: Request, *, criterion: str | None = None,
                       prompt_seed: int = 0, outputs: Sequence[int] | None = None) -> tuple[np.ndarray, list[int]]:
    """Per output token 1 .., every loop's gate signal ``[output_len - 1, r_max]``, and the greedy full-depth output
    tokens: ``outputs`` if given (e.g. :func:`greedy_outputs`), else decoded here one token at a time."""
    criterion = criterion or default_criterion(model)
    if criterion not in CRITERIA:
        raise ValueError(f"unknown exit criterion {criterion!r}; expected one of {CRITERIA}")
    if criterion == "hazard" and model.gate_w is None:
        raise ValueError("the hazard criterion needs an Ouro-style exit gate")
    cfg = model.config
    prompt = prompt_ids(request.request_id, request.prompt_len, cfg.vocab, prompt_seed)
    if outputs is None:
        outputs = ReferenceDecoder(model, KVLayout.DEPTH).generate(
            prompt, request.output_len, [cfg.r_max] * max(request.output_len - 1, 0),
            request_id=request.request_id).tokens
    outputs = [int(t) for t in outputs]
    if len(outputs) != request.output_len:
        raise ValueError(f"request {request.request_id}: {len(outputs)} output tokens, expected {request.output_len}")
    return teacher_forced_values(model, prompt, outputs, criterion, request.request_id), outputs


def greedy_outputs(model: LoopedLM, arch: ArchSpec, requests: Sequence[Request], *, prompt_seed: int = 0,
                   width: int = 64, prompts: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
    """Every request's greedy full-depth output from one batched CB executor run (all loops, depth-indexed KV), on
    ``prompts`` (token ids) if given, else the synthetic prompts of ``prompt_seed``."""
    requests = [Request(r.request_id, r.prompt_len, r.output_len, 0.0) for r in requests]
    longest = max(r.prompt_len + r.output_len for r in requests)
    width = max(1, min(width, len(requests)))
    config = ServeConfig(policy="cb", width=width, prefill_budget=max(width, min(8192, longest)),
                         timing="sync", layout=KVLayout.DEPTH)
    kv_blocks = 2 * width * max(need_blocks(r.prompt_len, r.output_len, config.block_size) for r in requests)
    return execute(arch, config, requests, kv_blocks, model=model, mode="sync", seed=prompt_seed,
                   prompts=prompts).tokens


def record_exit_trace(model: LoopedLM, requests: Sequence[Request], q: float, *, criterion: str | None = None,
                      prompt_seed: int = 0, arch: ArchSpec | None = None) -> list[Request]:
    """``requests`` with exit depths from the model's live gate at threshold ``q``; with ``arch`` the greedy outputs
    come from one batched executor run (:func:`greedy_outputs`)."""
    criterion = criterion or default_criterion(model)
    outputs = greedy_outputs(model, arch, requests, prompt_seed=prompt_seed) if arch is not None else None
    out = []
    for i, r in enumerate(requests):
        values, _ = record_gate_values(model, r, criterion=criterion, prompt_seed=prompt_seed,
                                       outputs=None if outputs is None else outputs[i])
        out.append(Request(r.request_id, r.prompt_len, r.output_len, r.arrival,
                           depths_from_values(values, q, criterion)))
    return out
