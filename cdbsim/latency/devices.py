"""GPU presets: datasheet figures, and the achievable figures they imply for a GPU this project has not measured.

Measured profiles come from an H200; another GPU carries the measured kernels over at the same share of its bandwidth
and matmul rate (:mod:`cdbsim.latency.kernels`), so a preset's achievable figures are the H200's scaled by the ratio
of the datasheets (:data:`DATASHEETS`), and its predictions are labelled "not validated".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from cdbsim.errors import unknown


@dataclass(frozen=True)
class DeviceSpec:
    """Figures of a device for the roofline profile; defaults are the H200's achievable ones."""

    name: str = "NVIDIA H200"
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
    bf16_flops: float      # dense
    memory_bytes: float
    bandwidth: float       # bytes/s
    source: str


DATASHEETS: dict[str, Datasheet] = {
    "h200": Datasheet("NVIDIA H200", 989e12, 141e9, 4.8e12, "NVIDIA H200 Tensor Core GPU datasheet"),
    "h100-sxm": Datasheet("NVIDIA H100 SXM", 989e12, 80e9, 3.35e12, "NVIDIA H100 Tensor Core GPU datasheet"),
    "b200": Datasheet("NVIDIA B200", 2250e12, 180e9, 7.7e12, "NVIDIA HGX B200 specifications"),
    "a100-80gb": Datasheet("NVIDIA A100 80GB SXM", 312e12, 80e9, 2.039e12, "NVIDIA A100 Tensor Core GPU datasheet"),
}
MEASURED = "h200"  # the GPU the shipped profiles were measured on


def device_preset(name: str) -> DeviceSpec:
    """A preset's achievable figures: the measured H200's, scaled by the datasheets' ratio."""
    if name not in DATASHEETS:
        raise unknown("device", name, DATASHEETS)
    if name == MEASURED:
        return H200
    sheet, base = DATASHEETS[name], DATASHEETS[MEASURED]
    return replace(H200, name=f"{sheet.name} (scaled from H200 measurements, not validated)",
                   bandwidth=H200.bandwidth * sheet.bandwidth / base.bandwidth,
                   matmul_flops=H200.matmul_flops * sheet.bf16_flops / base.bf16_flops,
                   memory_bytes=sheet.memory_bytes)

