"""The decode-attention work split shared by the executor and the latency model, and the mixed-context
correction built on it: rules, bounds, and that calibration's fit recovers a known attention width."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from calibration.fit import fit_attention_slots
from cdbsim.latency.gpu_work import (
    CHAINED_BLOCK,
    MAX_SPLITS,
    MIN_PROGRAMS,
    TARGET_PROGRAMS,
    TARGET_SPLITS,
    chained_walk_length,
    critical_positions,
    decode_splits,
    equivalent_length,
    first_context_reaching,
    head_parts,
    least_splits,
    padded_mean,
    split_positions,
)
from cdbsim.latency.model import LatencyModel
from cdbsim.latency.profile import Fit
from cdbsim.latency.shipped import resolve_profile
from cdbsim.model.arch import PRESETS
from cdbsim.serving.launch import Launch, Stage


@given(st.integers(1, 4096), st.integers(1, 128), st.integers(1, 256))
def test_splits_never_overshoot_the_program_target(rows: int, heads: int, head_dim: int) -> None:
    splits = decode_splits(rows, heads, head_dim)
    least = least_splits(head_dim)
    assert least <= splits <= MAX_SPLITS
    assert splits == least or rows * heads * splits <= TARGET_PROGRAMS
    assert decode_splits(rows + 1, heads, head_dim) <= splits  # more rows never get more splits


def test_no_batch_starts_more_programs_than_a_larger_one_at_the_target() -> None:
    """The old power-of-two rule gave 248 rows x 16 heads 4 splits (15,872 programs) and 256 rows 2."""
    assert decode_splits(248, 16, 128) == 2 and decode_splits(256, 16, 128) == 2
    assert decode_splits(64, 16, 128) == 8  # the B = 64, L = 4096 attention benchmark's eight splits


def test_a_launch_of_few_programs_gets_more_splits() -> None:
    """One Ouro row (16 heads) gets 32 splits, 512 programs (its core step 11% faster at L = 4,096 on the H200);
    two rows keep 16, the most the program target gives, and nothing exceeds MAX_SPLITS."""
    assert decode_splits(1, 16, 128) == MAX_SPLITS == 32
    assert decode_splits(2, 16, 128) == TARGET_SPLITS == 16
    assert decode_splits(1, 17, 128) == 31 and decode_splits(1, 31, 128) == 17  # ceil(512 / pairs)
    assert decode_splits(1, 55, 96) == TARGET_SPLITS  # Huginn's one row: 880 programs already
    assert all(decode_splits(1, heads, 128) * heads >= MIN_PROGRAMS for heads in range(16, 128))


def test_heads_loaded_in_two_parts_keep_two_splits_at_many_rows() -> None:
    """Huginn-3.5B's 55 x 96 heads: one split from 75 rows under the rows x heads rule alone, two now (its
    core step 5-7% faster at 128-256 rows on the H200); Ouro's 16 x 128 heads keep one past 512 rows."""
    assert head_parts(96) == (64, 32) and head_parts(128) == (128, 0) and head_parts(112) == (128, 0)
    assert head_parts(64) == (64, 0) and head_parts(80) == (64, 16) and head_parts(1) == (1, 0)
    assert [decode_splits(rows, 55, 96) for rows in (64, 75, 128, 512)] == [2, 2, 2, 2]
    assert decode_splits(8, 55, 96) == TARGET_SPLITS
    assert decode_splits(513, 16, 128) == 1 and decode_splits(513, 16, 112) == 1


@given(st.integers(1, 20000), st.integers(1, MAX_SPLITS))
def test_splits_cover_the_context(context: int, splits: int) -> None:
    per = split_positions(context, splits)
    assert per % 16 == 0 and per >= 64
    assert context <= splits * per
    assert critical_positions(context, splits) == min(context, per)


def _equivalent(contexts: list[int], padded: int, heads: int, slots: float, head_dim: int = 128) -> float:
    return equivalent_length(sum(contexts) / len(contexts), max(contexts), len(contexts), padded, heads,
                             least_splits(head_dim), slots)


def test_equivalent_length_lies_between_mean_and_longest() -> None:
    assert _equivalent([300] * 8, 8, 16, 2000.0) == 300
    few = _equivalent([571, 6400], 2, 16, 2112.0)  # one wave: the long row sets the time
    assert 6000 < few <= 6400
    many = _equivalent([100] * 128 + [300] * 128, 256, 16, 2112.0)  # many waves: the total sets it
    assert many == pytest.approx(200)
    # ... unless one row's program outlasts them all: 4,000 positions over 2 splits walk 2,000 each
    assert 900 < _equivalent([100] * 255 + [4000], 256, 16, 2112.0) < 4000
    wide = _equivalent([128] * 15 + [4096], 16, 16, 1e9)  # unbounded width: the critical path only
    assert wide > _equivalent([128] * 15 + [4096], 16, 16, 512.0)


@given(st.lists(st.integers(1, 20000), min_size=1, max_size=64), st.floats(16, 1e6))
def test_equivalent_length_is_bounded_by_mean_and_longest(contexts: list[int], slots: float) -> None:
    mean = sum(contexts) / len(contexts)
    length = _equivalent(contexts, len(contexts), 16, slots)
    assert mean - 1e-9 <= length <= max(contexts)


@given(st.floats(1, 20000), st.integers(1, 20000), st.integers(1, 512), st.sampled_from([1, 7, 16, 64, 256]),
       st.integers(1, 64), st.sampled_from([64, 96, 128]), st.floats(16, 1e6))
def test_equivalent_length_equals_its_definition_by_the_named_helpers(mean: float, longest: int, rows: int,
                                                                      padded: int, heads: int, head_dim: int,
                                                                      slots: float) -> None:
    """equivalent_length writes decode_splits and critical_positions out in place for speed; it must return
    exactly what composing the helpers returns (padded rows folded in first)."""
    if padded > rows:
        mean, rows = padded_mean(mean * rows, rows, padded), padded
    if rows <= 0 or longest <= mean * 1.0001:
        expected = float(mean)
    else:
        splits = decode_splits(padded, heads, head_dim)
        per_position = heads * rows / slots
        target = max(critical_positions(longest, splits), per_position * mean)
        if max(critical_positions(math.ceil(mean), splits), per_position * mean) >= target:
            expected = float(mean)
        else:
            length = min(target / per_position, float(first_context_reaching(target, splits)))
            expected = min(max(length, float(mean)), float(longest))
    assert equivalent_length(mean, longest, rows, padded, heads, least_splits(head_dim), slots) == expected


@given(st.integers(1, 40000), st.integers(1, 128))
def test_a_single_row_is_read_at_the_length_of_its_whole_tiles(context: int, heads: int) -> None:
    """One row on the chained path costs what its longest split's walk in whole tiles costs: the length
    returned walks as many tiles, is never shorter, and is the context itself where one tile is all."""
    splits = decode_splits(1, heads, 128)
    walked = chained_walk_length(context, heads, least_splits(128))
    per = split_positions(context, splits)
    assert walked >= context
    if per <= CHAINED_BLOCK:
        assert walked == context
    else:
        tiles = -(-per // CHAINED_BLOCK)
        assert walked == splits * CHAINED_BLOCK * tiles
        assert -(-split_positions(int(walked), splits) // CHAINED_BLOCK) == tiles
    assert chained_walk_length(context + 1, heads, least_splits(128)) >= walked  # never shorter for a longer row


def test_a_single_row_costs_the_same_within_one_tile_step() -> None:
    """A tile step is splits x 64 positions (ouro-1536 over 16 splits replayed 134 and 138 us of attention at 2,560
    and 3,072 positions, both three tiles a split, and 102 at 2,048); one Ouro-1.4B row has 32 splits, 2,048
    positions a step."""
    arch = PRESETS["ouro-1.4b"]  # 2,048 wide: its single rows run the chained kernels
    model = LatencyModel(arch, resolve_profile("h200-ouro-1.4b", arch))
    tile_step = decode_splits(1, arch.layer.heads, arch.layer.head_dim) * 64
    assert tile_step == 2048

    def step(context: int) -> float:
        return model.launch_time(Launch(0, Stage.CORE, requests=[0], positions=[context - 1], size=1, padded=1,
                                        context=context, longest=context, steps=[0], exits=[False]))

    assert step(tile_step + 1) == step(tile_step + 1000) == step(2 * tile_step) > step(tile_step)
    assert step(2 * tile_step + 1) > step(2 * tile_step)


def test_padded_rows_count_as_rows_of_one_position() -> None:
    """17 real rows at 2,500 positions in a graph of 24: the seven padded rows attend one position each."""
    assert padded_mean(17 * 2500, 17, 24) == pytest.approx((17 * 2500 + 7) / 24)
    assert padded_mean(17 * 2500, 17, 17) == 2500
    uniform = _equivalent([2500] * 17, 24, 32, 2048.0)
    assert padded_mean(17 * 2500, 17, 24) <= uniform < 2500  # the real rows' programs still set the walk
    assert _equivalent([2500] * 24, 24, 32, 2048.0) == 2500


@given(st.floats(0.5, 20000), st.integers(1, MAX_SPLITS))
def test_first_context_reaching_is_the_shortest(positions: float, splits: int) -> None:
    n = first_context_reaching(positions, splits)
    assert critical_positions(n, splits) >= positions
    assert n == 1 or critical_positions(n - 1, splits) < positions


@given(st.lists(st.integers(1, 20000), min_size=2, max_size=64), st.floats(16, 1e6))
def test_equivalent_length_is_where_the_uniform_batch_first_takes_as_long(contexts: list[int], slots: float) -> None:
    """The closed form against its definition: at the returned length a uniform batch's attention (the
    longer of the critical path and the spread work) reaches the mixed batch's, and a token shorter it
    does not (unless that is below the mean)."""
    rows, heads = len(contexts), 16
    mean, longest = sum(contexts) / rows, max(contexts)
    splits = decode_splits(rows, heads, 128)
    per_position = heads * rows / slots

    def time_at(length: float) -> float:
        return max(critical_positions(math.ceil(length), splits), per_position * length)

    target = max(critical_positions(longest, splits), per_position * mean)
    length = _equivalent(contexts, rows, heads, slots)
    if length > mean:
        assert time_at(length) >= target * (1 - 1e-9)
        assert length - 1 < mean or time_at(length - 1) < target


@given(st.lists(st.integers(1, 20000), min_size=2, max_size=160), st.floats(16, 1e6),
       st.sampled_from([1.0, 1.5, 2.0, 3.0, 8.0]), st.sampled_from([1, 16, 55]), st.sampled_from([96, 128]))
@example([2, 2, 325, 80], 597782.0, 3.0, 1, 128)  # a spread far below the critical path: once lost to rounding
def test_blended_length_is_where_the_uniform_batch_first_does_as_much_work(contexts: list[int], slots: float,
                                                                          sharpness: float, heads: int,
                                                                          head_dim: int) -> None:
    """With a finite sharpness the spread work and the critical path combine as a p-norm: at the returned
    length a uniform batch's combined work reaches the mixed batch's, and a token shorter it does not
    (unless that is below the mean, or the length sits on a page boundary where the work jumps)."""
    rows = len(contexts)
    mean, longest = sum(contexts) / rows, max(contexts)
    splits = decode_splits(rows, heads, head_dim)
    per_position = heads * rows / slots

    def work(spread: float, critical: float) -> float:
        return (spread ** sharpness + critical ** sharpness) ** (1 / sharpness)

    def work_at(length: float) -> float:
        return work(per_position * length, min(length, split_positions(math.ceil(length), splits)))

    target = work(per_position * mean, critical_positions(longest, splits))
    length = equivalent_length(mean, longest, rows, rows, heads, least_splits(head_dim), slots, sharpness)
    assert mean - 1e-9 <= length <= longest
    if mean < length < longest:
        on_boundary = length % (splits * 16) == 0  # the work jumps just past it: reached there
        assert work_at(length + 1 if on_boundary else length) >= target * (1 - 1e-6)
        assert length - 1 < mean or on_boundary or work_at(length - 1) < target


def test_a_sharper_blend_approaches_the_larger_bound() -> None:
    contexts = [2300] * 10 + [6800] * 3 + [900] * 2  # a ShareGPT-like core step of 15 rows at W = 16
    mean, longest = sum(contexts) / 15, max(contexts)
    lengths = [equivalent_length(mean, longest, 15, 16, 16, 1, 790.0, p) for p in (1.0, 2.0, 8.0, 64.0)]
    assert lengths == sorted(lengths, reverse=True)  # the p-norm shrinks toward the max as p grows
    assert lengths[-1] == pytest.approx(equivalent_length(mean, longest, 15, 16, 16, 1, 790.0), rel=0.02)
    assert lengths[0] > 1.1 * mean  # where spread and critical path are close, the blend exceeds the mean


def _synthetic_core(slots: float, heads: int = 16, sharpness: float = math.inf) -> tuple[Fit, list[list[float]]]:
    """A core stage whose attention costs c x (critical path, H x sum(L) / slots) combined as a p-norm
    (infinite: the larger), on a dense grid."""

    def t(rows: int, contexts: list[int]) -> float:
        splits = decode_splits(rows, heads, 128)
        bounds = np.array([max(critical_positions(c, splits) for c in contexts), heads * sum(contexts) / slots])
        work = bounds.max() if sharpness == math.inf else float((bounds ** sharpness).sum() ** (1 / sharpness))
        return 1e-3 + 2e-6 * rows + 4e-7 * work

    points = [[b, b * c, t(b, [c] * b)] for b in (2, 4, 8, 16, 32, 64) for c in range(64, 4097, 64)]
    skew = []
    for b, short, long, n in ((2, 256, 4096, 1), (4, 256, 4096, 1), (8, 128, 4096, 1), (16, 128, 4096, 1),
                              (16, 512, 4096, 4), (32, 128, 2048, 1), (64, 64, 1024, 8)):
        contexts = [long] * n + [short] * (b - n)
        skew.append([b, *contexts, t(b, contexts)])
    return Fit(delta=1e-3, points=points), skew


@pytest.mark.parametrize("slots", [512.0, 2048.0, 8192.0])
def test_calibration_recovers_the_attention_width(slots: float) -> None:
    core, skew = _synthetic_core(slots)
    fitted = fit_attention_slots(PRESETS["ouro-1.4b"], core, skew)
    if slots < 8192:  # wider than that, every skewed point is bound by its critical path: any width fits
        assert fitted["slots"] == pytest.approx(slots, rel=0.2)
    assert np.max(np.abs(fitted["error_with_slots_pct"])) < np.max(np.abs(fitted["error_with_mean_length_pct"]))
    assert np.max(np.abs(fitted["error_with_slots_pct"])) < 3


@pytest.mark.parametrize("sharpness", [1.5, 2.0, 4.0])
def test_calibration_recovers_the_sharpness(sharpness: float) -> None:
    core, skew = _synthetic_core(1024.0, sharpness=sharpness)
    fitted = fit_attention_slots(PRESETS["ouro-1.4b"], core, skew)
    assert fitted["sharpness"] == sharpness
    assert fitted["slots"] == pytest.approx(1024.0, rel=0.2)
    assert np.max(np.abs(fitted["error_with_slots_pct"])) < 1


def test_refit_fits_the_attention_record_again() -> None:
    from dataclasses import replace

    from calibration.fit import refit_profile
    from cdbsim.latency.profile import Profile, ProfileKind
    from cdbsim.latency.recipes import model_stage_name

    core, skew = _synthetic_core(1024.0, sharpness=2.0)
    arch = PRESETS["ouro-1.4b"]
    old = {"slots": 512.0, "heads": 16, "head_dim": 128, "points": skew}  # fitted before the sharpness was
    profile = Profile(name="synthetic", kind=ProfileKind.MEASURED, device={},
                      components={model_stage_name(arch, Stage.CORE): core}, attention=old)
    assert profile.attention_sharpness == math.inf
    refitted = refit_profile(replace(profile))
    assert refitted.attention_sharpness == 2.0 and refitted.attention_slots == pytest.approx(1024.0, rel=0.2)


def test_refit_reads_the_head_width_an_older_record_lacks_from_its_layer() -> None:
    """The head width sets the fewest splits of the mixed-context points, so a refit needs it: recorded with
    the points, or (a profile measured before it was) in its layer's name; neither is a one-line error."""
    from calibration.fit import refit_profile
    from cdbsim.errors import ConfigError
    from cdbsim.latency.profile import Profile, ProfileKind
    from cdbsim.latency.recipes import model_stage_name

    core, skew = _synthetic_core(1024.0)
    arch = PRESETS["huginn-3.5b"]
    components = {model_stage_name(arch, Stage.CORE): core}
    older = {"slots": 512.0, "heads": 55, "points": skew}
    with pytest.raises(ConfigError, match=r"attention\.head_dim"):
        refit_profile(Profile(name="synthetic", kind=ProfileKind.MEASURED, device={}, components=components,
                              attention=older))
    layer = {f"kv_copy/{arch.layer.key}": Fit(delta=1e-6)}
    refitted = refit_profile(Profile(name="synthetic", kind=ProfileKind.MEASURED, device={},
                                     components={**components, **layer}, attention=older))
    assert refitted.attention["head_dim"] == 96


def test_latency_model_looks_up_mixed_batches_at_their_equivalent_length() -> None:
    from dataclasses import replace
    from pathlib import Path

    from cdbsim.latency.profile import load_profile_file

    arch = PRESETS["ouro-1.4b"]
    shipped = load_profile_file(Path(__file__).parents[1] / "calibration/profiles/h200-ouro-1.4b.json")
    plain = LatencyModel(arch, replace(shipped, attention={}))
    fitted = LatencyModel(arch, replace(shipped, attention={"slots": 2048.0}))
    launch = Launch(0, Stage.CORE, requests=[0, 1], positions=[570, 6399], size=2, padded=2, context=6971,
                    longest=6400)
    launch.steps, launch.exits = [0, 0], [False, False]
    core = plain.tables[Stage.CORE]
    assert plain.launch_time(launch) == pytest.approx(core(2, 6971 / 2))
    equivalent = equivalent_length(6971 / 2, 6400, 2, 2, arch.layer.heads, least_splits(arch.layer.head_dim), 2048.0)
    assert equivalent > 6000
    assert fitted.launch_time(launch) == pytest.approx(core(2, equivalent))
    assert fitted.launch_time(launch) > plain.launch_time(launch)
    uniform = Launch(0, Stage.CORE, requests=[0, 1], positions=[3484, 3484], size=2, padded=2, context=6970,
                     longest=3485)
    assert fitted.launch_time(uniform) == pytest.approx(plain.launch_time(uniform))
    launch.longest = 0  # a log written before the column existed: the mean is all there is
    assert fitted.launch_time(launch) == pytest.approx(plain.launch_time(launch))
