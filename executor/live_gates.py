"""Live exit gates in a served run: each decoded token's own exit gate at every loop step it runs, computed inside
the batched launches (eagerly, or in their CUDA graphs), to set beside the depths a trace replays.

The rules are :mod:`executor.gates`' (``hazard``: Ouro's cumulative exit probability reaching q; ``latent-diff``:
Huginn's relative change between consecutive loop states below q). Per hidden-state bank row the engine keeps the
loop at which the gate first fired (0: not yet), the loops run and, for the hazard rule, the exit CDF and the
survival; the coda (CB: the fused decode) copies a token's record to buffers indexed like the token store, which
:meth:`LiveGates.compare` reads once the run is over. The live decision is the first loop at which the gate fires,
at least r_min, or r_max if it never fires there (as the recorded depths); a token whose gate had not fired by
the depth it was served at has no live depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from executor.model import LoopedLM
from traces.request import Request

CRITERIA = ("hazard", "latent-diff")  # the exit rules: Ouro's learned gate, Huginn's change between loop states


@dataclass(frozen=True)
class LiveGateSpec:
    """Which exit rule the live gates follow and at which threshold."""

    criterion: str
    q: float


@dataclass
class Track:
    """Gate records of a set of rows: first loop fired (1-indexed, 0: not yet), loops run, exit CDF, survival."""

    first: torch.Tensor
    ran: torch.Tensor
    cdf: torch.Tensor
    survive: torch.Tensor

    @classmethod
    def fresh(cls, rows: int, device: torch.device) -> Track:
        zeros = torch.zeros(rows, dtype=torch.int32, device=device)
        return cls(zeros, zeros.clone(), torch.zeros(rows, dtype=torch.float64, device=device),
                   torch.ones(rows, dtype=torch.float64, device=device))


@dataclass(frozen=True)
class LiveComparison:
    """Decoded tokens whose live gate agrees with the replayed depth, would have exited earlier, or had not fired
    by it; the mean of live minus replayed depth over the tokens with a live depth (None without one)."""

    criterion: str
    q: float
    tokens: int
    agree: int
    earlier: int
    not_fired: int
    mean_depth_diff: float | None

    def share(self, count: int) -> float | None:
        return count / self.tokens if self.tokens else None

    def to_dict(self) -> dict:
        return {"criterion": self.criterion, "q": self.q, "tokens": self.tokens, "agree": self.agree,
                "earlier": self.earlier, "not_fired": self.not_fired, "agree_share": self.share(self.agree),
                "earlier_share": self.share(self.earlier), "not_fired_share": self.share(self.not_fired),
                "mean_depth_diff": self.mean_depth_diff}


class LiveGates:
    """The device buffers of a run's live gates (allocated before any graph is captured) and their updates."""

    def __init__(self, model: LoopedLM, spec: LiveGateSpec, bank_rows: int, store_numel: int) -> None:
        if spec.criterion not in CRITERIA:
            raise ValueError(f"unknown exit criterion {spec.criterion!r}; expected one of {CRITERIA}")
        if spec.criterion == "hazard" and model.gate_w is None:
            raise ValueError("the hazard criterion needs an Ouro-style exit gate")
        self.model, self.spec = model, spec
        self.r_max = model.config.r_max
        device = model.device
        self.bank = Track.fresh(bank_rows, device)
        self.token_first = torch.zeros(store_numel, dtype=torch.int32, device=device)
        self.token_ran = torch.zeros(store_numel, dtype=torch.int32, device=device)

    def start(self, rows: torch.Tensor) -> None:
        """Bank ``rows`` hold tokens entering the loop: no gate fired, no loop run."""
        for tensor, value in ((self.bank.first, 0), (self.bank.ran, 0), (self.bank.cdf, 0.0),
                              (self.bank.survive, 1.0)):
            tensor.index_fill_(0, rows, value)

    def step(self, rows: torch.Tensor, before: torch.Tensor, after: torch.Tensor) -> None:
        """Bank ``rows`` ran one loop from ``before`` to ``after``."""
        track = Track(*(t[rows] for t in (self.bank.first, self.bank.ran, self.bank.cdf, self.bank.survive)))
        self.advance(track, before, after)
        for kept, new in ((self.bank.first, track.first), (self.bank.ran, track.ran), (self.bank.cdf, track.cdf),
                          (self.bank.survive, track.survive)):
            kept.index_copy_(0, rows, new)

    def advance(self, track: Track, before: torch.Tensor, after: torch.Tensor) -> None:
        """One loop of ``track``'s rows: the gate of the state ``after`` it (Ouro: normed; Huginn: raw)."""
        step = track.ran
        if self.spec.criterion == "hazard":
            lam = torch.sigmoid(self.model.gate_logit(after).double())
            track.cdf = track.cdf + torch.where(step == self.r_max - 1, track.survive, lam * track.survive)
            track.survive = track.survive * (1.0 - lam)
            fired = track.cdf >= self.spec.q
        else:
            s, b = after.float(), before.float()
            change = (s - b).norm(dim=-1) / s.norm(dim=-1).clamp_min(1e-30)
            fired = change.double() < self.spec.q
        track.first = torch.where((track.first == 0) & fired, step + 1, track.first)
        track.ran = step + 1

    def finish(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        """Bank ``rows`` left the loop; their tokens go to token-store indices ``out``."""
        self.record(self.bank.first[rows], self.bank.ran[rows], out)

    def record(self, first: torch.Tensor, ran: torch.Tensor, out: torch.Tensor) -> None:
        """Keep ``first`` (loop first fired) and ``ran`` (loops run) as the records of the tokens at token-store
        indices ``out``."""
        index = out.long()
        self.token_first.index_copy_(0, index, first)
        self.token_ran.index_copy_(0, index, ran)

    def compare(self, requests: Sequence[Request], stride: int, r_min: int) -> LiveComparison:
        """Every decoded token that ran the loop (output tokens 1 ..; prefill tokens run at full depth by rule):
        its live decision against the depth it was served at."""
        first = self.token_first.view(-1, stride).cpu().numpy()
        ran = self.token_ran.view(-1, stride).cpu().numpy()
        live, served = [], []
        for i, r in enumerate(requests):
            cols = slice(r.prompt_len + 1, r.prompt_len + r.output_len)
            keep = ran[i, cols] > 0
            live.append(first[i, cols][keep])
            served.append(ran[i, cols][keep])
        return compare_depths(np.concatenate(live or [np.zeros(0)]).astype(np.int64),
                              np.concatenate(served or [np.zeros(0)]).astype(np.int64), self.spec, r_min,
                              self.r_max)


def compare_depths(first: np.ndarray, served: np.ndarray, spec: LiveGateSpec, r_min: int,
                   r_max: int) -> LiveComparison:
    """Per token the loop its gate first fired at (0: not while served) and the loops it was served: the live
    depth (at least ``r_min``; ``r_max`` for a token served every loop without firing) against ``served``."""
    live = np.where(first > 0, np.maximum(first, r_min), np.where(served == r_max, r_max, 0))
    known = live > 0
    diff = (live - served)[known]
    return LiveComparison(spec.criterion, spec.q, len(served), int((known & (live == served)).sum()),
                          int((known & (live < served)).sum()), int((~known).sum()),
                          float(diff.mean()) if diff.size else None)
