"""The ``cdbsim`` command line: parse, call the library, print. No logic a library user would need."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cdbsim.arch import ArchSpec, load_arch
from cdbsim.config import ServeConfig
from cdbsim.errors import ConfigError
from traces import ExitModel

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Predict and measure serving throughput and latency of looped language models "
                       "under Continuous Depth Batching.")
console = Console()
DEFAULT_KV_TOKENS = 327_680  # the CDB paper's KV cache size


def fail(message: str) -> None:
    """Print a one-line error and exit with code 2."""
    Console(stderr=True).print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def friendly(command: Callable) -> Callable:
    """Turn bad-input exceptions into a one-line error with exit code 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except ConfigError as exc:
            fail(str(exc))
        except ImportError as exc:
            fail(f"{exc}; install the GPU extra: pip install 'cdbsim[gpu]'")

    return wrapper


# ----- shared options ----------------------------------------------------------------------------
Arch = Annotated[str, typer.Option("--arch", help="Preset (ouro-1.4b, ouro-2.6b, huginn-3.5b) or an "
                                                  "architecture JSON file.")]
Split = Annotated[str | None, typer.Option("--split", help="Re-split the layers as prelude-core-coda, "
                                                           "e.g. 1-4-1.")]
RMax = Annotated[int | None, typer.Option("--r-max", help="Maximum loops per token (default: the model's).")]
RMin = Annotated[int | None, typer.Option("--r-min", help="Minimum exit depth of the model (default 1; the "
                                                          "lookahead gate raises it to 2).")]
PolicyOpt = Annotated[str, typer.Option("--policy", help="cb, norefill or refill.")]
Width = Annotated[int, typer.Option("--W", "--width", help="Resident requests and tokens per decode launch.")]
CodaK = Annotated[int, typer.Option("--K", "--coda-batch", help="Coda batch refill waits for (1 <= K <= W).")]
Budget = Annotated[int, typer.Option("--M", "--prefill-budget", help="Prompt tokens per prefill launch.")]
TimingOpt = Annotated[str, typer.Option("--timing", help="sync, async or lookahead (lookahead: r_min = 2).")]
Layout = Annotated[str, typer.Option("--kv-layout", help="depth (with last-exited fill), shared or "
                                                         "first-shared.")]
Workload = Annotated[str, typer.Option("--workload", help="alpaca, sharegpt or arxiv.")]
TraceOpt = Annotated[Path | None, typer.Option("--trace", help="Replay a request+exit trace (.csv/.parquet) "
                                                              "instead of a workload preset.")]
Requests = Annotated[int | None, typer.Option("--requests", "-n", help="Number of requests (default per "
                                                                       "workload).")]
Rate = Annotated[float | None, typer.Option("--rate", help="Poisson arrivals at this many requests/s "
                                                           "(default: offline, all at t = 0).")]
Exits = Annotated[str, typer.Option("--exits", help="Exit model: none, fixed or synthetic.")]
Depth = Annotated[int | None, typer.Option("--depth", help="Depth for --exits fixed.")]
MeanDepth = Annotated[float | None, typer.Option("--mean-depth", help="Mean requested depth of the "
                                                                      "synthetic model (default: "
                                                                      "(r_max + 1) / 2).")]
Dispersion = Annotated[float, typer.Option("--dispersion", help="Synthetic depth dispersion in [0, 1).")]
Correlation = Annotated[float, typer.Option("--correlation", help="Token-to-token depth correlation.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed for lengths, arrivals and depths.")]
KVTokens = Annotated[int | None, typer.Option("--kv-tokens", help="KV capacity in tokens.")]
KVBlocks = Annotated[int | None, typer.Option("--kv-blocks", help="KV capacity in blocks of 16 tokens.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
CsvOut = Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")]


def build_arch(arch: str, split: str | None, r_max: int | None, r_min: int | None = None) -> ArchSpec:
    return load_arch(arch, split=split, r_max=r_max, r_min=r_min)


def build_exits(arch: ArchSpec, exits: str, depth: int | None, mean_depth: float | None,
                dispersion: float, correlation: float) -> ExitModel:
    from cdbsim.workload import default_mean_depth

    mean = mean_depth if mean_depth is not None else default_mean_depth(arch.r_max)
    return ExitModel(exits, depth=depth, mean=mean, dispersion=dispersion, correlation=correlation)


def emit(rows: list[dict], title: str, as_json: bool, as_csv: bool, caption: str | None = None) -> None:
    """Print ``rows`` as a rich table, JSON or CSV."""
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, default=float) + "\n")
        return
    if as_csv:
        import pandas as pd

        sys.stdout.write(pd.DataFrame(rows).to_csv(index=False))
        return
    table = Table(title=title, caption=caption)
    for key in rows[0] if rows else []:
        table.add_column(key, justify="right" if isinstance(rows[0][key], int | float) else "left")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    console.print(table)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# ----- commands ----------------------------------------------------------------------------------
@app.command()
@friendly
def schedule(
    arch: Arch = "ouro-1.4b", split: Split = None, r_max: RMax = None, r_min: RMin = None,
    policy: PolicyOpt = "refill",
    width: Width = 64, coda_batch: CodaK = 1, prefill_budget: Budget = 8192, timing: TimingOpt = "lookahead",
    kv_layout: Layout = "depth", workload: Workload = "sharegpt", trace: TraceOpt = None,
    requests: Requests = 256, exits: Exits = "synthetic", depth: Depth = None,
    mean_depth: MeanDepth = None, dispersion: Dispersion = 0.3, correlation: Correlation = 0.5,
    seed: Seed = 0, kv_tokens: KVTokens = None, kv_blocks: KVBlocks = None,
    launches: Annotated[int, typer.Option("--launches", help="How many launches to show.")] = 20,
    skip: Annotated[int, typer.Option("--skip", help="Launches to skip before showing.")] = 0,
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Print the first launches of a run as a table (stage, batch, loop-step mix, queues)."""
    from cdbsim.kv import capacity_blocks
    from cdbsim.replay import drive
    from cdbsim.scheduler import Scheduler
    from cdbsim.workload import WorkloadSpec

    spec = build_arch(arch, split, r_max, r_min)
    config = ServeConfig(policy=policy, width=width, coda_batch=coda_batch, prefill_budget=prefill_budget,
                         timing=timing, layout=kv_layout)
    exit_model = build_exits(spec, exits, depth, mean_depth, dispersion, correlation)
    reqs = WorkloadSpec(workload, requests, None, exit_model, seed, str(trace) if trace else None).build(
        spec, config.r_min(spec))
    if kv_tokens is None and kv_blocks is None:
        kv_tokens = DEFAULT_KV_TOKENS
    blocks = capacity_blocks(spec, config.layout, tokens=kv_tokens, blocks=kv_blocks)
    rows = []
    for launch in drive(Scheduler(spec, config, reqs, blocks)):
        if launch.index < skip:
            continue
        if len(rows) >= launches:
            break
        rows.append({"#": launch.index + 1, "stage": launch.stage.value, "B": launch.size,
                     "padded": launch.padded, "detail": describe_launch(launch),
                     "Q_P": launch.queue_waiting, "Q_R": launch.queue_core, "Q_C": launch.queue_coda,
                     "active": launch.active})
    emit(rows, f"{spec.name} ({spec.split}, r_max {spec.r_max}) | {config.describe()} | {workload}",
         as_json, as_csv, caption="Q_P waiting prompts, Q_R tokens queued for the core (norefill: the wave), "
                                  "Q_C tokens queued for the coda; loop steps r1.. are 1-indexed")


def describe_launch(launch: Any) -> str:
    """``r1:30 r2:12, 5 exit`` for core launches, ``1,024 tok, 3 chunk(s), 2 done`` for prefill."""
    if launch.stage.value == "prefill":
        done = sum(launch.finishes)
        return f"{launch.size:,} tok, {len(launch.chunk_lens)} chunk(s), {done} done"
    if launch.stage.value == "core":
        mix = " ".join(f"r{s + 1}:{c}" for s, c in launch.step_mix().items())
        return f"{mix}, {sum(launch.exits)} exit"
    return f"{launch.size} token(s)"


@app.command()
@friendly
def bound(
    arch: Arch = "ouro-1.4b", split: Split = None, r_max: RMax = None,
    mean_depth: Annotated[float | None, typer.Option("--mean-depth", help="Mean requested depth d-bar of "
                                                                          "decoded tokens.")] = None,
    prefill_share: Annotated[float, typer.Option("--prefill-share", help="Share a of GPU time CB spends in "
                                                                         "prefill.")] = 0.0,
    f1: Annotated[float | None, typer.Option("--f1", help="Fraction of output tokens produced by prefill "
                                                          "(default: from --workload).")] = None,
    workload: Workload = "sharegpt",
    as_json: JsonOut = False, as_csv: CsvOut = False,
) -> None:
    """Print the FLOP bounds S_dec and S_e2e and the KV bytes per token of each layout."""
    from cdbsim.bounds import s_dec, s_e2e
    from cdbsim.kvlayout import KVLayout
    from cdbsim.workload import default_mean_depth
    from traces import length_model

    spec = build_arch(arch, split, r_max)
    depth_decoded = mean_depth if mean_depth is not None else default_mean_depth(spec.r_max)
    frac = f1 if f1 is not None else 1.0 / length_model(workload).mean_output
    dbar = frac * spec.r_max + (1 - frac) * depth_decoded
    sdec = s_dec(spec, dbar)
    row = {"arch": spec.name, "split": spec.split, "r_max": spec.r_max, "F0/Fr": spec.f0 / spec.fr,
           "decoded depth": depth_decoded, "f1": frac, "d-bar": dbar, "S_dec": sdec,
           "a": prefill_share, "S_e2e": s_e2e(sdec, prefill_share, frac)}
    for layout in KVLayout:
        row[f"KV B/token {layout.value}"] = spec.kv_bytes_per_token(layout)
    if as_json or as_csv:
        emit([row], "", as_json, as_csv)
        return
    emit([{"quantity": k, "value": v} for k, v in row.items()], f"Bounds for {spec.name}", False, False,
         caption="d-bar counts each request's first token (from prefill) at r_max")


def main() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
