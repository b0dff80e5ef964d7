"""Looped-model architectures: layer shape, prelude-core-coda split, loop counts, and what they cost.

Preset shapes follow the public Hugging Face configs of Ouro-1.4B/2.6B (ByteDance) and Huginn-0125
(tomg-group-umd, r_max 16 as the CDB paper serves it, arXiv 2608.09444).
"""

from __future__ import annotations

import math
import os
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace

from cdbsim.errors import ConfigError, read_json, require, unknown
from traces.choice import Choice


class LayerStyle(Choice):
    """The block a layer is built as (see :class:`LayerShape`)."""

    OURO = "ouro"
    HUGINN = "huginn"

    @classmethod
    def what(cls) -> str:
        return "layer style"


@dataclass(frozen=True)
class LayerShape:
    """One transformer layer: attention and gated MLP sizes plus the block style, ``ouro`` (sandwich norm, separate
    projections) or ``huginn`` (post-norm, fused qkv with q/k bias, embedding adapter each loop)."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    style: LayerStyle = LayerStyle.OURO

    def __post_init__(self) -> None:
        object.__setattr__(self, "style", LayerStyle.parse(self.style))
        for name in ("hidden", "intermediate", "heads", "kv_heads", "head_dim"):
            require(getattr(self, name) >= 1, f"layer {name} must be >= 1, got {getattr(self, name)}")
        require(self.heads % self.kv_heads == 0,
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @property
    def key(self) -> str:
        """A name for this shape, so latency fits of one layer serve every split that uses it."""
        return f"{self.style}-h{self.hidden}-i{self.intermediate}-a{self.heads}x{self.head_dim}-kv{self.kv_heads}"

    @property
    def params(self) -> int:
        """Parameters of one layer (attention, MLP, 4 norms, Huginn's q/k bias)."""
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        attention = self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden
        qk_bias = (q_out + kv_out) if self.style is LayerStyle.HUGINN else 0
        return attention + 3 * self.hidden * self.intermediate + 4 * self.hidden + qk_bias

    @property
    def kv_bytes_per_slot(self) -> int:
        """Bytes of K and V for one token in one layer slot, at 2 bytes per value (bf16)."""
        return 2 * self.kv_heads * self.head_dim * 2


@dataclass(frozen=True)
class ArchSpec:
    """A looped LM: layer shape, prelude-core-coda split and the loop-depth limits."""

    name: str
    layer: LayerShape
    vocab: int
    prelude: int
    core: int
    coda: int
    r_max: int
    r_min: int = 1
    tied_head: bool = False
    rope_theta: float = 1e6
    norm_eps: float = 1e-6
    dtype_bytes: int = 2
    extras: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        require(self.core >= 1, f"the core needs at least one layer, got {self.core}")
        require(self.prelude >= 0 and self.coda >= 0, "prelude and coda layer counts must be >= 0")
        require(self.vocab >= 1, "vocab must be >= 1")
        require(self.r_max >= 1, f"r_max must be >= 1, got {self.r_max}")
        require(self.r_min >= 1, f"r_min must be >= 1, got {self.r_min}")
        require(self.r_min <= self.r_max, f"r_min ({self.r_min}) must not exceed r_max ({self.r_max})")
        require(self.dtype_bytes >= 1, f"dtype_bytes must be >= 1, got {self.dtype_bytes}")  # sizes KV and weights
        require(self.rope_theta > 0, f"rope_theta must be > 0, got {self.rope_theta}")
        require(self.norm_eps >= 0, f"norm_eps must be >= 0, got {self.norm_eps}")

    @property
    def style(self) -> LayerStyle:
        return self.layer.style

    @property
    def has_adapter(self) -> bool:
        """Huginn-style cores mix the prelude output back in each loop through a 2h -> h adapter."""
        return self.style is LayerStyle.HUGINN

    @property
    def split(self) -> str:
        return f"{self.prelude}-{self.core}-{self.coda}"

    @property
    def adapter_params(self) -> int:
        return 2 * self.layer.hidden * self.layer.hidden if self.has_adapter else 0

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.layer.hidden

    @property
    def head_params(self) -> int:
        """LM-head parameters; a tied head reuses the embedding but still costs its FLOPs."""
        return self.vocab * self.layer.hidden

    @property
    def final_norm_params(self) -> int:
        return self.layer.hidden

    @property
    def prelude_params(self) -> int:
        return self.prelude * self.layer.params

    @property
    def core_params(self) -> int:
        """Parameters applied once per loop: the core layers plus Huginn's adapter."""
        return self.core * self.layer.params + self.adapter_params

    @property
    def coda_params(self) -> int:
        return self.coda * self.layer.params

    @property
    def total_params(self) -> int:
        head = 0 if self.tied_head else self.head_params
        return (self.embedding_params + self.prelude_params + self.core_params + self.coda_params
                + self.final_norm_params + head)

    @property
    def f0(self) -> float:
        """F_0: work paid once per token (prelude, coda, final norm, head), counted in parameters."""
        return float(self.prelude_params + self.coda_params + self.final_norm_params + self.head_params)

    @property
    def fr(self) -> float:
        """F_r: work of one loop of the core, counted in parameters."""
        return float(self.core_params)

    def weight_bytes(self) -> dict[str, int]:
        """Weight bytes one pass of each stage reads (the embedding is a gather, so it reads rows only)."""
        b = self.dtype_bytes
        return {"prelude": self.prelude_params * b, "core": (self.core_params + self.final_norm_params) * b,
                "coda": (self.coda_params + self.final_norm_params + self.head_params) * b}

    def cache_layers(self, layout: KVLayout | str) -> int:
        """Layer slots holding KV for one token: prelude + slots x core + coda."""
        return self.prelude + KVLayout.parse(layout).slots(self.r_max) * self.core + self.coda

    def kv_bytes_per_token(self, layout: KVLayout | str) -> int:
        return self.cache_layers(layout) * self.layer.kv_bytes_per_slot

    def with_split(self, split: str) -> ArchSpec:
        """The same layer shape re-split as ``prelude-core-coda`` (e.g. ``1-4-1``)."""
        try:
            prelude, core, coda = (int(p) for p in split.split("-"))
        except ValueError:
            raise ConfigError(f"split must look like 2-4-2 (prelude-core-coda), got {split!r}") from None
        return replace(self, name=f"{self.name}@{prelude}-{core}-{coda}", prelude=prelude, core=core, coda=coda)

    def with_loops(self, r_max: int | None = None, r_min: int | None = None) -> ArchSpec:
        return replace(self, r_max=r_max if r_max is not None else self.r_max,
                       r_min=r_min if r_min is not None else self.r_min)

    def to_dict(self) -> dict:
        """The JSON form :func:`arch_from_dict` reads (a head size set apart from hidden says so)."""
        data = asdict(self)
        data.pop("extras")
        if self.layer.heads * self.layer.head_dim != self.layer.hidden:
            data["layer"][HEAD_DIM_EXPLICIT] = True
        return data


def _ouro(name: str, layers: int) -> ArchSpec:
    layer = LayerShape(hidden=2048, intermediate=5632, heads=16, kv_heads=16, head_dim=128, style=LayerStyle.OURO)
    return ArchSpec(name=name, layer=layer, vocab=49152, prelude=0, core=layers, coda=0, r_max=4)


PRESETS: dict[str, ArchSpec] = {
    "ouro-1.4b": _ouro("ouro-1.4b", 24),
    "ouro-2.6b": _ouro("ouro-2.6b", 48),
    "huginn-3.5b": ArchSpec(
        name="huginn-3.5b", vocab=65536, prelude=2, core=4, coda=2, r_max=16, tied_head=True, rope_theta=50000.0,
        layer=LayerShape(hidden=5280, intermediate=17920, heads=55, kv_heads=55, head_dim=96, style=LayerStyle.HUGINN)),
}


HEAD_DIM_EXPLICIT = "head_dim_explicit"
"""An architecture file's ``layer`` key saying its heads x head_dim differs from hidden on purpose."""


def head_dim_explicit(arch: ArchSpec) -> bool:
    """Whether ``arch`` sizes its attention heads apart from ``hidden`` on purpose (its file says so)."""
    return bool(arch.extras.get(HEAD_DIM_EXPLICIT, False))


def _typed_fields(cls: type, data: dict, where: str, skip: tuple[str, ...] = ()) -> dict:
    """``data`` checked against dataclass ``cls``'s fields: no unknown or missing keys, types as declared."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls) if f.name not in skip]
    unknown_keys = sorted(set(data) - set(names))
    require(not unknown_keys, f"{where}: unknown key(s) {', '.join(unknown_keys)}; valid keys: {', '.join(names)}")
    missing = [f.name for f in fields(cls) if f.name in names and f.name not in data and f.default is MISSING
               and f.default_factory is MISSING]
    require(not missing, f"{where}: missing key(s) {', '.join(missing)}")
    out = {}
    for name, value in data.items():
        kind = hints[name]
        if kind is int:
            whole = isinstance(value, int) and not isinstance(value, bool)
            require(whole, f"{where}: {name} must be a whole number, got {value!r}")
        elif kind is float:
            number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            require(number, f"{where}: {name} must be a finite number, got {value!r}")
        elif kind is bool:
            require(isinstance(value, bool), f"{where}: {name} must be true or false, got {value!r}")
        elif kind is str or name == "style":
            require(isinstance(value, str), f"{where}: {name} must be text, got {value!r}")
        out[name] = value
    return out


def arch_from_dict(data: dict, source: str = "architecture") -> ArchSpec:
    """An :class:`ArchSpec` from its JSON form (:meth:`ArchSpec.to_dict`); errors name ``source`` and the key. Heads
    x head_dim may differ from hidden only with ``layer.head_dim_explicit: true``."""
    require(isinstance(data, dict), f"{source}: an architecture file holds a JSON object, got {data!r:.60}")
    layer = data.get("layer")
    require(isinstance(layer, dict), f"{source}: layer must be a JSON object of the layer shape, got {layer!r:.60}")
    layer = dict(layer)
    explicit = layer.pop(HEAD_DIM_EXPLICIT, False)
    require(isinstance(explicit, bool), f"{source}: layer.{HEAD_DIM_EXPLICIT} must be true or false")
    shape_fields = _typed_fields(LayerShape, layer, f"{source}: layer")
    arch_fields = _typed_fields(ArchSpec, {k: v for k, v in data.items() if k != "layer"}, source,
                                skip=("layer", "extras"))
    try:
        shape = LayerShape(**shape_fields)
        arch = ArchSpec(layer=shape, **arch_fields, extras={HEAD_DIM_EXPLICIT: True} if explicit else {})
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    require(explicit or shape.heads * shape.head_dim == shape.hidden,
            f"{source}: layer heads x head_dim ({shape.heads} x {shape.head_dim} = {shape.heads * shape.head_dim}) "
            f"differs from hidden ({shape.hidden}); fix one, or add \"{HEAD_DIM_EXPLICIT}\": true to the layer "
            f"if the model sizes its heads apart from hidden")
    return arch


def load_arch(name_or_path: str, split: str | None = None, r_max: int | None = None,
              r_min: int | None = None) -> ArchSpec:
    """A preset by name or an architecture JSON file, optionally re-split or with other loop limits."""
    if name_or_path in PRESETS:
        arch = PRESETS[name_or_path]
    elif name_or_path.endswith(".json") or os.path.isfile(name_or_path):  # any file: read (a bad one is named)
        arch = arch_from_dict(read_json(name_or_path, "architecture file"), name_or_path)
    else:
        raise unknown("architecture", name_or_path, [*PRESETS, "<file>.json"])
    if split:
        arch = arch.with_split(split)
    if r_max is not None or r_min is not None:
        arch = arch.with_loops(r_max, r_min)
    return arch


class KVLayout(Choice):
    """Which KV slot each loop step of a core layer reads and writes."""

    DEPTH = "depth"
    SHARED = "shared"
    FIRST_SHARED = "first-shared"

    @classmethod
    def aliases(cls) -> dict[str, str]:
        return {"depth-indexed": "depth", "first-then-shared": "first-shared", "single": "shared"}

    @classmethod
    def what(cls) -> str:
        return "KV layout"

    def slots(self, r_max: int) -> int:
        """KV slots per core layer for a core looped up to ``r_max`` times."""
        if self is KVLayout.DEPTH:
            return r_max
        if self is KVLayout.SHARED:
            return 1
        return min(2, r_max)

    def slot_of_step(self, step: int, r_max: int) -> int:
        """The slot that 0-based loop ``step`` reads and writes."""
        return min(step, self.slots(r_max) - 1)

    def fill_copies(self, last_step: int, r_max: int) -> int:
        """Slots a token exiting after 0-based ``last_step`` must copy its KV into (per core layer)."""
        slots = self.slots(r_max)
        return slots - 1 - min(last_step, slots - 1)
