"""The measured profiles shipped with cdbsim (``calibration/profiles/``, read as plain JSON so the simulator never
imports calibration or torch), and how a profile name resolves."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from cdbsim.errors import ConfigError, require, unknown
from cdbsim.latency.carry import carry_measured, retarget
from cdbsim.latency.devices import H200, DeviceSpec, device_preset, device_tag, preset_of
from cdbsim.latency.model import HOST, roofline_profile
from cdbsim.latency.profile import Fit, Profile, ProfileKind, load_profile_file
from cdbsim.latency.recipes import components_for, model_stage_name
from cdbsim.model.arch import ArchSpec
from cdbsim.serving.launch import Stage

PROFILES_ENV = "CDBSIM_PROFILES"


def profile_dir() -> Path:
    """Where profile names resolve from: ``$CDBSIM_PROFILES`` if set, else the shipped ``calibration/profiles/``."""
    chosen = os.environ.get(PROFILES_ENV)
    if chosen:
        path = Path(chosen)
        if not path.is_dir() or not any(path.glob("*.json")):
            raise ConfigError(f"{PROFILES_ENV}={chosen}: not a folder of profile JSON files")
        return path
    return Path(__file__).resolve().parents[2] / "calibration" / "profiles"


def shipped_profiles() -> dict[str, Profile]:
    """Every shipped profile by name."""
    directory = profile_dir()
    if not directory.is_dir():
        return {}
    profiles = (load_profile_file(p) for p in sorted(directory.glob("*.json")))
    return {p.name: p for p in profiles}


def covers(profile: Profile, arch: ArchSpec) -> bool:
    """True if ``profile`` measured every component ``arch`` needs."""
    return all(name in profile.components for name in components_for(arch))


def measured_on(profile: Profile) -> str:
    """The device tag of the GPU ``profile`` was measured on (``h200``, ``h100``...)."""
    return device_tag(profile.device.get("name", ""))


def resolve_profile(name: str, arch: ArchSpec, device: DeviceSpec = H200) -> Profile:
    """``auto``, a GPU's tag (``h200``: ``auto`` among that GPU's profiles), ``roofline``, a shipped profile's name,
    or a profile JSON file, on ``device``.

    ``auto`` picks, among the profiles measured on ``device``'s GPU (else the H200's), this model's, else its layer
    shape's, else the kernel-level profile composed for ``arch``; else the roofline. A profile measured on another
    GPU than ``device``, or with other figures than a what-if gives, is carried to it (:mod:`cdbsim.latency.carry`).
    """
    if name == "roofline":
        return roofline_profile(arch, device)
    shipped = shipped_profiles()
    gpus = {measured_on(p) for p in shipped.values()}
    if name == "auto" or name in gpus:
        found = _auto(shipped, arch, (name,) if name in gpus else (device.tag, H200.tag))
        if found is None:
            return roofline_profile(arch, device)
        profile = found
    elif name in shipped:
        profile = shipped[name]
    elif Path(name).is_file():  # any suffix: read as the profile it claims to be (a bad one is named)
        profile = load_profile_file(name)
    else:
        raise unknown("profile", name, ["auto", *sorted(gpus), "roofline", "<file>.json", *shipped])
    return on_device(profile, arch, device, shipped)


def _auto(shipped: dict[str, Profile], arch: ArchSpec, gpus: tuple[str, ...]) -> Profile | None:
    """``arch``'s own profile, else its layer shape's, else the kernel-level one, of the first of ``gpus`` with one."""
    for tag in dict.fromkeys(gpus):
        here = [p for p in shipped.values() if measured_on(p) == tag]
        matching = [p for p in here if p.kind is ProfileKind.MEASURED and covers(p, arch)]
        exact = [p for p in matching if model_stage_name(arch, Stage.CORE) in p.components]  # this very model
        found = exact or matching or [p for p in here if p.kind is ProfileKind.KERNELS]
        if found:
            return found[0]
    return None


def on_device(profile: Profile, arch: ArchSpec, device: DeviceSpec, shipped: dict[str, Profile]) -> Profile:
    """``profile`` as measured where ``device`` is its GPU's preset unchanged, else carried to ``device``; a profile
    of a GPU without a preset is used as measured on the default device and refused on any other."""
    if profile.kind not in (ProfileKind.MEASURED, ProfileKind.KERNELS):
        return profile
    home_key = preset_of(profile.device.get("name", ""))
    if home_key is None:
        require(device == H200, f"profile {profile.name} was measured on a {profile.device.get('name', 'GPU')}, "
                                f"which has no preset to carry it from; leave out --device and the what-if figures")
        return profile
    home = device_preset(home_key)
    if device == home:
        return profile
    if device.host_launch_s != home.host_launch_s or device.host_item_s != home.host_item_s:
        host = Fit(delta=device.host_launch_s, gamma=device.host_item_s)
        profile = replace(profile, components={**profile.components, HOST: host})
    if profile.kind is ProfileKind.KERNELS:
        return retarget(profile, device)
    kernels = [p for p in shipped.values() if p.kind is ProfileKind.KERNELS and measured_on(p) == home.tag]
    require(bool(kernels), f"profile {profile.name} cannot be carried to {device.name}: no kernel-level profile "
                           f"of its GPU ({home.name}) to carry it with (cdbsim calibrate --kernels on one)")
    return carry_measured(profile, kernels[0], arch, device)
