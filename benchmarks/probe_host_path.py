"""Where the host's time per launch goes on the serving path, and what each way of queueing a launch costs.

Small shapes are host-bound: their throughput is the host's time per launch (``host_s`` in a run's log),
and that time moves with the machine. This splits it, to say which part is worth making faster:

* **serving** (one configuration of the unseen matrix per shape, run by the executor as ``validate`` runs
  it): per decode-type stage, the mean of each launch's ``host_s`` and of the parts timed inside it:
  ``Engine.prepare`` (the metadata), the pinned staging copy (``copy``: fill the pinned buffer, queue the
  host-to-device copy) and the graph replay (``replay``: ``cudaGraphLaunch``); ``rest`` is the remainder
  (completing finished launches, arrivals, ``Scheduler.plan``, the launch's two clock events).
* **calls** (one core graph of each shape, 8 rows, queued behind a spin kernel as in a lookahead run):
  the host's microseconds per call of each piece alone, and of the alternatives (a copy queued
  through the CUDA runtime directly, an event reused or made anew).

    python benchmarks/probe_host_path.py --out DIR     # on a CUDA GPU, about a minute

Writes ``DIR/host-path-serving.csv`` and ``DIR/host-path-calls.csv``.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from cdbsim.arch import load_arch  # noqa: E402
from cdbsim.kvlayout import KVLayout  # noqa: E402
from cdbsim.launch import Stage  # noqa: E402

MATRIX = ROOT / "calibration" / "matrices" / "unseen-h200.json"
CONFIGS = ("ouro-1536-alpaca-refill", "huginn-2048-alpaca-refill", "ouro-1536-alpaca-cb")
SHAPES = ("calibration/archs/unseen-ouro-1536.json", "calibration/archs/unseen-huginn-2048.json", "huginn-3.5b")
CALL_BATCH = 8
CALLS = 200


class PartTimer:
    """Host microseconds spent inside wrapped callables, per launch (reset by :meth:`take`)."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable, returns_wait: bool = False) -> Callable:
        """``fn`` timed under ``name``; with ``returns_wait``, less the seconds it returns (time spent
        waiting for the device, which a run's ``host_s`` leaves out too)."""
        def timed(*args, **kwargs):
            t = time.perf_counter()
            result = fn(*args, **kwargs)
            waited = result if returns_wait else 0.0
            self.current[name] += (time.perf_counter() - t - waited) * 1e6
            return result
        return timed

    def take(self) -> dict[str, float]:
        parts, self.current = dict(self.current), defaultdict(float)
        return parts


def serving(config_name: str) -> list[dict]:
    """Mean host microseconds per launch of each decode-type stage, split into its timed parts."""
    import torch

    from calibration.validation import load_matrix
    from executor import graphs as graphs_module
    from executor.driver import Executor, build_model

    entry = load_matrix(MATRIX, [config_name])[0]
    arch = entry.spec()
    model = build_model(arch, device="cuda", seed=0)
    executor = Executor(arch, entry.config(), entry.build_requests(), entry.kv_blocks(), model=model)
    executor.warmup()
    parts = PartTimer()
    per_launch: list[dict[str, float]] = []
    engine = executor.engine
    engine.prepare = parts.wrap("prepare", engine.prepare)
    staging_copy, replay = graphs_module.PinnedStaging.copy_to, graphs_module.CapturedStage.replay
    graphs_module.PinnedStaging.copy_to = parts.wrap("copy", staging_copy, returns_wait=True)
    graphs_module.CapturedStage.replay = parts.wrap("replay", replay)
    launch = executor.graphs.launch

    def launch_and_take(prepared, done=None):
        try:
            return launch(prepared, done)
        finally:
            per_launch.append(parts.take())
    executor.graphs.launch = launch_and_take
    try:
        log = executor.run().log
    finally:
        graphs_module.PinnedStaging.copy_to, graphs_module.CapturedStage.replay = staging_copy, replay
    table = log.launches
    rows = []
    frame = pd.DataFrame(per_launch).fillna(0.0)
    frame["stage"] = [getattr(s, "value", s) for s in table["stage"]]
    frame["host"] = [h * 1e6 for h in table["host_s"]]
    for stage, group in frame.groupby("stage"):
        if stage == Stage.PREFILL.value:
            continue
        row = {"config": config_name, "stage": stage, "launches": len(group)}
        for part in ("host", "prepare", "copy", "replay"):
            row[part] = group[part].mean()
        row["rest"] = row["host"] - row["prepare"] - row["copy"] - row["replay"]
        row["host_median"] = group["host"].median()
        rows.append(row)
    del executor, model
    torch.cuda.empty_cache()
    return rows


def _cudart() -> ctypes.CDLL | None:
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def calls(shape: str) -> dict:
    """Host microseconds per call (median of ``CALLS``) of each piece of queueing one core launch."""
    import torch

    from calibration.measure import Timer, UnitBench

    arch = load_arch(shape)
    device = torch.device("cuda")
    bench = UnitBench(arch, CALL_BATCH, 257, 65536, KVLayout.DEPTH, device, Timer(device, 5, 2))
    prepared = bench.prepared(Stage.CORE, CALL_BATCH, 256)
    graphs = bench.graphs
    row: dict = {"arch": arch.name, "batch": CALL_BATCH, "meta_bytes": prepared.meta.nbytes}
    with torch.inference_mode():
        graphs.launch(prepared)
        captured = graphs.get(Stage.CORE, prepared.launch.padded)
        staging = captured.staging
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream().cuda_stream
        cudart = _cudart()
        event = torch.cuda.Event(enable_timing=True)

        def queued(fn: Callable[[], object], spin_s: float = 0.05, each: bool = False) -> float:
            """Median host time of ``fn`` with the device busy (as behind a core step in lookahead); with
            ``each``, a short spin before and a synchronize after every call (for calls that must not
            pile up: the staging buffers wait for their own earlier copies)."""
            if not each:
                torch.cuda._sleep(int(spin_s * 2e9))
            times = []
            for _ in range(CALLS):
                if each:
                    torch.cuda._sleep(int(3e-4 * 2e9))
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e6)
                if each:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            return statistics.median(times)

        prepare = bench.engine.prepare
        row["prepare"] = queued(lambda: prepare(prepared.launch, graphs.width))
        row["fill_pinned"] = queued(lambda: staging.arrays[0].__setitem__(slice(None), prepared.meta))
        row["copy_torch"] = queued(lambda: captured.meta.copy_(staging.buffers[0], non_blocking=True))
        if cudart is not None:
            dst, src, size = captured.meta.data_ptr(), staging.buffers[0].data_ptr(), prepared.meta.nbytes
            memcpy = cudart.cudaMemcpyAsync
            memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            row["copy_runtime"] = queued(lambda: memcpy(dst, src, size, 1, stream))
        row["event_record"] = queued(event.record)
        current = torch.cuda.current_stream()
        row["event_record_on_stream"] = queued(lambda: event.record(current))
        row["event_new"] = queued(lambda: torch.cuda.Event(enable_timing=True).record())
        row["staging_copy_to"] = queued(lambda: staging.copy_to(captured.meta, prepared.meta), each=True)
        row["replay"] = queued(captured.graph.replay, spin_s=0.5)
        row["launch"] = queued(lambda: graphs.launch(prepared), each=True)
    bench.close()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: probe_host_path.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from calibration.measure import write_probe_table

    args.out.mkdir(parents=True, exist_ok=True)
    call_rows = []
    for shape in SHAPES:
        call_rows.append(calls(shape))
        print(", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in call_rows[-1].items()),
              flush=True)
    write_probe_table(pd.DataFrame(call_rows), args.out / "host-path-calls.csv", digits=1)
    serving_rows = []
    for name in CONFIGS:
        serving_rows += serving(name)
        for row in serving_rows[-3:]:
            print(", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
                  flush=True)
    write_probe_table(pd.DataFrame(serving_rows), args.out / "host-path-serving.csv", digits=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
