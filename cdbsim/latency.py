"""Stage latencies from component fits: what one launch costs on the device and on the host.

Every stage is a sum of components (see :mod:`cdbsim.profile`), so each stage's time is linear in the
launch's padded batch ``B``, its attended context ``C`` and, for core launches, its KV copies::

    prelude  = embed + P layer + stage/prelude
    core     = C_l layer + adapter + stage/core  (+ kv_copy per last-exited fill copy and core layer)
    coda     = D layer + head + stage/coda
    decode   = embed + (P + r_max C_l + D) layer + r_max adapter + head + stage/decode   (CB fused step)
    prefill  = embed + (P + r_max C_l + D) prefill_layer + r_max adapter + stage/prefill (+ head per
               finished prompt)

The analytic *roofline* profile (:func:`roofline_profile`) fills the components from a device's memory
bandwidth, matmul rate and per-kernel launch cost, so a user can ask what a GPU with other figures would
do before any measurement exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdbsim.arch import ArchSpec, LayerShape
from cdbsim.bounds import saturation_batch
from cdbsim.errors import ConfigError
from cdbsim.launch import STAGES, Launch, Stage
from cdbsim.profile import Fit, Profile


# ----- component names ---------------------------------------------------------------------------
def layer_name(shape: LayerShape) -> str:
    return f"layer/{shape.key}"


def prefill_layer_name(shape: LayerShape) -> str:
    return f"prefill_layer/{shape.key}"


def kv_copy_name(shape: LayerShape) -> str:
    return f"kv_copy/{shape.key}"


def adapter_name(hidden: int) -> str:
    return f"adapter/h{hidden}"


def embed_name(hidden: int) -> str:
    return f"embed/h{hidden}"


def head_name(hidden: int, vocab: int) -> str:
    return f"head/h{hidden}-v{vocab}"


def stage_name(stage: Stage) -> str:
    return f"stage/{stage.value}"


HOST = "host"


def components_for(arch: ArchSpec) -> list[str]:
    """The component fits a profile needs to predict ``arch``."""
    h = arch.layer.hidden
    names = [layer_name(arch.layer), prefill_layer_name(arch.layer), kv_copy_name(arch.layer), embed_name(h),
             head_name(h, arch.vocab), HOST, *(stage_name(s) for s in STAGES)]
    if arch.has_adapter:
        names.append(adapter_name(h))
    return names


# ----- the analytic roofline ---------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceSpec:
    """Figures of a device for the roofline profile; defaults are measured H200 numbers
    (reference/h200-notes.md: ~4.3 TB/s copy bandwidth, ~790 TFLOP/s bf16 matmul)."""

    name: str = "NVIDIA H200"
    bandwidth: float = 4.3e12           # bytes/s
    matmul_flops: float = 7.9e14        # FLOP/s
    launch_s: float = 2.5e-6            # per kernel inside a CUDA graph
    memory_bytes: float = 141e9
    attention_efficiency: float = 0.5   # share of matmul rate prefill attention reaches
    host_launch_s: float = 30e-6        # host: plan + prepare + replay one launch
    host_item_s: float = 0.3e-6         # host: per item planned

    def as_dict(self) -> dict:
        return {"name": self.name, "memory_bytes": self.memory_bytes, "bandwidth": self.bandwidth,
                "matmul_flops": self.matmul_flops, "launch_s": self.launch_s,
                "attention_efficiency": self.attention_efficiency, "host_launch_s": self.host_launch_s,
                "host_item_s": self.host_item_s}


H200 = DeviceSpec()
KERNELS_PER_LAYER = 9


def roofline_components(arch: ArchSpec, device: DeviceSpec) -> dict[str, Fit]:
    """Analytic fits: a weight-read floor, matmul work per token, and KV bytes per attended token."""
    shape, bw, flops, launch, b = arch.layer, device.bandwidth, device.matmul_flops, device.launch_s, \
        arch.dtype_bytes
    h, v = shape.hidden, arch.vocab
    act_bytes = (10 * h + 3 * shape.intermediate) * b
    attn_flops_per_pair = 4 * shape.heads * shape.head_dim
    comps = {
        layer_name(shape): Fit(delta=shape.params * b / bw + KERNELS_PER_LAYER * launch,
                               gamma=2 * shape.params / flops + act_bytes / bw,
                               alpha=shape.kv_bytes_per_slot / bw),
        prefill_layer_name(shape): Fit(delta=shape.params * b / bw + KERNELS_PER_LAYER * launch,
                                       gamma=2 * shape.params / flops + act_bytes / bw,
                                       alpha=attn_flops_per_pair / (flops * device.attention_efficiency)),
        kv_copy_name(shape): Fit(delta=launch, gamma=2 * shape.kv_bytes_per_slot / bw),
        adapter_name(h): Fit(delta=2 * h * h * b / bw + launch, gamma=4 * h * h / flops),
        embed_name(h): Fit(delta=launch, gamma=2 * h * b / bw),
        head_name(h, v): Fit(delta=v * h * b / bw + 3 * launch, gamma=2 * v * h / flops + 2 * v * 4 / bw),
        HOST: Fit(delta=device.host_launch_s, gamma=device.host_item_s),
    }
    for stage in STAGES:
        comps[stage_name(stage)] = Fit(delta=3 * launch)
    return comps


def roofline_profile(arch: ArchSpec, device: DeviceSpec = H200) -> Profile:
    """An analytic profile of ``arch`` on ``device`` (no measurement)."""
    name = "h200-roofline" if device == H200 else f"roofline-{device.bandwidth / 1e12:g}TBps"
    return Profile(name=name, kind="roofline", device=device.as_dict(),
                   components=roofline_components(arch, device),
                   notes="analytic: weight bytes / bandwidth + kernels x launch cost; matmul FLOPs / rate "
                         "per token; KV bytes / bandwidth per attended token")


def constant_profile(stage_seconds: dict[Stage, float] | float, host_s: float = 0.0,
                     host_item_s: float = 0.0) -> Profile:
    """Every launch of a stage takes a fixed time, whatever its batch (for hand-checkable runs)."""
    per_stage = stage_seconds if isinstance(stage_seconds, dict) else dict.fromkeys(STAGES, stage_seconds)
    comps = {stage_name(s): Fit(delta=per_stage.get(s, 0.0)) for s in STAGES}
    comps[HOST] = Fit(delta=host_s, gamma=host_item_s)
    return Profile(name="constant", kind="constant", device={"name": "constant-latency model"},
                   components=comps)


# ----- per-stage costs ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StageCost:
    """``t = delta + gamma B + alpha C + copy_delta [copies > 0] + copy x copies + sample terms``."""

    delta: float = 0.0
    gamma: float = 0.0
    alpha: float = 0.0
    copy_delta: float = 0.0
    copy: float = 0.0
    sample_delta: float = 0.0
    sample: float = 0.0

    def __call__(self, batch: float, context: float = 0.0, copies: int = 0, samples: int = 0) -> float:
        t = self.delta + self.gamma * batch + self.alpha * context
        if copies:
            t += self.copy_delta + self.copy * copies
        if samples:
            t += self.sample_delta + self.sample * samples
        return t


def _sum(*terms: tuple[float, Fit]) -> tuple[float, float, float]:
    return (sum(k * f.delta for k, f in terms), sum(k * f.gamma for k, f in terms),
            sum(k * f.alpha for k, f in terms))


class LatencyModel:
    """Device and host time of each launch of ``arch`` under ``profile``.

    A profile that lacks a component ``arch`` needs is refused; with ``force`` the missing ones come
    from the roofline of the profile's device figures (or the H200's).
    """

    def __init__(self, arch: ArchSpec, profile: Profile, force: bool = False) -> None:
        self.arch = arch
        self.profile = profile
        comps = dict(profile.components)
        if profile.kind != "constant":
            missing = [n for n in components_for(arch) if n not in comps]
            if missing and not force:
                raise ConfigError(
                    f"profile {profile.name} has no measurement of {', '.join(missing[:3])}"
                    f"{' ...' if len(missing) > 3 else ''} (it was made for another device or shape); "
                    "calibrate this shape, use --profile roofline, or pass --force to fill the gaps from "
                    "the roofline")
            if missing:
                device = DeviceSpec(**{k: v for k, v in profile.device.items()
                                       if k in DeviceSpec.__dataclass_fields__})
                roof = roofline_components(arch, device)
                comps.update({n: roof[n] for n in missing})
        zero = Fit(delta=0.0)

        def get(name: str) -> Fit:
            return comps.get(name, zero)

        h, a = arch.layer.hidden, arch
        layer, pre_layer = get(layer_name(a.layer)), get(prefill_layer_name(a.layer))
        adapter = get(adapter_name(h)) if a.has_adapter else zero
        embed, head, copy = get(embed_name(h)), get(head_name(h, a.vocab)), get(kv_copy_name(a.layer))
        full = a.prelude + a.r_max * a.core + a.coda
        costs = {
            Stage.PRELUDE: _sum((1, embed), (a.prelude, layer), (1, get(stage_name(Stage.PRELUDE)))),
            Stage.CORE: _sum((a.core, layer), (1, adapter), (1, get(stage_name(Stage.CORE)))),
            Stage.CODA: _sum((a.coda, layer), (1, head), (1, get(stage_name(Stage.CODA)))),
            Stage.DECODE: _sum((1, embed), (full, layer), (a.r_max, adapter), (1, head),
                               (1, get(stage_name(Stage.DECODE)))),
            Stage.PREFILL: _sum((1, embed), (full, pre_layer), (a.r_max, adapter),
                                (1, get(stage_name(Stage.PREFILL)))),
        }
        self.costs = {s: StageCost(*costs[s]) for s in STAGES}
        self.costs[Stage.CORE] = StageCost(*costs[Stage.CORE], copy_delta=copy.delta,
                                           copy=copy.gamma * a.core)
        self.costs[Stage.PREFILL] = StageCost(*costs[Stage.PREFILL], sample_delta=head.delta,
                                              sample=head.gamma)
        self.host = get(HOST)

    def launch_time(self, launch: Launch) -> float:
        """Device seconds of ``launch``."""
        cost = self.costs[launch.stage]
        if launch.stage is Stage.PREFILL:
            return cost(launch.padded, launch.context, samples=sum(launch.finishes))
        return cost(launch.padded, launch.context, launch.kv_copies)

    def host_time(self, launch: Launch) -> float:
        """Host seconds to plan, prepare and launch ``launch``."""
        return self.host.delta + self.host.gamma * len(launch.requests)

    def saturation_batch(self, context_len: float, stage: Stage = Stage.CORE) -> float:
        """B*(L) of a stage: the batch at which the weight-read floor stops dominating."""
        cost = self.costs[stage]
        return saturation_batch(cost.delta, cost.gamma, cost.alpha, context_len)


def resolve_profile_for(arch: ArchSpec, profile: Profile | str | None, device: DeviceSpec = H200) -> Profile:
    """``profile`` itself, or the roofline of ``device`` when it is None or ``"roofline"``."""
    if profile is None or profile == "roofline":
        return roofline_profile(arch, device)
    if isinstance(profile, str):
        raise ConfigError(f"unknown profile {profile!r}")
    return profile
