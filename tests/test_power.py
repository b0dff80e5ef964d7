"""The power limit of long compute-bound launches: the stretch, its fit, and where the latency model uses it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdbsim.latency.power import SustainedLoad, fit_sustained
from cdbsim.serving.launch import Stage, prefill_launch

loads = st.builds(SustainedLoad, onset_s=st.floats(0.0, 0.5), slowdown=st.floats(1.0, 1.5))
seconds = st.floats(0.0, 5.0)


@given(loads, seconds, seconds)
def test_stretch_never_shortens_and_keeps_the_order_of_launches(load: SustainedLoad, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert load.stretch(lo) >= lo
    assert load.stretch(lo) <= load.stretch(hi)
    assert load.stretch(hi) <= hi * load.slowdown + 1e-12


def test_stretch_leaves_launches_shorter_than_the_onset_alone() -> None:
    load = SustainedLoad(onset_s=0.1, slowdown=1.2)
    assert load.stretch(0.05) == 0.05
    assert load.stretch(0.1) == pytest.approx(0.1)
    assert load.stretch(0.6) == pytest.approx(0.1 + 0.5 * 1.2)


@pytest.mark.parametrize(("onset", "slowdown"), [(0.0, 1.3), (0.08, 1.17), (0.25, 1.05)])
def test_fit_recovers_a_known_onset_and_slowdown_from_noisy_replays(onset: float, slowdown: float) -> None:
    rested = 0.0075
    rng = np.random.default_rng(0)
    work = rested * np.arange(1, 151)
    truth = SustainedLoad(onset, slowdown)
    elapsed = np.array([truth.stretch(w) for w in work])
    per_replay = np.diff(elapsed, prepend=0.0) * (1 + 0.01 * rng.standard_normal(work.size))
    fit = fit_sustained(work, np.cumsum(per_replay))
    assert fit.onset_s == pytest.approx(onset, abs=0.02)
    assert fit.slowdown == pytest.approx(slowdown, abs=0.01)


def test_fit_of_a_board_that_never_slows_is_no_stretch() -> None:
    work = 0.01 * np.arange(1, 50)
    fit = fit_sustained(work, work * 0.999)
    assert fit.slowdown == 1.0
    assert fit.stretch(0.3) == pytest.approx(0.3)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="slowdown >= 1"):
        SustainedLoad(onset_s=0.1, slowdown=0.9)
    with pytest.raises(ValueError, match="three or more"):
        fit_sustained([0.1, 0.2], [0.1, 0.2])
    assert SustainedLoad.from_record(None) is None
    assert SustainedLoad.from_record({"replays": []}) is None


def test_a_kernel_profiles_composed_prefill_is_stretched_and_a_measured_profiles_is_not() -> None:
    """The kernel profile's tables price a rested board, so its composed prefills are stretched by the record's
    ``sustained`` entry; a whole-model profile measured its prefills replayed back to back and is not."""
    from cdbsim.latency.model import LatencyModel
    from cdbsim.latency.shipped import resolve_profile
    from cdbsim.model.arch import load_arch

    arch = load_arch("huginn-3.5b")
    kernels = resolve_profile("calibration/profiles/h200-kernels.json", arch)
    load = SustainedLoad.from_record(kernels.kernels.get("sustained"))
    assert load is not None and load.slowdown > 1.0
    rested = copy.deepcopy(kernels)
    del rested.kernels["sustained"]
    long = prefill_launch([0, 1], [0, 0], [4096, 4096], [[], []], 8192)
    short = prefill_launch([0], [0], [16], [[]], 16)
    stretched, plain = LatencyModel(arch, kernels), LatencyModel(arch, rested)
    assert plain.launch_time(long) > load.onset_s  # long enough to reach the limit
    assert stretched.launch_time(long) == pytest.approx(load.stretch(plain.launch_time(long)))
    assert stretched.launch_time(short) == pytest.approx(plain.launch_time(short))
    measured = LatencyModel(arch, resolve_profile("auto", arch))
    assert measured.profile.kind.value == "measured" and measured.prefill is not None
    assert measured.prefill.sustained is None
    assert long.stage is Stage.PREFILL


def test_refit_fits_the_power_limit_again_from_the_stored_replays_and_names_a_bad_file() -> None:
    from calibration.fit import refit_sustained
    from cdbsim.errors import ConfigError
    from cdbsim.latency.profile import load_profile_file

    entry = load_profile_file("calibration/profiles/h200-kernels.json").kernels["sustained"]
    again = refit_sustained(entry)
    assert (again["onset_s"], again["slowdown"]) == (entry["onset_s"], entry["slowdown"])
    shifted = refit_sustained({**entry, "replays": [[t, s * (1.3 if t > 0.2 else 1.0)] for t, s in entry["replays"]]})
    assert shifted["slowdown"] > entry["slowdown"]
    with pytest.raises(ConfigError, match=r"kernels\.sustained\.replays"):
        refit_sustained({**entry, "replays": [[0.0, 0.01]]})
    with pytest.raises(ConfigError, match=r"kernels\.sustained\.replays"):
        refit_sustained({**entry, "replays": "none"})


def test_a_malformed_power_limit_in_a_profile_is_a_one_line_error() -> None:
    from cdbsim.errors import ConfigError

    with pytest.raises(ConfigError, match=r"kernels\.sustained: .*slowdown >= 1"):
        SustainedLoad.from_record({"onset_s": 0.1, "slowdown": 0.5})
    with pytest.raises(ConfigError, match=r"kernels\.sustained"):
        SustainedLoad.from_record({"onset_s": "soon", "slowdown": 1.2})
