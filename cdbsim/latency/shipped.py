"""The measured profiles shipped with cdbsim (``calibration/profiles/``, read as plain JSON so the simulator never
imports calibration or torch), and how a profile name resolves."""

from __future__ import annotations

import os
from pathlib import Path

from cdbsim.errors import ConfigError, unknown
from cdbsim.latency.devices import H200, DeviceSpec
from cdbsim.latency.model import roofline_profile
from cdbsim.latency.profile import Profile, ProfileKind, load_profile_file
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


def resolve_profile(name: str, arch: ArchSpec, device: DeviceSpec = H200) -> Profile:
    """``auto``, ``roofline``, a shipped profile's name, or a profile JSON file.

    ``auto`` picks a shipped profile that measured this model's stages, else its layer shape, else the kernel-level
    profile composed for ``arch``, else the roofline; on a device other than the measured H200, the kernel-level
    profile carried to that device (or the roofline).
    """
    if name == "roofline":
        return roofline_profile(arch, device)
    if name.endswith(".json"):
        return _on(load_profile_file(name), device)
    shipped = shipped_profiles()
    if name == "auto":
        kernels = [p for p in shipped.values() if p.kind is ProfileKind.KERNELS]
        if device != H200:
            return _on(kernels[0], device) if kernels else roofline_profile(arch, device)
        matching = [p for p in shipped.values() if p.kind is ProfileKind.MEASURED and covers(p, arch)]
        exact = [p for p in matching if model_stage_name(arch, Stage.CORE) in p.components]  # this very model
        return (exact or matching or kernels or [roofline_profile(arch, device)])[0]
    if name in shipped:
        return _on(shipped[name], device)
    if Path(name).is_file():  # a file by another suffix: read as the profile it claims to be (a bad one is named)
        return _on(load_profile_file(name), device)
    raise unknown("profile", name, ["auto", "roofline", "<file>.json", *shipped])


def _on(profile: Profile, device: DeviceSpec) -> Profile:
    """A kernel-level profile carried to ``device``; any other profile as it is (it was measured whole)."""
    if profile.kind is ProfileKind.KERNELS and device != H200:
        from cdbsim.latency.kernels import retarget

        return retarget(profile, device)
    return profile
