"""Stage latencies from component fits: what one launch costs on the device and on the host.

A stage is a sum of components (:data:`cdbsim.latency.recipes.RECIPES`), each linear in the padded batch and the
attended context; a core launch adds its last-exited fill copies, a prefill a term per packed prompt. Measured
profiles interpolate their points instead (:mod:`cdbsim.latency.interp`, :mod:`cdbsim.latency.prefill`) and use a
stage measured on the very model where they have one; a decode-type launch also pays its metadata copy where
measured. The *roofline* profile derives every component from a device's datasheet figures.
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
from cdbsim.latency.kernels import compose_profile
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
KERNELS_PER_LAYER = 9
STAGE_KERNELS = 3  # gather/scatter of the hidden-state bank and the graph launch itself


def roofline_components(arch: ArchSpec, device: DeviceSpec) -> dict[str, Fit]:
    """Analytic fits: a weight-read floor, matmul work per token, and KV bytes per attended token."""
    shape, bw, flops, launch, b = arch.layer, device.bandwidth, device.matmul_flops, device.launch_s, \
        arch.dtype_bytes
    h, v = shape.hidden, arch.vocab
    act_bytes = (10 * h + 3 * shape.intermediate) * b
    attn_flops_per_pair = 4 * shape.heads * shape.head_dim
    layer = Fit(delta=shape.params * b / bw + KERNELS_PER_LAYER * launch,
                gamma=2 * shape.params / flops + act_bytes / bw, alpha=shape.kv_bytes_per_slot / bw)
    prefill_layer = Fit(delta=layer.delta, gamma=layer.gamma,
                        alpha=attn_flops_per_pair / (flops * device.attention_efficiency))
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
    """``t = delta + gamma B + alpha C + chunk k + copy terms + sample terms``, at least ``floor`` (the smallest
    launch measured)."""

    delta: float = 0.0
    gamma: float = 0.0
    alpha: float = 0.0
    chunk: float = 0.0
    copy_delta: float = 0.0
    copy: float = 0.0
    sample_delta: float = 0.0
    sample: float = 0.0
    floor: float = 0.0

    def __call__(self, batch: float, context: float = 0.0, copies: int = 0, samples: int = 0,
                 chunks: int = 0) -> float:
        t = self.delta + self.gamma * batch + self.alpha * context + self.chunk * chunks
        if copies:
            t += self.copy_delta + self.copy * copies
        if samples:
            t += self.sample_delta + self.sample * samples
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
        self.launch_gap = (0.0 if profile.kind is ProfileKind.CONSTANT
                           else float(profile.device.get("launch_gap_s", H200.launch_gap_s)))
        self.idle_start = (0.0 if profile.kind is ProfileKind.CONSTANT
                           else float(profile.device.get("idle_start_s", H200.idle_start_s)))
        self.meta_copy = comps.get(META_COPY)
        self._copy_times: dict[tuple[int, int], float] = {}
        self.attention_slots = profile.attention_slots
        self.attention_sharpness = profile.attention_sharpness
        self._heads, self._least_splits = arch.layer.heads, least_splits(arch.layer.head_dim)
        self._chained = arch.layer.hidden <= CHAINED_MAX_HIDDEN  # its single rows run the chained kernels
        self.tables: dict[Stage, StageTable] = {}
        self.prefill: PrefillCost | None = None  # the curve a measured profile prices prefills on
        if profile.kind is ProfileKind.CONSTANT:
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
            floor = smallest_time(comps[model_stage_name(a, Stage.PREFILL)])
            self.costs[Stage.PREFILL] = StageCost(*costs[Stage.PREFILL], floor=floor)
        else:  # the composed prefill samples one prompt; its floor is made of its components' floors
            floor = sum(count * smallest_time(comps[c.key(a)]) for c, count in recipe(Stage.PREFILL, a))
            self.costs[Stage.PREFILL] = StageCost(*costs[Stage.PREFILL], sample=comps[Component.CODA0.key(a)].gamma,
                                                  floor=floor)
        if profile.kind in (ProfileKind.MEASURED, ProfileKind.KERNELS):
            self.prefill = self._prefill_curve(comps)  # priced on the curve through the points, not the line
            self._tabulate(comps)

    def _prefill_curve(self, comps: dict[str, Fit]) -> PrefillCost | None:
        """A measured prefill's curve through its points: the whole model's, else the sum of its components'; None
        without points (the line of ``costs`` stands)."""
        a = self.arch
        if Stage.PREFILL in self.measured_stages:
            terms, sample = [(1, comps[model_stage_name(a, Stage.PREFILL)])], 0.0
        else:
            terms = [(count, comps[c.key(a)]) for c, count in recipe(Stage.PREFILL, a) if count]
            sample = comps[Component.CODA0.key(a)].gamma
        if not all(len(fit.points) >= 2 for _, fit in terms):
            return None
        # kernels timed in short bursts price a rested board; a long prefill runs into its power limit
        sustained = (SustainedLoad.from_record(self.profile.kernels.get("sustained"))
                     if self.profile.kind is ProfileKind.KERNELS else None)
        return PrefillCost(summed_curve((count, fit_curve(fit.points)) for count, fit in terms), sample=sample,
                           sustained=sustained)

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
        stage_time: dict[Stage, Callable[[float, float], float]] = {}
        lengths: dict[Stage, list[float]] = {}
        for stage in decode_types:
            terms = [(surfaces[c], count) for c, count in recipe(stage, a) if count]
            stage_time[stage] = summed(terms)
            lengths[stage] = measured_lengths
        measured = {stage: Surface(comps[model_stage_name(a, stage)])
                    for stage in self.measured_stages - {Stage.PREFILL, Stage.DECODE}}
        if Stage.DECODE in self.measured_stages:
            step = comps[model_stage_name(a, Stage.DECODE)]
            if {Stage.PRELUDE, Stage.CORE, Stage.CODA} <= measured.keys():
                loops = ((Stage.PRELUDE, 1), (Stage.CORE, a.r_max), (Stage.CODA, 1))
                step = below_shortest_context(step, [(measured[stage], count) for stage, count in loops])
            measured[Stage.DECODE] = Surface(step)
        for stage, surface in measured.items():
            stage_time[stage], lengths[stage] = surface, surface.lengths
        for stage, fn in stage_time.items():
            self.tables[stage] = StageTable(fn, lengths[stage])

    def launch_time(self, launch: Launch, table_width: int = 0) -> float:
        """Device seconds of ``launch``; given the run's block-table width, a decode-type launch also pays its
        metadata copy where the profile measured it. Called once per simulated launch."""
        stage = launch.stage
        table = self.tables.get(stage)
        if table is not None:  # attended_length, written out in place
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
        if table_width and self.meta_copy is not None:
            copy = self._copy_times.get((launch.padded, table_width))
            t += copy if copy is not None else self._copy_time(launch.padded, table_width)
        return t

    def _copy_time(self, padded: int, width: int) -> float:
        """The metadata copy of a launch, memoised: a run has a handful of padded sizes and one width."""
        fit = self.meta_copy
        assert fit is not None  # launch_time asks only where the profile measured the copy
        t = self._copy_times[(padded, width)] = fit(metadata_bytes(padded, width))
        return t

    def attended_length(self, launch: Launch) -> float:
        """The per-row context a decode-type launch is looked up at: :func:`~cdbsim.latency.gpu_work.padded_mean`, or
        with a calibrated attention width :func:`~cdbsim.latency.gpu_work.equivalent_length`."""
        mean = launch.context / launch.size
        if launch.padded == 1 and self._chained:
            return chained_walk_length(launch.context, self._heads, self._least_splits)
        if self.attention_slots is None or launch.longest <= 0:
            return padded_mean(launch.context, launch.size, launch.padded)
        return equivalent_length(mean, launch.longest, launch.size, launch.padded, self._heads, self._least_splits,
                                 self.attention_slots, self.attention_sharpness)

    def with_host(self, host: Fit, stages: dict[Stage, Fit] | None = None) -> LatencyModel:
        """The same device model with another host line, and a line of their own for the stages in ``stages``."""
        other = LatencyModel(self.arch, *self._given)
        other.host = host
        other.stage_hosts = dict(stages or {})
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
