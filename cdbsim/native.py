"""Which simulator modules an install compiles with mypyc (``setup.py``), and the rule that keeps a stale build out.

The build records each module's source hash (:data:`STAMP`). At ``import cdbsim``, if a source changed after the
build, the build is incomplete, or ``CDBSIM_PURE=1`` is set, every module of :data:`COMPILED` is imported from
source, all together (compiled modules call each other directly).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
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
