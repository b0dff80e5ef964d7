"""Live exit gates in a served run against the depths a recorded trace replays: a token's first decoded step sees
the context the recording saw (its prompt at full depth), so there the live gate must fire exactly at the recorded
depth; a depth moved by one shows as an earlier live exit or a gate not yet fired."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from cdbsim.serving.config import ServeConfig  # noqa: E402
from executor.driver import execute  # noqa: E402
from executor.gates import default_criterion  # noqa: E402
from executor.live_gates import LiveComparison, LiveGateSpec, compare_depths  # noqa: E402
from executor.record import Checkpoint, record  # noqa: E402
from traces.request import Request  # noqa: E402

from .test_executor_record import huginn_checkpoint, ouro_checkpoint  # noqa: E402

Q = {"ouro": 0.7, "huginn": 0.8}  # thresholds at which the tiny checkpoints' first decoded tokens exit at mixed depths


def open_checkpoint(folder: Path, style: str, device: str = "cpu") -> Checkpoint:
    """A tiny checkpoint in float32 (Huginn: 4 loops from a random start)."""
    if style == "ouro":
        return Checkpoint.open(ouro_checkpoint(folder), device=device, dtype=torch.float32)
    return Checkpoint.open(huginn_checkpoint(folder), device=device, dtype=torch.float32, r_max=4,
                           state_init="random", state_seed=5)


@dataclass
class Replay:
    """A recorded trace served again with the live gates on: the comparison, the run's meta, the recorded depths
    and the depths served."""

    live: LiveComparison
    meta: dict
    recorded: list[int]
    served: list[int]


def replay_recorded(tmp_path: Path, style: str, policy: str, device: str = "cpu",
                    alter: Callable[[list[int], int], list[int]] | None = None, graphs: bool = True) -> Replay:
    """Record 12 prompts' first decoded token (one output token after the prefill's), then serve the trace, its
    depths ``alter``ed (given them and r_max), from the same checkpoint with the live gates on (``graphs``: captured
    on a GPU, static buffers on the CPU)."""
    opened = open_checkpoint(tmp_path / style, style, device)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, 100, size=int(rng.integers(2, 10))).tolist() for _ in range(12)]
    q = Q[style]
    requests = record(opened, prompts, q, max_new_tokens=2).requests
    recorded = [int(r.depths[0]) for r in requests]
    assert len(set(recorded)) > 1, "every token exits at one depth: pick another q"
    served = alter(recorded, opened.arch.r_max) if alter is not None else recorded
    requests = [Request(r.request_id, r.prompt_len, r.output_len, r.arrival, np.asarray([d], dtype=np.int16))
                for r, d in zip(requests, served, strict=True)]
    config = ServeConfig(policy=policy, width=4, coda_batch=1, prefill_budget=32, timing="sync", layout="depth")
    run = execute(opened.arch, config, requests, 64, model=opened.model, prompts=prompts, graphs=graphs,
                  live_gates=LiveGateSpec(default_criterion(opened.model), q))
    assert run.live is not None
    return Replay(run.live, run.log.meta, recorded, served)


@pytest.mark.parametrize("policy", ["refill", "norefill"])
@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_live_gates_fire_at_the_recorded_depths(tmp_path: Path, style: str, policy: str) -> None:
    replay = replay_recorded(tmp_path, style, policy)
    live = replay.live
    assert (live.tokens, live.agree, live.earlier, live.not_fired) == (12, 12, 0, 0)
    assert live.mean_depth_diff == 0.0
    assert replay.meta["live_gates"]["agree_share"] == 1.0 and replay.meta["live_gates"]["q"] == Q[style]


def moved(depths: list[int], r_max: int) -> list[int]:
    """Every third depth one loop deeper (where it can be), every third from the second one loop shallower."""
    return [d + 1 if i % 3 == 0 and d < r_max else d - 1 if i % 3 == 1 and d > 1 else d
            for i, d in enumerate(depths)]


@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_moved_depths_show_as_earlier_exits_and_gates_not_fired(tmp_path: Path, style: str) -> None:
    replay = replay_recorded(tmp_path, style, "refill", alter=moved)
    deeper = sum(s > r for r, s in zip(replay.recorded, replay.served, strict=True))
    shallower = sum(s < r for r, s in zip(replay.recorded, replay.served, strict=True))
    assert deeper > 0 and shallower > 0
    live = replay.live
    assert (live.earlier, live.not_fired, live.agree) == (deeper, shallower, 12 - deeper - shallower)
    assert live.mean_depth_diff == pytest.approx(-deeper / (12 - shallower))  # each earlier exit by one loop


def test_under_cb_every_token_runs_every_loop(tmp_path: Path) -> None:
    replay = replay_recorded(tmp_path, "ouro", "cb")
    full = replay.recorded.count(3)  # the tiny Ouro checkpoint loops 3 times
    assert (replay.live.agree, replay.live.earlier, replay.live.not_fired) == (full, 12 - full, 0)


def test_live_depths_follow_the_recording_rules() -> None:
    spec = LiveGateSpec("latent-diff", 0.1)
    first = np.array([0, 0, 1, 1, 2, 3, 0])
    served = np.array([4, 2, 2, 3, 2, 4, 3])
    # never fired in all 4 loops: 4, as a recording gives; never fired in 2 or 3: unknown; fired at 1: r_min 2
    got = compare_depths(first, served, spec, r_min=2, r_max=4)
    assert (got.tokens, got.agree, got.earlier, got.not_fired) == (7, 3, 2, 2)
    assert got.mean_depth_diff == pytest.approx((0 + 0 - 1 + 0 - 1) / 5)
    assert got.to_dict()["not_fired_share"] == pytest.approx(2 / 7)
    none = compare_depths(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), spec, 1, 4)
    assert none.tokens == 0 and none.mean_depth_diff is None and none.to_dict()["agree_share"] is None


def test_validate_reports_the_live_gates_of_a_checkpoint_run(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from calibration.validation import CheckpointRun, Entry
    from cdbsim.planner.experiment import Experiment
    from cli import app
    from traces import write_trace

    folder = ouro_checkpoint(tmp_path / "ouro")
    opened = Checkpoint.open(folder)
    prompts = [[5, 17, 3, 42], [9, 8, 7, 6, 5, 4], [1, 2], [30, 31, 32]]
    trace = write_trace(record(opened, prompts, 0.7, max_new_tokens=4).requests, tmp_path / "t.csv")
    options = {"arch.hf_config": str(folder / "config.json"), "workload.trace": str(trace), "serve.width": 4,
               "serve.timing": "sync", "serve.kv_tokens": 4096}
    # the run validate --checkpoint --live-q 0.7 makes on a GPU, here on the CPU, saved as validate saves it
    entry = Entry.from_experiment("config", Experiment().override(options))
    requests = entry.build_requests()
    run_with = CheckpointRun(folder, live_q=0.7, prompts=prompts)
    run = execute(entry.spec(), entry.config(), requests, entry.given_blocks(), model=opened.model,
                  prompts=run_with.prompts_for(requests), live_gates=run_with.live_gates(opened.model))
    run.log.meta["rate"] = None
    run.log.save(tmp_path / "measured" / "config")
    args = ["validate", "--measured", str(tmp_path / "measured"), "--profile", "roofline", "--out",
            str(tmp_path / "out"), *(f"--{k.split('.')[1].replace('_', '-')}={v}" for k, v in options.items())]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    live = json.loads(result.stdout)[0]["live_gates"]["config"]
    assert live == run.live.to_dict() and live["tokens"] == 3 * 4 and live["criterion"] == "hazard"
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["live_gates"]["config"] == live
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0 and "live exit gates against the replayed depths" in table.stdout
    assert "agree" in table.stdout and "not fired by" in table.stdout
    with pytest.raises(ValueError, match="has 2 prompt tokens in the trace, 3 in the prompts file"):
        CheckpointRun(folder, prompts=[[1], [2], [3, 4, 5]]).prompts_for(
            [Request(2, 2, 1, 0.0, np.zeros(0, dtype=np.int16))])
