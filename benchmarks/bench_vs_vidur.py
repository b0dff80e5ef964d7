"""Simulator speed against Vidur: 10,000 ArXiv requests under continuous batching on both, in one run.

    python benchmarks/bench_vs_vidur.py [--peer /work/peer] [--requests 10000] [--json FILE]

Vidur (github.com/microsoft/vidur) is a discrete-event simulator of LLM serving. It lives outside this
repository, in ``--peer DIR``: ``DIR/vidur`` holds a snapshot of its repository (code and ``data/``) and
``DIR/venv`` a virtual environment with its requirements (created, and the requirements installed from the
package index, when missing). Its operator profiles are CSV files under ``data/``; the attention profiles
(``attention.csv``, each over 4 MiB) are often missing from snapshots, and then a stand-in profile is written
on Vidur's own attention input grid from a bandwidth/compute model of the H100, and the output says so.
Vidur's first run trains random-forest predictors (about 19 minutes on a 2-core machine, "cold"); later runs
load them from ``DIR/cache_*`` ("warm").

The comparison is simulator speed, not predictions: Vidur simulates Llama-2-7B on an H100 (TP1, vLLM
scheduler, batch cap 64), cdbsim simulates ouro-1.4b on its shipped H200 profile (``--policy cb``, W = 64).
Vidur has no looped models and cdbsim no Llama-2 profile, so these are the closest like-for-like settings:
the same workload (ArXiv summarisation lengths), the same count of offline requests, the same batch cap and
the same scheduling discipline (token-level continuous batching). Each tool runs in its own process; wall
time includes interpreter start, imports and (for Vidur) predictor training or loading; event-loop time is
the simulation proper, timed inside the process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_PEER = Path("/work/peer")
MODEL = "meta-llama/Llama-2-7b-hf"
DEVICE = "h100"
NETWORK = "h100_dgx"
ARXIV_TRACE = "data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
BATCH_CAP = 64
RESULT_TAG = "BENCH_RESULT "  # prefix of the JSON line each child process prints

# Run inside Vidur's virtual environment, from its repository: build the simulator from Vidur's own command
# line, count events as they are queued, and time construction (predictor training or cache loading) and the
# event loop apart. Vidur writes its metrics at interpreter exit, after this line is printed.
VIDUR_DRIVER = f"""
import collections, json, time
from vidur.config import SimulationConfig
from vidur.simulator import Simulator
from vidur.utils.random import set_seeds

counts = collections.Counter()
tokens = {{"prefill": 0, "decode": 0}}
queue_event = Simulator._add_event

def counting_add_event(self, event):
    name = type(event).__name__
    counts[name] += 1
    if name == "RequestArrivalEvent":
        tokens["prefill"] += event._request.num_prefill_tokens
        tokens["decode"] += event._request.num_decode_tokens
    queue_event(self, event)

Simulator._add_event = counting_add_event
config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)
start = time.perf_counter()
simulator = Simulator(config)
built = time.perf_counter()
simulator.run()
done = time.perf_counter()
print({RESULT_TAG!r} + json.dumps({{
    "setup_s": built - start, "event_loop_s": done - built, "batches": counts["BatchEndEvent"],
    "events": sum(counts.values()), "prefill_tokens": tokens["prefill"], "decode_tokens": tokens["decode"],
    "simulated_s": simulator._time}}), flush=True)
"""


class SetupError(Exception):
    """Vidur cannot be made to run here; the message says why."""


@dataclass(frozen=True)
class VidurSetup:
    """Where Vidur's code, interpreter, profiles and predictor cache are, and how its profile was obtained."""

    repo: Path
    python: Path
    attention_file: Path
    stand_in_attention: bool
    cache_dir: Path
    cold: bool


@dataclass
class ToolRun:
    """One tool's measured run: what it simulated and how long it took."""

    tool: str
    model: str
    wall_s: float
    event_loop_s: float
    batches: int
    decode_tokens: int
    setup_s: float | None = None
    note: str = ""

    @property
    def us_per_batch(self) -> float:
        return self.event_loop_s / self.batches * 1e6

    @property
    def us_per_decode_token(self) -> float:
        return self.event_loop_s / self.decode_tokens * 1e6


# --- step 1: find or set up Vidur -------------------------------------------------------------------------

def ensure_venv(peer: Path, repo: Path) -> Path:
    """The peer venv's interpreter, with Vidur's requirements importable (installed from the index if not)."""
    python = peer / "venv" / "bin" / "python"
    if not python.exists():
        print(f"creating {peer / 'venv'}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(peer / "venv")], check=True)
    probe = [str(python), "-c", "import vidur.main"]
    if subprocess.run(probe, cwd=repo, capture_output=True).returncode != 0:
        print(f"installing Vidur's requirements ({repo / 'requirements.txt'}) into {peer / 'venv'}", flush=True)
        install = subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(repo / "requirements.txt")],
                                 capture_output=True, text=True)
        if install.returncode != 0:
            raise SetupError(f"pip could not install Vidur's requirements: {install.stderr.strip()[-500:]}")
    check = subprocess.run(probe, cwd=repo, capture_output=True, text=True, env=vidur_env())
    if check.returncode != 0:
        raise SetupError(f"'import vidur.main' fails in {peer / 'venv'}: {check.stderr.strip()[-500:]}")
    return python


def require_data(repo: Path) -> None:
    """Vidur cannot run without the MLP and network profiles and the ArXiv trace; say which one is missing."""
    needed = [repo / f"data/profiling/compute/{DEVICE}/{MODEL}/mlp.csv",
              repo / f"data/profiling/network/{NETWORK}/all_reduce.csv",
              repo / f"data/profiling/network/{NETWORK}/send_recv.csv",
              repo / ARXIV_TRACE]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        raise SetupError("missing data files of the Vidur snapshot (no stand-in is made for these): "
                         + ", ".join(missing))


def find_or_setup_vidur(peer: Path) -> VidurSetup:
    """Locate the snapshot, make its venv work, and choose the attention profile and predictor cache."""
    repo = peer / "vidur"
    if not (repo / "vidur" / "main.py").exists():
        raise SetupError(f"no Vidur repository snapshot at {repo} (expected {repo / 'vidur' / 'main.py'}); "
                         "extract a snapshot of github.com/microsoft/vidur there")
    python = ensure_venv(peer, repo)
    require_data(repo)
    real = repo / f"data/profiling/compute/{DEVICE}/{MODEL}/attention.csv"
    stand_in = not real.exists()
    attention = peer / "stand_in" / DEVICE / MODEL / "attention.csv" if stand_in else real
    if stand_in and not attention.exists():
        write_stand_in_attention(attention)
    # Vidur's cache key ignores the attention file's path: one cache folder per kind of profile.
    cache_dir = peer / ("cache_stand_in" if stand_in else "cache_rf")
    cold = not any(cache_dir.glob("*.pkl"))
    return VidurSetup(repo, python, attention, stand_in, cache_dir, cold)


def vidur_grid(max_seq_len: int = 4096, max_batch: int = 128) -> list[tuple[int, int, int]]:
    """(prefill chunk, KV cache size, batch size) points of Vidur's attention profiling grid (its defaults)."""
    chunks = [*range(64, 129, 16), *range(128, 1025, 32), *range(1024, 4097, 64)]
    lengths = [*range(0, 1025, 32), *range(1024, 4097, 64)]
    points = {(c, i * c, 1) for c in chunks if c <= max_seq_len for i in range(max_seq_len // c)}
    points |= {(s, 0, 1) for s in lengths if 0 < s < max_seq_len}
    points |= {(0, s, b) for s in lengths if 0 < s < max_seq_len for b in range(1, max_batch + 1)}
    return sorted(points)


def write_stand_in_attention(path: Path) -> None:
    """An H100 attention profile for Llama-2-7B (TP1, fp16) from datasheet bandwidth and compute.

    Decode attention reads the batch's KV cache at 70% of 3.35 TB/s; prefill attention does 4 * chunk *
    (kv + chunk / 2) * hidden FLOPs at 50% of 989 TFLOP/s plus the KV read; saving the new tokens' keys and
    values is a write at the same bandwidth; each kernel has a 5-10 us floor. Times in ms, as Vidur's.
    """
    import pandas as pd

    hidden, heads, kv_heads, block = 4096, 32, 32, 16
    kv_bytes_per_token = 2 * kv_heads * (hidden // heads) * 2
    bandwidth, flops = 3.35e12 * 0.7, 989e12 * 0.5
    rows = []
    for chunk, kv, batch in vidur_grid():
        kv_read_ms = batch * kv * kv_bytes_per_token / bandwidth * 1e3
        prefill_ms = 0.010 + 4 * chunk * (kv + chunk / 2) * hidden / flops * 1e3 + kv_read_ms if chunk else None
        rows.append({
            "n_embd": hidden, "n_q_head": heads, "n_kv_head": kv_heads, "block_size": block,
            "num_tensor_parallel_workers": 1, "max_model_len": 4096, "batch_size": batch,
            "prefill_chunk_size": chunk, "kv_cache_size": kv, "is_prefill": chunk > 0,
            "time_stats.attn_prefill.median": prefill_ms,
            "time_stats.attn_decode.median": None if chunk else 0.005 + kv_read_ms,
            "time_stats.attn_kv_cache_save.median": 0.005 + max(chunk, batch) * kv_bytes_per_token / bandwidth * 1e3,
        })
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    print(f"wrote a stand-in attention profile ({len(rows):,} points of Vidur's grid) to {path}", flush=True)


# --- step 2: run both simulators --------------------------------------------------------------------------

def vidur_env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": ""}


def vidur_arguments(setup: VidurSetup, requests: int, out_dir: Path) -> list[str]:
    """Vidur's command line: Llama-2-7B, H100, TP1, vLLM scheduler, batch cap 64, offline, lean outputs."""
    predictor = "--random_forrest_execution_time_predictor_config_"
    return [
        "--replica_config_device", DEVICE, "--replica_config_network_device", NETWORK,
        "--replica_config_model_name", MODEL, "--replica_config_tensor_parallel_size", "1",
        "--replica_scheduler_config_type", "vllm", "--vllm_scheduler_config_batch_size_cap", str(BATCH_CAP),
        "--request_generator_config_type", "synthetic", "--length_generator_config_type", "trace",
        "--trace_request_length_generator_config_trace_file", ARXIV_TRACE,
        "--synthetic_request_generator_config_num_requests", str(requests),
        "--interval_generator_config_type", "static",
        f"{predictor}attention_input_file", str(setup.attention_file),
        "--metrics_config_cache_dir", str(setup.cache_dir),
        "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
        "--metrics_config_output_dir", str(out_dir),
    ]


def result_line(stdout: str) -> dict:
    """The JSON a child process printed after ``RESULT_TAG``."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise ValueError("no result line in the child's output")


def run_vidur(setup: VidurSetup, requests: int) -> ToolRun:
    """Run Vidur once in its own interpreter; wall time from process start to exit (metrics written)."""
    out_dir = setup.repo.parent / "out" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    command = [str(setup.python), "-c", VIDUR_DRIVER, *vidur_arguments(setup, requests, out_dir)]
    print(f"running Vidur ({'cold: training its predictors first' if setup.cold else 'warm: cached predictors'})",
          flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=setup.repo, env=vidur_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SetupError(f"Vidur exited with {done.returncode}: {done.stderr.strip()[-800:]}")
    r = result_line(done.stdout)
    profile = "stand-in attention profile" if setup.stand_in_attention else "measured profiles"
    return ToolRun("Vidur", "Llama-2-7B, H100, TP1, vLLM scheduler", wall, r["event_loop_s"], r["batches"],
                   r["decode_tokens"], setup_s=r["setup_s"],
                   note=f"{'cold (training included)' if setup.cold else 'warm'}, {profile}, "
                        f"{r['events']:,} events, {r['simulated_s']:,.0f} s simulated")


def cdbsim_child(requests: int) -> None:
    """In a fresh process: import cdbsim, build the ArXiv trace and simulate CB; print times and counts."""
    start = time.perf_counter()
    from cdbsim.arch import PRESETS
    from cdbsim.config import ServeConfig
    from cdbsim.latency import LatencyModel
    from cdbsim.shipped import resolve_profile
    from cdbsim.sim import simulate
    from traces import ExitModel, build_trace

    arch = PRESETS["ouro-1.4b"]
    trace = build_trace("arxiv", requests, arch.r_max, 2, ExitModel(mean=2.5), seed=0)
    latency = LatencyModel(arch, resolve_profile("auto", arch))
    built = time.perf_counter()
    log = simulate(arch, ServeConfig(policy="cb", width=BATCH_CAP), trace, latency, kv_blocks=1_000_000)
    done = time.perf_counter()
    print(RESULT_TAG + json.dumps({
        "setup_s": built - start, "event_loop_s": done - built, "batches": len(log.launches),
        "decode_tokens": sum(r.output_len - 1 for r in trace),
        "simulated_s": float(log.launches["end"].max())}), flush=True)


def run_cdbsim(requests: int) -> ToolRun:
    """Run cdbsim once in its own interpreter, as Vidur is run."""
    command = [sys.executable, str(Path(__file__).resolve()), "--cdbsim-child", str(requests)]
    print("running cdbsim", flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, check=True)
    wall = time.perf_counter() - start
    r = result_line(done.stdout)
    return ToolRun("cdbsim", "ouro-1.4b, H200 (shipped profile), --policy cb, W = 64", wall, r["event_loop_s"],
                   r["batches"], r["decode_tokens"], setup_s=r["setup_s"],
                   note=f"{r['simulated_s']:,.0f} s simulated")


# --- step 3: the table ------------------------------------------------------------------------------------

def print_table(runs: list[ToolRun], header: dict) -> None:
    print()
    print(f"{header['requests']:,} ArXiv requests, offline, continuous batching (batch cap {BATCH_CAP}) on "
          f"{header['machine']}, {header['date']}, load average {header['load_average']:.2f}")
    print("The models differ (Vidur has no looped models, cdbsim no Llama-2 profile): this compares simulator "
          "speed, not predictions.")
    print(f"{'tool':7s} {'wall s':>8s} {'setup s':>8s} {'loop s':>7s} {'batches':>9s} {'decode tok':>11s} "
          f"{'us/batch':>9s} {'us/dec tok':>10s}  run")
    for r in runs:
        print(f"{r.tool:7s} {r.wall_s:8.1f} {r.setup_s:8.1f} {r.event_loop_s:7.2f} {r.batches:9,d} "
              f"{r.decode_tokens:11,d} {r.us_per_batch:9.1f} {r.us_per_decode_token:10.2f}  {r.model}; {r.note}")
    vidur, cdbsim = runs
    print(f"cdbsim / Vidur: {vidur.us_per_batch / cdbsim.us_per_batch:.1f}x faster per batch, "
          f"{vidur.us_per_decode_token / cdbsim.us_per_decode_token:.1f}x per decode token (event loop)")


def write_json(path: Path, runs: list[ToolRun], header: dict) -> None:
    rows = [{**asdict(r), "us_per_batch": r.us_per_batch, "us_per_decode_token": r.us_per_decode_token}
            for r in runs]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**header, "runs": rows}, indent=2) + "\n")
    print(f"results: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", type=Path, default=DEFAULT_PEER,
                        help="folder with Vidur's snapshot (vidur/) and venv (venv/) (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=10_000, help="ArXiv requests (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="also write the table to this JSON file")
    parser.add_argument("--cdbsim-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cdbsim_child is not None:
        cdbsim_child(args.cdbsim_child)
        return 0
    if args.requests < 1:
        print(f"error: --requests must be >= 1, got {args.requests}", file=sys.stderr)
        return 2
    try:
        setup = find_or_setup_vidur(args.peer.resolve())
        if setup.stand_in_attention:
            print(f"Vidur uses a STAND-IN attention profile ({setup.attention_file}): the snapshot has no "
                  f"{DEVICE}/{MODEL} attention.csv; its simulated times are approximate, its speed is not affected")
        vidur = run_vidur(setup, args.requests)
    except (SetupError, subprocess.CalledProcessError, ValueError) as exc:
        print(f"error: Vidur cannot be run here: {exc}", file=sys.stderr)
        return 1
    cdbsim = run_cdbsim(args.requests)
    from benchmarks.bench_sim import machine  # imported here: the cdbsim child times its own imports

    header = {"requests": args.requests, "machine": machine(),
              "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
              "load_average": os.getloadavg()[0], "vidur_cold": setup.cold,
              "vidur_stand_in_attention": setup.stand_in_attention,
              "clock": "wall (perf_counter); event loop timed inside each process"}
    print_table([vidur, cdbsim], header)
    if args.json:
        write_json(args.json, [vidur, cdbsim], header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
