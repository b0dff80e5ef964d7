"""The GPU commands: the simulator checked against the GPU executor (validate), and the latency profiles
measured on this GPU (calibrate). The executor and the measurements (torch) are imported by the command that
runs them, never by ``cdbsim`` alone."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.status import Status

from cdbsim.errors import ConfigError, require
from cdbsim.latency.devices import preset_of
from cdbsim.model.arch import LayerStyle, load_arch
from cdbsim.planner.experiment import Experiment, settings
from cdbsim.report.outputs import check_dir, check_file
from commands.common import CommandGroup, CsvOut, JsonOut, comma_list, emit, emit_data

group = CommandGroup()

# options of every command that runs the executor on a checkpoint (record, validate --checkpoint)
StateInitOpt = Annotated[str, typer.Option(
    "--state-init", help="Where Huginn's loop starts: zeros, or random: each token its own draw as the authors' "
                         "code makes it (a normal truncated at 3 std, std sqrt(2/5) after the embedding scale), "
                         "keyed by --state-seed, the request and the position.")]
StateSeedOpt = Annotated[int | None, typer.Option("--state-seed", min=0, help="Seed of --state-init random "
                                                                              "(default 0).")]
CriterionOpt = Annotated[str | None, typer.Option("--criterion", help="hazard (Ouro's gate) or latent-diff "
                                                                      "(default: the model's own).")]
PROMPTS_HELP = "JSONL (one object a line: text, prompt or token_ids) or CSV (a text or token_ids column)."


def _start_state(state_init: str, state_seed: int | None) -> tuple[str, int]:
    """``--state-init`` and ``--state-seed`` as the model takes them; a seed without a random start is refused."""
    require(state_seed is None or state_init == "random", "--state-seed goes with --state-init random")
    return state_init, state_seed or 0


@group.command("validate", "arch.name", "arch.hf_config", "arch.split", "serve.policy", "serve.width",
               "serve.coda_batch", "serve.timing", "serve.kv_layout", "workload.name", "workload.trace",
               "workload.requests", "exits.model", "exits.mean_depth", "workload.seed", "serve.kv_tokens",
               "serve.memory_fraction", "serve.core_launch", "latency.profile", "latency.force", "latency.device",
               defaults={"workload.name": "alpaca", "workload.requests": 128, "workload.seed": 1})
def validate(
    exp: Experiment,
    given: frozenset[str],
    matrix: Annotated[Path | None, typer.Option(
        "--matrix", help="A validation matrix JSON file (default: one configuration from the options below).")] = None,
    only: Annotated[str | None, typer.Option("--only", help="Comma-separated config names of the matrix.")] = None,
    measured: Annotated[Path | None, typer.Option(
        "--measured", help="Compare against executor logs saved in this directory instead of running the GPU.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Where logs, tables and plots go.")] = Path("validation"),
    rate_of_capacity: Annotated[float | None, typer.Option(
        "--rate-of-capacity", help="Online run: Poisson arrivals at this fraction of the simulated offline "
                                   "capacity.")] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Refuse a profile measured by another executor build than the runs' (sources, torch, "
                         "Triton, CUDA or GPU) instead of warning.")] = False,
    checkpoint: Annotated[Path | None, typer.Option(
        "--checkpoint", help="Run the executor with this checkpoint's weights (a Hugging Face model folder); its "
                             "config.json is the architecture (default: random weights of the shapes).")] = None,
    live_q: Annotated[float | None, typer.Option(
        "--live-q", help="With --checkpoint: also run the model's own exit gate live in the served run at this "
                         "threshold (as cdbsim record's --q) and report how it differs from the replayed depths.")]
        = None,
    criterion: CriterionOpt = None,
    prompts: Annotated[Path | None, typer.Option(
        "--prompts", help="With --checkpoint and a recorded --trace: the prompts it was recorded on (prompt i is "
                          f"request i; default: synthetic prompts of the trace's lengths). {PROMPTS_HELP}")] = None,
    state_init: StateInitOpt = "zeros", state_seed: StateSeedOpt = None,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Run configurations on the GPU executor and in the simulator on identical requests; show the errors. With
    --checkpoint --trace --live-q Q the model's own exit gate also runs live at every loop step each token is
    served, and a second table shows the share of decoded tokens whose live exit agrees with the replayed depth,
    would have come earlier, or had not fired by it, and the mean depth difference (also in --json, the run's
    meta.json and summary.json)."""
    from calibration import validation as val

    require(matrix is not None or only is None, "--only picks configurations of a --matrix file; give --matrix too")
    require(matrix is None or rate_of_capacity is None, "--rate-of-capacity sets the configuration given by options; "
            "a --matrix entry sets its own (rate_of_capacity)")
    unused = [s.flags[0] for s in settings() if s.key in given and s.section != "latency"]
    require(matrix is None or not unused, f"{', '.join(unused)}: a --matrix entry sets its own configuration; of the "
            "options only --profile, --force and --device apply to it")
    if checkpoint is not None:
        require(matrix is None and measured is None, f"--checkpoint {checkpoint}: runs the configuration of the "
                "options on the GPU; a --matrix entry names its own architecture and --measured runs nothing")
        chosen = sorted({"arch.name", "arch.hf_config"} & given)
        flags = {s.key: s.flags[0] for s in settings()}
        require(not chosen, f"--checkpoint {checkpoint}: its config.json is the architecture; drop "
                            f"{' and '.join(flags[c] for c in chosen)}")
        require(checkpoint.is_dir() and (checkpoint / "config.json").is_file(),
                f"--checkpoint {checkpoint}: not a model folder with a config.json")
        exp = exp.override({"arch.hf_config": str(checkpoint / "config.json")}, source=None)
        run_with = _checkpoint_run(checkpoint, exp, live_q, criterion, prompts, *_start_state(state_init, state_seed))
    else:
        given_options = [flag for flag, value in (("--live-q", live_q), ("--criterion", criterion),
                                                  ("--prompts", prompts), ("--state-seed", state_seed))
                         if value is not None] + (["--state-init"] if state_init != "zeros" else [])
        require(not given_options, f"{', '.join(given_options)}: run a checkpoint; give --checkpoint")
        run_with = None
    check_dir(out, "--out", ("measured",))
    given_measured = measured
    unpacked = contextlib.ExitStack()
    if measured is not None:  # a committed archive of logs re-predicts as it is
        measured = unpacked.enter_context(val.unpacked_logs(measured))
    if measured is not None and not measured.is_dir():
        raise ConfigError(f"--measured {measured}: not a directory of saved executor logs (or a .tgz of one)")
    if matrix is not None:
        entries = val.load_matrix(matrix, only=comma_list(only, "--only") if only else None)
    else:
        entries = [val.Entry.from_experiment("config", exp, rate_of_capacity)]
    if "latency.device" not in given:  # the GPU the runs are (or were) measured on chooses the profiles
        gpu = val.measured_gpu(measured) if measured is not None else _this_gpu()
        preset = preset_of(gpu) if gpu else None
        exp = exp.override({"latency.device": preset}, source=None) if preset else exp
    latency_for = functools.cache(exp.latency.model)
    created = not out.exists()
    try:
        with unpacked:
            if measured is not None:
                _require_saved_runs(entries, measured, given_measured, matrix is not None)
            result = val.run_validation(entries, out, latency_for, measured=measured, strict=strict,
                                        log=lambda msg: Console(stderr=True, soft_wrap=True).print(msg, markup=False),
                                        checkpoint=run_with)
    finally:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a run that failed before writing anything leaves no empty directory either
    profiles = "; ".join(dict.fromkeys(val.profile_names(latency_for, entries).values()))
    builds = "; ".join(dict.fromkeys(row["profile build"] for row in result.summary))
    live = {"live_gates": result.live_gates} if result.live_gates else {}
    if emit_data(as_json, as_csv, [{**row, "profile": profiles} for row in result.summary],
                 [{"summary": result.summary, "errors": result.errors, "profile": profiles, **live}]):
        return
    if len(entries) == 1:
        start = result.comparisons[0].measured_log.meta.get("state_init")
        emit(result.comparisons[0].rows, f"{entries[0].describe()} | errors are (predicted - measured) / measured",
             caption=f"predicted with profile {profiles} ({builds})"
                     + (f" | loop start {start}" if start else "") + f" | files in {out}")
    else:
        emit(result.summary, f"validation: {len(entries)} configurations",
             caption=" | ".join(f"{k}: {v:.3g}" for k, v in result.errors.items())
             + f" | predicted with profile {profiles} ({builds}) | files in {out}")
    if result.live_gates:
        emit(val.live_gate_rows(result.live_gates), "live exit gates against the replayed depths (decoded tokens)",
             caption="earlier: the live gate fired before the replayed depth; not fired: it had not by then")


def _checkpoint_run(folder: Path, exp: Experiment, live_q: float | None, criterion: str | None,
                    prompts: Path | None, state_init: str, state_seed: int) -> Any:
    """How validate runs the checkpoint (:class:`calibration.validation.CheckpointRun`), its options checked and
    its prompts read before any GPU work."""
    from calibration.validation import CheckpointRun
    from executor.gates import CRITERIA
    from executor.record import Vocabulary, check_start_state, read_prompts

    arch = exp.arch.spec()
    check_start_state(arch, state_init, state_seed)
    require(criterion is None or live_q is not None, "--criterion chooses the rule of the live gates: give --live-q")
    require(criterion is None or criterion in CRITERIA,
            f"unknown exit criterion {criterion!r}; choose one of: {', '.join(CRITERIA)}")
    require(criterion != "hazard" or arch.style is LayerStyle.OURO, "the hazard criterion needs Ouro's exit gate")
    require(prompts is None or exp.workload.trace is not None,
            "--prompts are those a recorded trace was recorded on: give --trace too")
    ids = read_prompts(prompts, Vocabulary.of(folder, arch.vocab)) if prompts is not None else None
    return CheckpointRun(folder, state_init, state_seed, live_q, criterion, ids)


def _this_gpu() -> str | None:
    """The name of this machine's GPU, None without one (or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _require_saved_runs(entries: list, folder: Path, given: Path | None, from_matrix: bool) -> None:
    """Refuse ``--measured`` (unpacked into ``folder``) that lacks the saved run of an entry, naming it as the
    user knows it: a matrix entry, or the configuration of the options (saved as ``config/``)."""
    from cdbsim.report.logs import RunLog

    missing = [e.name for e in entries if not RunLog.saved_in(folder / e.name)]
    if not missing:
        return
    what = "the configuration of the options"
    if from_matrix:
        names = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        what = f"matrix entr{'y' if len(missing) == 1 else 'ies'} {names}"
    log = f"{missing[0]}/launches.parquet (or .csv)"
    expected = f"{given}/{log}" if given is not None and given.is_dir() else f"{log} in the archive"
    raise ConfigError(f"--measured {given}: no saved executor run for {what}; expected {expected}"
                      f"{', one folder per entry' if len(missing) > 1 else ''}, as validate --out DIR saves them in "
                      f"DIR/measured")


def _saved_launches(path: Path) -> list:
    """The launch logs of every saved executor run under ``path`` (a directory of run directories, one run's
    directory, or a .tgz of them), read before the archive's temporary copy goes."""
    from calibration import validation as val
    from cdbsim.report.logs import RunLog

    require(path.exists(), f"--launch-gap {path}: no such directory or archive")
    with val.unpacked_logs(path, "--launch-gap") as root:
        require(root.is_dir(), f"--launch-gap {path}: not a directory of saved executor runs (or a .tgz of one)")
        runs = [root] if RunLog.saved_in(root) else sorted(d for d in root.iterdir() if RunLog.saved_in(d))
        require(bool(runs), f"--launch-gap {path}: no saved executor runs in it")
        return [RunLog.load(run).launches for run in runs]


def _mixed_context_title(name: str, profile: Any) -> str:
    """The title of a profile's mixed-context table: the attention width and sharpness it fitted."""
    slots = profile.attention_slots
    return (f"{name}: core steps with mixed context lengths (attention width "
            f"{f'{slots:,.0f}' if slots else 'not fitted'}, sharpness {profile.attention_sharpness:g})")


CALIBRATED = "ouro-1.4b,ouro-2.6b,huginn-3.5b"  # the models calibrate measures by default


@group.command("record")
def record(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="A Hugging Face model folder of an Ouro or Huginn "
                                                                  "checkpoint (config.json, safetensors, "
                                                                  "tokenizer.json).")],
    prompts: Annotated[Path, typer.Option("--prompts", help=PROMPTS_HELP)],
    q: Annotated[float, typer.Option("--q", help="Exit threshold: Ouro's cumulative exit probability (the paper: "
                                                 "0.2-1.0), Huginn's relative change between loop states.")],
    out: Annotated[Path, typer.Option("--out", help="The trace to write (.csv or .parquet).")],
    outputs: Annotated[Path | None, typer.Option("--outputs", help="Also write each request's output ids and text "
                                                                   "(JSONL).")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="Output tokens per prompt at most "
                                                                                "(fewer at end of sequence).")] = 256,
    criterion: CriterionOpt = None,
    r_max: Annotated[int | None, typer.Option("--r-max", min=1, help="Loops (default: the config's; Huginn 16).")]
        = None,
    device: Annotated[str, typer.Option("--device", help="cuda (default when there is one) or cpu.")] = "auto",
    state_init: StateInitOpt = "zeros", state_seed: StateSeedOpt = None,
) -> None:
    """Run a checkpoint on real prompts and record the depth at which its own exit rule fires for every output
    token: a trace that predict, compare and validate replay with --trace."""
    import json

    from cdbsim.report.outputs import atomic_file
    from cdbsim.report.progress import progress_display
    from executor.record import Checkpoint, read_prompts
    from executor.record import record as run_record
    from traces import write_trace

    check_file(out, "--out", (".csv", ".parquet"))
    if outputs is not None:
        check_file(outputs, "--outputs", (".jsonl",))
    import torch

    chosen = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    require(chosen in ("cuda", "cpu"), f"--device must be cuda, cpu or auto, got {device!r}")
    require(chosen == "cpu" or torch.cuda.is_available(), "--device cuda: no CUDA GPU here (use --device cpu)")
    init, seed = _start_state(state_init, state_seed)
    opened = Checkpoint.open(checkpoint, device=chosen, r_max=r_max, state_init=init, state_seed=seed)
    ids = read_prompts(prompts, opened.vocabulary)
    with progress_display() as factory:
        recorded = run_record(opened, ids, q, max_new_tokens=max_new_tokens, criterion=criterion,
                              progress=factory(f"recording {len(ids):,} prompts", len(ids)))
    with atomic_file(out) as staging:
        write_trace(recorded.requests, staging)
    if outputs is not None:
        with atomic_file(outputs) as staging:
            staging.write_text("".join(json.dumps({"request_id": r.request_id, "token_ids": t, "text": x}) + "\n"
                                       for r, t, x in zip(recorded.requests, recorded.outputs, recorded.texts,
                                                          strict=True)))
    depths = [d for r in recorded.requests for d in r.depths.tolist()]
    mean = sum(depths) / len(depths) if depths else float("nan")
    emit([{"prompts": len(ids), "output tokens": sum(r.output_len for r in recorded.requests),
           "mean exit depth": mean, "r_max": opened.arch.r_max, "loop start": opened.model.config.start_state}],
         f"{opened.arch.name}: exits at q = {q:g}", caption=f"trace written to {out}")


@group.command("calibrate")
def calibrate(
    arch: Annotated[str, typer.Option("--arch", help="Comma-separated presets or architecture files.")] = CALIBRATED,
    out: Annotated[Path, typer.Option("--out", help="Where the profiles (JSON + PNG) go.")] = Path("profiles"),
    quick: Annotated[bool, typer.Option("--quick", help="A few points per component (minutes less).")] = False,
    device: Annotated[str, typer.Option("--device", help="cuda (default) or cpu (for a tiny test model).")] = "cuda",
    refit: Annotated[list[Path] | None, typer.Option(
        "--refit", help="Refit this profile JSON from its raw points, in place, and measure nothing "
                        "(no GPU needed; repeat for several).")] = None,
    kernels: Annotated[bool | None, typer.Option(
        "--kernels/--no-kernels", help="Only the kernel-level profile (any architecture) / only the --arch "
                                       "models' profiles (default: both).")] = None,
    update: Annotated[Path | None, typer.Option(
        "--update", help="Re-measure --families into this existing kernel profile; with --no-kernels, the "
                         "mixed-context core steps (family skew) into this --arch model's profile.")] = None,
    families: Annotated[str | None, typer.Option(
        "--families", help="Kernel-level: comma-separated families to measure (default: all).")] = None,
    head_dims: Annotated[str | None, typer.Option(
        "--head-dims", help="With --update of a kernel profile: measure the attention families at these head "
                            "sizes only (comma-separated), keeping its rows of the others.")] = None,
    launch_gap: Annotated[Path | None, typer.Option(
        "--launch-gap", help="With --refit: set the device's launch gap to the mean back-to-back gap over these "
                             "saved executor runs (a directory or .tgz, as validate --out saves them).")] = None,
    checkpoint: Annotated[Path | None, typer.Option(
        "--checkpoint", help="Calibrate the architecture of this Hugging Face model folder (its config.json) in "
                             "place of --arch; stage times do not depend on the weights, so its shapes are timed "
                             "with random ones.")] = None,
) -> None:
    """Measure this GPU with the executor, fit the latency model, and write a profile per model and a
    kernel-level profile that predicts architectures nobody has built."""
    from calibration.fit import attention_rows, quality_rows, refit_profile, saturation_rows, with_launch_gap
    from calibration.run import calibrate as run_calibration
    from cdbsim.latency.profile import load_profile_file

    if launch_gap is not None and not refit:
        raise ConfigError("--launch-gap goes with --refit (it sets the gap of the profiles refitted)")
    if refit:  # every file checked, read and refitted before any is rewritten
        refitted = [(path, refit_profile(load_profile_file(check_file(path, "--refit", (".json",)))))
                    for path in refit]
        if launch_gap is not None:
            logs = _saved_launches(launch_gap)
            refitted = [(path, with_launch_gap(profile, logs)) for path, profile in refitted]
        for path, profile in refitted:
            profile.save(path)
            emit(quality_rows(profile), f"{profile.label()}: refitted fits", caption=f"written to {path}")
            if profile.attention.get("points"):
                emit(attention_rows(profile), _mixed_context_title(profile.label(), profile))
        return
    check_dir(out, "--out")
    if checkpoint is not None:
        from cdbsim.model.hf_config import arch_from_hf_config

        require(arch == CALIBRATED, f"--checkpoint {checkpoint} names the architecture; drop --arch {arch}")
        require(not kernels, "--checkpoint calibrates a model's profile; --kernels measures the kernel-level one")
        require((checkpoint / "config.json").is_file(), f"--checkpoint {checkpoint}: not a model folder with a "
                                                         f"config.json")
        specs = [arch_from_hf_config(checkpoint / "config.json")]
        kernels = False
    else:
        specs = [] if kernels else [load_arch(name) for name in comma_list(arch, "--arch")]
    require(head_dims is None or kernels is not False,
            "--head-dims chooses head sizes of the kernel-level profile; drop --no-kernels")
    if kernels is False and update is not None:
        _update_model_attention(specs, update, families, out, device)
        return
    if kernels is not False:
        base = load_profile_file(update) if update is not None else None
        from calibration.kernels import FAMILIES, calibrate_kernels, summary_rows

        chosen = tuple(comma_list(families, "--families")) if families else FAMILIES
        bad = [f for f in chosen if f not in FAMILIES]
        require(not bad, f"unknown kernel families {', '.join(bad)}; choose from: {', '.join(FAMILIES)}")
        sizes = _head_dims(head_dims, update) if head_dims is not None else None
    with calibration_progress() as progress:
        profiles = run_calibration(specs, out, quick=quick, device=device, progress=progress)
        if kernels is not False:
            kernel_profile = calibrate_kernels(out, device=device, quick=quick, progress=progress,
                                               families=chosen, base=base, head_dims=sizes)
    if kernels is not False:
        emit(summary_rows(kernel_profile), f"{kernel_profile.label()}: kernel tables",
             caption=f"written to {out / (kernel_profile.name + '.json')}")
    for spec, profile in zip(specs, profiles, strict=True):
        emit(quality_rows(profile), f"{profile.label()}: fits")
        if profile.attention:
            emit(attention_rows(profile), _mixed_context_title(spec.name, profile))
        emit(saturation_rows(profile, spec), f"{spec.name}: core stage and B*(L)",
             caption=f"written to {out / (profile.name + '.json')} and .png")


def _head_dims(text: str, update: Path | None) -> tuple[int, ...]:
    """``--head-dims``: even positive sizes, re-measured into an existing profile (``--update``)."""
    sizes = comma_list(text, "--head-dims")
    bad = [item for item in sizes if not (item.isdigit() and int(item) > 0 and int(item) % 2 == 0)]
    if bad:
        raise ConfigError(f"--head-dims: {bad[0]!r} is not an even positive head size")
    require(update is not None, "--head-dims re-measures some head sizes into a kernel profile; give --update")
    return tuple(sorted({int(item) for item in sizes}))


@contextlib.contextmanager
def calibration_progress(every_s: float = 10.0) -> Iterator[Callable[[str], None]]:
    """Where a calibration is: a spinner on a terminal; in a log, a timestamped line when the step's kind (its first
    word) changes, else at most every ``every_s``."""
    console = Console(stderr=True)
    if console.is_terminal:
        with Status("calibrating", console=console) as status:
            yield status.update
        return
    start, last, kind = time.perf_counter(), -every_s, ""

    def line(message: str) -> None:
        nonlocal last, kind
        now, step = time.perf_counter() - start, message.split(" ", 1)[0]
        if now - last >= every_s or step != kind:
            last, kind = now, step
            console.print(f"[{now:7.1f} s] {message}", markup=False, highlight=False, soft_wrap=True)

    yield line


def _update_model_attention(specs: list, update: Path, families: str | None, out: Path, device: str) -> None:
    """``calibrate --no-kernels --update PROFILE``: the model's mixed-context core steps measured again into
    its profile (written to ``out``), every other fit kept."""
    from calibration.fit import attention_rows
    from calibration.measure import remeasure_attention
    from calibration.run import torch_device
    from cdbsim.latency.profile import ProfileKind, load_profile_file

    chosen = comma_list(families, "--families") if families else ["skew"]
    if chosen != ["skew"]:
        raise ConfigError(f"--update of a model profile re-measures the family skew only, not {', '.join(chosen)}")
    require(len(specs) == 1, f"--update of a model profile takes one --arch, not {len(specs)}")
    profile = load_profile_file(check_file(update, "--update", (".json",)))
    if profile.kind is not ProfileKind.MEASURED:
        raise ConfigError(f"--update {update}: {profile.name} is a {profile.kind} profile, not a measured one")
    with calibration_progress() as progress:
        updated = remeasure_attention(specs[0], profile, torch_device(device), progress=progress)
    path = out / update.name
    updated.save(path)
    emit(attention_rows(updated), _mixed_context_title(specs[0].name, updated), caption=f"written to {path}")
