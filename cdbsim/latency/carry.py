"""Profiles carried to another GPU, or to a what-if device.

A kernel's time splits into the part its roofline explains and the rest (launch, latency, synchronisation): the first
scales to the other device's roofline, the rest stays (:func:`cdbsim.latency.kernels.carried`). A kernel-level
profile carries kernel by kernel; a whole-model profile carries point by point, each measured time moved by what the
kernel model of the same GPU, composed for the same model, says the other device changes at that point.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from cdbsim.latency.devices import DeviceSpec
from cdbsim.latency.kernels import KernelModel, Speeds, carried, speeds_of
from cdbsim.latency.profile import Fit, Profile, fit_points
from cdbsim.latency.recipes import Component, kind_of, model_stage_name, recipe
from cdbsim.model.arch import ArchSpec
from cdbsim.serving.launch import Stage

NOT_VALIDATED = "not validated"


def retarget(profile: Profile, device: DeviceSpec) -> Profile:
    """A kernel-level profile carried to ``device``'s figures (bandwidth, matmul rate, launch cost)."""
    speeds = speeds_of(device)
    if speeds == Speeds(**profile.kernels.get("device", {})):
        return profile
    kernels = {**profile.kernels, "target": asdict(speeds), "carried_from": profile.device.get("name", "")}
    return replace(profile, kernels=kernels, device=_device_info(profile, device))


def carry_measured(profile: Profile, kernels: Profile, arch: ArchSpec, device: DeviceSpec) -> Profile:
    """``profile`` (measured whole, on the GPU ``kernels`` was measured on) carried to ``device`` for ``arch``:
    its components of ``arch`` with every point moved, the host's as they are; other shapes' are left out."""
    here, there = KernelModel(kernels.kernels), KernelModel(kernels.kernels, speeds_of(device))
    components = {}
    for name, fit in profile.components.items():
        kind = kind_of(name)
        if kind in (Component.HOST, Component.META_COPY):
            components[name] = fit
        elif isinstance(kind, Component) and name == kind.key(arch):
            components[name] = _moved(fit, lambda m, p, c=kind: _component_time(m, arch, c, p), here, there)
        elif isinstance(kind, Stage) and name == model_stage_name(arch, kind):
            terms = [(c, n) for c, n in recipe(kind, arch) if n]
            components[name] = _moved(
                fit, lambda m, p, t=terms: sum(n * _component_time(m, arch, c, p) for c, n in t), here, there)
    remark = f"carried from the {profile.device.get('name', 'measured GPU')} by its kernels: {NOT_VALIDATED}"
    return replace(profile, components=components, device=_device_info(profile, device),
                   remark="; ".join(filter(None, [profile.remark, remark])))


def _device_info(profile: Profile, device: DeviceSpec) -> dict:
    return {**profile.device, "name": device.name, "memory_bytes": device.memory_bytes}


def _moved(fit: Fit, time_of, here: KernelModel, there: KernelModel) -> Fit:
    """``fit`` refitted through its points, each moved from ``here``'s kernel time to ``there``'s."""
    if len(fit.points) < 2:
        return fit
    points = [[*p[:-1], carried(p[-1], time_of(here, p), time_of(there, p))] for p in fit.points]
    return fit_points(points)


def _component_time(model: KernelModel, arch: ArchSpec, component: Component, point: list[float]) -> float:
    """The kernel model's time of ``component`` at a profile point: ``[batch, batch x length, t]`` for decode
    work, ``[tokens, causal pairs, prompts, t]`` for prefill work, ``[copies, 0, t]`` for KV copies."""
    rows, context = max(round(point[0]), 1), point[1]
    if component in (Component.PREFILL_LAYER, Component.PREFILL1):
        chunks = max(round(point[2]), 1)
        prompt = rows / chunks
        prefix = max(round((context / chunks - prompt * (prompt + 1) / 2) / prompt), 0)  # causal_pairs inverted
        fn = model.prefill_layer if component is Component.PREFILL_LAYER else model.prefill1
        return fn(arch, rows, chunks, prefix)
    by_rows = {Component.PRELUDE0: model.prelude0, Component.CODA0: model.coda0, Component.ADAPTER: model.adapter}
    if component in by_rows:
        return by_rows[component](arch, rows)
    if component is Component.KV_COPY:
        return point[0] * model.kv_copy(arch)
    fn = model.layer if component is Component.LAYER else model.core1
    return fn(arch, rows, context / rows)
