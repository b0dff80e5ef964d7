"""A looped (recurrent-depth) transformer built from an :class:`~cdbsim.model.arch.ArchSpec`: four RMSNorms per layer,
a gated-SiLU MLP, no linear biases, in two block styles.

``ouro`` (ByteDance Ouro): ``x = x + norm2(attn(norm1(x))); x = x + norm4(mlp(norm3(x)))``; rotate-half RoPE,
untied head, the final norm after every loop (the next loop's input and what the exit gate ``Linear(h, 1)`` reads).

``huginn`` (Huginn-0125): ``x = norm2(attn(norm1(x)) + x); x = norm4(mlp(norm3(x)) + x)``; q/k bias before
interleaved-pair RoPE, embedding scaled by sqrt(h), an adapter ``Linear(2h, h)`` on ``concat(state, prelude
output)`` every loop, ``ln_f`` / coda / ``ln_f`` after the loop, tied head. The loop starts from zeros, or with
``state_init="random"`` as the authors' ``initialize_state`` does: every token its own truncated-normal vector (std
sqrt(2/5) after the embedding scale, cut at 3 std), here drawn from ``state_seed``, the request and the position
(:func:`token_states`), so a run is reproducible and a token starts from the same state in any batch.

Weights are fused (``wqkv``; ``w_gate_up``, gate first); :mod:`executor.loader` maps public names onto them. Layers
call the attention context they are given (:mod:`executor.attention`) with their cache layer; they know no pages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from cdbsim.latency import gpu_work
from cdbsim.model.arch import ArchSpec, LayerStyle
from executor.ops import Ops

STATE_INITS = ("zeros", "random")
STATE_SEEDS = range(1 << 32)  # a start-state seed is a 32-bit hash key
STATE_CUT = 3.0  # the random start state is a normal truncated at this many standard deviations
_MASK = 0xFFFFFFFF


def chained_rows(config: ModelConfig, backend: str) -> int:
    """The batch size up to which the triton backend runs layers on the chained path (:meth:`Layer.forward_fused`)
    by default (:func:`cdbsim.latency.gpu_work.chained_rows`); 0 for the torch backend."""
    return gpu_work.chained_rows(config.hidden) if backend == "triton" else 0


def default_ops(config: ModelConfig, backend: str) -> Ops:
    """``backend``'s primitives with the model's default chained path and, on triton, the few-row matmul
    (:mod:`executor.few_rows`) up to :func:`cdbsim.latency.gpu_work.few_rows` rows."""
    few = gpu_work.few_rows(config.hidden) if backend == "triton" else 0
    return Ops(backend, fuse_rows=chained_rows(config, backend), few_rows=few)


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of one looped LM (derived from an ArchSpec by :meth:`from_arch`)."""

    style: LayerStyle
    vocab: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    prelude: int
    core: int
    coda: int
    r_max: int
    tied_head: bool
    rope_theta: float
    norm_eps: float
    init_std: float = 0.02
    state_init: str = "zeros"
    state_seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "style", LayerStyle.parse(self.style))
        if self.state_init not in STATE_INITS:
            raise ValueError(f"state_init must be one of {STATE_INITS}, got {self.state_init!r}")
        if self.state_seed not in STATE_SEEDS:
            raise ValueError(f"state_seed must be in [0, 2**32), got {self.state_seed}")
        if self.head_dim % 2:
            raise ValueError("RoPE needs an even head_dim")

    @classmethod
    def from_arch(cls, arch: ArchSpec, **overrides: object) -> ModelConfig:
        layer = arch.layer
        config = cls(style=layer.style, vocab=arch.vocab, hidden=layer.hidden, intermediate=layer.intermediate,
                     heads=layer.heads, kv_heads=layer.kv_heads, head_dim=layer.head_dim, prelude=arch.prelude,
                     core=arch.core, coda=arch.coda, r_max=arch.r_max, tied_head=arch.tied_head,
                     rope_theta=arch.rope_theta, norm_eps=arch.norm_eps)
        return replace(config, **overrides) if overrides else config

    @property
    def sandwich(self) -> bool:
        return self.style is LayerStyle.OURO

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden) if self.style is LayerStyle.HUGINN else 1.0

    @property
    def state_std(self) -> float:
        """Standard deviation of the random start state before truncation: the authors' init std sqrt(2 / (5 h))
        times the embedding scale."""
        return math.sqrt(2 / (5 * self.hidden)) * self.embed_scale

    @property
    def random_state(self) -> bool:
        """Whether each token's loop starts from its own random state (Huginn with ``state_init="random"``)."""
        return self.style is LayerStyle.HUGINN and self.state_init == "random"

    @property
    def start_state(self) -> str:
        """Where the loop starts, as a run's metadata says: ``prelude output`` (Ouro), ``zeros`` or
        ``random (seed N)``."""
        if self.style is LayerStyle.OURO:
            return "prelude output"
        return f"random (seed {self.state_seed})" if self.random_state else "zeros"


class Layer(nn.Module):
    """One transformer layer's weights (fused) and its forward for either style."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i, d = config.hidden, config.intermediate, config.head_dim
        self.wqkv = nn.Parameter(torch.empty((config.heads + 2 * config.kv_heads) * d, h), requires_grad=False)
        self.wo = nn.Parameter(torch.empty(h, config.heads * d), requires_grad=False)
        self.w_gate_up = nn.Parameter(torch.empty(2 * i, h), requires_grad=False)
        self.w_down = nn.Parameter(torch.empty(h, i), requires_grad=False)
        for name in ("norm1", "norm2", "norm3", "norm4"):
            setattr(self, name, nn.Parameter(torch.ones(h), requires_grad=False))
        if config.style is LayerStyle.HUGINN:
            self.q_bias = nn.Parameter(torch.zeros(config.heads * d), requires_grad=False)
            self.k_bias = nn.Parameter(torch.zeros(config.kv_heads * d), requires_grad=False)
        else:
            self.q_bias = self.k_bias = None

    def forward(self, x: torch.Tensor, h: torch.Tensor, attn, layer: int, next_norm: torch.Tensor | None,
                ops: Ops, eps: float, sandwich: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``h`` is ``norm1(x)``; returns the new residual and ``next_norm`` of it (None without one)."""
        o = attn(ops.linear(h, self.wqkv), layer, self.q_bias, self.k_bias)
        x, h = ops.residual_norm(ops.linear(o, self.wo), x, self.norm2, self.norm3, eps, sandwich)
        m = ops.linear(ops.linear_swiglu(h, self.w_gate_up), self.w_down)
        return ops.residual_norm(m, x, self.norm4, next_norm, eps, sandwich)

    def forward_fused(self, x: torch.Tensor, pending: tuple[torch.Tensor, torch.Tensor] | None, attn, layer: int,
                      ops: Ops, eps: float, sandwich: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The layer as four skinny matmuls with norms, residual adds and SwiGLU fused in. ``pending``: the previous
        layer's MLP output and post-norm weight, not yet added to ``x`` (None at a stage's start); returns its own."""
        if pending is None:
            qkv = ops.gemv_rmsnorm(x, self.norm1, eps, self.wqkv)
        else:
            qkv, x = ops.gemv_residual(pending[0], x, pending[1], self.norm1, eps, sandwich, self.wqkv)
        o = attn(qkv, layer, self.q_bias, self.k_bias)
        act, x = ops.gemv_residual(ops.gemv(o, self.wo), x, self.norm2, self.norm3, eps, sandwich,
                                   self.w_gate_up, swiglu=True)
        return x, (ops.gemv(act, self.w_down), self.norm4)


class LoopedLM(nn.Module):
    """Embedding, prelude layers, looped core, coda layers and head, as stage functions that take an attention
    context and their first cache layer (the engine decides pages, slots and batching)."""

    def __init__(self, config: ModelConfig, ops: Ops | None = None) -> None:
        super().__init__()
        self.config = config
        self.ops = ops or Ops("torch")
        h = config.hidden
        self.embed = nn.Parameter(torch.empty(config.vocab, h), requires_grad=False)
        self.prelude_layers = nn.ModuleList(Layer(config) for _ in range(config.prelude))
        self.core_layers = nn.ModuleList(Layer(config) for _ in range(config.core))
        self.coda_layers = nn.ModuleList(Layer(config) for _ in range(config.coda))
        self.final_norm = nn.Parameter(torch.ones(h), requires_grad=False)
        self.head = None if config.tied_head else nn.Parameter(torch.empty(config.vocab, h), requires_grad=False)
        if config.style is LayerStyle.HUGINN:
            self.adapter = nn.Parameter(torch.empty(h, 2 * h), requires_grad=False)
            self.gate_w = self.gate_b = None
        else:
            self.adapter = None
            self.gate_w = nn.Parameter(torch.empty(1, h), requires_grad=False)
            self.gate_b = nn.Parameter(torch.zeros(1), requires_grad=False)

    @classmethod
    def empty(cls, config: ModelConfig, ops: Ops | None = None, *, device: torch.device | str = "cpu",
              dtype: torch.dtype | None = None) -> LoopedLM:
        """Uninitialised weights (float32 on CPU, bf16 on GPU by default)."""
        device = torch.device(device)
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        with torch.device("meta"):
            model = cls(config, ops)
        return model.to_empty(device=device).to(dtype)

    @classmethod
    def random(cls, config: ModelConfig, *, seed: int = 0, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None, ops: Ops | None = None) -> LoopedLM:
        """Random weights (normal, std ``init_std``; norms 1), float32 on CPU and bf16 on GPU by default."""
        model = cls.empty(config, ops, device=device, dtype=dtype)
        gen = torch.Generator(device=model.device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, config.init_std, generator=gen)
        return model

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed if self.head is None else self.head

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def fused(self, x: torch.Tensor) -> bool:
        """Whether a batch this small runs the chained skinny-matmul path (:meth:`Layer.forward_fused`)."""
        return x.shape[0] <= self.ops.fuse_rows

    def run_layers(self, layers: nn.ModuleList, x: torch.Tensor, attn, first_layer: int,
                   tail_norm: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Apply ``layers`` (cache layers ``first_layer ..``); also returns ``tail_norm(x)`` if given."""
        cfg, ops = self.config, self.ops
        with ops.pdl_scope(x.shape[0]):
            if not len(layers):
                return x, (ops.rms_norm(x, tail_norm, cfg.norm_eps) if tail_norm is not None else None)
            if self.fused(x):
                pending = None
                for i, layer in enumerate(layers):
                    x, pending = layer.forward_fused(x, pending, attn, first_layer + i, ops, cfg.norm_eps,
                                                     cfg.sandwich)
                return ops.residual_norm(pending[0], x, pending[1], tail_norm, cfg.norm_eps, cfg.sandwich)
            h = ops.rms_norm(x, layers[0].norm1, cfg.norm_eps)
            for i, layer in enumerate(layers):
                nxt = layers[i + 1].norm1 if i + 1 < len(layers) else tail_norm
                x, h = layer(x, h, attn, first_layer + i, nxt, ops, cfg.norm_eps, cfg.sandwich)
            return x, h

    def prelude(self, ids: torch.Tensor, attn) -> torch.Tensor:
        """Embedding and prelude layers (cache layers 0 .. P-1): the prelude output ``e``."""
        x = F.embedding(ids, self.embed)
        x = x * self.config.embed_scale if self.config.embed_scale != 1.0 else x
        return self.run_layers(self.prelude_layers, x, attn, 0, None)[0]

    def initial_state(self, e: torch.Tensor, request: torch.Tensor | None = None,
                      position: torch.Tensor | None = None) -> torch.Tensor:
        """Loop state before step 0 of the tokens whose prelude output is ``e``: ``e`` itself (Ouro), zeros or, with
        ``state_init="random"``, each token's own draw (:func:`token_states`; needs each row's ``request`` key and
        ``position``)."""
        cfg = self.config
        if cfg.style is LayerStyle.OURO:
            return e
        if not cfg.random_state:
            return torch.zeros_like(e)
        if request is None or position is None:
            raise ValueError("a random start state needs each token's request and position")
        return token_states(cfg, request, position, e.dtype)

    def core_step(self, s: torch.Tensor, e: torch.Tensor | None, attn, first_layer: int) -> torch.Tensor:
        """One loop of the core: Huginn mixes ``e`` in through the adapter; Ouro ends with the final norm."""
        if self.adapter is None:
            return self.run_layers(self.core_layers, s, attn, first_layer, self.final_norm)[1]
        s = torch.cat((s, e), dim=-1)
        s = self.ops.gemv(s, self.adapter) if self.fused(s) else self.ops.linear(s, self.adapter)
        return self.run_layers(self.core_layers, s, attn, first_layer, None)[0]

    def coda(self, s: torch.Tensor, attn, first_layer: int) -> torch.Tensor:
        """From the final loop state to the normed hidden state the head reads."""
        cfg, ops = self.config, self.ops
        if cfg.style is LayerStyle.HUGINN:
            s = ops.rms_norm(s, self.final_norm, cfg.norm_eps)
        elif not len(self.coda_layers):
            return s  # Ouro's loop already ended with the final norm
        return self.run_layers(self.coda_layers, s, attn, first_layer, self.final_norm)[1]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The head's float32 logits: chained for single rows only (at two rows the few-row matmul is faster)."""
        w = self.head_weight
        return (self.ops.gemv(h, w) if h.shape[0] == 1 and self.fused(h) else self.ops.linear(h, w)).float()

    def gate_logit(self, s: torch.Tensor) -> torch.Tensor:
        """Ouro's exit-gate logit of a (normed) loop state, ``[N]``."""
        if self.gate_w is None:
            raise ValueError("only Ouro-style models have an exit gate")
        return (F.linear(s, self.gate_w, self.gate_b)).float().squeeze(-1)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` of 32-bit values held in int64, with no intermediate past 2**49 (no signed overflow)."""
    low = x * (c & 0xFFFF)
    high = ((x * (c >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser, elementwise on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


STATE_CHUNK = 1 << 21  # elements of the int64 hash drawn at a time (16 MiB), so a long prefill stays small


def token_states(config: ModelConfig, request: torch.Tensor, position: torch.Tensor,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random start states ``[N, hidden]`` in ``dtype`` of the tokens at ``position`` of ``request`` (int tensors of
    ``N``): a normal of std :attr:`ModelConfig.state_std` truncated at ``STATE_CUT`` std (inverse CDF of a
    uniform, as ``torch.nn.init.trunc_normal_``), each element a hash of (``state_seed``, request, position,
    element). Counter-based: a token's draw does not depend on its batch, the hash is the same on every device,
    and it runs inside a CUDA graph."""
    device = position.device
    key = _mix32(torch.full_like(position, config.state_seed, dtype=torch.int64) ^ 0x3C6EF372)
    key = _mix32(key ^ (request.long() & _MASK))
    key = _mix32((key + (position.long() & _MASK)) & _MASK)
    dims = _mix32((torch.arange(config.hidden, device=device, dtype=torch.int64) + 0x9E3779B9) & _MASK)
    edge = math.erf(STATE_CUT / math.sqrt(2))
    out = torch.empty((key.shape[0], config.hidden), device=device, dtype=dtype)
    rows = max(1, STATE_CHUNK // config.hidden)
    for start in range(0, key.shape[0], rows):
        bits = _mix32(key[start: start + rows, None] ^ dims[None, :])
        u = ((bits >> 8).float() + 0.5) * 2.0 ** -24  # 24 random bits, in (0, 1)
        z = torch.erfinv((2 * u - 1) * edge) * math.sqrt(2)
        out[start: start + rows] = z.clamp(-STATE_CUT, STATE_CUT) * config.state_std
    return out
