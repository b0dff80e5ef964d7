"""The driver's logs: the simulator's schema, consistent times and token counts, run metadata."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cdbsim.latency.build import Build  # noqa: E402
from cdbsim.report.logs import LAUNCH_COLUMNS, RunLog  # noqa: E402
from cdbsim.serving.config import ServeConfig  # noqa: E402
from executor.build import current_build  # noqa: E402
from executor.driver import execute, run_executor  # noqa: E402
from traces.request import Request  # noqa: E402

from .helpers import tiny_arch, tiny_model, tiny_requests  # noqa: E402


@pytest.mark.parametrize("mode", ["sync", "lookahead"])
def test_run_executor_log_schema_and_times(tmp_path, mode: str) -> None:
    arch = tiny_arch("ouro")
    requests = tiny_requests(n=5, seed=2)
    config = ServeConfig(policy="refill", width=4, coda_batch=1, prefill_budget=32, timing="sync", layout="depth")
    log = run_executor(arch, config, requests, 64, device="cpu", mode=mode, seed=0,
                       model=tiny_model(arch))
    assert isinstance(log, RunLog)
    assert tuple(log.launches.columns) == LAUNCH_COLUMNS
    launches = log.launches
    assert (launches["end"] >= launches["start"]).all()
    assert (np.diff(launches["start"]) >= 0).all()
    assert (launches["end"].to_numpy()[:-1] <= launches["start"].to_numpy()[1:] + 1e-9).all()
    assert (launches["host_s"] >= 0).all()
    assert launches["tokens"].sum() == sum(r.output_len for r in requests)
    assert [len(t) for t in log.token_times] == [r.output_len for r in requests]
    assert log.meta["mode"] == mode and log.meta["backend"] == "executor"
    assert {"device", "torch", "dtype", "policy", "layout"} <= set(log.meta)
    assert Build.from_record(log.meta["build"]) == current_build("cpu")  # the build validate checks profiles with
    assert log.meta["chained_rows"] == 0  # a torch-backend model: the chained path is a triton one
    back = RunLog.load(log.save(tmp_path / "run"))
    assert len(back.launches) == len(launches)


def test_host_time_counts_completion_work(monkeypatch) -> None:
    """host_s is all the host's work per launch: logging a finished launch (completion work) counts."""
    import executor.driver as driver

    slow_ms = 5.0
    original = driver.RunRecorder.record

    def slow_record(self, *args, **kwargs):
        time.sleep(slow_ms / 1e3)
        return original(self, *args, **kwargs)

    arch = tiny_arch("ouro")
    config = ServeConfig(policy="refill", width=4, coda_batch=1, prefill_budget=32, layout="depth")

    def host_ms() -> tuple[float, int]:
        log = run_executor(arch, config, tiny_requests(n=4, seed=4), 64, device="cpu", mode="lookahead",
                           model=tiny_model(arch))
        launches = log.launches
        assert (launches["host_s"] > 0).all()
        assert launches["host_s"].sum() + (launches["end"] - launches["start"]).sum() <= log.meta["wall_s"]
        return 1e3 * launches["host_s"].sum(), len(launches)

    plain, n = host_ms()
    monkeypatch.setattr(driver.RunRecorder, "record", slow_record)
    slowed, n_slowed = host_ms()
    assert n_slowed == n
    # every launch but the last is logged before the next one is handed over
    assert slowed - plain >= 0.8 * slow_ms * (n - 1)


def test_online_arrivals_are_released_on_time() -> None:
    arch = tiny_arch("huginn")
    requests = [Request(0, 5, 3, 0.0, np.array([1, 2], dtype=np.int16)),
                Request(1, 8, 2, 0.05, np.array([3], dtype=np.int16))]
    config = ServeConfig(policy="norefill", width=2, prefill_budget=16, timing="sync", layout="shared")
    run = execute(arch, config, requests, 16, model=tiny_model(arch), mode="sync")
    scheduled = run.log.requests["scheduled"].to_numpy()
    assert scheduled[1] >= 0.05
    assert all(len(t) == r.output_len for t, r in zip(run.tokens, requests, strict=True))


def test_model_and_arch_must_agree() -> None:
    arch = tiny_arch("ouro")
    config = ServeConfig(policy="cb", width=2, prefill_budget=16)
    with pytest.raises(ValueError, match="r_max"):
        execute(arch.with_loops(r_max=3), config, tiny_requests(n=2, r_max=3), 16, model=tiny_model(arch))


@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_warmup_prefill_touches_no_request(style: str) -> None:
    """The untimed warm-up prefill writes only the trash block and the scratch token row."""
    from executor.engine import Engine

    arch = tiny_arch(style)
    config = ServeConfig(policy="refill", width=4, prefill_budget=32, layout="depth")
    requests = tiny_requests(n=3)
    engine = Engine(tiny_model(arch), config, requests, 16)
    engine.cache.k.normal_()
    engine.cache.v.normal_()
    k, v, tokens = engine.cache.k.clone(), engine.cache.v.clone(), engine.tokens.clone()
    engine.warmup_prefill()
    trash = engine.geo.trash_block
    real = [b for b in range(engine.geo.pages_per_layer) if b != trash]
    assert torch.equal(engine.cache.k[:, real], k[:, real]) and torch.equal(engine.cache.v[:, real], v[:, real])
    assert not torch.equal(engine.cache.k[:, trash], k[:, trash])
    scratch = len(requests) * engine.stride
    assert torch.equal(engine.tokens[:scratch], tokens[:scratch])


def test_run_clock_starts_after_the_collector_pass(monkeypatch) -> None:
    """Setup before serving (the collector pass of paused_gc) is not logged as run time."""
    import contextlib
    import time

    import executor.driver as driver

    @contextlib.contextmanager
    def slow_pause():
        time.sleep(1.0)
        yield

    monkeypatch.setattr(driver, "paused_gc", slow_pause)
    arch = tiny_arch("ouro")
    config = ServeConfig(policy="cb", width=2, prefill_budget=16, timing="sync")
    log = run_executor(arch, config, tiny_requests(n=2, seed=1), 32, model=tiny_model(arch), mode="sync")
    assert log.launches["start"].iloc[0] < 1.0


def test_launch_metadata_is_the_size_the_latency_model_charges() -> None:
    """cdbsim.serving.launch prices a decode-type launch's copy from the padded rows and the run's block-table
    width; the engine's graphs copy exactly that buffer."""
    from cdbsim.serving.launch import Stage, metadata_bytes, table_width
    from executor.engine import Engine

    arch = tiny_arch("ouro")
    requests = tiny_requests(n=5, seed=2)
    config = ServeConfig(policy="refill", width=4, layout="depth")
    engine = Engine(tiny_model(arch), config, requests, 64)
    assert engine.max_blocks == table_width(requests, config.block_size) == -(-max(
        r.prompt_len + r.output_len for r in requests) // config.block_size)
    for stage in (Stage.PRELUDE, Stage.CORE, Stage.CODA, Stage.DECODE):
        for rows in (1, 4):
            assert engine.scratch(stage, rows, engine.max_blocks).nbytes == metadata_bytes(rows, engine.max_blocks)


def test_decode_metadata_gathers_the_block_table_from_a_fresh_template() -> None:
    """A decode-type launch's table row is its request's block ids (those past its position included:
    attention masks them), then the trash block; each launch's buffer is its own copy of the shape's
    scratch template, so filling one leaves the next launch's padding untouched."""
    from cdbsim.serving.launch import Stage, decode_launch
    from executor.engine import FIELDS, Engine

    arch = tiny_arch("ouro")
    requests = tiny_requests(n=2, seed=2)
    config = ServeConfig(policy="refill", width=4, layout="depth")
    engine = Engine(tiny_model(arch), config, requests, 64)
    width, trash = engine.max_blocks, engine.geo.trash_block
    blocks = [[7, 3, 9], [5]]  # request 0 holds a block past its position 17 (block 1)
    prepared = engine.prepare(decode_launch(Stage.CORE, [0, 1], [17, 2], blocks, 4), width)
    table = prepared.meta[len(FIELDS) * 4:].reshape(4, width)
    assert table[0].tolist() == [7, 3, 9] + [trash] * (width - 3)
    assert table[1].tolist() == [5] + [trash] * (width - 1)
    assert (table[2:] == trash).all()
    again = engine.prepare(decode_launch(Stage.CORE, [1], [2], [[5]], 4), width)
    assert (again.meta[len(FIELDS) * 4:].reshape(4, width)[1:] == trash).all()


def test_decode_metadata_matches_a_row_by_row_reading_of_the_launch() -> None:
    """The engine builds a launch's metadata with a few numpy gathers over host mirrors of every request's
    block table and bank row. Every field is re-derived here row by row from the launch itself, including
    after a request was given back and admitted again with other blocks of the same count (the mirror must
    notice new ids, not only a longer list)."""
    from cdbsim.serving.launch import Stage, decode_launch
    from executor.engine import FIELDS, Engine

    arch = tiny_arch("ouro")
    requests = [Request(i, 30, 6, 0.0, np.full(5, 2, dtype=np.int16)) for i in range(3)]
    config = ServeConfig(policy="refill", width=4, layout="depth")
    engine = Engine(tiny_model(arch), config, requests, 64)
    engine.admit([0, 1, 2])
    geo, bs, width = engine.geo, config.block_size, engine.max_blocks

    def check(launch) -> None:
        prepared = engine.prepare(launch, width)
        rows = launch.padded
        field = dict(zip(FIELDS, prepared.meta[: len(FIELDS) * rows].reshape(len(FIELDS), rows), strict=True))
        fills = []
        for i, (r, pos) in enumerate(zip(launch.requests, launch.positions, strict=True)):
            blocks = launch.blocks[i]
            expected = {"tok": r * engine.stride + pos, "pos": pos, "bank": engine.row_of[r],
                        "row0": blocks[pos // bs] * bs + pos % bs, "out": r * engine.stride + pos + 1,
                        "seq_len": pos + 1, "layer_base": 0, "fill": 0}
            if launch.stage is Stage.CORE:
                step = launch.steps[i]
                expected["layer_base"] = geo.slot_of_step(step) * geo.core
                expected["fill"] = geo.fill_count(step) if launch.exits[i] else 0
            fills.append(expected["fill"])
            assert {name: int(field[name][i]) for name in FIELDS} == expected
        assert prepared.max_fill == max(fills)

    check(decode_launch(Stage.CORE, [0, 2], [17, 3], [[7, 3], [4]], 4, steps=[0, 2], exits=[True, False]))
    check(decode_launch(Stage.PRELUDE, [1], [20], [[1, 2]], 1))
    engine.release([0])
    engine.admit([0])
    check(decode_launch(Stage.CORE, [0], [17], [[8, 6]], 1, steps=[1], exits=[True]))  # same count, new ids
