"""The executor build a profile or a saved executor run was measured with, as a plain record: a short hash of the
executor's kernel and launch sources, the torch, Triton and CUDA versions and the GPU's name.

:mod:`executor.build` computes it (torch needed); this module only reads, describes and compares records, so the
simulator can name a profile's build without torch. A record is a JSON object ``{sources, torch, triton, cuda, gpu}``
of texts; a profile or a log without one is of an unknown build.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from cdbsim.errors import require

UNKNOWN = "build unknown"


@dataclass(frozen=True)
class Build:
    """One executor build: what decides a measured time besides the workload."""

    sources: str        # short hash of the executor's kernel and launch sources (executor.build.SOURCES)
    torch: str = ""
    triton: str = ""
    cuda: str = ""
    gpu: str = ""

    @classmethod
    def from_record(cls, data: object, where: str = "build") -> Build | None:
        """The build a JSON record holds; None for a missing or empty one; a malformed one is a one-line error."""
        if data is None or data == {}:
            return None
        names = [f.name for f in fields(cls)]
        require(isinstance(data, dict), f"{where} must be an object of {', '.join(names)}, got {data!r:.60}")
        unknown = sorted(set(data) - set(names))
        require(not unknown, f"{where}: unknown key(s) {', '.join(unknown)}; a build has {', '.join(names)}")
        require(isinstance(data.get("sources"), str) and data["sources"], f"{where}.sources must be a non-empty "
                                                                          f"text, got {data.get('sources')!r:.40}")
        for name in names:
            require(isinstance(data.get(name, ""), str), f"{where}.{name} must be a text, got {data[name]!r:.40}")
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)

    def differences(self, other: Build) -> list[str]:
        """The parts that differ from ``other``: ``sources``, ``torch``, ``triton``, ``cuda``, ``gpu``."""
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]

    def describe(self) -> str:
        """``build 3f2a9c1e, torch 2.11, NVIDIA H200``: the hash, torch's major.minor and the GPU."""
        torch = ".".join(self.torch.split("+")[0].split(".")[:2])
        return ", ".join(filter(None, [f"build {self.sources}", torch and f"torch {torch}", self.gpu]))


def describe(build: Build | None) -> str:
    """A build's one-line description, :data:`UNKNOWN` for none."""
    return UNKNOWN if build is None else build.describe()
