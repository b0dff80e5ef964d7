"""GPU presets: datasheet figures, the achievable figures they imply, and which GPU a profile was measured on.

A preset's achievable figures are the measured H200's scaled by the ratio of the datasheets (:data:`DATASHEETS`); a
profile measured on one GPU is carried to another GPU's figures by :mod:`cdbsim.latency.carry`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

from cdbsim.errors import unknown


@dataclass(frozen=True)
class DeviceSpec:
    """Figures of a device for the roofline profile; defaults are the H200's achievable ones."""

    name: str = "NVIDIA H200"
    tag: str = "h200"                   # the prefix of the names of profiles measured on it (device_tag)
    memory_bytes: float = 141e9
    bandwidth: float = 4.3e12           # bytes/s
    matmul_flops: float = 7.9e14        # FLOP/s
    launch_s: float = 2.5e-6            # per kernel inside a CUDA graph
    attention_efficiency: float = 0.5   # share of matmul rate prefill attention reaches
    host_launch_s: float = 30e-6        # host: plan + prepare + replay one launch
    host_item_s: float = 0.3e-6         # host: per item planned
    launch_gap_s: float = 1.30e-6       # device: one launch's end to the next one's start (LatencyModel.launch_gap)
    idle_start_s: float = 4.5e-6        # device: an idle device's start after the host hands a launch over

    def as_dict(self) -> dict:
        return asdict(self)


H200 = DeviceSpec()


@dataclass(frozen=True)
class Datasheet:
    name: str
    tag: str               # device_tag of the GPU's name as torch reports it
    bf16_flops: float      # dense
    memory_bytes: float
    bandwidth: float       # bytes/s
    source: str


DATASHEETS: dict[str, Datasheet] = {
    "h200": Datasheet("NVIDIA H200", "h200", 989e12, 141e9, 4.8e12, "NVIDIA H200 Tensor Core GPU datasheet"),
    "h100-sxm": Datasheet("NVIDIA H100 SXM", "h100", 989e12, 80e9, 3.35e12, "NVIDIA H100 Tensor Core GPU datasheet"),
    "b200": Datasheet("NVIDIA B200", "b200", 2250e12, 180e9, 7.7e12, "NVIDIA HGX B200 specifications"),
    "a100-80gb": Datasheet("NVIDIA A100 80GB SXM", "a100", 312e12, 80e9, 2.039e12,
                           "NVIDIA A100 Tensor Core GPU datasheet"),
}
BASE = "h200"  # the GPU whose measured figures the presets scale


def device_preset(name: str) -> DeviceSpec:
    """A preset's achievable figures: the H200's, scaled by the datasheets' ratio for another GPU."""
    if name not in DATASHEETS:
        raise unknown("device", name, DATASHEETS)
    if name == BASE:
        return H200
    sheet, base = DATASHEETS[name], DATASHEETS[BASE]
    return replace(H200, name=sheet.name, tag=sheet.tag, memory_bytes=sheet.memory_bytes,
                   bandwidth=H200.bandwidth * sheet.bandwidth / base.bandwidth,
                   matmul_flops=H200.matmul_flops * sheet.bf16_flops / base.bf16_flops)


def device_tag(gpu_name: str) -> str:
    """``NVIDIA H200`` -> ``h200``, ``NVIDIA H100 80GB HBM3`` -> ``h100``: how profile names start."""
    words = re.sub(r"^(nvidia|amd)\s+", "", gpu_name.strip(), flags=re.I).split()
    return (words[0] if words else "device").lower()


def preset_of(gpu_name: str) -> str | None:
    """The preset of the GPU torch names ``gpu_name`` (None for a GPU without one)."""
    tag = device_tag(gpu_name)
    return next((key for key, sheet in DATASHEETS.items() if sheet.tag == tag), None)
