"""Latency profiles: per-component fits ``t = delta + gamma x + alpha c (+ kappa k)`` of one device, as JSON.

A component is named by what it computes and the shape it was measured at (``layer/<shape>``, ``core1/<shape>``,
``prelude0/h<hidden>``, ``coda0/h<hidden>-v<vocab>``, ``prefill_layer``, ``prefill1``, ``adapter``, ``kv_copy``,
``<stage>/<model>`` for a whole-model stage, ``host``, ``meta_copy``, ``constant/<stage>``), so a re-split model
reuses the same fits. File format ``cdbsim-profile/1``: ``name``, ``kind``, ``device``, ``versions``, ``build``
(the executor build that measured it, :mod:`cdbsim.latency.build`; absent: unknown), ``date``, ``notes`` and
``components`` ``{name: {delta, gamma, alpha, kappa, r2, max_rel_residual, points}}``, times in
seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from cdbsim.errors import ConfigError, read_json, require
from cdbsim.latency.build import Build, describe
from cdbsim.latency.power import SustainedLoad
from traces.choice import Choice

FORMAT = "cdbsim-profile/1"


class ProfileKind(Choice):
    """Where a profile's numbers come from: stages measured on a GPU, kernels measured over the design space
    (composed per architecture), a device's datasheet figures, or a constant time per stage."""

    MEASURED = "measured"
    KERNELS = "kernels"
    ROOFLINE = "roofline"
    CONSTANT = "constant"

    @classmethod
    def what(cls) -> str:
        return "profile kind"


@dataclass
class Fit:
    """``t = delta + gamma x + alpha c (+ kappa k)`` with its fit quality and its points ``[x, c, t]`` (or
    ``[x, c, k, t]``), which measured components interpolate (:mod:`cdbsim.latency.interp`)."""

    delta: float
    gamma: float = 0.0
    alpha: float = 0.0
    r2: float | None = None
    max_rel_residual: float | None = None
    points: list[list[float]] = field(default_factory=list)
    kappa: float = 0.0

    def __call__(self, x: float, c: float = 0.0, k: float = 0.0) -> float:
        return self.delta + self.gamma * x + self.alpha * c + self.kappa * k

    def to_dict(self) -> dict:
        return asdict(self)


FIT_DIGITS = 10  # significant digits a fitted coefficient keeps, so every CPU's BLAS gives the same profile


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin |a x - b|`` over ``x >= 0``, to :data:`FIT_DIGITS` significant digits (columns scaled to unit norm;
    scipy's ``nnls`` where the plain solution has a negative term)."""
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    x = np.linalg.lstsq(a, b, rcond=None)[0]
    if np.any(x < 0):  # a bound binds
        from scipy.optimize import nnls  # imported only here: predicting a shipped model seldom needs it

        x = nnls(a, b)[0]
    return np.array([float(f"{v:.{FIT_DIGITS}g}") for v in x / scale])


def fit_points(points: np.ndarray | list, with_context: bool = True, relative: bool = True) -> Fit:
    """Least-squares fit of ``t = delta + gamma x + alpha c (+ kappa k)``, all terms >= 0, to rows ``[x, c, t]`` or
    ``[x, c, k, t]``; residuals weighted by ``1/t`` unless ``relative=False``, a constant column's term left at 0."""
    pts = np.asarray(points, dtype=float)
    require(pts.ndim == 2 and pts.shape[1] in (3, 4) and len(pts) >= 2,
            "a fit needs at least 2 points [x, c, t] or [x, c, k, t]")
    t = pts[:, -1]
    require(bool(np.all(t > 0)) or not relative, "measured times must be > 0")
    names = ["delta", "gamma"]
    columns = [np.ones(len(pts)), pts[:, 0]]
    if with_context and np.ptp(pts[:, 1]) > 0:
        names.append("alpha")
        columns.append(pts[:, 1])
    if pts.shape[1] == 4 and np.ptp(pts[:, 2]) > 0:
        names.append("kappa")
        columns.append(pts[:, 2])
    design = np.stack(columns, axis=1)
    weights = 1.0 / t if relative else np.ones(len(t))
    solution = nonnegative_lstsq(design * weights[:, None], t * weights)
    predicted = design @ solution
    ss_res = float(np.sum((t - predicted) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    scale = t if relative else np.full(len(t), np.abs(t).max())  # unweighted: against the largest time
    worst = float(np.max(np.abs(predicted - t) / np.maximum(scale, 1e-12)))
    coef = dict(zip(names, map(float, solution), strict=True))
    return Fit(r2=r2, max_rel_residual=worst, points=pts.tolist(), **{"delta": 0.0, **coef})


@dataclass
class Profile:
    """Component fits of one device, plus the device facts used for KV sizing and the roofline."""

    name: str
    kind: ProfileKind
    device: dict
    components: dict[str, Fit]
    versions: dict = field(default_factory=dict)
    date: str = ""
    notes: str = ""
    source: str = ""
    attention: dict = field(default_factory=dict)  # decode attention's programs per wave ("slots"), its points
    kernels: dict = field(default_factory=dict)    # a kernel-level profile's tables (cdbsim.latency.kernels)
    remark: str = ""                                # what a label adds (a composed profile: its shape, reach)
    build: dict = field(default_factory=dict)       # the executor build that measured it (Build's record)

    def __post_init__(self) -> None:
        self.kind = ProfileKind.parse(self.kind)

    @property
    def attention_slots(self) -> float | None:
        """Decode-attention programs the device runs at once, fitted by calibration; None when unmeasured."""
        slots = self.attention.get("slots")
        return float(slots) if slots else None

    @property
    def attention_sharpness(self) -> float:
        """The p of the p-norm combining a mixed batch's attention bounds; infinite when not fitted."""
        sharpness = self.attention.get("sharpness")
        return float(sharpness) if sharpness else math.inf

    @property
    def memory_bytes(self) -> float:
        return float(self.device.get("memory_bytes", 0.0))

    def executor_build(self) -> Build | None:
        """The executor build that measured this profile; None when unrecorded (or not measured)."""
        return Build.from_record(self.build, f"{self.source or self.name}: build")

    def build_label(self) -> str:
        """``build 3f2a9c1e, torch 2.11, NVIDIA H200``, or ``build unknown``."""
        return describe(self.executor_build())

    def label(self) -> str:
        device = self.device.get("name", "unknown device")
        date = f", {self.date}" if self.date else ""
        remark = f"; {self.remark}" if self.remark else ""
        return f"{self.name} ({self.kind}, {device}{date}{remark})"

    def to_dict(self) -> dict:
        return {"format": FORMAT, "name": self.name, "kind": self.kind.value, "device": self.device,
                "versions": self.versions, **({"build": self.build} if self.build else {}),
                "date": self.date, "notes": self.notes,
                **({"attention": self.attention} if self.attention else {}),
                **({"kernels": self.kernels} if self.kernels else {}),
                "components": {k: v.to_dict() for k, v in sorted(self.components.items())}}

    def save(self, path: str | Path) -> Path:
        """Write the JSON form; written whole or not at all (:func:`cdbsim.report.outputs.atomic_file`)."""
        from cdbsim.report.outputs import atomic_file

        path = Path(path)
        with atomic_file(path) as staging:
            staging.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path


FIT_TERMS = ("delta", "gamma", "alpha", "kappa")  # seconds (per unit): finite and >= 0
FIT_QUALITY = ("r2", "max_rel_residual")           # numbers, or null where not fitted


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fit_from_dict(data: object, where: str) -> Fit:
    """One component's fit, every field checked (a non-finite, negative or text time is refused with its key)."""
    require(isinstance(data, dict), f"{where}: expected an object of fit terms, got {data!r:.60}")
    valid = [f.name for f in fields(Fit)]
    unknown_keys = sorted(set(data) - set(valid))
    require(not unknown_keys, f"{where}: unknown key(s) {', '.join(unknown_keys)}; valid keys: {', '.join(valid)}")
    require("delta" in data, f"{where}: missing key delta")
    for term in FIT_TERMS:
        value = data.get(term, 0.0)
        require(_number(value) and value >= 0, f"{where}.{term} must be a finite number >= 0, got {value!r}")
    for term in FIT_QUALITY:
        value = data.get(term)
        require(value is None or _number(value), f"{where}.{term} must be a finite number or null, got {value!r}")
    points = data.get("points", [])
    require(isinstance(points, list), f"{where}.points must be a list of [x, c, t] rows, got {points!r:.60}")
    for i, row in enumerate(points):
        require(isinstance(row, list) and len(row) in (3, 4) and all(_number(v) for v in row),
                f"{where}.points[{i}] must be [x, c, t] or [x, c, k, t] of finite numbers, got {row!r:.60}")
    return Fit(**data)


def _check_attention(data: dict, where: str) -> None:
    """The decode-attention fit's numbers, checked when the file is read."""
    for key in ("slots", "sharpness"):
        value = data.get(key)
        require(value is None or (_number(value) and value > 0), f"{where}.{key} must be a finite number > 0 or "
                                                                   f"null, got {value!r:.40}")
    heads = data.get("heads")
    require(heads is None or (isinstance(heads, int) and not isinstance(heads, bool) and heads >= 1),
            f"{where}.heads must be a whole number >= 1, got {heads!r:.40}")
    points = data.get("points", [])
    require(isinstance(points, list), f"{where}.points must be a list of rows of numbers, got {points!r:.40}")
    for i, row in enumerate(points):
        require(isinstance(row, list) and len(row) >= 2 and all(_number(v) for v in row),
                f"{where}.points[{i}] must be a row of finite numbers, got {row!r:.40}")


def profile_from_dict(data: dict, source: str = "profile") -> Profile:
    """Parse the JSON form; a wrong format or malformed value is a one-line error naming ``source`` and the key."""
    require(isinstance(data, dict), f"{source}: not a cdbsim profile (a profile file holds a JSON object, "
                                    f"got {data!r:.40})")
    if data.get("format") != FORMAT:
        raise ConfigError(f"{source}: not a cdbsim profile (expected format {FORMAT!r})")
    for key in ("name", "kind", "device", "components"):
        require(key in data, f"{source}: malformed profile (missing key {key})")
    for key, kind in (("name", str), ("date", str), ("notes", str), ("device", dict), ("components", dict),
                      ("versions", dict), ("attention", dict), ("kernels", dict), ("build", dict)):
        if key in data:
            require(isinstance(data[key], kind), f"{source}: {key} must be {'text' if kind is str else 'an object'}, "
                                                 f"got {data[key]!r:.60}")
    _check_attention(data.get("attention", {}), f"{source}: attention")
    Build.from_record(data.get("build"), f"{source}: build")
    try:
        SustainedLoad.from_record(data.get("kernels", {}).get("sustained"))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    memory = data["device"].get("memory_bytes", 0.0)
    require(_number(memory) and memory >= 0, f"{source}: device.memory_bytes must be a finite number >= 0, "
                                             f"got {memory!r}")
    components = {name: _fit_from_dict(fit, f"{source}: components.{name}")
                  for name, fit in data["components"].items()}
    try:
        return Profile(name=data["name"], kind=data["kind"], device=dict(data["device"]),
                       components=components, versions=dict(data.get("versions", {})),
                       date=data.get("date", ""), notes=data.get("notes", ""), source=source,
                       attention=dict(data.get("attention", {})), kernels=dict(data.get("kernels", {})),
                       build=dict(data.get("build", {})))
    except ConfigError as exc:
        raise ConfigError(f"{source}: malformed profile ({exc})") from None


def load_profile_file(path: str | Path) -> Profile:
    return profile_from_dict(read_json(path, "profile file"), str(path))
