"""Calibration on the CPU with a tiny model: the pipeline runs end to end, and a measured profile
predicts re-split models from the same components."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from calibration.fit import attention_rows, quality_rows, saturation_rows
from calibration.measure import Plan
from calibration.run import calibrate
from cdbsim.latency.devices import device_tag
from cdbsim.latency.model import LatencyModel, components_for, model_stage_name
from cdbsim.latency.profile import load_profile_file
from cdbsim.model.arch import ArchSpec, LayerShape
from cdbsim.serving.launch import Stage
from executor.build import current_build

TINY_PLAN = Plan(batches=(1, 2, 4), contexts=(16, 48), max_positions=512,
                 prefill_points=((16, 1, 0), (32, 1, 0), (16, 1, 16), (8, 3, 0)), model_contexts=(16, 32),
                 decode_contexts=(16,), model_max_positions=256,
                 model_prefill_points=((16, 1, 0), (32, 1, 0), (8, 3, 0)), skew_points=((4, 8, 32, 1),),
                 repeats=3, warmup=1)


def tiny(style: str) -> ArchSpec:
    return ArchSpec(name=f"tiny-{style}", layer=LayerShape(64, 128, 4, 4, 16, style), vocab=97,
                    prelude=2 if style == "huginn" else 0, core=2, coda=2 if style == "huginn" else 0, r_max=3,
                    tied_head=style == "huginn")


@pytest.mark.parametrize("style", ["ouro", pytest.param("huginn", marks=pytest.mark.slow)])
def test_calibrate_on_cpu_writes_a_usable_profile(tmp_path, style: str) -> None:
    arch = tiny(style)
    (profile,) = calibrate([arch], tmp_path, device="cpu", plan=TINY_PLAN)
    assert (tmp_path / f"{profile.name}.png").stat().st_size > 1000
    back = load_profile_file(tmp_path / f"{profile.name}.json")
    assert back.kind == "measured" and back.components.keys() == profile.components.keys()
    assert back.executor_build() == current_build("cpu")  # the build that measured it, as written and read back
    assert back.build_label().startswith(f"build {current_build('cpu').sources}, torch ")
    assert set(components_for(arch)) <= set(back.components)
    for stage in Stage:
        assert model_stage_name(arch, stage) in back.components
    for row in quality_rows(back):
        assert row["points"] >= 1
    from calibration.measure import FILL_LOOPS, META_COPY_BYTES

    copies = [p[0] for p in back.components["kv_copy/" + arch.layer.key].points]
    assert copies == [b * (FILL_LOOPS - 1) * 4 for b in TINY_PLAN.batches]  # every exit fills the deeper slots
    assert [p[0] for p in back.components["meta_copy"].points] == list(META_COPY_BYTES)
    assert back.attention["points"][0][1:-1] == [32, 8, 8, 8]  # the skewed core step's row contexts
    assert len(back.attention["error_with_mean_length_pct"]) == 1
    assert attention_rows(back)[0]["max L"] == 32
    # the mixed-context core steps measured again, with a spread of contexts in a padded graph
    import dataclasses

    import torch

    from calibration.measure import remeasure_attention

    again = remeasure_attention(arch, back, torch.device("cpu"), dataclasses.replace(TINY_PLAN,
                                                                                        spread_points=((3, 8, 32),)))
    assert [row[:-1] for row in again.attention["points"]] == [[4, 32, 8, 8, 8], [4, 32, 16, 8]]
    assert again.components == back.components and len(again.attention["error_with_slots_pct"]) == 2
    model = LatencyModel(arch, back)
    assert model.measured_stages == set(Stage)
    assert all(model.costs[s](4, 64) > 0 for s in Stage)
    row = saturation_rows(back, arch)[0]  # CPU timings are noise: a bound may bind (delta 0 gives B* 0)
    delta, gamma, alpha = row["core delta ms"] / 1e3, row["core gamma us"] / 1e6, row["core alpha ns"] / 1e9
    assert min(delta, gamma, alpha) >= 0 and delta + gamma + alpha > 0
    assert row["B*(128)"] == pytest.approx(delta / (gamma + alpha * 128) if gamma + alpha > 0 else math.inf, rel=1e-9)
    # a re-split of the same layer shape needs no new measurement; its CB step is composed
    resplit = arch.with_split("0-2-0")
    other = LatencyModel(resplit, back)
    assert not other.measured_stages
    layer = back.components["layer/" + arch.layer.key]
    assert other.costs[Stage.CORE].delta == pytest.approx(back.components["core1/" + arch.layer.key].delta
                                                          + layer.delta)
    if style == "huginn":
        bigger = LatencyModel(arch.with_split("2-2-2"), back)
        assert bigger.costs[Stage.CODA].delta - other.costs[Stage.CODA].delta == pytest.approx(2 * layer.delta)
    assert all(other.tables[s](4, 20) > 0 for s in other.tables)


def test_device_tag() -> None:
    assert device_tag("NVIDIA H200") == "h200"
    assert device_tag("NVIDIA H100 80GB HBM3") == "h100"


@pytest.mark.parametrize("style", ["ouro", "huginn"])
def test_calibration_times_stages_on_random_data(style: str) -> None:
    """The bench's KV cache and loop states hold random values, not zeros: a stage fed zeros runs on
    zero activations, which a GPU computes at lower power (and higher clocks) than a serving run."""
    import torch

    from calibration.measure import Timer, UnitBench
    from cdbsim.model.arch import KVLayout

    arch = tiny(style)
    device = torch.device("cpu")
    bench = UnitBench(arch, 4, 48, 512, KVLayout.SHARED, device, Timer(device, 1, 0))
    engine = bench.engine
    states = [engine.cache.k, engine.cache.v, engine.bank_state]
    if style == "huginn":
        states.append(engine.bank_inject)
    assert all(float(t.float().std()) > 0.5 for t in states)
    assert bench.stage(Stage.CORE, 2, 16) > 0
    assert bench.blocks_for([40, 40]) == [[0, 1, 2], [3, 4, 5]]  # consecutive ids by default
    # the options that reproduce a run's conditions: scattered blocks, mixed loop steps; or zeros
    other = UnitBench(arch, 4, 48, 512, KVLayout.DEPTH, device, Timer(device, 1, 0, busy_s=0.01), zeros=True,
                      scatter=True, kv_blocks=200)
    assert other.kv_blocks == 200 and float(other.engine.cache.k.abs().max()) == 0.0
    blocks = other.blocks_for([40] * 4)
    flat = [b for row in blocks for b in row]
    assert len(set(flat)) == len(flat) == 12 and flat != sorted(flat) and max(flat) < 200
    assert other.stage(Stage.CORE, 4, 40, mixed_steps=True) > 0


def test_held_out_error_of_interpolation() -> None:
    """Points linear in B at each context: interpolation predicts every point it did not see above the
    smallest batch (below the grid, it holds the smallest measured value)."""
    import numpy as np

    from calibration.fit import held_out_predictions
    from cdbsim.latency.profile import Fit

    def held_out_errors(fit: Fit) -> np.ndarray:
        predicted = held_out_predictions(fit)
        measured = np.array([p[-1] for p in fit.points])
        return np.abs(predicted - measured) / measured

    points = [[b, b * length, 1e-3 + 1e-5 * b + 1e-8 * b * length] for length in (128, 512) for b in (1, 2, 4, 8)]
    errors = held_out_errors(Fit(delta=1e-3, gamma=1e-5, alpha=1e-8, points=points))
    assert errors.shape == (8,) and np.delete(errors, [0, 4]).max() < 1e-9
    assert errors[0] > 0
    bent = [list(p) for p in points]
    bent[1][2] *= 1.5  # B = 2 at L = 128 off the line: its neighbours cannot predict it
    assert held_out_errors(Fit(delta=1e-3, points=bent))[1] > 0.2
    assert held_out_predictions(Fit(delta=1e-3, points=[[1, 0, 0, 1.0]] * 3)).size == 0


def test_prefill_family_extends_rope_kv_beyond_the_decode_grid(tmp_path) -> None:
    """The kernel calibration's prefill family adds prefill-sized RoPE / KV-write launches to ``rope_kv``
    (only beyond the decode grid's largest), replacing earlier such rows and keeping the decode ones."""
    from calibration.kernels import KernelPlan, calibrate_kernels, merge_prefill_rope

    decode = [[8, 1, 64, 1e-5], [16, 1, 64, 2e-5]]
    merged = merge_prefill_rope([*decode, [512, 1, 64, 9.0]], [[512, 1, 64, 1e-4]], 16)
    assert merged == [*decode, [512, 1, 64, 1e-4]]
    plan = KernelPlan(attention_rows=(1, 2), prefill_tokens=(1, 16), prefill_chunks=(1,), prefill_prefix=(0,),
                      prefill_heads=(8,), head_dims=(64,), prefill_groups=(1,), repeats=2, warmup=1)
    profile = calibrate_kernels(tmp_path, device="cpu", plan=plan, families=("prefill",))
    assert load_profile_file(tmp_path / f"{profile.name}.json").executor_build() == current_build("cpu")
    tables = profile.kernels["tables"]
    assert [row[:3] for row in tables["rope_kv"]] == [[128, 1, 64]]  # 16 tokens x 8 heads; 1 x 8 is decode's
    assert all(row[3] > 0 for row in tables["rope_kv"])
    assert len(tables["prefill_attention"]) == 2


def test_attention_family_alone_keeps_the_prefill_rows_of_rope_kv(tmp_path) -> None:
    """Re-measuring the attention family into an existing profile (``--update``) replaces the decode grid's
    RoPE / KV-write rows and keeps the prefill family's beyond it: the prefill composition needs them."""
    from calibration.kernels import KernelPlan, calibrate_kernels

    plan = KernelPlan(attention_rows=(1, 2), attention_lengths=(32,), head_dims=(64,), groups=(1,), chained_heads=(),
                      max_positions=4096,
                      prefill_tokens=(1, 16), prefill_chunks=(1,), prefill_prefix=(0,), prefill_heads=(8,),
                      prefill_groups=(1,), repeats=2, warmup=1)
    base = calibrate_kernels(tmp_path / "base", device="cpu", plan=plan, families=("prefill",))
    prefill_rows = base.kernels["tables"]["rope_kv"]
    updated = calibrate_kernels(tmp_path / "updated", device="cpu", plan=plan, families=("attention",), base=base)
    rows = updated.kernels["tables"]["rope_kv"]
    assert [row[:3] for row in rows] == [[8, 1, 64], [16, 1, 64], [128, 1, 64]]  # 1 and 2 rows x 8 heads, then prefill
    assert rows[-1] == prefill_rows[-1]


def test_a_group_wider_than_the_decode_grids_heads_is_measured_on_as_many_heads(tmp_path) -> None:
    """GQA 16:1 needs 16 query heads per KV head: the decode grid takes that many heads at group 16 (its rows
    capped at the grid's largest rows x heads), the chained and prefill grids skip heads narrower than a group, and
    each prefill heads is measured at its widest group too (one KV head)."""
    from calibration.kernels import KernelPlan, calibrate_kernels

    plan = KernelPlan(attention_rows=(1, 2), attention_lengths=(32,), head_dims=(80,), groups=(1, 16),
                      chained_heads=(8, 16), max_positions=4096, prefill_tokens=(16,), prefill_chunks=(1,),
                      prefill_prefix=(0,), prefill_heads=(8, 16), prefill_groups=(1, 16), repeats=2, warmup=1)
    assert plan.decode_heads(16) == 16 and plan.decode_rows(16) == (1,)
    tables = calibrate_kernels(tmp_path, device="cpu", plan=plan, families=("attention", "prefill")).kernels["tables"]
    assert [row[:3] for row in tables["decode_attention"]] == [[8, 1, 80], [16, 1, 80], [16, 16, 80]]
    assert sorted(tuple(row[:2]) for row in tables["chained_attention"]) == [(8, 1), (16, 1), (16, 16)]
    assert sorted(tuple(row[3:5]) for row in tables["prefill_attention"]) == [(8, 1), (8, 8), (16, 1), (16, 16)]
    assert all(row[-1] > 0 for name in ("decode_attention", "chained_attention", "prefill_attention")
               for row in tables[name])


def test_attention_families_measured_in_parts_by_head_size_equal_one_sitting(tmp_path) -> None:
    """``--head-dims``: each part replaces its own head sizes' rows and fits and keeps the rest, so two parts leave
    the rows (and fitted widths) one run measures."""
    from calibration.kernels import KernelPlan, calibrate_kernels

    plan = KernelPlan(attention_rows=(1, 2, 4), attention_lengths=(32, 128), head_dims=(64, 80), groups=(1,),
                      chained_heads=(), max_positions=4096, prefill_tokens=(16, 128), prefill_chunks=(1,),
                      prefill_prefix=(0,), prefill_heads=(8,), prefill_groups=(1,), skew_heads=8, skew_groups=(1,),
                      skew_points=((4, 32, 128, 1),), spread_points=(), repeats=2, warmup=1)
    families = ("attention", "prefill", "skew")
    whole = calibrate_kernels(tmp_path / "whole", device="cpu", plan=plan, families=families).kernels
    first = calibrate_kernels(tmp_path / "a", device="cpu", plan=plan, families=families, base=None, head_dims=(64,))
    both = calibrate_kernels(tmp_path / "b", device="cpu", plan=plan, families=families, base=first,
                             head_dims=(80,)).kernels
    for table, column in (("rope_kv", 2), ("decode_attention", 2), ("prefill_attention", 5)):
        shape = sorted(tuple(row[:-1]) for row in whole["tables"][table])
        assert sorted(tuple(row[:-1]) for row in both["tables"][table]) == shape, table
        assert {row[column] for row in both["tables"][table]} == {64, 80}
    assert set(both["attention_points"]) == set(whole["attention_points"]) == {"64", "80"}
    kept = [row for row in both["tables"]["decode_attention"] if row[2] == 64]
    assert kept == [row for row in first.kernels["tables"]["decode_attention"] if row[2] == 64]


def test_skew_family_fits_the_attention_width_on_its_own_head_layout_and_refits_alike(tmp_path) -> None:
    """The mixed-context points run on the plan's skew layout (heads, group), against the uniform table at
    that layout; refitting a record from its points gives the same width and sharpness."""
    from calibration.fit import refit_attention_width
    from calibration.kernels import KernelPlan, calibrate_kernels

    plan = KernelPlan(attention_rows=(1, 2, 4, 8), attention_lengths=(32, 128, 512), head_dims=(64,), groups=(1, 2),
                      chained_heads=(), max_positions=4096, skew_heads=8, skew_groups=(1, 2),
                      skew_points=((4, 32, 512, 1), (8, 32, 256, 2)), spread_points=((8, 6, 32, 256),),
                      repeats=2, warmup=1)
    record = calibrate_kernels(tmp_path, device="cpu", plan=plan, families=("attention", "skew")).kernels
    assert record["attention_layout"] == {"heads": 8}
    assert set(record["attention_points"]["64"]) == {"1", "2"}
    rows = record["attention_points"]["64"]["2"]
    assert [len(row) for row in rows] == [6, 10, 8]  # padded rows, each real row's context..., seconds
    assert rows[2][:7] == [8, 256, 169, 111, 74, 49, 32]  # six real rows spread 256..32 in a graph of eight
    again = refit_attention_width(record)
    assert again["attention_slots"] == record["attention_slots"]
    assert again["attention_sharpness"] == record["attention_sharpness"]


def test_mixed_probe_layers_record_each_real_rows_context_in_the_padded_graph(tmp_path) -> None:
    """One decode layer of a probe shape per point, as ``[probe, padded rows, contexts..., seconds]``."""
    from calibration.kernels import KernelPlan, calibrate_kernels
    from cdbsim.model.arch import LayerShape, LayerStyle

    shape = LayerShape(hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=32, style=LayerStyle.OURO)
    plan = KernelPlan(probes=(shape,), mixed_probe_points=((3, 40, 200), (2, 64, 64)), repeats=2, warmup=1)
    record = calibrate_kernels(tmp_path, device="cpu", plan=plan, families=("mixed_probes",)).kernels
    rows = record["mixed_probes"]
    assert [row[:-1] for row in rows] == [[0, 3, 200, 89, 40], [0, 2, 64, 64]]
    assert all(isinstance(row[-1], float) for row in rows)  # a two-layer less a one-layer step: noisy on a CPU


def test_sustained_family_records_its_replays_and_the_fit_they_give(tmp_path) -> None:
    """A prefill of a probe shape replayed back to back: every replay's start and seconds, the rested pace of
    the first ones, and the onset and slowdown fitted to them (a CPU has no power limit to find)."""
    from calibration.kernels import KernelPlan, calibrate_kernels
    from cdbsim.latency.power import SustainedLoad, fit_replays
    from cdbsim.model.arch import LayerShape, LayerStyle

    shape = LayerShape(hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=32, style=LayerStyle.OURO)
    plan = KernelPlan(probes=(shape,), sustained_probe=0, sustained_tokens=64, sustained_rest_s=0.0,
                      sustained_lead_s=0.02, sustained_s=0.1, repeats=2, warmup=1)
    record = calibrate_kernels(tmp_path, device="cpu", plan=plan, families=("sustained",)).kernels
    entry = record["sustained"]
    starts, replays = zip(*entry["replays"], strict=True)
    assert len(replays) >= 3 and list(starts) == sorted(starts) and min(replays) > 0
    assert entry["probe"] == 0 and entry["tokens"] == 64
    again, _ = fit_replays(replays)
    assert SustainedLoad.from_record(entry) == again


def test_few_gemm_family_records_the_few_row_points_and_the_builds_rule(tmp_path) -> None:
    pytest.importorskip("torch")
    from calibration.kernel_chains import few_gemm_points
    from calibration.kernels import KernelPlan, calibrate_kernels
    from cdbsim.latency.gpu_work import FEW_ROWS_MAX, FEW_ROWS_MAX_HIDDEN

    plan = KernelPlan(gemm_m=(1, 8, 32), gemm_n=(64, 4096), gemm_k=(64, 4096), repeats=2, warmup=1)
    record = calibrate_kernels(tmp_path, device="cpu", plan=plan, families=("few_gemm",)).kernels
    assert record["few_rows"] == {"rows": FEW_ROWS_MAX, "hidden": FEW_ROWS_MAX_HIDDEN}
    measured = {tuple(p[:3]) for p in record["tables"]["few_gemm"]}
    assert measured == set(few_gemm_points(plan))
    assert (32, 64, 64) not in measured and (8, 4096, 4096) not in measured  # past its rows; a wide model's
    assert (8, 4096, 64) in measured and all(p[3] > 0 for p in record["tables"]["few_gemm"])


def test_few_swiglu_family_times_the_gate_up_kernel_and_the_model_reads_it(tmp_path) -> None:
    """The SwiGLU variant is measured at the few-row points whose output is at least twice their input, as
    ``(m, I, h)``; a record with it composes a few-row gate/up projection from it (not from the plain table)."""
    pytest.importorskip("torch")
    from dataclasses import replace

    from calibration.kernel_chains import few_swiglu_points
    from calibration.kernels import KernelPlan, calibrate_kernels
    from cdbsim.latency.kernels import KernelModel
    from cdbsim.model.arch import PRESETS

    plan = KernelPlan(gemm_m=(1, 8), gemm_n=(64, 4096), gemm_k=(64, 2048), repeats=2, warmup=1)
    record = calibrate_kernels(tmp_path, device="cpu", plan=plan, families=("few_gemm", "few_swiglu")).kernels
    measured = {tuple(p[:3]) for p in record["tables"]["few_swiglu"]}
    assert measured == set(few_swiglu_points(plan)) == {(m, 2048, k) for m in (1, 8) for k in (64, 2048)}
    shape = replace(PRESETS["ouro-1.4b"].layer, intermediate=2048)  # its gate/up on the table's grid
    with_swiglu = KernelModel({**record, "tables": {**record["tables"], "few_swiglu": [[m, n, k, 1.0]
                                                                                      for m, n, k in measured]}})
    without = KernelModel({**record, "tables": {k: v for k, v in record["tables"].items() if k != "few_swiglu"}})
    assert with_swiglu.projections(8, shape)[2][1] == pytest.approx(1.0)  # read off the SwiGLU table
    assert without.projections(8, shape)[2][1] < 0.1  # the plain table's (a CPU's microseconds)
    assert [t for _, t in with_swiglu.projections(8, shape)][:2] == [t for _, t in without.projections(8, shape)][:2]


def test_gemv_points_cover_every_chained_layer_and_only_those() -> None:
    """The single-row family measures only what a chained layer launches (models up to 2,048 wide), and
    brackets every such launch of the shipped, probe and unseen shapes in its op's grid."""
    from pathlib import Path

    from calibration.kernel_chains import KernelPlan, gemv_points
    from cdbsim.latency.gpu_work import CHAINED_MAX_HIDDEN
    from cdbsim.latency.kernels import PROBE_SHAPES
    from cdbsim.model.arch import PRESETS, load_arch

    points = gemv_points(KernelPlan())
    grid = {op: ({n for o, n, _ in points if o == op}, {k for o, _, k in points if o == op})
            for op in ("gemv", "rmsnorm", "residual", "swiglu")}
    assert len(points) < 4 * len(KernelPlan().gemv_n) * len(KernelPlan().gemv_k)
    assert all(k <= CHAINED_MAX_HIDDEN for op, _, k in points if op != "gemv")
    assert all(n <= CHAINED_MAX_HIDDEN for op, n, _ in points if op == "gemv")
    archs = [*(a.layer for a in PRESETS.values()), *PROBE_SHAPES,
             *(load_arch(str(p)).layer for p in sorted(Path("calibration/archs").glob("*.json")))]
    narrow = [s for s in archs if s.hidden <= CHAINED_MAX_HIDDEN]
    assert len(narrow) >= 5
    for s in narrow:  # the chained layer's launches (cdbsim.latency.kernels.KernelModel.layer_kernels)
        qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
        for op, n, k in (("residual", qkv, s.hidden), ("gemv", s.hidden, s.heads * s.head_dim),
                         ("swiglu", s.intermediate, s.hidden), ("gemv", s.hidden, s.intermediate)):
            ns, ks = grid[op]
            assert min(ns) <= n <= max(ns) and min(ks) <= k <= max(ks), (s, op, n, k)


@pytest.mark.parametrize("bstar", [0.0, math.inf])
def test_the_profile_plot_draws_an_undefined_saturation_batch(tmp_path, monkeypatch, bstar: float) -> None:
    """A CPU calibration can fit no weight-read floor (B*(L) = 0 at every L) or no per-token cost (B*
    unbounded): the plot is still written (a log axis over such values raised)."""
    from calibration import fit
    from cdbsim.latency.shipped import resolve_profile
    from cdbsim.model.arch import PRESETS

    arch = PRESETS["ouro-1.4b"]
    monkeypatch.setattr(fit.LatencyModel, "saturation_batch", lambda self, context: bstar)
    path = fit.plot_profile(resolve_profile("h200-ouro-1.4b", arch), arch, tmp_path / "p.png")
    assert path.stat().st_size > 0


def test_a_calibration_logged_to_a_file_prints_each_new_step_and_few_repeats(capsys) -> None:
    """Off a terminal (a GPU session's log) progress is a line per change of step, not one per point."""
    from commands.gpu import calibration_progress

    with calibration_progress(every_s=60.0) as progress:
        for message in ("gemm m=1", "gemm m=2", "gemm m=4", "decode_attention rows=1", "decode_attention rows=2"):
            progress(message)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["gemm m=1", "decode_attention rows=1"]
