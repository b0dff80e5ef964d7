"""Live exit gates: record per-token exit depths from a model, to save as a trace and replay.

Replaying recorded exits is how the CDB paper (and cdbsim) serve: the exit decision of every generated
token is computed once, offline, from a full-depth run, then replayed by the scheduler. Two criteria:

* ``hazard`` (Ouro): after loop t the exit gate gives lambda_t = sigmoid(gate(normed state_t)); the exit
  distribution is p_t = lambda_t * prod_{j<t}(1 - lambda_j) for t < T and the remaining mass at T; the
  token exits at the first t where the CDF reaches q (reference/cdb-engine-spec.md section 3).
* ``latent-diff`` (Huginn): value_r = ||s_r - s_{r-1}|| / ||s_r|| of the loop state (before ``ln_f``; s_0 is
  the initial state); the token exits at the first r with value_r < q (q = 0: never).

Recording takes each request's greedy output at full depth (decoded one request at a time by the
reference decoder, or all together in one batched CB run of the executor), then one teacher-forced
full-depth forward over prompt + output: with every loop computed and every slot written, that equals
incremental decoding. Output token j >= 1 takes the gate values of the step whose input sits at position
prompt_len + j - 1, as the paper's recorder does.
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
from executor.model import LoopedLM
from executor.reference import ReferenceDecoder
from executor.tokens import prompt_ids
from traces.request import Request

CRITERIA = ("hazard", "latent-diff")


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
                          criterion: str) -> np.ndarray:
    """Gate signals of output tokens 1 .. from one full-depth forward over ``prompt + outputs[:-1]``.

    Row ``j - 1`` holds the signal of every loop at input position ``len(prompt) + j - 1``. Teacher
    forcing gives what incremental full-depth decoding gives: every loop runs and every slot is written.
    """
    cfg = model.config
    first, rows = len(prompt), max(len(outputs) - 1, 0)
    values = np.zeros((rows, cfg.r_max), dtype=np.float32)
    if not rows:
        return values
    states: dict[int, torch.Tensor] = {}

    def keep(positions: range, step: int, state: torch.Tensor) -> None:
        states[step] = state[first: first + rows]

    ReferenceDecoder(model, KVLayout.DEPTH).generate([*prompt, *outputs[:-1]], 1, [], observer=keep)
    for step in range(cfg.r_max):
        if criterion == "hazard":
            values[:, step] = model.gate_logit(states[step]).cpu().numpy()
        else:
            s, before = states[step].float(), states[step - 1].float()
            values[:, step] = ((s - before).norm(dim=-1) / s.norm(dim=-1).clamp_min(1e-30)).cpu().numpy()
    return values


def record_gate_values(model: LoopedLM, request: Request, *, criterion: str | None = None,
                       prompt_seed: int = 0, outputs: Sequence[int] | None = None) -> tuple[np.ndarray, list[int]]:
    """Per decoded token (output tokens 1 ..), the gate signal of every loop, ``[output_len - 1, r_max]``.

    Hazard: the gate logit of each loop's normed state. Latent-diff: ||s_r - s_{r-1}|| / ||s_r||.
    Also returns the greedy output tokens of the full-depth run: ``outputs`` if given (say from a batched
    executor run, :func:`greedy_outputs`), else decoded here one token at a time.
    """
    criterion = criterion or default_criterion(model)
    if criterion not in CRITERIA:
        raise ValueError(f"unknown exit criterion {criterion!r}; expected one of {CRITERIA}")
    if criterion == "hazard" and model.gate_w is None:
        raise ValueError("the hazard criterion needs an Ouro-style exit gate")
    cfg = model.config
    prompt = prompt_ids(request.request_id, request.prompt_len, cfg.vocab, prompt_seed)
    if outputs is None:
        decoded = ReferenceDecoder(model, KVLayout.DEPTH).generate(
            prompt, request.output_len, [cfg.r_max] * max(request.output_len - 1, 0))
        outputs = decoded.tokens
    outputs = [int(t) for t in outputs]
    if len(outputs) != request.output_len:
        raise ValueError(f"request {request.request_id}: {len(outputs)} output tokens, expected {request.output_len}")
    return teacher_forced_values(model, prompt, outputs, criterion), outputs


def greedy_outputs(model: LoopedLM, arch: ArchSpec, requests: Sequence[Request], *, prompt_seed: int = 0,
                   width: int = 64) -> list[np.ndarray]:
    """Every request's greedy output at full depth from one batched CB run of the executor (CB runs every
    token through all ``r_max`` loops, with depth-indexed KV as the recorder defines it), instead of
    decoding requests one at a time."""
    requests = [Request(r.request_id, r.prompt_len, r.output_len, 0.0) for r in requests]
    longest = max(r.prompt_len + r.output_len for r in requests)
    width = max(1, min(width, len(requests)))
    config = ServeConfig(policy="cb", width=width, prefill_budget=max(width, min(8192, longest)),
                         timing="sync", layout=KVLayout.DEPTH)
    kv_blocks = 2 * width * max(need_blocks(r.prompt_len, r.output_len, config.block_size) for r in requests)
    run = execute(arch, config, requests, kv_blocks, model=model, mode="sync", seed=prompt_seed)
    return run.tokens


def record_exit_trace(model: LoopedLM, requests: Sequence[Request], q: float, *, criterion: str | None = None,
                      prompt_seed: int = 0, arch: ArchSpec | None = None) -> list[Request]:
    """``requests`` with exit depths from the model's live gate at threshold ``q`` (``traces.write_trace``
    saves them). With ``arch`` (the model's architecture) the greedy outputs come from one batched
    executor run (:func:`greedy_outputs`); each request then takes one teacher-forced forward."""
    criterion = criterion or default_criterion(model)
    outputs = greedy_outputs(model, arch, requests, prompt_seed=prompt_seed) if arch is not None else None
    out = []
    for i, r in enumerate(requests):
        values, _ = record_gate_values(model, r, criterion=criterion, prompt_seed=prompt_seed,
                                       outputs=None if outputs is None else outputs[i])
        out.append(Request(r.request_id, r.prompt_len, r.output_len, r.arrival,
                           depths_from_values(values, q, criterion)))
    return out
