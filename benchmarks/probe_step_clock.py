"""Does a whole stage replay slower once the board has been busy for a while, and is the SM clock why?

The executor table times each stage as a few back-to-back replays (``bench_executor.py``). A 2-ms core step
is then a burst on a rested board; Huginn-3.5B's CB step at 256 rows (76 ms) is two seconds of load, past the
tenth of a second in which compute-bound GEMMs reach the H200's power limit
(``benchmarks/probe_gemm_clock.py``). On that table the CB step took 76.3 ms against 72.9 ms for its prelude,
16 core steps and coda timed alone. This replays each point's CUDA graph back to back from rest, records every
replay's time against the time since the load began, and samples the SM clock and power with ``nvidia-smi``:

    python benchmarks/probe_step_clock.py --out DIR          # on a CUDA GPU, about two minutes
    python benchmarks/probe_step_clock.py --summarize DIR/step-clock.csv DIR/smi.csv \\
        [--stages benchmarks/results/executor-table/stages/stages.csv]     # any machine

A point is ``MODEL:STAGE:B:L`` (a decode-type stage over ``B`` rows at context ``L``) or ``MODEL:prefill:T``
(one ``T``-token chunk without a prefix at full depth); the KV layout is the executor table's (shared).
Writes ``DIR/step-clock.csv`` (every replay), ``DIR/smi.csv`` (the samples, with the host clock's offset in its
first line) and ``DIR/step-clock.png``. The summary gives each point's first replay and its mean replay in each
of ``WINDOWS`` with the SM clock over each; ``--stages`` holds them against the table's weights + KV roofline,
and a prefill is held against the kernel profile's fastest GEMM (``--profile``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
from probe_gemm_clock import binned, plot, ready_to_measure, smi_sampling  # noqa: E402

from cdbsim.arch import load_arch  # noqa: E402
from cdbsim.errors import ConfigError  # noqa: E402

DEFAULT_POINTS = ("huginn-3.5b:decode:256:512,huginn-3.5b:prelude:256:512,huginn-3.5b:core:256:512,"
                  "huginn-3.5b:coda:256:512,huginn-3.5b:decode:64:512,huginn-3.5b:core:64:512,"
                  "ouro-1.4b:decode:256:512,ouro-1.4b:core:256:512,ouro-1.4b:prefill:2048,ouro-1.4b:prefill:4096")
# where a replay began, seconds since the point's load began: the plateau the clock first settles at, and what
# follows the excursion that H200 boards show about 0.8 s into a load (benchmarks/results/step-clock/README.md)
WINDOWS = {"plateau": (0.1, 0.7), "late": (1.1, float("inf"))}


@dataclass(frozen=True)
class Point:
    """One graph to replay: a decode-type stage over ``batch`` rows at ``context``, or a prefill of
    ``batch`` tokens (``context`` 0)."""

    model: str
    stage: str
    batch: int
    context: int

    @property
    def name(self) -> str:
        size = f"{self.batch} tokens" if self.stage == "prefill" else f"B={self.batch} L={self.context}"
        return f"{self.model} {self.stage} {size}"


def parse_points(text: str) -> list[Point]:
    """``MODEL:STAGE:B:L`` or ``MODEL:prefill:T``, comma-separated; a malformed one is a ValueError naming it."""
    stages = ("prelude", "core", "coda", "decode")
    points = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) == 3 and parts[1] == "prefill":
                points.append(Point(parts[0], "prefill", int(parts[2]), 0))
            elif len(parts) == 4 and parts[1] in stages:
                points.append(Point(parts[0], parts[1], int(parts[2]), int(parts[3])))
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"point {item!r} is not MODEL:STAGE:B:L (STAGE one of {', '.join(stages)}) "
                             "or MODEL:prefill:TOKENS") from None
        if points[-1].batch < 1 or points[-1].context < 0:
            raise ValueError(f"point {item!r}: sizes must be positive")
    return points


def measure(points: list[Point], rest_s: float, seconds: float, device_name: str = "cuda") -> pd.DataFrame:
    """Every replay of every point, each point after ``rest_s`` of rest, replayed back to back for ``seconds``
    (on a CPU the eager launches, which says only that the script runs)."""
    import torch

    from calibration.measure import Timer, UnitBench, back_to_back
    from cdbsim.kvlayout import KVLayout
    from cdbsim.launch import Stage

    device = torch.device(device_name)
    rows = []
    for model in dict.fromkeys(p.model for p in points):
        mine = [p for p in points if p.model == model]
        decode = [p for p in mine if p.stage != "prefill"] or [Point(model, "core", 1, 1)]
        longest = max([p.context for p in decode] + [p.batch for p in mine if p.stage == "prefill"])
        positions = max([p.batch * (p.context + 1) for p in decode] + [longest + 16])  # points reuse blocks
        bench = UnitBench(load_arch(model), max(p.batch for p in decode), longest + 1, positions,
                          KVLayout.SHARED, device, Timer(device, 5, 3))
        for point in mine:
            replay = (bench.prefill_graph(point.batch) if point.stage == "prefill"
                      else bench.graph(Stage(point.stage), point.batch, point.context))
            if device.type == "cuda":
                torch.cuda.synchronize()
            time.sleep(rest_s)
            began = time.time()
            times = back_to_back(replay, seconds, device, min_calls=4)
            rows += [{"point": point.name, "model": model, "stage": point.stage, "batch": point.batch,
                      "context": point.context, "began_unix_s": began, "t_s": t, "ms": s * 1e3}
                     for t, s in times]
            late = [s * 1e3 for t, s in times if t >= WINDOWS["late"][0]]
            print(f"{point.name}: first {times[0][1] * 1e3:.3f} ms, {sum(late) / max(len(late), 1):.3f} ms from "
                  f"{WINDOWS['late'][0]} s ({len(times)} replays)", flush=True)
        bench.close()
    return pd.DataFrame(rows)


def read_smi(path: Path) -> pd.DataFrame:
    """The samples of ``path`` with ``unix_s`` on the host's clock (its first line holds the offset)."""
    with open(path) as f:
        offset = float(f.readline().split("=")[1])
        table = pd.read_csv(f, skipinitialspace=True)
    table.columns = [c.split(" ")[0].replace("clocks.current.", "clocks.") for c in table.columns]
    stamps = pd.to_datetime(table["timestamp"].str.replace("/", "-"), utc=True)
    return table.assign(unix_s=(stamps - pd.Timestamp(0, tz="UTC")).dt.total_seconds() + offset)


def window(smi: pd.DataFrame, start: float, end: float) -> tuple[float, float]:
    """Mean SM clock (MHz) and power (W) of the samples in ``[start, end)`` (host seconds), NaN if none."""
    inside = smi[(smi["unix_s"] >= start) & (smi["unix_s"] < end)]
    return float(inside["clocks.sm"].mean()), float(inside["power.draw"].mean())


def summary(replays: pd.DataFrame, smi: pd.DataFrame | None = None, stages: pd.DataFrame | None = None,
            peak_tflops: float | None = None) -> pd.DataFrame:
    """Per point: its first replay, the mean replay of each of :data:`WINDOWS` and its ratio to the first, the
    slowest replay's ratio, the SM clock over each (with ``smi``; nvidia-smi's ``power.draw`` averages over about
    a second, so only the late window's power is given), and each against the executor table's weights + KV
    roofline (with ``stages``, matched on model, stage, batch and context; decode-type stages) or, for a
    prefill, its weight flops' share of ``peak_tflops`` (``profile_prefill.py``'s measure)."""
    rows = []
    for name, g in replays.groupby("point", sort=False):
        first = g.iloc[0]
        row = {"point": name, "model": first["model"], "stage": first["stage"], "batch": int(first["batch"]),
               "context": int(first["context"]), "replays": len(g), "first_ms": first["ms"]}
        start = first["began_unix_s"]
        end = g["t_s"].iloc[-1] + g["ms"].iloc[-1] / 1e3
        if smi is not None:
            row["first_mhz"] = window(smi, start, start + first["ms"] / 1e3 + 0.05)[0]
        for label, (lo, hi) in WINDOWS.items():
            inside = g[(g["t_s"] >= lo) & (g["t_s"] < hi)]
            row[f"{label}_ms"] = inside["ms"].mean() if len(inside) else float("nan")
            row[f"{label}_over_first"] = row[f"{label}_ms"] / row["first_ms"]
            if smi is not None:
                row[f"{label}_mhz"] = window(smi, start + lo, start + min(hi, end))[0]
        if smi is not None:
            row["late_w"] = window(smi, start + WINDOWS["late"][0], start + end)[1]
        row["slowest_over_first"] = g["ms"].max() / row["first_ms"]
        rows.append(row)
    table = pd.DataFrame(rows)
    times = ["first", *WINDOWS]
    if stages is not None:
        roof = stages.rename(columns={"roofline_weights_kv_ms": "roof_ms"})
        table = table.merge(roof[["model", "stage", "batch", "context", "roof_ms"]], how="left",
                            on=["model", "stage", "batch", "context"])
        decode = table["stage"] != "prefill"  # a prefill is held against the matmul rate instead
        for label in times:
            table[f"{label}_x_roof"] = (table[f"{label}_ms"] / table["roof_ms"]).where(decode)
        table = table.drop(columns="roof_ms")
    if peak_tflops is not None:
        from profile_prefill import weight_flops

        flops = pd.Series([weight_flops(r.model, r.batch) if r.stage == "prefill" else float("nan")
                           for r in table.itertuples()], index=table.index)
        for label in times:
            table[f"{label}_of_peak"] = flops / table[f"{label}_ms"] / 1e9 / peak_tflops
    return table


def read_table(path: Path, what: str, columns: tuple[str, ...],
               reader: Callable[[Path], pd.DataFrame] = pd.read_csv) -> pd.DataFrame:
    """``path`` read by ``reader`` as a ``what`` table holding ``columns``, or a ValueError that names the file."""
    try:
        table = reader(path)
    except (OSError, ValueError, IndexError, KeyError) as exc:  # pandas' parse errors are ValueErrors
        raise ValueError(f"{path} is not a readable {what} table ({exc})") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)} column: not a {what} table")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the run's tables go (needs a CUDA GPU)")
    parser.add_argument("--points", default=DEFAULT_POINTS, help="MODEL:STAGE:B:L or MODEL:prefill:T, comma-separated")
    parser.add_argument("--rest-s", type=float, default=4.0, help="idle seconds before each point")
    parser.add_argument("--seconds", type=float, default=1.5, help="seconds of back-to-back replays per point")
    parser.add_argument("--summarize", type=Path, nargs=2, metavar=("REPLAYS_CSV", "SMI_CSV"),
                        help="summarize a saved run instead (no GPU)")
    parser.add_argument("--stages", type=Path, metavar="STAGES_CSV",
                        help="a bench_executor.py stage table whose weights + KV roofline the summary uses")
    parser.add_argument("--profile", type=Path, default=ROOT / "calibration" / "profiles" / "h200-kernels.json",
                        help="the kernel profile whose fastest GEMM a prefill is held against")
    args = parser.parse_args(argv)
    try:
        stages = (read_table(args.stages, "stage", ("model", "stage", "batch", "context", "roofline_weights_kv_ms"))
                  if args.stages else None)
        if args.summarize:
            replays = read_table(args.summarize[0], "replay", ("point", "t_s", "ms", "began_unix_s"))
            smi = read_table(args.summarize[1], "smi", ("unix_s", "clocks.sm", "power.draw"), read_smi)
    except ValueError as exc:
        print(f"error: probe_step_clock.py: {exc}", file=sys.stderr)
        return 2
    if not args.summarize:
        try:
            points = parse_points(args.points)
            for model in {p.model for p in points}:
                load_arch(model)  # an unknown model is refused before any GPU work
        except (ValueError, ConfigError) as exc:
            parser.error(str(exc))
        if not ready_to_measure(parser, args.out, "probe_step_clock.py"):
            return 2
        import torch

        with smi_sampling(args.out / "smi.csv"):
            replays = measure(points, args.rest_s, args.seconds)
        replays.round(6).to_csv(args.out / "step-clock.csv", index=False)
        first = replays.groupby("point", sort=False)["ms"].transform("first")
        plot(binned(replays.assign(over_start=replays["ms"] / first), ("point", "stage"), "ms"),
             args.out / "step-clock.png", "time per replay / its first replay", label="point")
        smi = read_smi(args.out / "smi.csv")
        print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    from profile_prefill import gemm_peak_tflops

    try:
        peak = gemm_peak_tflops(args.profile)
    except (OSError, KeyError, ValueError) as exc:
        print(f"error: probe_step_clock.py: {args.profile} is not a kernel profile ({exc})", file=sys.stderr)
        return 2
    print(summary(replays, smi, stages, peak).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
