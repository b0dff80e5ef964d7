"""``cdbsim calibrate``: measure each layer shape once, each model's fused CB step and the host, then fit
and write one profile (JSON + PNG) per model."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from calibration.fit import attention_skew_name, build_profile, fit_attention_slots, plot_profile
from cdbsim.errors import ConfigError, unknown
from cdbsim.latency.devices import device_tag
from cdbsim.latency.profile import Profile
from cdbsim.latency.recipes import model_stage_name
from cdbsim.model.arch import ArchSpec
from cdbsim.serving.config import ServeConfig
from cdbsim.serving.launch import Stage
from cdbsim.serving.memory import KVCapacity, RequestShape

DEVICES = ("cuda", "cpu")  # cuda or cuda:N measures a GPU; cpu runs the tiny test models


def torch_device(device: str) -> object:
    """The torch device to measure on: ``cuda`` (or ``cuda:N``) with a GPU present, or ``cpu``; else one-line error."""
    import torch

    if device.split(":")[0] not in DEVICES:
        raise unknown("device", device, DEVICES)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("cdbsim calibrate needs a CUDA GPU (torch.cuda.is_available() is False); "
                          "run it on the GPU machine, or use the shipped profiles and --profile roofline here")
    try:
        return torch.device(device)
    except RuntimeError as exc:  # cuda:x, cuda:-1
        raise ConfigError(f"device {device!r}: {str(exc).splitlines()[0]}") from None


def calibrate(archs: list[ArchSpec], out: Path, quick: bool = False, device: str = "cuda",
              progress: Callable[[str], None] = lambda _: None, plan: object | None = None) -> list[Profile]:
    """Measure, fit and save a profile for every architecture in ``archs``; returns the profiles."""
    from calibration.measure import Plan, environment, measure_host, measure_model, measure_shape
    from executor.build import current_build

    dev = torch_device(device)
    plan = plan or (Plan.quick() if quick else Plan())
    info, versions = environment(dev)
    if info["memory_bytes"]:  # every model must fit beside a KV cache before any is measured
        for arch in archs:
            KVCapacity().plan(arch, ServeConfig(), RequestShape.FEWEST, info["name"], info["memory_bytes"])
    build = current_build(dev).to_dict()
    out.mkdir(parents=True, exist_ok=True)
    shape_points: dict[str, dict] = {}
    host_points: dict[str, dict] = {}
    profiles = []
    for arch in archs:
        started = time.perf_counter()
        key = f"{arch.layer.key}-v{arch.vocab}"
        if key not in shape_points:
            shape_points[key] = measure_shape(arch, plan, dev, progress)
            host_points[key] = measure_host(arch, dev, plan.repeats, plan.warmup, progress=progress)
        points = {**shape_points[key], **host_points[key], **measure_model(arch, plan, dev, progress)}
        name = f"{device_tag(info['name'])}-{arch.name}"
        skew = points.pop(attention_skew_name(arch), [])
        profile = build_profile(name, info, versions, points,
                                notes=f"measured with cdbsim calibrate{' --quick' if quick else ''} for {arch.name} "
                                      f"({arch.split}); wall time {time.perf_counter() - started:.0f} s", build=build)
        if skew:
            core = profile.components[model_stage_name(arch, Stage.CORE)]
            profile.attention = fit_attention_slots(arch, core, skew)
        profile.save(out / f"{name}.json")
        plot_profile(profile, arch, out / f"{name}.png")
        profiles.append(profile)
    return profiles
