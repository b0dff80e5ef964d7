"""A plain per-request decoder, the yardstick the batched, paged executor is tested against: one request at a
time, one dense K/V tensor per cache layer, the layer math written out anew (it shares weights and the start
state's draw, not code).

Semantics the executor must reproduce: prefill (possibly chunked) runs ``r_max`` loops, each writing its step's
slot, and yields output token 0; token ``j >= 1`` runs ``depths[j-1]`` core loops, then an exit after step ``e``
copies slot(e)'s KV into the deeper slots the layout names (last-exited fill); a recompute after preemption (an
:class:`Episode` at ``generated > 0``) drops the KV and prefills prompt + generated tokens at full depth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from cdbsim.model.arch import KVLayout, LayerStyle
from executor.kv_cache import CacheGeometry
from executor.model import LoopedLM

# observer(positions, step, state): the loop state of every chunk row, with step -1 before the first loop
# and step t after loop t (Ouro: after its final norm; Huginn: the raw state, before ln_f)
Observer = Callable[[range, int, torch.Tensor], None]


@dataclass
class Episode:
    """One (re-)prefill of a request: tokens generated before it and the chunk lengths it was run in."""

    generated: int
    chunks: list[int]


@dataclass
class ReferenceOutput:
    tokens: list[int]
    logits: torch.Tensor  # [output_len, vocab], float32
    episodes: list[Episode] = field(default_factory=list)


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float, interleaved: bool) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = (positions.double()[:, None] * inv[None, :]).to(x.device)
    cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    xf = x.float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2).to(x.dtype)
    a, b = xf[..., : d // 2], xf[..., d // 2:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1).to(x.dtype)


class ReferenceDecoder:
    """Decode one request at a time with dense per-slot KV (see the module docstring)."""

    def __init__(self, model: LoopedLM, layout: KVLayout | str) -> None:
        self.model = model
        self.cfg = cfg = model.config
        self.geo = CacheGeometry(cfg.prelude, cfg.core, cfg.coda, cfg.r_max, KVLayout.parse(layout), 0)
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.request_id = 0

    @torch.inference_mode()
    def generate(self, prompt: Sequence[int], output_len: int, depths: Sequence[int],
                 episodes: Sequence[Episode] | None = None, observer: Observer | None = None,
                 request_id: int = 0) -> ReferenceOutput:
        """Greedy tokens and their logits; ``depths[j-1]`` is the executed depth of output token ``j``;
        ``request_id`` keys a random start state (:func:`executor.model.token_states`)."""
        self.request_id = request_id
        episodes = list(episodes) if episodes else [Episode(0, [len(prompt)])]
        by_start = {e.generated: e for e in episodes}
        if 0 not in by_start:
            raise ValueError("the first episode must start at 0 generated tokens")
        tokens = [int(t) for t in prompt]
        shape = (len(prompt) + output_len, self.cfg.kv_heads, self.cfg.head_dim)
        self.k = [self.model.embed.new_zeros(shape) for _ in range(self.geo.layers)]
        self.v = [self.model.embed.new_zeros(shape) for _ in range(self.geo.layers)]
        out_tokens: list[int] = []
        out_logits: list[torch.Tensor] = []
        for g in range(output_len):
            episode = by_start.get(g)
            if episode is not None:
                for t in (*self.k, *self.v):
                    t.zero_()
                if sum(episode.chunks) != len(tokens):
                    raise ValueError(f"episode at {g} covers {sum(episode.chunks)} tokens, expected {len(tokens)}")
                start = 0
                for n in episode.chunks:
                    logits = self._forward(tokens[start:start + n], start, self.cfg.r_max, observer)
                    start += n
            else:
                depth = int(depths[g - 1])
                if not 1 <= depth <= self.cfg.r_max:
                    raise ValueError(f"executed depth {depth} outside [1, {self.cfg.r_max}]")
                logits = self._forward(tokens[-1:], len(tokens) - 1, depth, observer)
            token = int(torch.argmax(logits))
            out_tokens.append(token)
            out_logits.append(logits)
            tokens.append(token)
        return ReferenceOutput(out_tokens, torch.stack(out_logits) if out_logits else torch.zeros(0), episodes)

    def _forward(self, ids: list[int], start: int, depth: int, observer: Observer | None) -> torch.Tensor:
        """Run ``ids`` (positions ``start ..``) through the model; the logits of the last position."""
        cfg, m, geo = self.cfg, self.model, self.geo
        positions = range(start, start + len(ids))
        x = m.embed[torch.as_tensor(ids, device=m.device)]
        if cfg.style is LayerStyle.HUGINN:
            x = x * math.sqrt(cfg.hidden)
        for i, layer in enumerate(m.prelude_layers):
            x = self._layer(layer, x, start, i)  # prelude layer i is cache layer i
        e = x
        index = torch.arange(start, start + len(ids), device=m.device)
        s = m.initial_state(e, torch.full_like(index, self.request_id), index)
        if observer is not None:
            observer(positions, -1, s)
        for step in range(depth):
            if cfg.style is LayerStyle.HUGINN:
                s = torch.cat((s, e), dim=-1) @ m.adapter.T
            for i, layer in enumerate(m.core_layers):
                s = self._layer(layer, s, start, geo.core_layer(geo.slot_of_step(step), i))
            if cfg.style is LayerStyle.OURO:
                s = _norm(s, m.final_norm, cfg.norm_eps)
            if observer is not None:
                observer(positions, step, s)
        last_slot = geo.slot_of_step(depth - 1)
        for extra in range(1, geo.fill_count(depth - 1) + 1):  # last-exited fill
            for i in range(cfg.core):
                src, dst = geo.core_layer(last_slot, i), geo.core_layer(last_slot + extra, i)
                self.k[dst][start:start + len(ids)] = self.k[src][start:start + len(ids)]
                self.v[dst][start:start + len(ids)] = self.v[src][start:start + len(ids)]
        h = s
        if cfg.style is LayerStyle.HUGINN:
            h = _norm(h, m.final_norm, cfg.norm_eps)
        for i, layer in enumerate(m.coda_layers):
            h = self._layer(layer, h, start, geo.coda_layer(i))
        if cfg.style is LayerStyle.HUGINN or cfg.coda:
            h = _norm(h, m.final_norm, cfg.norm_eps)
        return (h[-1] @ m.head_weight.T).float()

    def _layer(self, w, x: torch.Tensor, start: int, cache_layer: int) -> torch.Tensor:
        cfg = self.cfg
        n, eps = x.shape[0], cfg.norm_eps
        hq, hk, d = cfg.heads, cfg.kv_heads, cfg.head_dim
        q, k, v = (_norm(x, w.norm1, eps) @ w.wqkv.T).split((hq * d, hk * d, hk * d), dim=-1)
        q, k, v = q.reshape(n, hq, d), k.reshape(n, hk, d), v.reshape(n, hk, d)
        if w.q_bias is not None:
            q, k = q + w.q_bias.view(hq, d), k + w.k_bias.view(hk, d)
        pos = torch.arange(start, start + n)
        interleaved = cfg.style is LayerStyle.HUGINN
        q, k = _rope(q, pos, cfg.rope_theta, interleaved), _rope(k, pos, cfg.rope_theta, interleaved)
        self.k[cache_layer][start:start + n] = k
        self.v[cache_layer][start:start + n] = v
        keys = self.k[cache_layer][: start + n].repeat_interleave(hq // hk, dim=1)
        values = self.v[cache_layer][: start + n].repeat_interleave(hq // hk, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), keys.float()) / math.sqrt(d)
        causal = torch.arange(start + n)[None, :] <= pos[:, None]
        scores = scores.masked_fill(~causal.to(scores.device)[None], float("-inf"))
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values.float()).to(x.dtype).reshape(n, hq * d)
        a = o @ w.wo.T
        if cfg.style is LayerStyle.OURO:
            x = x + _norm(a, w.norm2, eps)
            gate, up = (_norm(x, w.norm3, eps) @ w.w_gate_up.T).chunk(2, dim=-1)
            return x + _norm((torch.nn.functional.silu(gate) * up) @ w.w_down.T, w.norm4, eps)
        x = _norm(a + x, w.norm2, eps)
        gate, up = (_norm(x, w.norm3, eps) @ w.w_gate_up.T).chunk(2, dim=-1)
        return _norm((torch.nn.functional.silu(gate) * up) @ w.w_down.T + x, w.norm4, eps)
