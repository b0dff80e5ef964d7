"""The compiled build of the simulator's hot modules: used only while it matches its source, and it
simulates exactly what the source does."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdbsim import native

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the compiled modules' sources, with one fake extension beside them."""
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    for name in native.COMPILED:
        target = native.source_file(name, tmp_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(native.source_file(name).read_bytes())
    return tmp_path


def _add_extension(package: Path) -> None:
    scheduler = native.source_file("cdbsim.serving.scheduler", package)
    scheduler.with_name(f"scheduler{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")


def test_without_extensions_the_source_runs_silently(package: Path) -> None:
    assert native.stale_reason(package) is None


def test_a_build_without_its_stamp_is_not_used(package: Path) -> None:
    _add_extension(package)
    assert native.stale_reason(package) == "the compiled build is incomplete"


def test_a_matching_stamp_lets_the_build_run(package: Path) -> None:
    _add_extension(package)
    (package / native.STAMP).write_text(json.dumps(native.source_hashes(package)))
    assert native.stale_reason(package) is None


def test_an_edited_source_turns_the_build_off(package: Path) -> None:
    _add_extension(package)
    (package / native.STAMP).write_text(json.dumps(native.source_hashes(package)))
    with native.source_file("cdbsim.serving.blocks", package).open("a") as fh:
        fh.write("\n# edited\n")
    assert native.stale_reason(package) == "their source was edited after the build"


def test_the_environment_switch_turns_the_build_off(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _add_extension(package)
    (package / native.STAMP).write_text(json.dumps(native.source_hashes(package)))
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.stale_reason(package) == f"{native.PURE_ENV} is set"
    monkeypatch.setenv(native.PURE_ENV, "0")
    assert native.stale_reason(package) is None



def test_the_build_key_changes_with_any_source_and_with_mypy(package: Path) -> None:
    hashes = native.source_hashes(package)
    key = native.build_key(hashes, "1.0", "options")
    assert key == native.build_key(dict(reversed(hashes.items())), "1.0", "options")
    assert key != native.build_key(hashes, "1.1", "options")
    assert key != native.build_key(hashes, "1.0", "other options")
    with native.source_file("cdbsim.serving.blocks", package).open("a") as fh:
        fh.write("\n# edited\n")
    assert key != native.build_key(native.source_hashes(package), "1.0", "options")


def _fake_build(directory: Path) -> dict[str, Path]:
    """A build's files ({extension name: file}), each holding its own name."""
    directory.mkdir(parents=True)
    files = {name: directory / f"{name}.so" for name in (*native.COMPILED, "abc__mypyc")}
    for name, path in files.items():
        path.write_bytes(name.encode())
    return files


def test_a_stored_build_comes_back_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    entry = native.cache_root() / "key"
    assert entry == tmp_path / "cache" / "cdbsim" / "mypyc" / "key"
    assert native.cached_build(entry) is None  # a miss: nothing there yet
    native.store_build(entry, _fake_build(tmp_path / "first"))
    found = native.cached_build(entry)
    assert found is not None and found.keys() == {*native.COMPILED, "abc__mypyc"}
    assert all(path.read_bytes() == name.encode() for name, path in found.items())
    assert [path.name for path in entry.parent.iterdir()] == ["key"]  # no staging left behind
    (entry / "cdbsim.serving.blocks").unlink()
    assert native.cached_build(entry) is None  # an incomplete build is a miss
    native.store_build(entry, _fake_build(tmp_path / "second"))
    assert native.cached_build(entry) is not None  # and the next build replaces it


def test_the_cache_keeps_the_most_recently_used_builds(tmp_path: Path) -> None:
    files = _fake_build(tmp_path / "built")
    cache = tmp_path / "cache"
    for used, key in ((3000, "c"), (1000, "a"), (2000, "b")):
        native.store_build(cache / key, files)
        os.utime(cache / key, (used, used))
    native.store_build(cache / "d", files, keep=2)
    assert sorted(path.name for path in cache.iterdir()) == ["c", "d"]


RUN = """
import hashlib, sys
from cdbsim import native
from cdbsim.model.arch import PRESETS
from cdbsim.serving.config import ServeConfig
from cdbsim.latency.model import LatencyModel
from cdbsim.latency.shipped import resolve_profile
from cdbsim.simulator.sim import simulate
from traces import ExitModel, build_trace

arch = PRESETS["huginn-3.5b"]
requests = build_trace("sharegpt", 120, arch.r_max, 2, ExitModel(mean=6.0), rate=4.0, seed=3)
latency = LatencyModel(arch, resolve_profile("auto", arch))
digest = hashlib.sha256()
for policy, k in (("refill", 4), ("norefill", 1), ("cb", 1), ("adaptive", 1)):
    log = simulate(arch, ServeConfig(policy=policy, width=32, coda_batch=k), requests, latency, kv_blocks=4000)
    digest.update(log.launches.to_csv().encode())
    digest.update(log.requests.to_csv().encode())
print(native.compiled(), digest.hexdigest())
"""


def _run(pure: bool) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    if pure:
        env[native.PURE_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], out[1]


def test_compiled_and_source_runs_log_the_same_launches() -> None:
    compiled, compiled_digest = _run(pure=False)
    if compiled != "True":
        pytest.skip("this install has no compiled build (pure Python): nothing to compare")
    source, source_digest = _run(pure=True)
    assert source == "False"
    assert compiled_digest == source_digest


def test_the_compiled_modules_type_check() -> None:
    """mypyc compiles only what mypy accepts, and a build it refuses installs the pure-Python package without
    a word in CI (the simulator then runs at about half its speed): the modules it compiles must type-check."""
    api = pytest.importorskip("mypy.api")
    report, errors, status = api.run(["--no-incremental", *(str(native.source_file(name)) for name in native.COMPILED)])
    assert status == 0, report + errors
