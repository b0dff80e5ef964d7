"""Stage latencies from component fits: what one launch costs on the device and on the host.

A stage is a sum of components (:data:`cdbsim.latency.recipes.RECIPES`), each linear in the padded batch and the
attended context; a core launch adds its last-exited fill copies, a prefill a term per packed prompt. Measured
profiles interpolate their points instead (:mod:`cdbsim.latency.interp`, :mod:`cdbsim.latency.prefill`) and use a
stage measured on the very model where they have one. The *roofline* profile derives every component from a
device's datasheet figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cdbsim.errors import ConfigError
from cdbsim.latency.devices import H200, DeviceSpec
from cdbsim.latency.gpu_work import (
    CHAINED_MAX_HIDDEN,
    chained_walk_length,
    equivalent_length,
    least_splits,
    padded_mean,
)
from cdbsim.latency.interp import StageTable, Surface
from cdbsim.latency.kernels import MANY_KERNELS, compose_profile
from cdbsim.latency.power import SustainedLoad
from cdbsim.latency.prefill import PrefillCost, fit_curve
from cdbsim.latency.prefill import summed as summed_curve
from cdbsim.latency.profile import Fit, Profile, ProfileKind
from cdbsim.latency.recipes import Component, components_for, model_stage_name, recipe
from cdbsim.model.arch import ArchSpec
from cdbsim.model.bounds import saturation_batch
from cdbsim.serving.launch import STAGES, Launch, Stage, metadata_bytes

HOST = Component.HOST.value
META_COPY = Component.META_COPY.value  # the launch metadata copy, per byte (cdbsim.serving.launch); optional

__all__ = ["HOST", "META_COPY", "DeviceSpec", "LatencyModel", "components_for", "model_stage_name",
           "roofline_profile"]


# ----- the analytic roofline ---------------------------------------------------------------------
STAGE_KERNELS = 3  # gather/scatter of the hidden-state bank and the graph launch itself


def roofline_components(arch: ArchSpec, device: DeviceSpec) -> dict[str, Fit]:
    """Analytic fits: a weight-read floor, matmul work per token, and KV bytes per attended token."""
    shape, h, v, b = arch.layer, arch.layer.hidden, arch.vocab, arch.dtype_bytes
    bw, flops, launch = device.bandwidth, device.matmul_flops, device.launch_s
    act_bytes = (10 * h + 3 * shape.intermediate) * b
    layer = Fit(delta=shape.params * b / bw + MANY_KERNELS * launch,
                gamma=2 * shape.params / flops + act_bytes / bw, alpha=shape.kv_bytes_per_slot / bw)
    # attention: 4 FLOPs per head dimension and (query, key) pair, at the device's attention share of its matmul rate
    prefill_layer = replace(layer, alpha=4 * shape.heads * shape.head_dim / (flops * device.attention_efficiency))
    adapter = Fit(delta=2 * h * h * b / bw + launch, gamma=4 * h * h / flops) if arch.has_adapter else Fit(0.0)
    glue = Fit(delta=STAGE_KERNELS * launch)
    embed = Fit(delta=launch, gamma=2 * h * b / bw)
    head = Fit(delta=v * h * b / bw + 3 * launch, gamma=2 * v * h / flops + 2 * v * 4 / bw)
    fits = {
        Component.LAYER: layer,
        Component.CORE1: _add(layer, adapter, glue),
        Component.PREFILL_LAYER: prefill_layer,
        Component.PREFILL1: _add(prefill_layer, embed, head, glue),
        Component.KV_COPY: Fit(delta=launch, gamma=2 * shape.kv_bytes_per_slot / bw),
        Component.PRELUDE0: _add(embed, glue),
        Component.CODA0: _add(head, glue),
        Component.HOST: Fit(delta=device.host_launch_s, gamma=device.host_item_s),
    }
    if arch.has_adapter:
        fits[Component.ADAPTER] = adapter
    return {component.key(arch): fit for component, fit in fits.items()}


def _add(*fits: Fit) -> Fit:
    return Fit(delta=sum(f.delta for f in fits), gamma=sum(f.gamma for f in fits),
               alpha=sum(f.alpha for f in fits))


def roofline_profile(arch: ArchSpec, device: DeviceSpec = H200) -> Profile:
    """An analytic profile of ``arch`` on ``device`` (no measurement)."""
    name = "h200-roofline" if device == H200 else f"roofline-{device.bandwidth / 1e12:g}TBps"
    return Profile(name=name, kind=ProfileKind.ROOFLINE, device=device.as_dict(),
                   components=roofline_components(arch, device),
                   notes="analytic: weight bytes / bandwidth + kernels x launch cost; matmul FLOPs / rate "
                         "per token; KV bytes / bandwidth per attended token")


def constant_profile(stage_seconds: dict[Stage, float] | float, host_s: float = 0.0,
                     host_item_s: float = 0.0) -> Profile:
    """Every launch of a stage takes a fixed time, whatever its batch (for hand-checkable runs)."""
    per_stage = stage_seconds if isinstance(stage_seconds, dict) else dict.fromkeys(STAGES, stage_seconds)
    comps = {f"constant/{s.value}": Fit(delta=per_stage.get(s, 0.0)) for s in STAGES}
    comps[HOST] = Fit(delta=host_s, gamma=host_item_s)
    return Profile(name="constant", kind=ProfileKind.CONSTANT, device={"name": "constant-latency model"},
                   components=comps)


# ----- per-stage costs ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StageCost:
    """``t = delta + gamma B + alpha C + chunk k + copy terms + sample * samples``, at least ``floor`` (the smallest
    launch measured)."""

    delta: float = 0.0
    gamma: float = 0.0
    alpha: float = 0.0
    chunk: float = 0.0
    copy_delta: float = 0.0
    copy: float = 0.0
    sample: float = 0.0
    floor: float = 0.0

    def __call__(self, batch: float, context: float = 0.0, copies: int = 0, samples: int = 0,
                 chunks: int = 0) -> float:
        t = self.delta + self.gamma * batch + self.alpha * context + self.chunk * chunks
        if copies:
            t += self.copy_delta + self.copy * copies
        if samples:
            t += self.sample * samples
        return max(t, self.floor)


def smallest_time(fit: Fit) -> float:
    """The shortest measured time of a component (0 without points)."""
    return min((p[-1] for p in fit.points), default=0.0)


def _sum(*terms: tuple[float, Fit]) -> tuple[float, float, float, float]:
    return (sum(k * f.delta for k, f in terms), sum(k * f.gamma for k, f in terms),
            sum(k * f.alpha for k, f in terms), sum(k * f.kappa for k, f in terms))


class LatencyModel:
    """Device and host time of each launch of ``arch`` under ``profile``; a missing component is refused, or with
    ``force`` filled from the roofline of the profile's device.

    ``launch_gap`` is the device time between a launch's end and a queued next one's start (the stream's work between
    CUDA graphs); ``idle_start`` the delay from handing a launch to an idle device to its first kernel. Both come
    from the profile's device (default: the H200's), and are 0 for constant-latency profiles.
    """

    def __init__(self, arch: ArchSpec, profile: Profile, force: bool = False) -> None:
        self.arch = arch
        self._given = (profile, force)  # what this model was built from (with_host builds another)
        self.warnings: list[str] = []
        if profile.kind is ProfileKind.KERNELS:  # composed for this architecture from measured kernels
            profile, self.warnings = compose_profile(profile, arch)
        self.profile = profile
        comps = dict(profile.components)
        zero = Fit(delta=0.0)
        self.host = comps.get(HOST, zero)
        self.stage_hosts: dict[Stage, Fit] = {}  # a host line per stage, where one is given (with_host)
        self.host_seconds: list[float] | None = None  # each launch's host time, by index (with_host_times)
        constant = profile.kind is ProfileKind.CONSTANT
        self.launch_gap = 0.0 if constant else float(profile.device.get("launch_gap_s", H200.launch_gap_s))
        self.idle_start = 0.0 if constant else float(profile.device.get("idle_start_s", H200.idle_start_s))
        self.meta_copy = comps.get(META_COPY)
        self._copy_times: dict[tuple[int, int], float] = {}
        self.attention_slots = profile.attention_slots
        self.attention_sharpness = profile.attention_sharpness
        self._heads, self._least_splits = arch.layer.heads, least_splits(arch.layer.head_dim)
        self._chained = arch.layer.hidden <= CHAINED_MAX_HIDDEN  # its single rows run the chained kernels
        self.tables: dict[Stage, StageTable] = {}
        self.prefill: PrefillCost | None = None  # the curve a measured profile prices prefills on
        if constant:
            self.costs = {s: StageCost(comps.get(f"constant/{s.value}", zero).delta) for s in STAGES}
            return
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
            self.host = comps[HOST]
        a = arch
        copy = comps[Component.KV_COPY.key(a)]
        costs = {stage: _sum(*((count, comps[c.key(a)]) for c, count in recipe(stage, a))) for stage in STAGES}
        self.measured_stages = {s for s in STAGES if len(comps.get(model_stage_name(a, s), zero).points) >= 2}
        for stage in self.measured_stages:
            costs[stage] = _sum((1, comps[model_stage_name(a, stage)]))
        self.costs = {s: StageCost(*costs[s]) for s in STAGES}
        self.costs[Stage.CORE] = StageCost(*costs[Stage.CORE], copy_delta=copy.delta, copy=copy.gamma * a.core)
        # a prefill reads every weight at least once: none is predicted faster than the smallest one measured
        if Stage.PREFILL in self.measured_stages:
            floor, sample = smallest_time(comps[model_stage_name(a, Stage.PREFILL)]), 0.0
        else:  # the composed prefill samples one prompt; its floor is made of its components' floors
            floor = sum(count * smallest_time(comps[c.key(a)]) for c, count in recipe(Stage.PREFILL, a))
            sample = comps[Component.CODA0.key(a)].gamma
        self.costs[Stage.PREFILL] = StageCost(*costs[Stage.PREFILL], sample=sample, floor=floor)
        if profile.kind in (ProfileKind.MEASURED, ProfileKind.KERNELS):
            self.prefill = self._prefill_curve(comps)  # priced on the curve through the points, not the line
            self._tabulate(comps)

    def _prefill_curve(self, comps: dict[str, Fit]) -> PrefillCost | None:
        """A measured prefill's curve through its points: the whole model's, else the sum of its components'; None
        without points (the line of ``costs`` stands)."""
        a = self.arch
        terms = ([(1, comps[model_stage_name(a, Stage.PREFILL)])] if Stage.PREFILL in self.measured_stages
                 else [(count, comps[c.key(a)]) for c, count in recipe(Stage.PREFILL, a) if count])
        if not all(len(fit.points) >= 2 for _, fit in terms):
            return None
        # kernels timed in short bursts price a rested board; a long prefill runs into its power limit
        sustained = (SustainedLoad.from_record(self.profile.kernels.get("sustained"))
                     if self.profile.kind is ProfileKind.KERNELS else None)
        return PrefillCost(summed_curve((count, fit_curve(fit.points)) for count, fit in terms),
                           sample=self.costs[Stage.PREFILL].sample, sustained=sustained)

    def _tabulate(self, comps: dict[str, Fit]) -> None:
        """Decode-type stages of a measured profile: interpolate the measured points (see cdbsim.latency.interp)."""
        a = self.arch
        decode_types = (Stage.PRELUDE, Stage.CORE, Stage.CODA, Stage.DECODE)
        used = {c for stage in decode_types for c, _ in recipe(stage, a)}
        if any(len(comps[c.key(a)].points) < 2 for c in used):
            return  # fits without points (e.g. filled from the roofline): the linear costs stand
        surfaces = {c: Surface(comps[c.key(a)]) for c in used}
        # tabulated at the context lengths the decode layers were measured at
        measured_lengths = sorted(set(surfaces[Component.LAYER].lengths) | set(surfaces[Component.CORE1].lengths))
        for stage in decode_types:
            terms = [(surfaces[c], count) for c, count in recipe(stage, a) if count]
            self.tables[stage] = StageTable(summed(terms), measured_lengths)
        measured = {stage: Surface(comps[model_stage_name(a, stage)])
                    for stage in self.measured_stages - {Stage.PREFILL, Stage.DECODE}}
        if Stage.DECODE in self.measured_stages:
            step = comps[model_stage_name(a, Stage.DECODE)]
            if {Stage.PRELUDE, Stage.CORE, Stage.CODA} <= measured.keys():
                loops = ((Stage.PRELUDE, 1), (Stage.CORE, a.r_max), (Stage.CODA, 1))
                step = below_shortest_context(step, [(measured[stage], count) for stage, count in loops])
            measured[Stage.DECODE] = Surface(step)
        for stage, surface in measured.items():
            self.tables[stage] = StageTable(surface, surface.lengths)

    def launch_time(self, launch: Launch, table_width: int = 0) -> float:
        """Device seconds of ``launch``; given the run's block-table width, a decode-type launch also pays its
        metadata copy where the profile measured it. Called once per simulated launch."""
        stage = launch.stage
        table = self.tables.get(stage)
        if table is not None:  # looked up at the per-row context of gpu_work's attention model
            padded, size, longest, slots = launch.padded, launch.size, launch.longest, self.attention_slots
            if padded == 1 and self._chained:
                t = table(1, chained_walk_length(launch.context, self._heads, self._least_splits))
            else:
                t = table(padded, padded_mean(launch.context, size, padded) if slots is None or longest <= 0
                          else equivalent_length(launch.context / size, longest, size, padded, self._heads,
                                                 self._least_splits, slots, self.attention_sharpness))
            copies = launch.kv_copies
            if copies:
                cost = self.costs[stage]
                t += cost.copy_delta + cost.copy * copies
        elif stage is Stage.PREFILL:
            samples, chunks = max(sum(launch.finishes) - 1, 0), len(launch.chunk_lens)
            if self.prefill is not None:
                return self.prefill(launch.padded, launch.context, samples=samples, chunks=chunks)
            return self.costs[stage](launch.padded, launch.context, samples=samples, chunks=chunks)
        else:
            t = self.costs[stage](launch.padded, launch.context, launch.kv_copies)
        if table_width and self.meta_copy is not None:  # memoised: a run has a few padded sizes and one width
            key = (launch.padded, table_width)
            copy = self._copy_times.get(key)
            if copy is None:
                copy = self._copy_times[key] = self.meta_copy(metadata_bytes(*key))
            t += copy
        return t

    def with_host(self, host: Fit, stages: dict[Stage, Fit] | None = None) -> LatencyModel:
        """The same device model with another host line, and a line of their own for the stages in ``stages``."""
        other = LatencyModel(self.arch, *self._given)
        other.host, other.stage_hosts = host, dict(stages or {})
        return other

    def with_host_times(self, seconds: list[float]) -> LatencyModel:
        """The same device model with launch ``i``'s host time ``seconds[i]`` (later launches keep the host line)."""
        other = LatencyModel(self.arch, *self._given)
        other.host, other.stage_hosts = self.host, self.stage_hosts
        other.host_seconds = [float(s) for s in seconds]
        return other

    def host_time(self, launch: Launch) -> float:
        """The host's seconds for ``launch``: completing finished launches, planning, preparing and enqueueing it."""
        if self.host_seconds is not None and launch.index < len(self.host_seconds):
            return self.host_seconds[launch.index]
        host = self.stage_hosts.get(launch.stage, self.host) if self.stage_hosts else self.host
        return host.delta + host.gamma * len(launch.requests)

    def saturation_batch(self, context_len: float, stage: Stage = Stage.CORE) -> float:
        """B*(L) of a stage: the batch at which the weight-read floor stops dominating."""
        cost = self.costs[stage]
        return saturation_batch(cost.delta, cost.gamma, cost.alpha, context_len)


def below_shortest_context(step: Fit, parts: list[tuple[Surface, int]]) -> Fit:
    """A CB step's fit extended below its shortest measured context: at each measured batch, the step's time there
    less what its stages (``parts``: surface and count) save down to each shorter length they were measured at."""
    points = [list(p) for p in step.points]
    per_row = [round(c / max(b, 1.0)) for b, c, *_ in points]
    shortest = min(per_row)
    shorter = sorted({n for surface, _ in parts for n in surface.lengths if 0 < n < shortest})
    if not shorter:
        return step
    added = []
    for (b, _, *rest), n in zip(points, per_row, strict=True):
        if n != shortest:
            continue
        for length in shorter:
            saved = sum(count * (surface(b, shortest) - surface(b, length)) for surface, count in parts)
            added.append([b, b * length, *rest[:-1], max(rest[-1] - saved, 1e-9)])
    return replace(step, points=points + added)


def summed(terms: list[tuple[Surface, int]]) -> Callable[[float, float], float]:
    """A stage's time at (batch, context): the sum of its kernels' surfaces, each times its count."""
    return lambda b, n: sum(count * s(b, n) for s, count in terms)
