"""Hand-checked scheduler behaviour: admission, queue order, coda batching, waves, KV pressure."""

from __future__ import annotations

import numpy as np
import pytest

from cdbsim.errors import ConfigError
from cdbsim.serving.config import ServeConfig, decode_graph_sizes, prefill_graph_sizes
from cdbsim.serving.launch import Stage
from cdbsim.serving.pipeline import drive
from cdbsim.serving.requests import clipped_depths
from cdbsim.serving.scheduler import Scheduler
from tests.conftest import make_requests, tiny_arch
from traces import Request


def stages(launches) -> list[str]:
    return [x.stage.value for x in launches]


def test_refill_two_requests_exact_sequence() -> None:
    arch = tiny_arch(r_max=3)
    requests = make_requests([(4, 2), (4, 2)], depths=[[1], [3]])
    config = ServeConfig(policy="refill", width=4, coda_batch=1, prefill_budget=16, timing="sync")
    launches = list(drive(Scheduler(arch, config, requests, 64)))
    assert stages(launches) == ["prefill", "prelude", "core", "coda", "core", "core", "coda"]
    assert launches[0].chunk_lens == [4, 4] and launches[0].finishes == [True, True]
    core = launches[2]
    assert core.requests == [0, 1] and core.steps == [0, 0] and core.exits == [True, False]
    # request 1 keeps looping at the head of the queue while request 0's coda runs first
    assert launches[4].steps == [1] and launches[5].steps == [2] and launches[5].exits == [True]
    assert launches[1].positions == [4, 4]  # the first decode token's input sits after the prompt


def test_lookahead_raises_minimum_depth_to_two() -> None:
    arch = tiny_arch(r_max=3)
    requests = make_requests([(4, 2)], depths=[[1]])
    launches = list(drive(Scheduler(arch, ServeConfig(width=2, timing="lookahead"), requests, 64)))
    assert sum(x.size for x in launches if x.stage is Stage.CORE) == 2


def test_cb_runs_one_fused_step_per_token() -> None:
    arch = tiny_arch(r_max=3)
    requests = make_requests([(4, 3), (6, 2)], depths=[[1, 1], [1]])
    launches = list(drive(Scheduler(arch, ServeConfig(policy="cb", width=4), requests, 64)))
    assert stages(launches) == ["prefill", "decode", "decode"]
    assert launches[1].requests == [0, 1] and launches[2].requests == [0]


def test_norefill_wave_shrinks_and_ends_with_one_coda() -> None:
    arch = tiny_arch(r_max=4)
    requests = make_requests([(4, 2), (4, 2), (4, 2)], depths=[[2], [4], [3]])
    config = ServeConfig(policy="norefill", width=4, timing="lookahead")
    launches = list(drive(Scheduler(arch, config, requests, 64)))
    assert stages(launches) == ["prefill", "prelude", "core", "core", "core", "core", "coda"]
    assert [x.size for x in launches[2:6]] == [3, 3, 2, 1]
    assert launches[-1].size == 3


def test_admission_waits_for_free_slots() -> None:
    """W = 8 with min_free_slots = 4: six residents admit nothing; after two finish, four are admitted."""
    arch = tiny_arch(r_max=2)
    specs = [(4, 4)] * 2 + [(4, 30)] * 4 + [(4, 2)] * 6
    config = ServeConfig(policy="refill", width=8, min_free_slots=4, prefill_budget=16, timing="sync")
    scheduler = Scheduler(arch, config, make_requests(specs, depths=[[2] * (o - 1) for _, o in specs]), 256)
    for i in range(6):
        scheduler.arrive(i)
    while scheduler.active < 6:
        scheduler.complete(scheduler.plan())
    for i in range(6, 12):
        scheduler.arrive(i)
    admitted_at = None
    while admitted_at is None:
        launch = scheduler.plan()
        if launch.stage is Stage.PREFILL and any(i >= 6 for i in launch.requests):
            admitted_at = scheduler.finished
            fresh = [i for i in launch.requests if i >= 6]
        scheduler.complete(launch)
    assert admitted_at == 2 and fresh == [6, 7, 8, 9]


def test_coda_batch_waits_for_k_and_flushes_when_idle() -> None:
    arch = tiny_arch(r_max=4)
    specs = [(4, 5)] * 6
    depths = [[2, 3, 4, 2], [4, 4, 2, 2], [3, 2, 2, 4], [2, 2, 2, 2], [4, 3, 2, 3], [3, 3, 3, 3]]
    counts = {}
    for k in (1, 3, 6):
        config = ServeConfig(policy="refill", width=6, coda_batch=k, timing="sync")
        launches = list(drive(Scheduler(arch, config, make_requests(specs, depths), 64)))
        codas = [x for x in launches if x.stage is Stage.CODA]
        assert sum(x.size for x in codas) == 6 * 4
        counts[k] = len(codas)
    assert counts[1] > counts[3] >= counts[6]


def test_kv_pressure_stalls_then_preempts_and_still_finishes() -> None:
    arch = tiny_arch(r_max=2)
    specs = [(16, 40), (16, 40), (16, 40)]
    config = ServeConfig(policy="refill", width=4, timing="sync", kv_margin=0.0)
    scheduler = Scheduler(arch, config, make_requests(specs, depths=[[2] * 39] * 3), 4)
    launches = list(drive(scheduler))
    assert scheduler.preemptions >= 1
    assert scheduler.kv.used == 0 and scheduler.finished == 3
    assert sum(x.size for x in launches if x.stage is Stage.CODA) + 3 + scheduler.recomputes == 120


def test_capacity_smaller_than_one_request_is_refused() -> None:
    with pytest.raises(ConfigError, match="smaller than request 0's need of 3 blocks"):
        Scheduler(tiny_arch(), ServeConfig(), make_requests([(40, 2)]), 2)


@pytest.mark.parametrize("kwargs,message", [
    ({"coda_batch": 65}, "K \\(65\\) must not exceed W"), ({"width": 0}, "W must be >= 1"),
    ({"policy": "fifo"}, "choose one of: adaptive, cb, norefill, refill"), ({"prefill_budget": 32}, "must not exceed"),
    ({"layout": "paged"}, "choose one of: depth, first-shared, shared"), ({"coda_batch": 0}, "K must be"),
])
def test_impossible_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServeConfig(**kwargs)


def test_graph_sizes_follow_the_engine_buckets() -> None:
    assert decode_graph_sizes(64) == (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64)
    sizes = decode_graph_sizes(600)
    assert 496 in sizes and 512 in sizes and 544 in sizes and sizes[-1] == 600
    assert prefill_graph_sizes(8192)[:3] == (16, 32, 48) and prefill_graph_sizes(8192)[-1] == 8192


def queued_at_steps(steps: list[int], width: int, core_launch: str) -> Scheduler:
    """A refill scheduler whose ready queue holds one token per request at the given 0-based loop steps."""
    arch = tiny_arch(r_max=4)
    requests = make_requests([(4, 2)] * len(steps), depths=[[4]] * len(steps))
    config = ServeConfig(policy="refill", width=width, timing="sync", core_launch=core_launch)
    scheduler = Scheduler(arch, config, requests, 64)
    for i, s in enumerate(steps):
        scheduler.table.last[i] = 3  # every token loops to r_max
        scheduler.ready.append(i)
        scheduler._ready_steps.append(s)
    return scheduler


def test_per_step_core_launch_takes_the_head_step_and_defers_the_rest_in_order() -> None:
    """The paper's engine's own case: steps [0, 1, 2, 0] launch [0, 0]; the others keep their order."""
    scheduler = queued_at_steps([0, 1, 2, 0], width=4, core_launch="per-step")
    launch = scheduler.plan()
    assert launch.stage is Stage.CORE and launch.requests == [0, 3] and launch.steps == [0, 0]
    assert list(scheduler.ready) == [0, 3, 1, 2]  # survivors back at the head, deferred tokens behind
    second = scheduler.plan()  # the head is now at step 1, as are 3 and the deferred 1
    assert second.requests == [0, 3, 1] and second.steps == [1, 1, 1]
    assert list(scheduler.ready) == [0, 3, 1, 2]


def test_per_step_core_launch_takes_matching_tokens_from_anywhere_in_the_queue() -> None:
    scheduler = queued_at_steps([1, 0, 1, 1, 2], width=5, core_launch="per-step")
    assert scheduler.plan().requests == [0, 2, 3]
    assert list(scheduler.ready) == [0, 2, 3, 1, 4]
    assert scheduler._ready_steps == [2, 2, 2, 0, 2]


def test_mixed_core_launch_takes_the_head_whatever_the_steps() -> None:
    scheduler = queued_at_steps([0, 1, 2, 0], width=4, core_launch="mixed")
    launch = scheduler.plan()
    assert launch.requests == [0, 1, 2, 3] and launch.steps == [0, 1, 2, 0]


def test_unknown_core_launch_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="mixed, per-step"):
        ServeConfig(core_launch="split")


def test_exit_steps_clamp_depths_of_any_width_before_narrowing_them() -> None:
    """Depths are clamped to [r_min, r_max] before they are stored as int16: 40,000 or -3 in a wider array
    becomes r_max or r_min, not a wrapped-around value."""
    requests = [Request(0, 3, 4, 0.0, np.array([1, 9, -3], dtype=np.int64)),
                Request(1, 2, 1, 0.0, np.zeros(0, dtype=np.int16)),
                Request(2, 2, 3, 0.0, np.array([2, 40_000], dtype=np.int32))]
    steps, starts = clipped_depths(requests, 2, 4, offset=-1)
    assert steps.typecode == "h" and steps.tolist() == [1, 3, 1, 1, 3] and starts == [0, 3, 3]
    assert clipped_depths([], 2, 4)[1] == []
