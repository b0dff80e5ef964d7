"""The measured profiles shipped with cdbsim, and how a profile name (``--profile``, ``latency.profile``)
is resolved.

The profiles are written by calibration and installed as its package data (``calibration/profiles/``,
beside this package). They are read here as plain JSON files, so the simulator finds them without
importing calibration (imports point from calibration to cdbsim, never back) and without torch.
"""

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
    """Where the profiles ``auto`` and profile names resolve from: the folder in ``$CDBSIM_PROFILES`` if
    set, else the shipped ones, ``calibration/profiles/`` next to ``cdbsim/``.

    A saved measurement is re-predicted with the profiles of the executor build that made it: after a
    kernel change the shipped profiles describe the new build, and the old ones are kept in a results
    folder that this variable points at (e.g. ``benchmarks/results/profiles-tile64``)."""
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

    ``auto`` picks, in order: a shipped profile that measured this very model's stages, else one that
    measured its layer shape (a re-split model), else the kernel-level profile composed for ``arch``
    (:mod:`cdbsim.latency.kernels`), else the roofline. On another device than the measured H200, stage
    measurements do not carry over: ``auto`` takes the kernel-level profile carried to that device's
    figures (or the roofline without one).
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
