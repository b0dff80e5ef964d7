"""What each stage costs, as a sum of measured components: the one table the latency model and calibration share.

For a model with ``P`` prelude, ``C`` core and ``D`` coda layers looped up to ``r_max`` times::

    prelude  = prelude0 + P layer
    core     = core1 + (C - 1) layer                      (+ kv_copy per last-exited fill copy and core layer)
    coda     = coda0 + D layer
    decode   = prelude0 + (P + D) layer + r_max core1 + r_max (C - 1) layer + coda0      (the CB fused step)
    prefill  = prefill1 + (P + r_max C + D - 1) prefill_layer + (r_max - 1) adapter      (adapter: Huginn)

``host`` and ``meta_copy`` are per launch, added by :mod:`cdbsim.latency.model`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cdbsim.model.arch import ArchSpec, LayerStyle
from cdbsim.serving.launch import Stage
from traces.choice import Choice


class Component(Choice):
    """A measured piece of work; its profile key adds the shape it was measured at (:meth:`key`)."""

    LAYER = "layer"                    # one more decode layer: batch tokens, (query, key) pairs attended
    CORE1 = "core1"                    # a one-layer core step: the layer, adapter, loop norm and glue
    PRELUDE0 = "prelude0"              # embedding and the stage's glue
    CODA0 = "coda0"                    # final norm, LM head, greedy sampling and glue
    PREFILL_LAYER = "prefill_layer"    # one more prefill layer: prompt tokens, causal pairs, packed prompts
    PREFILL1 = "prefill1"              # a one-layer, one-loop prefill with embedding, head and sampling
    ADAPTER = "adapter"                # Huginn's adapter (2h -> h) applied at each loop
    KV_COPY = "kv_copy"                # one (token, slot) copy of the last-exited fill, per core layer
    HOST = "host"                      # the host's work per launch as served, against items
    META_COPY = "meta_copy"            # a launch's metadata copy to the device, against bytes

    def key(self, arch: ArchSpec | None) -> str:
        """The component's name in a profile for ``arch``: ``layer/<shape>``, ``coda0/h<hidden>-v<vocab>``..."""
        if self in (Component.HOST, Component.META_COPY):  # one per device, whatever the model
            return self.value
        shape, h, v = arch.layer, arch.layer.hidden, arch.vocab
        if self in _BY_SHAPE:
            return f"{self.value}/{shape.key}"
        if self is Component.PREFILL1:
            return f"{self.value}/{shape.key}-v{v}"
        if self is Component.CODA0:
            return f"{self.value}/h{h}-v{v}"
        return f"{self.value}/h{h}"  # prelude0, adapter


_BY_SHAPE = frozenset({Component.LAYER, Component.CORE1, Component.PREFILL_LAYER, Component.KV_COPY})
# what a measured profile predicts from its points (its time bends with the batch)
_INTERPOLATED = frozenset({Component.LAYER, Component.CORE1, Component.PRELUDE0, Component.CODA0})


@dataclass(frozen=True)
class Term:
    """``count(arch)`` of ``component`` in a stage, for layers of the given styles."""

    component: Component
    count: Callable[[ArchSpec], int]
    styles: frozenset[LayerStyle] = frozenset(LayerStyle)


def _one(_: ArchSpec) -> int:
    return 1


RECIPES: dict[Stage, tuple[Term, ...]] = {
    Stage.PRELUDE: (Term(Component.PRELUDE0, _one), Term(Component.LAYER, lambda a: a.prelude)),
    Stage.CORE: (Term(Component.CORE1, _one), Term(Component.LAYER, lambda a: a.core - 1)),
    Stage.CODA: (Term(Component.CODA0, _one), Term(Component.LAYER, lambda a: a.coda)),
    Stage.DECODE: (Term(Component.PRELUDE0, _one), Term(Component.LAYER, lambda a: a.prelude + a.coda),
                   Term(Component.CORE1, lambda a: a.r_max),
                   Term(Component.LAYER, lambda a: a.r_max * (a.core - 1)), Term(Component.CODA0, _one)),
    Stage.PREFILL: (Term(Component.PREFILL1, _one),
                    Term(Component.PREFILL_LAYER, lambda a: a.prelude + a.r_max * a.core + a.coda - 1),
                    Term(Component.ADAPTER, lambda a: a.r_max - 1, frozenset({LayerStyle.HUGINN}))),
}
PER_LAUNCH = (Component.KV_COPY, Component.HOST)  # needed besides the stage sums; META_COPY is optional


def recipe(stage: Stage, arch: ArchSpec) -> list[tuple[Component, int]]:
    """``(component, count)`` of ``stage`` for ``arch`` in table order (other styles' left out, zero counts kept)."""
    return [(t.component, t.count(arch)) for t in RECIPES[stage] if arch.style in t.styles]


def components_for(arch: ArchSpec) -> list[str]:
    """Profile keys of every component a profile needs to predict ``arch`` (whole-model stages are optional)."""
    needed = {c for stage in RECIPES for c, _ in recipe(stage, arch)} | set(PER_LAUNCH)
    return [c.key(arch) for c in Component if c in needed]  # in the enum's order: the layer first


def model_stage_name(arch: ArchSpec, stage: Stage) -> str:
    """A stage measured on this very model; where present it predicts the stage instead of the recipe."""
    return f"{stage.value}/{arch.name}-{arch.split}-r{arch.r_max}"


def kind_of(name: str) -> Component | Stage | None:
    """What a profile key measures: a component, a stage measured whole, or None (an unknown prefix)."""
    prefix = name.split("/", 1)[0]
    for choice in (Component, Stage):
        try:
            return choice(prefix)
        except ValueError:
            continue
    return None


def interpolated(name: str) -> bool:
    """Whether a measured profile predicts the fit ``name`` from its points (decode-type components and stages)."""
    kind = kind_of(name)
    if isinstance(kind, Stage):
        return kind is not Stage.PREFILL
    return kind in _INTERPOLATED


def fitted_on_differences(name: str) -> bool:
    """Measured as a difference of two steps (can be zero), so fitted on plain rather than relative residuals."""
    return kind_of(name) is Component.KV_COPY
