"""The kernel-level latency model: table lookups, composition for any architecture, other GPUs."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdbsim.latency.devices import H200, device_preset
from cdbsim.latency.kernel_table import KernelTable
from cdbsim.latency.model import LatencyModel
from cdbsim.latency.profile import ProfileKind
from cdbsim.latency.shipped import resolve_profile, shipped_profiles
from cdbsim.model.arch import PRESETS, ArchSpec, LayerShape, LayerStyle
from cdbsim.serving.launch import Stage, decode_launch


def kernel_profile():
    return shipped_profiles()["h200-kernels"]


def test_table_is_exact_on_the_grid_log_linear_between_and_carried_outside() -> None:
    points = [[m, n, 1e-6 * m * n] for m in (1, 4, 16) for n in (10, 1000)]
    table = KernelTable("t", ("m", "n"), points, proxy=lambda q: q[0] * q[1])
    assert table(4, 10) == pytest.approx(4e-5)
    assert table(2, 10) == pytest.approx(math.exp((math.log(1e-5) + math.log(4e-5)) / 2), rel=0.2)
    inside = table.lookup(8, 100)
    assert inside.reach == 1.0 and 4e-4 < inside.seconds < 1.6e-3
    outside = table.lookup(64, 1000)  # 4x beyond the largest m: carried from m = 16 by the proxy
    assert outside.seconds == pytest.approx(table(16, 1000) * 64 / 16)
    assert outside.reach == pytest.approx(65 / 17)


def test_a_capped_dimension_is_read_at_most_at_its_bounds_grid_value() -> None:
    """GQA groups: 8 heads hold at most group 8, so (12 heads, group 12) lies between (8, 8) and (16, 12), inside."""
    points = [[8, 1, 1.0], [8, 8, 2.0], [16, 1, 3.0], [16, 4, 4.0], [16, 16, 8.0]]
    table = KernelTable("t", ("heads", "group"), points, proxy=lambda q: q[0], caps={"group": "heads"})
    between = table.lookup(12, 12)
    assert between.reach == 1.0 and 2.0 < between.seconds < 8.0
    assert table.lookup(8, 16).seconds == 2.0 and table.lookup(8, 16).reach == 1.0
    uncapped = KernelTable("t", ("heads", "group"), points, proxy=lambda q: q[0]).lookup(12, 12)
    assert uncapped.reach > 1.4  # without the cap, 8 heads' grid ends at group 8
    with pytest.raises(ValueError, match="earlier"):
        KernelTable("t", ("group", "heads"), [[1, 8, 1.0]], proxy=lambda q: 1.0, caps={"group": "heads"})


def test_exact_dimensions_must_match() -> None:
    table = KernelTable("t", ("style", "rows"), [[0, 1, 1e-5], [0, 8, 2e-5]], proxy=lambda q: q[1],
                        exact=frozenset({"style"}))
    with pytest.raises(KeyError, match="no style = 1"):
        table(1, 4)


shapes = st.builds(
    lambda style, width, ratio, group, d, layers, vocab: ArchSpec(
        name="random", layer=LayerShape(hidden=width, intermediate=int(width * ratio) // 64 * 64,
                                        heads=max(group, width // d // group * group),
                                        kv_heads=max(1, width // d // group), head_dim=d, style=style),
        vocab=vocab, prelude=1 if style is LayerStyle.HUGINN else 0, core=layers,
        coda=1 if style is LayerStyle.HUGINN else 0, r_max=4),
    st.sampled_from(list(LayerStyle)), st.sampled_from([1024, 1536, 2048, 3072, 4096, 6144, 8192]),
    st.floats(2.5, 3.5), st.sampled_from([1, 2, 4, 8]), st.sampled_from([64, 96, 128]), st.integers(2, 8),
    st.sampled_from([32000, 65536, 151936]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=shapes)
def test_random_shapes_get_positive_times_non_decreasing_in_batch_and_context(arch: ArchSpec) -> None:
    model = LatencyModel(arch, kernel_profile())
    assert model.profile.kind is ProfileKind.KERNELS and "composed for" in model.profile.label()
    for stage in (Stage.PRELUDE, Stage.CORE, Stage.CODA, Stage.DECODE):
        for length in (32, 512, 4096):
            times = [model.launch_time(decode_launch(stage, list(range(b)), [length - 1] * b, [[0]] * b, b))
                     for b in (1, 2, 8, 32, 128, 512)]
            assert all(math.isfinite(t) and t > 0 for t in times)
            assert all(b >= 0.97 * a for a, b in itertools.pairwise(times)), (stage, length, times)
        by_length = [model.launch_time(decode_launch(stage, list(range(16)), [n - 1] * 16, [[0]] * 16, 16))
                     for n in (32, 128, 512, 2048, 8192)]
        assert all(b >= 0.97 * a for a, b in itertools.pairwise(by_length)), (stage, by_length)


def test_a_shape_far_outside_the_grid_says_so() -> None:
    huge = ArchSpec(name="huge", layer=LayerShape(hidden=32768, intermediate=131072, heads=256, kv_heads=256,
                                                  head_dim=128), vocab=65536, prelude=0, core=2, coda=0, r_max=2)
    model = LatencyModel(huge, kernel_profile())
    assert model.warnings and "outside the calibrated grid" in model.warnings[0]
    assert "outside the kernel grid" in model.profile.label()


def test_auto_prefers_the_model_then_its_layer_shape_then_kernels() -> None:
    from cdbsim.model.arch import PRESETS

    assert resolve_profile("auto", PRESETS["ouro-1.4b"]).kind is ProfileKind.MEASURED
    assert resolve_profile("auto", PRESETS["huginn-3.5b"].with_split("0-4-0")).kind is ProfileKind.MEASURED
    unseen = ArchSpec(name="u", layer=LayerShape(2560, 6912, 20, 10, 128), vocab=32000, prelude=0, core=8, coda=0,
                      r_max=8)
    assert resolve_profile("auto", unseen).kind is ProfileKind.KERNELS



def test_auto_picks_the_profiles_of_the_chosen_gpu_and_carries_the_h200s_elsewhere() -> None:
    arch = PRESETS["ouro-1.4b"]
    assert resolve_profile("auto", arch).name == "h200-ouro-1.4b"
    assert resolve_profile("auto", arch, device_preset("h100-sxm")).name == "h100-ouro-1.4b"
    assert "not validated" not in resolve_profile("auto", arch, device_preset("h100-sxm")).label()
    on_b200 = resolve_profile("auto", arch, device_preset("b200"))
    assert on_b200.name == "h200-ouro-1.4b" and on_b200.device["name"] == "NVIDIA B200"
    assert "carried from the NVIDIA H200" in on_b200.label() and "not validated" in on_b200.label()
    unseen = ArchSpec(name="u", layer=LayerShape(2560, 6912, 20, 10, 128), vocab=32000, prelude=0, core=8, coda=0,
                      r_max=8)
    assert resolve_profile("auto", unseen, device_preset("h100-sxm")).name == "h100-kernels"
    # a what-if on the measured GPU carries its own profile
    assert "carried" in resolve_profile("auto", arch, replace(H200, bandwidth=1e12)).label()


@pytest.mark.parametrize("name", ["ouro-1.4b", "huginn-3.5b"])
def test_the_h200_profile_carried_to_the_h100_lands_near_the_h100_measurement(name: str) -> None:
    """Carried by the H200's kernels, the H200's measured core step comes within 7% of the H100's own."""
    arch, h100 = PRESETS[name], device_preset("h100-sxm")
    carried = LatencyModel(arch, resolve_profile(f"h200-{name}", arch, h100))
    measured = LatencyModel(arch, resolve_profile(f"h100-{name}", arch, h100))
    for rows, length in ((1, 128), (8, 512), (64, 512), (32, 2048)):
        launch = decode_launch(Stage.CORE, list(range(rows)), [length - 1] * rows, [[0]] * rows, rows)
        assert carried.launch_time(launch) == pytest.approx(measured.launch_time(launch), rel=0.07)


def test_device_presets_order_memory_bound_decode_by_bandwidth() -> None:
    from cdbsim.model.arch import PRESETS

    arch = PRESETS["ouro-1.4b"]
    launch = decode_launch(Stage.CORE, list(range(8)), [511] * 8, [[0]] * 8, 8)
    times = {name: LatencyModel(arch, resolve_profile("h200-kernels", arch,
                                                      device_preset(name) if name != "h200" else H200)
                                ).launch_time(launch)
             for name in ("a100-80gb", "h100-sxm", "h200", "b200")}
    assert times["a100-80gb"] > times["h100-sxm"] > times["h200"] > times["b200"]
    # mostly weight reads: slower by up to the bandwidth ratio, less the launch and latency that do not scale
    assert 1.1 < times["h100-sxm"] / times["h200"] < 4.8 / 3.35


def test_one_slow_small_batch_is_averaged_not_carried_to_every_larger_batch(monkeypatch) -> None:
    """A kernel that measured slow at one row (cuBLAS picks another kernel there) must not set the time of
    every larger batch: the composed times over the batches are made non-decreasing by isotonic regression,
    not by a running maximum."""
    from cdbsim.latency.kernels import KernelModel
    from cdbsim.latency.recipes import Component

    arch = ArchSpec(name="wide", layer=LayerShape(hidden=5120, intermediate=13824, heads=40, kv_heads=8,
                                                 head_dim=128, style=LayerStyle.OURO),
                    vocab=32000, prelude=0, core=4, coda=0, r_max=4)
    model = KernelModel(kernel_profile().kernels)
    # one slow point at B = 1 (120 us), then a flat 100 us that grows from B = 64 on
    monkeypatch.setattr(KernelModel, "layer", lambda self, a, rows, length: 1.2e-4 if rows == 1
                        else 1e-4 * max(1.0, rows / 64))
    points = {(int(b), round(c / b)): t for b, c, t in model.components(arch)[Component.LAYER.key(arch)].points}
    times = [points[(b, 512)] for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    assert all(a <= b for a, b in itertools.pairwise(times))
    assert 1e-4 < times[0] < 1.2e-4 and times[4] < 1.1e-4   # averaged with its neighbours
    assert times[-1] == pytest.approx(2e-4)                 # the larger batches keep their own times


def _probe_record(share: float, per_kernel: float) -> dict:
    """The shipped kernel record with its probe layers replaced by layers that take exactly their kernels'
    tables, ``share`` more of their GEMMs' and ``per_kernel`` seconds per kernel (many-row path)."""
    from cdbsim.latency.kernels import MANY_KERNELS, PROBE_SHAPES, KernelModel

    record = dict(kernel_profile().kernels)
    model = KernelModel({**record, "gaps": {}})
    probes = []
    for index, shape in enumerate(PROBE_SHAPES):
        arch = ArchSpec(name="probe", layer=shape, vocab=4096, prelude=0, core=1, coda=0, r_max=1)
        for rows, length in itertools.product((1, 2, 16, 128), (128, 2048)):
            kernels, path = model.layer_kernels(arch, rows, float(length))
            gemm = sum(t for name, t in kernels if name == "gemm")
            # the many-row gap is per layer (MANY_KERNELS of them, whether the SwiGLU has its own kernel or not)
            extra = share * gemm + per_kernel * MANY_KERNELS if path == "many" else 1e-7 * len(kernels)
            probes.append([index, rows, length, sum(t for _, t in kernels) + extra])
    return {**record, "probes": probes}


def test_layer_gaps_recover_a_share_of_the_gemms_and_a_time_per_kernel() -> None:
    from calibration.fit import fit_gaps

    gaps = fit_gaps(_probe_record(share=-0.08, per_kernel=0.7e-6))
    for style in ("ouro", "huginn"):
        assert gaps[style]["many_gemm"] == pytest.approx(-0.08, abs=1e-3)
        assert gaps[style]["many"] == pytest.approx(0.7e-6, rel=1e-2)
        assert set(gaps[style]) == {"many", "many_gemm"}  # the probes on the early-launch paths are not fitted


def test_layers_on_the_early_launch_paths_take_their_kernels_sum_and_cublas_layers_add_the_gap() -> None:
    """Chained and few-row layers (every kernel launched early, as in the chains that timed it) are the sum of their
    kernels' tables whatever the gaps; a cuBLAS layer adds the gap per kernel and the GEMM share."""
    from cdbsim.latency.kernels import MANY_KERNELS, KernelModel

    gaps = {style: {"many": 1e-6, "many_gemm": 0.1} for style in ("ouro", "huginn")}
    model = KernelModel({**kernel_profile().kernels, "gaps": gaps})
    narrow = ArchSpec(name="n", layer=PRESETS["ouro-1.4b"].layer, vocab=4096, prelude=0, core=1, coda=0, r_max=1)
    paths = {}
    for rows in (1, 8, 64):
        kernels, path = model.layer_kernels(narrow, rows, 512.0)
        total, gemm = sum(t for _, t in kernels), sum(t for n, t in kernels if n == "gemm")
        paths[rows] = path
        expected = total if path in ("chained", "few") else total + 0.1 * gemm + MANY_KERNELS * 1e-6
        assert model.layer(narrow, rows, 512.0) == pytest.approx(expected)
    assert paths == {1: "chained", 8: "few", 64: "many"}


def test_a_few_probe_layers_far_off_do_not_move_the_gap_fit() -> None:
    from calibration.fit import fit_gaps

    record = _probe_record(share=-0.08, per_kernel=0.7e-6)
    record["probes"][-1][3] *= 1.5  # one long-context layer whose attention is far off, as measured once
    record["probes"][-3][3] *= 1.3
    gaps = fit_gaps(record)  # (least squares would fit a share of +0.56 and a negative gap here)
    assert gaps["huginn"]["many_gemm"] == pytest.approx(-0.08, abs=1e-2)
    assert gaps["huginn"]["many"] == pytest.approx(0.7e-6, rel=0.1)


@pytest.mark.parametrize("sharpness", [1.0, 3.0])
def test_mixed_probe_layers_choose_the_sharpness_they_were_made_with(sharpness: float) -> None:
    """Probe layers built to take what the rule says at one sharpness (and each layout's width fitted at
    it) are fitted back to that sharpness, every layer then exact."""
    from calibration.fit import fit_mixed_sharpness, refit_attention_width
    from cdbsim.latency.gpu_work import equivalent_length, least_splits
    from cdbsim.latency.kernels import PROBE_SHAPES, KernelModel

    record = {k: v for k, v in kernel_profile().kernels.items() if k != "probes"}  # no layer error to take out
    model = KernelModel({**record, **refit_attention_width(record, (sharpness,))})
    probes = []
    for index, shape in enumerate(PROBE_SHAPES):
        arch = ArchSpec(name="probe", layer=shape, vocab=4096, prelude=0, core=1, coda=0, r_max=1)
        for padded, contexts in ((4, [6000, 2000, 700, 300]), (16, [4000, 3000] + [500] * 14),
                                 (24, [6000] + [900] * 16)):
            length = equivalent_length(sum(contexts) / len(contexts), max(contexts), len(contexts), padded,
                                       shape.heads, least_splits(shape.head_dim), model.attention_slots(arch),
                                       sharpness)
            probes.append([index, padded, *contexts, model.layer(arch, padded, length)])
    fitted = fit_mixed_sharpness({**record, "mixed_probes": probes})
    assert fitted["attention_mixed_probes"]["sharpness"] == sharpness
    assert fitted["attention_mixed_probes"]["width_scale"] == 1.0
    assert max(map(abs, fitted["attention_mixed_probes"]["error_pct"])) < 1e-6
    assert set(fitted["attention_sharpness"]["64"].values()) == {sharpness}


SMALL_OURO = ArchSpec(name="small-ouro", layer=LayerShape(hidden=1536, intermediate=4096, heads=24, kv_heads=6,
                                                          head_dim=64, style=LayerStyle.OURO),
                      vocab=49152, prelude=0, core=4, coda=0, r_max=4)


def test_the_gemm_share_changes_many_row_layers_only() -> None:
    from cdbsim.latency.kernels import KernelModel

    record = kernel_profile().kernels
    base = KernelModel({**record, "gaps": {"ouro": {"many": 0.0}}})
    less = KernelModel({**record, "gaps": {"ouro": {"many": 0.0, "many_gemm": -0.1}}})
    arch = SMALL_OURO
    kernels, path = base.layer_kernels(arch, 64, 512.0)
    gemm = sum(t for name, t in kernels if name == "gemm")
    assert path == "many" and less.layer(arch, 64, 512.0) == pytest.approx(base.layer(arch, 64, 512.0) - 0.1 * gemm)
    for rows in (1, 8):  # the chained and few-row paths
        assert less.layer(arch, rows, 512.0) == pytest.approx(base.layer(arch, rows, 512.0))


def test_refitting_a_kernel_profile_refits_its_gaps_and_keeps_its_tables(tmp_path) -> None:
    from dataclasses import replace

    from calibration.fit import refit_profile
    from cdbsim.errors import ConfigError

    profile = replace(kernel_profile(), kernels=_probe_record(share=-0.05, per_kernel=0.4e-6))
    refitted = refit_profile(profile)
    assert refitted.kernels["tables"] is profile.kernels["tables"]
    assert refitted.kernels["gaps"]["ouro"]["many_gemm"] == pytest.approx(-0.05, abs=1e-3)
    no_probes = replace(profile, kernels={k: v for k, v in profile.kernels.items() if k != "probes"})
    with pytest.raises(ConfigError, match="probes"):
        refit_profile(no_probes)


def test_attention_width_by_head_size_and_group_is_log_interpolated() -> None:
    from cdbsim.latency.kernels import KernelModel

    record = {**kernel_profile().kernels, "attention_slots": {"64": {"1": 1000.0, "4": 4000.0}, "128": 500.0},
              "attention_sharpness": {"64": {"1": 1.0, "4": 3.0}}}
    model = KernelModel(record)

    def arch(d: int, kv_heads: int) -> ArchSpec:
        return ArchSpec(name="a", layer=LayerShape(hidden=32 * d, intermediate=4096, heads=32, kv_heads=kv_heads,
                                                   head_dim=d, style=LayerStyle.OURO), vocab=32000, prelude=0,
                        core=4, coda=0, r_max=4)

    assert model.attention_slots(arch(64, 32)) == pytest.approx(1000.0)
    assert model.attention_slots(arch(64, 16)) == pytest.approx(2000.0)  # group 2: between, in log group
    assert model.attention_slots(arch(64, 4)) == pytest.approx(4000.0)  # group 8: the nearest measured
    assert model.attention_slots(arch(128, 8)) == pytest.approx(500.0)  # one number for every group
    w = math.log(96 / 64) / math.log(2)  # head size 96 between 64 and 128, in log size
    assert model.attention_slots(arch(96, 32)) == pytest.approx(1000.0 ** (1 - w) * 500.0 ** w)
    assert model.attention_sharpness(arch(64, 16)) in (1.0, 3.0) and model.attention_sharpness(arch(64, 4)) == 3.0


def test_a_profile_composes_the_few_row_matmul_only_if_it_measured_it() -> None:
    """A profile with a ``few_gemm`` table and the build's rule composes few-row launches of narrow models from
    that table without the SwiGLU kernel; one measured before the kernel existed (the shipped one without them)
    and wide models compose cuBLAS GEMMs and the SwiGLU kernel, as their build ran them."""
    from cdbsim.latency.kernels import KernelModel

    shipped = kernel_profile().kernels
    record = {**{k: v for k, v in shipped.items() if k != "few_rows"},
              "tables": {k: v for k, v in shipped["tables"].items() if k not in ("few_gemm", "few_swiglu")}}
    gemm = record["tables"]["gemm"]
    few = {**record, "tables": {**record["tables"], "few_gemm": [[m, n, k, 0.5 * t] for m, n, k, t in gemm]},
           "few_rows": {"rows": 16, "hidden": 2048}}
    narrow = ArchSpec(name="n", layer=PRESETS["ouro-1.4b"].layer, vocab=4096, prelude=0, core=1, coda=0, r_max=1)
    wide = PRESETS["huginn-3.5b"]
    old, new = KernelModel(record), KernelModel(few)
    for model, arch, rows, few_path in ((old, narrow, 8, False), (new, narrow, 8, True), (new, narrow, 32, False),
                                        (new, wide, 8, False)):
        kernels, path = model.layer_kernels(arch, rows, 512.0)
        names = [name for name, _ in kernels]
        assert path == ("few" if few_path else "many") and names.count("gemm") == 4
        assert ("silu_mul" in names) != few_path, (arch.name, rows)
    halved = sum(t for n, t in new.layer_kernels(narrow, 8, 512.0)[0] if n == "gemm")
    assert halved == pytest.approx(0.5 * sum(t for n, t in old.layer_kernels(narrow, 8, 512.0)[0] if n == "gemm"))
    # a few_swiglu table, where the profile has one, prices the gate/up projection in place of the plain table
    swiglu = KernelModel({**few, "tables": {**few["tables"], "few_swiglu": [
        [m, n // 2, k, 1e-3] for m, n, k, _ in few["tables"]["few_gemm"] if n >= 2 * k and n % 2 == 0]}})
    gemms = sorted(t for n, t in swiglu.layer_kernels(narrow, 8, 512.0)[0] if n == "gemm")
    assert gemms[-1] == pytest.approx(1e-3) and gemms[-2] < 1e-4


def test_a_profile_chains_two_rows_only_if_it_measured_them() -> None:
    """A kernel profile whose ``gemv`` table predates its ``rows`` dimension (four columns, no ``chained_rows``
    rule: the shipped one until it is re-measured) composes two-row layers of a narrow model as its build ran
    them, on the many-row kernels; one with the rule and two-row points chains them, from those points."""
    from cdbsim.latency.kernels import GEMV_OPS, KernelModel

    shipped = kernel_profile().kernels
    legacy_gemv = [[op, n, k, t] for op, rows, n, k, t in
                   (row if len(row) == 5 else [row[0], 1.0, *row[1:]] for row in shipped["tables"]["gemv"])
                   if rows == 1]
    legacy = {**{k: v for k, v in shipped.items() if k != "chained_rows"},
              "tables": {**shipped["tables"], "gemv": legacy_gemv}}
    two = [[op, 2.0, n, k, 3 * t] for op, n, k, t in legacy_gemv]
    current = {**legacy, "tables": {**legacy["tables"], "gemv": [[op, 1.0, n, k, t] for op, n, k, t in legacy_gemv]
                                    + two}, "chained_rows": {"rows": 2, "hidden": 2048}}
    narrow = ArchSpec(name="n", layer=PRESETS["ouro-1.4b"].layer, vocab=4096, prelude=0, core=1, coda=0, r_max=1)
    old, new = KernelModel(legacy), KernelModel(current)
    assert old.layer_kernels(narrow, 1, 512.0)[1] == new.layer_kernels(narrow, 1, 512.0)[1] == "chained"
    assert old.layer_kernels(narrow, 2, 512.0)[1] == "few" and new.layer_kernels(narrow, 2, 512.0)[1] == "chained"
    assert new.layer_kernels(narrow, 4, 512.0)[1] == "few"
    assert new.layer_kernels(PRESETS["huginn-3.5b"], 2, 512.0)[1] == "many"
    s = narrow.layer
    one = new.time("gemv", GEMV_OPS["gemv"], 1, s.hidden, s.intermediate)
    assert new.time("gemv", GEMV_OPS["gemv"], 2, s.hidden, s.intermediate) == pytest.approx(3 * one)
    assert old.time("gemv", GEMV_OPS["gemv"], 1, s.hidden, s.intermediate) == pytest.approx(one)


def design_box() -> list[ArchSpec]:
    """The corners of the shapes people build: width 1,024 and 8,192, every head size of the grid, both layer
    styles, MHA with a 32k vocabulary and GQA 16:1 with a 262k one, MLP at 4x."""
    shapes = []
    for hidden, d, style in itertools.product((1024, 8192), (64, 80, 96, 128, 256), LayerStyle):
        heads = min(max(hidden // d, 8), 64)
        for group, vocab in ((1, 32000), (min(16, heads), 262144)):
            layer = LayerShape(hidden=hidden, intermediate=4 * hidden, heads=heads, kv_heads=heads // group,
                               head_dim=d, style=style)
            shapes.append(ArchSpec(name=f"box-{hidden}-d{d}-g{group}-{style}", layer=layer, vocab=vocab, prelude=1,
                                   core=4, coda=1, r_max=4))
    return shapes


@pytest.mark.parametrize("name", ["h100-kernels"])
def test_the_shipped_kernel_grid_holds_every_shape_of_the_design_box(name: str) -> None:
    """No corner of the design box is composed from outside the measured grid (no carrying by roofline)."""
    from cdbsim.latency.kernels import compose_profile

    profile = shipped_profiles()[name]
    outside = {arch.name: warnings for arch in design_box() if (warnings := compose_profile(profile, arch)[1])}
    assert not outside, f"{len(outside)} of {len(design_box())} shapes outside: {next(iter(outside.values()))}"



def test_the_design_box_check_fails_on_a_grid_without_the_widest_heads() -> None:
    """The check above is not vacuous: with the head size 256 rows taken out of the grid, those shapes are outside."""
    from cdbsim.latency.kernels import TABLE_DIMS, compose_profile

    profile = shipped_profiles()["h100-kernels"]
    tables = {name: [row for row in rows if "head_dim" not in TABLE_DIMS[name]
                     or row[TABLE_DIMS[name].index("head_dim")] < 256]
              for name, rows in profile.kernels["tables"].items()}
    narrower = replace(profile, kernels={**profile.kernels, "tables": tables})
    outside = {arch.name for arch in design_box() if compose_profile(narrower, arch)[1]}
    assert outside == {arch.name for arch in design_box() if arch.layer.head_dim == 256}
