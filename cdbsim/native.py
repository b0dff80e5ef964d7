"""Which simulator modules an install compiles with mypyc (``setup.py``), the build cache that lets a reinstall
reuse them, and the rule that keeps a stale build out.

The build records each module's source hash (:data:`STAMP`). At ``import cdbsim``, if a source changed after the
build, the build is incomplete, or ``CDBSIM_PURE=1`` is set, every module of :data:`COMPILED` is imported from
source, all together (compiled modules call each other directly).

The build cache (:func:`cache_root`) keeps each build's extension files under a key of everything they depend on
(:func:`build_key`): an install whose key is there copies them instead of compiling.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

COMPILED = ("cdbsim.serving.blocks", "cdbsim.serving.requests", "cdbsim.serving.launch", "cdbsim.serving.scheduler",
            "cdbsim.serving.pipeline", "cdbsim.latency.gpu_work", "cdbsim.latency.interp", "cdbsim.latency.model",
            "cdbsim.report.logs", "cdbsim.simulator.sim")
STAMP = "native-build.json"  # beside the compiled modules: {module: sha256 of the source it was built from}
PURE_ENV = "CDBSIM_PURE"
PACKAGE = Path(__file__).resolve().parent


def source_file(name: str, package: Path = PACKAGE) -> Path:
    """The ``.py`` file of module ``name`` (one of :data:`COMPILED`)."""
    return package.joinpath(*name.split(".")[1:]).with_suffix(".py")


def source_hashes(package: Path = PACKAGE) -> dict[str, str]:
    """The sha256 of each compiled module's source file (the build's stamp records them)."""
    return {name: hashlib.sha256(source_file(name, package).read_bytes()).hexdigest() for name in COMPILED}


def build_key(hashes: dict[str, str], mypy_version: str, options: str = "") -> str:
    """The build cache's key: the sources' hashes, the mypy version, the build ``options``, and this Python (version,
    ABI, platform)."""
    parts = [sorted(hashes.items()), mypy_version, options, sys.version, sys.implementation.cache_tag,
             sysconfig.get_config_var("EXT_SUFFIX"), sysconfig.get_platform()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def cache_root() -> Path:
    """Where builds are kept: ``$XDG_CACHE_HOME/cdbsim/mypyc`` (``~/.cache`` without the variable)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdbsim" / "mypyc"


def cached_build(entry: Path) -> dict[str, Path] | None:
    """The files of the build kept as ``entry`` ({extension name: file}), or None where it holds no complete build."""
    try:
        files = {path.name: path for path in entry.iterdir() if path.is_file()}
    except OSError:
        return None
    return files if set(COMPILED) <= files.keys() else None


def store_build(entry: Path, files: dict[str, Path], keep: int = 4) -> None:
    """Keep a finished build's files ({extension name: file}) as ``entry``, whole or not at all, and only the ``keep``
    most recently used builds beside it."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=entry.parent))
    try:
        for name, path in files.items():
            shutil.copyfile(path, staging / name)
        if cached_build(entry) is None:
            shutil.rmtree(entry, ignore_errors=True)
            staging.rename(entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    builds = sorted((path for path in entry.parent.iterdir() if not path.name.startswith(".")),
                    key=lambda path: path.stat().st_mtime, reverse=True)
    for old in builds[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def _has_extensions(package: Path) -> bool:
    return any(source_file(name, package).with_suffix(suffix).exists()
               for name in COMPILED for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def stale_reason(package: Path = PACKAGE) -> str | None:
    """Why the compiled modules must not be used (None: they match their source, or there are none)."""
    if not _has_extensions(package):
        return None
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"{PURE_ENV} is set"
    try:
        built = json.loads((package / STAMP).read_text())
    except (OSError, ValueError):
        return "the compiled build is incomplete"
    if built != source_hashes(package):
        return "their source was edited after the build"
    return None


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Imports the compiled modules from their ``.py`` files, ahead of the extensions beside them."""

    def __init__(self, package: Path) -> None:
        self.package = package

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name not in COMPILED:
            return None
        return importlib.util.spec_from_file_location(name, source_file(name, self.package))


def guard() -> None:
    """Run every compiled module from source if the build is stale or switched off; warns once when stale."""
    reason = stale_reason()
    if reason is None or any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _SourceFinder(PACKAGE))
    if not reason.startswith(PURE_ENV):
        warnings.warn(f"cdbsim runs its Python source, not the compiled modules: {reason} "
                      "(pip install -e . compiles them again)", RuntimeWarning, stacklevel=2)


def compiled() -> bool:
    """Whether the simulator's hot modules run compiled in this process."""
    module = importlib.import_module("cdbsim.serving.scheduler")
    return str(module.__file__).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
