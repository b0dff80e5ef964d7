"""Property-based tests of the shared scheduler over random policies, widths, budgets, capacities,
layouts, workloads and exit depths."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdbsim.model.arch import KVLayout
from cdbsim.serving.blocks import need_blocks
from cdbsim.serving.config import CoreLaunch, Policy, ServeConfig, Timing
from cdbsim.serving.launch import Launch, Stage
from cdbsim.serving.scheduler import Scheduler
from tests.conftest import make_requests, tiny_arch


@dataclass
class Case:
    policy: Policy
    timing: Timing
    layout: KVLayout
    width: int
    coda_batch: int
    budget: int
    r_max: int
    specs: list[tuple[int, int]]
    depths: list[list[int]]
    extra_blocks: int
    pipelined: bool
    min_free_slots: int | None
    core_launch: CoreLaunch = CoreLaunch.MIXED

    def build(self, depths: list[list[int]] | None = None) -> Scheduler:
        arch = tiny_arch(self.r_max)
        config = ServeConfig(policy=self.policy, width=self.width, coda_batch=self.coda_batch,
                             prefill_budget=self.budget, timing=self.timing, layout=self.layout,
                             min_free_slots=self.min_free_slots, core_launch=self.core_launch)
        requests = make_requests(self.specs, depths if depths is not None else self.depths)
        capacity = max(need_blocks(p, o) for p, o in self.specs) + self.extra_blocks
        return Scheduler(arch, config, requests, capacity)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    width = draw(st.integers(1, 8))
    r_max = draw(st.integers(1, 6))
    n = draw(st.integers(1, 10))
    specs = [(draw(st.integers(1, 70)), draw(st.integers(1, 24))) for _ in range(n)]
    depths = [[draw(st.integers(1, r_max)) for _ in range(o - 1)] for _, o in specs]
    return Case(
        policy=draw(st.sampled_from(list(Policy))),
        timing=draw(st.sampled_from(list(Timing))),
        layout=draw(st.sampled_from(list(KVLayout))),
        width=width,
        coda_batch=draw(st.integers(1, width)),
        budget=draw(st.integers(width, 96)),
        r_max=r_max,
        specs=specs,
        depths=depths,
        extra_blocks=draw(st.sampled_from([0, 0, 1, 2, 4, 16, 64])),
        pipelined=draw(st.booleans()),
        min_free_slots=draw(st.one_of(st.none(), st.integers(1, width))),
        core_launch=draw(st.sampled_from(list(CoreLaunch))),
    )


# Device seconds the adaptive policy observes: boundary stages nearly as dear as a core step, so its rule
# holds prelude and coda launches back and the invariants are checked on that path too.
SECONDS = {Stage.PRELUDE: (0.5, 0.001), Stage.CORE: (1.0, 0.01), Stage.CODA: (0.8, 0.001)}


def finish(scheduler: Scheduler, launch: Launch) -> None:
    delta, gamma = SECONDS.get(launch.stage, (1.0, 0.0))
    scheduler.observe(launch, delta + gamma * launch.padded)
    scheduler.complete(launch)


def run(scheduler: Scheduler, pipelined: bool, limit: int) -> list[Launch]:
    """Drive ``scheduler`` to the end, checking KV and width invariants after every plan."""
    for i in range(len(scheduler.requests)):
        scheduler.arrive(i)
    cfg = scheduler.config
    launches: list[Launch] = []
    pending: list[Launch] = []
    while not scheduler.done:
        assert len(launches) < limit, "the run does not terminate"
        launch = scheduler.plan()
        if launch is None:
            assert pending, "deadlock: nothing planned and nothing in flight"
            finish(scheduler, pending.pop(0))
            continue
        launches.append(launch)
        pending.append(launch)
        # width and budget
        if launch.stage is Stage.PREFILL:
            assert 1 <= launch.size <= cfg.prefill_budget
            assert launch.size == sum(launch.chunk_lens)
        else:
            assert 1 <= launch.size <= cfg.width
        assert launch.padded >= launch.size
        # KV: in use never above capacity, no block held twice, every attended position has a block
        held = [b for blocks in scheduler.blocks for b in blocks]
        assert len(held) == len(set(held)) == scheduler.kv.used <= scheduler.kv.total
        if launch.stage is Stage.PREFILL:
            for i, start, n in zip(launch.requests, launch.positions, launch.chunk_lens, strict=True):
                assert (start + n) <= len(scheduler.blocks[i]) * cfg.block_size
        else:
            for i, pos in zip(launch.requests, launch.positions, strict=True):
                assert pos < len(scheduler.blocks[i]) * cfg.block_size
        if len(pending) > (1 if pipelined else 0):
            finish(scheduler, pending.pop(0))
    assert scheduler.kv.used == 0, "KV blocks leaked"
    return launches


def signature(launches: list[Launch]) -> list[tuple]:
    return [(x.stage, tuple(x.requests), tuple(x.positions), tuple(x.steps), tuple(x.chunk_lens))
            for x in launches]


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_scheduler_invariants(case: Case) -> None:
    scheduler = case.build()
    limit = 20 + sum(p + o * (case.r_max + 3) for p, o in case.specs) * 4
    launches = run(scheduler, case.pipelined, limit)
    r_min = scheduler.r_min
    produced = [0] * len(case.specs)
    core_steps = [0] * len(case.specs)
    from_prefill = [0] * len(case.specs)
    for launch in launches:
        if launch.stage is Stage.PREFILL:
            for i, final in zip(launch.requests, launch.finishes, strict=True):
                if final:
                    produced[i] += 1
                    from_prefill[i] += 1
                    core_steps[i] = 0
        elif launch.stage is Stage.CORE:
            assert case.policy is not Policy.CB
            for i, s in zip(launch.requests, launch.steps, strict=True):
                assert s == core_steps[i], "loop steps of a token must run in order"
                core_steps[i] += 1
        elif launch.stage is Stage.CODA:
            for i in launch.requests:
                token = produced[i]
                expected = min(max(case.depths[i][token - 1], r_min), case.r_max)
                assert core_steps[i] == expected, (i, token, core_steps[i], expected)
                core_steps[i] = 0
                produced[i] += 1
        elif launch.stage is Stage.DECODE:
            assert case.policy is Policy.CB
            for i in launch.requests:
                produced[i] += 1
    # every request finishes with exactly its output length; only the first token (and tokens after a
    # recompute preemption) come from prefill
    assert produced == [o for _, o in case.specs]
    assert sum(from_prefill) == len(case.specs) + scheduler.recomputes
    if case.policy is Policy.CB:
        assert all(x.stage in (Stage.PREFILL, Stage.DECODE) for x in launches)
    # determinism: the same inputs give the same launches
    assert signature(run(case.build(), case.pipelined, limit)) == signature(launches)


@settings(max_examples=150, deadline=None)
@given(cases(), st.integers(0, 2**31 - 1))
def test_cb_ignores_exit_depths(case: Case, seed: int) -> None:
    case.policy = Policy.CB
    rng = np.random.default_rng(seed)
    other = [list(rng.integers(1, case.r_max + 1, size=len(d))) for d in case.depths]
    limit = 20 + sum(p + o * (case.r_max + 3) for p, o in case.specs) * 4
    first = run(case.build(), case.pipelined, limit)
    second = run(case.build(other), case.pipelined, limit)
    assert signature(first) == signature(second)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_norefill_waves_shrink_and_end_in_one_coda(case: Case) -> None:
    case.policy = Policy.NOREFILL
    limit = 20 + sum(p + o * (case.r_max + 3) for p, o in case.specs) * 4
    launches = run(case.build(), case.pipelined, limit)
    wave: list[Launch] | None = None
    for launch in launches:
        if launch.stage is Stage.PRELUDE:
            assert wave is None, "a new wave starts only after the previous coda"
            wave = [launch]
        elif launch.stage is Stage.CORE:
            assert wave is not None
            previous = wave[-1]
            assert launch.size <= previous.size
            assert len(set(launch.steps)) == 1, "a wave's tokens sit at the same loop step"
            wave.append(launch)
        elif launch.stage is Stage.CODA:
            assert wave is not None
            assert launch.size == wave[0].size, "one coda for all of the wave's tokens"
            wave = None


@settings(max_examples=300, deadline=None)
@given(cases())
def test_per_step_core_launches_are_step_homogeneous(case: Case) -> None:
    """Under per-step every core launch applies one loop step; mixed runs the same tokens to the same
    depths (the invariants above), only grouped differently."""
    case.core_launch = CoreLaunch.PER_STEP
    limit = 20 + sum(p + o * (case.r_max + 3) for p, o in case.specs) * 4
    launches = run(case.build(), case.pipelined, limit)
    assert all(len(set(x.steps)) == 1 for x in launches if x.stage is Stage.CORE)
