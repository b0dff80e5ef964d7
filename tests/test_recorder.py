"""The run recorder: tables and token times built from its buffers whatever their size."""

from __future__ import annotations

import numpy as np
import pytest

from cdbsim.latency.model import LatencyModel, roofline_profile
from cdbsim.model.arch import PRESETS
from cdbsim.report import logs
from cdbsim.report.logs import RunRecorder, _token_times
from cdbsim.serving.config import ServeConfig
from cdbsim.simulator.sim import Simulation
from traces import ExitModel, build_trace


@pytest.mark.parametrize("policy", ["refill", "norefill", "cb"])
def test_small_buffers_give_the_same_logs(policy: str) -> None:
    """Buffers of 7 launches (tokens, step mixes and rows cut at many places) log what one buffer does."""
    arch = PRESETS["ouro-1.4b"]
    requests = build_trace("alpaca", 40, arch.r_max, 2, ExitModel(mean=2.5), seed=3)
    latency = LatencyModel(arch, roofline_profile(arch))
    logs = []
    for rows in (7, 1 << 16):
        sim = Simulation(arch, ServeConfig(policy=policy, width=8), requests, latency, kv_blocks=10_000)
        sim.recorder = RunRecorder(sim.requests, chunk_rows=rows)
        logs.append(sim.run())
    small, whole = logs
    assert len(whole.launches) > 7 * 5
    assert small.launches.equals(whole.launches)
    assert small.requests.equals(whole.requests)
    assert all(np.array_equal(a, b) for a, b in zip(small.token_times, whole.token_times, strict=True))


@pytest.mark.parametrize("piece", [5, 1 << 16])
def test_token_times_follow_each_request_through_its_launches(piece: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request's times are the ends of the launches that produced its tokens, in launch order, with
    request ids past 16 bits (the second radix pass), a request with no tokens, a buffer of launches that
    produced none, and buffers placed in several pieces or in one."""
    monkeypatch.setattr(logs, "_PIECE_TOKENS", piece)
    rng = np.random.default_rng(5)
    n = 70_000
    ids = np.array([3, 65_535, 65_536, 69_999, 12, 0])
    launches = [rng.permutation(ids)[:rng.integers(0, len(ids) + 1)] for _ in range(23)]
    launches[4:8] = [ids[:0]] * 4
    ends = np.sort(rng.random(len(launches)))
    tokens = np.array([len(batch) for batch in launches])
    rows = 4
    parts = [np.concatenate([np.array([], dtype=np.int32), *launches[a:a + rows]]).astype(np.int32)
             for a in range(0, len(launches), rows)]
    times, first, last = _token_times(parts, ends, tokens, n, rows)
    assert parts == []
    want: dict[int, list[float]] = {}
    for batch, end in zip(launches, ends, strict=True):
        for i in batch:
            want.setdefault(int(i), []).append(end)
    for i in (*ids, 1, 65_537):
        expected = want.get(int(i), [])
        assert times[i].tolist() == expected
        if expected:
            assert (first[i], last[i]) == (expected[0], expected[-1])
        else:
            assert np.isnan(first[i]) and np.isnan(last[i])
    assert sum(len(t) for t in times) == tokens.sum()
