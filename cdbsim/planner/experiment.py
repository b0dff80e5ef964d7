"""One experiment, declared once: the model, how it is served, what it serves, how its tokens exit and which latency
model prices the launches. Every setting is a section dataclass field declared with :func:`~.options.option` (as
microsoft/vidur declares its configs); from these come every command's options, the experiment TOML file's
``[section]`` tables and the ``--set section.field=value`` keys.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cdbsim.errors import ConfigError, read_text, require
from cdbsim.model.arch import ArchSpec, KVLayout, head_dim_explicit, load_arch
from cdbsim.planner.options import Section, Setting, option, parse_value, section_hints, toml_value, where
from cdbsim.serving.config import CoreLaunch, Policy, ServeConfig, Timing
from cdbsim.serving.memory import MEMORY_FRACTION, KVCapacity, MemoryPlan, RequestShape, gib
from cdbsim.simulator.workload import Arrival, WorkloadSpec, default_mean_depth
from traces import ExitModel

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tomli backport has the same API
    import tomli as tomllib

__all__ = ["MAX_PREFILL_BUDGET", "MAX_WIDTH", "SECTIONS", "ArchSection", "BuiltExperiment", "ExitsSection",
           "Experiment", "LatencySection", "ServeSection", "Setting", "WorkloadSection", "parse_value", "read_toml",
           "settings"]

if TYPE_CHECKING:
    from cdbsim.latency.devices import DeviceSpec
    from cdbsim.latency.model import LatencyModel
    from cdbsim.report.progress import ProgressFactory
    from traces import Request


@dataclass(frozen=True)
class ArchSection(Section):
    """The looped model: a preset, an architecture JSON file or a Hugging Face config.json, optionally with
    another layer shape, split or loop limits. Shape fields left unset keep the base model's values."""

    NAME: ClassVar[str] = "arch"

    name: str = option("ouro-1.4b", "Preset (ouro-1.4b, ouro-2.6b, huginn-3.5b) or an architecture JSON file.",
                       "--arch")
    split: str | None = option(None, "Re-split the layers as prelude-core-coda, e.g. 1-4-1.")
    r_max: int | None = option(None, "Maximum loops per token (default: the model's; 16 for a Huginn config).")
    r_min: int | None = option(None, "Minimum exit depth of the model (default 1; the lookahead gate raises it to 2).")
    hf_config: Path | None = option(None, "A Hugging Face config.json of an Ouro (model_type ouro) or Huginn "
                                          "(huginn_raven) checkpoint, instead of --arch.")
    hidden: int | None = option(None, "Hidden size (overrides the model's).")
    intermediate: int | None = option(None, "MLP intermediate size.")
    heads: int | None = option(None, "Attention heads.")
    kv_heads: int | None = option(None, "Key/value heads.")
    head_dim: int | None = option(None, "Size of one attention head.")
    vocab: int | None = option(None, "Vocabulary size.")
    style: str | None = option(None, "Layer style: ouro (sandwich norm) or huginn (post-norm, adapter).")
    prelude: int | None = option(None, "Layers before the loop (instead of --split).")
    core: int | None = option(None, "Layers in the loop (instead of --split).")
    coda: int | None = option(None, "Layers after the loop (instead of --split).")

    SHAPE: ClassVar[tuple[str, ...]] = ("hidden", "intermediate", "heads", "kv_heads", "head_dim", "style")
    LAYERS: ClassVar[tuple[str, ...]] = ("prelude", "core", "coda")

    def spec(self) -> ArchSpec:
        """The :class:`ArchSpec`: the base model, then the shape fields, the split and the loop limits."""
        arch = self._base()
        shape = {k: getattr(self, k) for k in self.SHAPE
                 if getattr(self, k) is not None and getattr(self, k) != getattr(arch.layer, k)}
        if self.vocab is not None and self.vocab != arch.vocab:
            shape["vocab"] = self.vocab
        if shape:
            changed = ",".join(f"{k}={v}" for k, v in shape.items())
            vocab = shape.pop("vocab", arch.vocab)
            arch = replace(arch, name=f"{arch.name}[{changed}]", layer=replace(arch.layer, **shape), vocab=vocab)
            self._check_heads(arch)
        layers = [getattr(self, k) for k in self.LAYERS]
        if any(n is not None for n in layers):
            require(self.split is None, "give arch.split or arch.prelude/core/coda, not both")
            before = [getattr(arch, k) for k in self.LAYERS]
            counts = [b if n is None else n for b, n in zip(before, layers, strict=True)]
            if counts != before:
                arch = arch.with_split("-".join(map(str, counts)))
        elif self.split:
            arch = arch.with_split(self.split)
        if self.r_max is not None or self.r_min is not None:
            arch = arch.with_loops(self.r_max, self.r_min)
        return arch

    def _check_heads(self, arch: ArchSpec) -> None:
        """Refuse a changed shape whose heads x head_dim differs from hidden, unless a head size is set on purpose
        (``head_dim`` given, or the base file's ``head_dim_explicit``)."""
        layer = arch.layer
        if layer.heads * layer.head_dim == layer.hidden or self.head_dim is not None or head_dim_explicit(arch):
            return
        raise ConfigError(f"heads x head_dim ({layer.heads} x {layer.head_dim} = {layer.heads * layer.head_dim}) "
                          f"differs from hidden ({layer.hidden}); set --heads so they match, or give --head-dim "
                          f"to choose a head size on purpose")

    def _base(self) -> ArchSpec:
        if self.hf_config is None:
            return load_arch(self.name)
        from cdbsim.model.hf_config import arch_from_hf_config

        require(self.name == ArchSection.name,
                f"give a preset or architecture file (arch.name = {self.name!r}) or a Hugging Face config "
                f"(arch.hf_config), not both")
        return arch_from_hf_config(self.hf_config)


MAX_WIDTH = 65_536                 # W: resident requests; the scheduler keeps a padding table this long
MAX_PREFILL_BUDGET = 1_048_576     # M: prompt tokens per launch, 64 x the longest request a preset draws


@dataclass(frozen=True)
class ServeSection(Section):
    """How the model is served: policy, widths, budgets, exit timing, KV layout and KV capacity."""

    NAME: ClassVar[str] = "serve"

    policy: Policy = option(Policy.REFILL, "cb, norefill, refill or adaptive (chooses its coda batch as it runs).")
    width: int = option(64, "Resident requests and tokens per decode launch.", "--W", "--width",
                        maximum=MAX_WIDTH)
    coda_batch: int | None = option(None, "Coda batch refill waits for (1 <= K <= W; default 1).", "--K",
                                    "--coda-batch", minimum=1)
    prefill_budget: int = option(8192, "Prompt tokens per prefill launch.", "--M", "--prefill-budget",
                                 maximum=MAX_PREFILL_BUDGET)
    timing: Timing = option(Timing.LOOKAHEAD, "sync, async or lookahead (lookahead: r_min = 2).")
    kv_layout: KVLayout = option(KVLayout.DEPTH, "depth (with last-exited fill), shared or first-shared.")
    core_launch: CoreLaunch = option(CoreLaunch.MIXED, "mixed (a core launch takes tokens at any loop step) or "
                                                       "per-step (one loop step per launch, as the paper's engine).")
    kv_tokens: int | None = option(None, "KV capacity in tokens.", minimum=1)
    kv_blocks: int | None = option(None, "KV capacity in blocks of 16 tokens.", minimum=1)
    memory_fraction: float = option(MEMORY_FRACTION, "Share of the device's memory for weights, KV cache and run "
                                                      "time; without a KV size, the cache takes what it leaves.",
                                    above=0, maximum=1)
    over_memory: bool = option(False, "Simulate a given KV size the device cannot hold (a what-if; the title says "
                                      "so).")

    def config(self) -> ServeConfig:
        require(self.coda_batch is None or self.policy is not Policy.ADAPTIVE,
                f"--policy adaptive chooses the coda batch K itself as it runs; drop --K {self.coda_batch} "
                f"(serve.coda_batch)")
        return ServeConfig(policy=self.policy, width=self.width, coda_batch=self.coda_batch or 1,
                           prefill_budget=self.prefill_budget, timing=self.timing, layout=self.kv_layout,
                           core_launch=self.core_launch)

    def kv_capacity(self) -> KVCapacity:
        """The KV cache size given (tokens or blocks), else what the device memory leaves after weights."""
        return KVCapacity(tokens=self.kv_tokens, blocks=self.kv_blocks, memory_fraction=self.memory_fraction,
                          over_memory=self.over_memory)


@dataclass(frozen=True)
class WorkloadSection(Section):
    """What is served: a workload preset or a trace file, how many requests, and when they arrive."""

    NAME: ClassVar[str] = "workload"

    name: str = option("sharegpt", "alpaca, sharegpt or arxiv.", "--workload")
    trace: Path | None = option(None, "Replay a request+exit trace (.csv/.parquet) instead of a workload preset.")
    requests: int | None = option(None, "Number of requests (default per workload).", "--requests", "-n",
                                  minimum=1)
    rate: float | None = option(None, "Poisson arrivals at this many requests/s (default: offline, all at t = 0).",
                                above=0)
    arrival: Arrival = option(Arrival.POISSON, "Arrival process at --rate: poisson.")
    seed: int = option(0, "Seed for lengths, arrivals and depths (>= 0).", minimum=0)

    def spec(self, exits: ExitModel) -> WorkloadSpec:
        if self.trace is not None and self.rate is not None:
            raise ConfigError(f"the trace {self.trace} carries its own arrivals; drop --rate {self.rate:g} "
                              f"(workload.rate)")
        return WorkloadSpec(self.name, self.requests, self.rate, exits, self.seed,
                            str(self.trace) if self.trace else None, self.arrival)


@dataclass(frozen=True)
class ExitsSection(Section):
    """How deep each generated token loops: no exits, one fixed depth, a synthetic distribution, or the
    paper's operating point at a threshold q (:mod:`cdbsim.simulator.workload`)."""

    NAME: ClassVar[str] = "exits"

    model: str = option("synthetic", "Exit model: none, fixed, synthetic, or paper (with --q).", "--exits")
    depth: int | None = option(None, "Depth for --exits fixed.")
    mean_depth: float | None = option(None, "Mean requested depth of the synthetic model (default: the midpoint of "
                                            "r_min..r_max, at least the least depth served: 2 under lookahead).")
    dispersion: float = option(0.3, "Synthetic depth dispersion in [0, 1).")
    correlation: float = option(0.5, "Token-to-token depth correlation.")
    q: float | None = option(None, "Exit threshold of --exits paper: Ouro 0.2, 0.4, 0.5, 0.7, 1.0; Huginn 0.28, "
                                   "0.16, 0.10, 0.0.")

    def exit_model(self, arch: ArchSpec, served_min: int = 1) -> ExitModel:
        """The exit model for ``arch`` served from depth ``served_min`` on (which the default mean depth respects)."""
        if self.model == "paper":
            from cdbsim.simulator.workload import CORRELATION, DISPERSION, paper_point

            require(self.q is not None, "--exits paper needs the threshold --q (e.g. 0.2 for Ouro, 0.28 for Huginn)")
            require(self.mean_depth is None, "--exits paper sets the mean depth from --q; drop --mean-depth")
            point = paper_point(arch, self.q)
            source = f"paper q = {self.q:g}, mean {'reported' if point.reported else 'inferred'}"
            return ExitModel("synthetic", mean=max(point.mean_depth, served_min), dispersion=DISPERSION,
                             correlation=CORRELATION, source=source)
        require(self.q is None, "--q goes with --exits paper")
        require(self.depth is None or self.model == "fixed", f"--depth goes with --exits fixed, not {self.model}")
        require(self.mean_depth is None or self.model == "synthetic",
                f"--mean-depth goes with --exits synthetic, not {self.model}")
        mean = self.mean_depth
        if mean is None:
            mean = default_mean_depth(arch.r_max, arch.r_min, served_min)
        return ExitModel(self.model, depth=self.depth, mean=mean, dispersion=self.dispersion,
                         correlation=self.correlation)


WHAT_IF_MAX = 1_000_000  # TB/s, TFLOP/s, us, GB: a million times today's GPUs is no longer a what-if but an overflow
WHAT_IF_MIN = 1e-3  # TB/s, TFLOP/s, GB below which a device would take hours per launch (launch and host: 0 ok)


@dataclass(frozen=True)
class LatencySection(Section):
    """Which latency model prices each launch: a measured profile or the roofline of a device."""

    NAME: ClassVar[str] = "latency"

    profile: str = option("auto", "auto (of the profiles measured on --device's GPU, else the H200's: this "
                                  "model's, else its layer shape's, else the kernel-level one composed for it; "
                                  "else the roofline), a GPU (h200, h100: auto among its profiles), roofline, a "
                                  "shipped name, or a profile JSON file.")
    force: bool = option(False, "Use a profile made for another shape, filling gaps from the roofline.")
    device: str = option("h200", "GPU: h200, h100-sxm (measured), b200, a100-80gb (the H200's profiles "
                                 "carried to their datasheet figures, not validated).")
    bandwidth: float | None = option(None, "What-if device: achievable memory bandwidth in TB/s.",
                                     maximum=WHAT_IF_MAX)
    matmul_tflops: float | None = option(None, "What-if device: achievable bf16 matmul rate in TFLOP/s.",
                                         maximum=WHAT_IF_MAX)
    launch_us: float | None = option(None, "What-if device: per-kernel launch cost in us (0 allowed).",
                                     maximum=WHAT_IF_MAX)
    memory_gb: float | None = option(None, "What-if device: device memory in GB.", maximum=WHAT_IF_MAX)
    host_us: float | None = option(None, "What-if device: host time per launch in us (0 allowed).",
                                   maximum=WHAT_IF_MAX)

    DEVICE: ClassVar[dict[str, tuple[str, float]]] = {  # field -> DeviceSpec field and unit
        "bandwidth": ("bandwidth", 1e12), "matmul_tflops": ("matmul_flops", 1e12), "launch_us": ("launch_s", 1e-6),
        "memory_gb": ("memory_bytes", 1e9), "host_us": ("host_launch_s", 1e-6)}

    def model(self, arch: ArchSpec) -> LatencyModel:
        """The named profile on the chosen device (a preset, changed by any what-if figures given), carried
        there when it was measured elsewhere (:func:`cdbsim.latency.shipped.resolve_profile`)."""
        from cdbsim.latency.model import LatencyModel
        from cdbsim.latency.shipped import resolve_profile

        return LatencyModel(arch, resolve_profile(self.profile, arch, self.device_spec()), force=self.force)

    def device_spec(self) -> DeviceSpec:
        """The device's figures: the preset's, with the what-if ones given on top (zero launch and host
        costs are allowed what-ifs; a zero bandwidth, rate or memory is not)."""
        from cdbsim.latency.devices import device_preset

        device = device_preset(self.device)
        overrides, given = {}, []
        for key, (device_field, scale) in self.DEVICE.items():
            value = getattr(self, key)
            if value is not None:
                zero_ok = key in ("launch_us", "host_us")
                require(math.isfinite(value) and (value >= 0 if zero_ok else value >= WHAT_IF_MIN),
                        f"latency.{key} must be {'>= 0' if zero_ok else f'>= {WHAT_IF_MIN:g}'} and finite, "
                        f"got {value:g}")
                overrides[device_field] = value * scale
                given.append(f"{key} {value:g}")
        if not overrides:
            return device
        return replace(device, name=f"{device.name}, what-if {', '.join(given)}", **overrides)


SECTIONS: dict[str, type[Section]] = {"arch": ArchSection, "serve": ServeSection, "workload": WorkloadSection,
                                      "exits": ExitsSection, "latency": LatencySection}


def settings() -> list[Setting]:
    """Every field of every section, in declaration order."""
    out = []
    for section, cls in SECTIONS.items():
        hints = section_hints(cls)
        for f in fields(cls):
            flags = f.metadata["flags"] or ("--" + f.name.replace("_", "-"),)
            out.append(Setting(section, f.name, hints[f.name], f.default, tuple(flags), f.metadata["help"]))
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed TOML of an experiment file; a missing file or bad TOML is a one-line error."""
    text = read_text(path, "experiment file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None


@dataclass(frozen=True)
class Experiment:
    """Everything a run is made of, one section per concern. Sections may be given as dicts of their
    fields: ``Experiment(serve={"width": 128}, workload={"name": "alpaca", "requests": 100})``."""

    arch: ArchSection = field(default_factory=ArchSection)
    serve: ServeSection = field(default_factory=ServeSection)
    workload: WorkloadSection = field(default_factory=WorkloadSection)
    exits: ExitsSection = field(default_factory=ExitsSection)
    latency: LatencySection = field(default_factory=LatencySection)

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, cls().updated(value, name))
            elif not isinstance(value, cls):
                raise ConfigError(f"{name} must be a {cls.__name__} or a dict of its fields, got {value!r}")

    @classmethod
    def from_toml(cls, path: str | Path) -> Experiment:
        """An experiment file: a table per section (``[serve]``, ...); fields left out keep their defaults."""
        return cls().merge(read_toml(path), source=str(path))

    def merge(self, data: Mapping[str, Any], source: str | None = None) -> Experiment:
        """A copy with the sections of ``data`` (``{"serve": {"width": 128}}``) set; errors name ``source``."""
        updates = {}
        for name, values in data.items():
            if name not in SECTIONS:
                raise ConfigError(f"{where(source)}unknown section [{name}]; valid sections: {', '.join(SECTIONS)}")
            if not isinstance(values, Mapping):
                raise ConfigError(f"{where(source)}{name} must be a table of settings ([{name}]), got {values!r}")
            updates[name] = getattr(self, name).updated(values, name, source)
        return replace(self, **updates)

    def override(self, assignments: Iterable[str] | Mapping[str, Any], source: str | None = "--set") -> Experiment:
        """A copy with ``section.field=value`` assignments (or a ``{"section.field": value}`` mapping) applied
        in order, each value parsed to its field's type; errors name ``source``."""
        items = assignments.items() if isinstance(assignments, Mapping) else map(self._split, assignments)
        nested: dict[str, dict[str, Any]] = {}
        for key, value in items:
            section, dot, name = key.partition(".")
            if not dot or not section or not name or "." in name:
                raise ConfigError(f"{where(source)}expected section.field=value, got {key!r}")
            nested.setdefault(section, {})[name] = value
        return self.merge(nested, source)

    def get(self, key: str) -> Any:
        """The value of the field ``section.field``."""
        section, _, name = key.partition(".")
        return getattr(getattr(self, section), name)

    def refuse_unused(self, given: Iterable[str]) -> None:
        """Refuse set fields (``given``: ``section.field`` keys) this experiment would not use: with a trace, the
        workload preset, request count, seed and exit model."""
        if self.workload.trace is None:
            return
        given = set(given)
        unused = [s for s in settings() if s.key in given
                  and (s.section == "exits" or s.key in ("workload.name", "workload.requests", "workload.seed"))]
        if unused:
            flags = ", ".join(s.flags[0] for s in unused)
            raise ConfigError(f"the trace {self.workload.trace} holds the requests and their exit depths; "
                              f"{flags} would be ignored: drop {'it' if len(unused) == 1 else 'them'}")

    @staticmethod
    def _split(assignment: str) -> tuple[str, str]:
        key, eq, value = assignment.partition("=")
        require(bool(eq), f"--set: expected section.field=value, got {assignment!r}")
        return key.strip(), value

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{section: {field: value}}`` with enums and paths as plain values (``None`` for unset)."""
        return {name: getattr(self, name).to_dict() for name in SECTIONS}

    def to_toml(self) -> str:
        """The experiment as TOML that :meth:`from_toml` reads back equal (unset optional fields left out)."""
        lines = []
        for name, values in self.to_dict().items():
            lines.append(f"[{name}]")
            lines += [f"{key} = {toml_value(value)}" for key, value in values.items() if value is not None]
            lines.append("")
        return "\n".join(lines)

    def workload_spec(self, arch: ArchSpec) -> WorkloadSpec:
        """The workload with this experiment's exit model for ``arch`` (served as :attr:`serve` sets)."""
        return self.workload.spec(self.exits.exit_model(arch, self.serve.config().r_min(arch)))

    def build(self, progress: ProgressFactory | None = None) -> BuiltExperiment:
        """Resolve the sections into architecture, serving config, workload, latency model, KV capacity and requests;
        settings that cannot run are refused before any request is drawn (``progress`` follows the drawing)."""
        arch = self.arch.spec()
        config = self.serve.config()
        workload = self.workload_spec(arch)
        latency = self.latency.model(arch)
        kv = self.serve.kv_capacity()
        blocks = kv.blocks_for(arch, config, latency, RequestShape.FEWEST)  # refuses a cache that cannot fit
        requests = workload.build(arch, config.r_min(arch), progress, kv_blocks=blocks)
        return BuiltExperiment(self, arch, config, workload, latency, kv, requests,
                               kv.plan_on(arch, config, latency, RequestShape.of(requests)))


@dataclass(frozen=True)
class BuiltExperiment:
    """An :class:`Experiment` resolved: the objects the simulator and the studies take."""

    experiment: Experiment
    arch: ArchSpec
    config: ServeConfig
    workload: WorkloadSpec
    latency: LatencyModel
    kv: KVCapacity
    requests: list[Request]
    memory: MemoryPlan

    def title(self) -> str:
        """One line naming the model, the serving settings, the workload and the latency profile, and, for a
        cache the device cannot hold, that it is a what-if past the device's memory."""
        c = self.config
        title = (f"{self.arch.name} ({self.arch.split}, r_max {self.arch.r_max}) | W={c.width} M={c.prefill_budget} "
                 f"{c.timing.value} {c.layout.value}-KV | {self.workload.describe()} | "
                 f"profile {self.latency.profile.label()}")
        if not self.memory.fits:
            title += (f" | WHAT-IF PAST DEVICE MEMORY (--over-memory): needs {gib(self.memory.total)}, "
                      f"{self.memory.fraction:.0%} of the {self.memory.device} is {gib(self.memory.usable)}")
        return title
