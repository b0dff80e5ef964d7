"""How much longer does a launch take when the device was idle as the host handed it over?

In the unseen shapes' serving logs, core launches that start after the device idled (the host was late)
took 13-15% longer than back-to-back launches of the same size (huginn-2048, Alpaca refill: 345 against
307 us), and the latency model, timed on queued replays, predicts the back-to-back time. The executor
records a launch's start event before it queues the launch's metadata copy and graph, so on an idle device
the logged time also holds the host's own queueing; what the device itself adds is what is left.

Each point is timed three ways, as the executor launches it (metadata copy, then the stage's graph, which
records the launch's end event):

* ``queued``: behind a spin kernel, so the start event fires once everything is queued (calibration's way);
* ``idle``: after the host waited with nothing on the device; ``enqueue`` is the host's time in the call;
* ``idle_graph``: idle, but the start event recorded after the copy is queued, just before the graph.

and a few idle launches under the PyTorch profiler give, on one timeline, when ``cudaGraphLaunch`` returned
and when the graph's first kernel began (``first_kernel_after_api``), which is what the device adds:

    python benchmarks/probe_idle_start.py --out DIR     # on a CUDA GPU, about a minute

Writes ``DIR/idle-start.csv`` (arch, stage, batch and the microseconds of each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from cdbsim.arch import load_arch  # noqa: E402
from cdbsim.kvlayout import KVLayout  # noqa: E402
from cdbsim.launch import Stage  # noqa: E402

ARCHS = ("calibration/archs/unseen-huginn-2048.json", "calibration/archs/unseen-ouro-1536.json", "huginn-3.5b")
BATCHES = (8, 64)
CONTEXT = 256
IDLE_S = 3e-4     # the host's wait with nothing queued, longer than any launch gap the pipeline leaves
SPIN_S = 2e-4


def _host_wait(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def time_point(bench, stage: Stage, batch: int, repeats: int) -> dict:
    """Medians in microseconds of one launch of ``stage`` at ``batch`` rows, queued and after idling."""
    import torch

    prepared = bench.prepared(stage, batch, CONTEXT)
    graphs = bench.graphs
    with torch.inference_mode():
        graphs.launch(prepared)  # capture
        captured = graphs.get(stage, prepared.launch.padded)
        stream = torch.cuda.current_stream()
        torch.cuda.synchronize()
        out: dict[str, list[float]] = {"queued": [], "idle": [], "enqueue": [], "idle_graph": [], "graph_api": []}
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(SPIN_S * 2e9))
            start.record()
            graphs.launch(prepared, torch.cuda.Event(enable_timing=True))
            end.record()
            end.synchronize()
            out["queued"].append(start.elapsed_time(end) * 1e3)

            _host_wait(IDLE_S)
            t0 = time.perf_counter()
            start.record(stream)  # on the stream looked up once, as the executor's clock records
            graphs.launch(prepared, torch.cuda.Event(enable_timing=True))
            t1 = time.perf_counter()
            end.record()
            end.synchronize()
            out["idle"].append(start.elapsed_time(end) * 1e3)
            out["enqueue"].append((t1 - t0) * 1e6)

            _host_wait(IDLE_S)
            captured.staging.copy_to(captured.meta, prepared.meta)
            start.record()
            t0 = time.perf_counter()
            captured.replay()
            t1 = time.perf_counter()
            end.record()
            end.synchronize()
            out["idle_graph"].append(start.elapsed_time(end) * 1e3)
            out["graph_api"].append((t1 - t0) * 1e6)
        row = {key: statistics.median(values) for key, values in out.items()}
        row.update(profiled(graphs, prepared))
    return row


def profiled(graphs, prepared, repeats: int = 8) -> dict:
    """Median microseconds from ``cudaGraphLaunch``'s return to the first kernel of the graph, on an idle
    device, and the API call's own duration, read from a profiler trace."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            _host_wait(IDLE_S)
            graphs.launch(prepared, torch.cuda.Event(enable_timing=True))
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    api = sorted((e["ts"], e["dur"]) for e in events if e.get("name") == "cudaGraphLaunch" and "dur" in e)
    kernels = sorted(e["ts"] for e in events if e.get("cat") == "kernel")
    after, calls = [], []
    for ts, dur in api:
        first = next((k for k in kernels if k >= ts), None)
        if first is not None:
            after.append(first - (ts + dur))
            calls.append(dur)
    return {"graph_launch_api": statistics.median(calls) if calls else float("nan"),
            "first_kernel_after_api": statistics.median(after) if after else float("nan")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: probe_idle_start.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from calibration.measure import Timer, UnitBench, write_probe_table

    device = torch.device("cuda")
    rows = []
    for name in ARCHS:
        arch = load_arch(name)
        bench = UnitBench(arch, max(BATCHES), CONTEXT + 1, 65536, KVLayout.DEPTH, device, Timer(device, 5, 2))
        stages = [s for s in (Stage.PRELUDE, Stage.CORE, Stage.CODA)]
        for stage in stages:
            for batch in BATCHES:
                row = {"arch": arch.name, "stage": stage.value, "batch": batch,
                       **time_point(bench, stage, batch, args.repeats)}
                row["idle_extra"] = row["idle"] - row["queued"]
                rows.append(row)
                print(", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
                      flush=True)
        bench.close()
    table = pd.DataFrame(rows)
    write_probe_table(table, args.out / "idle-start.csv", digits=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
