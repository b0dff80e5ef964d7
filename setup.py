"""Build: the simulator's hot modules (``cdbsim/native.py`` lists them and says why) compiled with mypyc.

Compiling takes about a minute, so each build's extension files are kept in a cache (``native.cache_root()``,
``~/.cache/cdbsim/mypyc``) under a key of the modules' sources, the mypy version, this Python and platform, and
this file: a reinstall with the same key copies them instead of compiling, and any trouble with the cache falls
back to compiling. Everything else is declared in ``pyproject.toml``. Where the modules cannot be compiled (no C
compiler, a type error mypyc refuses, or ``CDBSIM_PURE=1`` at install time) the install says so and stays pure
Python, which runs the same code about half as fast. pip shows these messages with ``pip install -v``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import ClassVar

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _load_native() -> ModuleType:
    """cdbsim/native.py (standard library only), loaded without the package around it."""
    spec = importlib.util.spec_from_file_location("cdbsim_native_build", ROOT / "cdbsim" / "native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NATIVE = _load_native()


def _say(message: str) -> None:
    print(f"cdbsim build: {message}", file=sys.stderr)


HASHES = NATIVE.source_hashes()  # what this build compiles: the stamp records it, the cache key starts from it


class OptionalBuildExt(build_ext):
    """Compiles the modules, or copies them from the build cache; on failure leaves the pure-Python package (no
    stamp: the source runs)."""

    entry: ClassVar[Path | None] = None  # this build's place in the cache
    cached: ClassVar[dict[str, Path]] = {}  # the files found there, by extension name (empty: compile)

    def run(self) -> None:
        if not self.extensions:
            return
        stamp = Path(self.get_ext_fullpath("cdbsim.native")).parent / NATIVE.STAMP
        stamp.unlink(missing_ok=True)  # an earlier build's stamp must not vouch for this one
        self.built: dict[str, Path] = {}
        self.copying, compiler = bool(self.cached), self.compiler
        if self.copying:
            try:
                super().run()
            except Exception as error:
                _say(f"the build cache failed ({error}); compiling instead")
                self.copying, self.compiler = False, compiler  # run() replaced the compiler's name with one
                if not self._compile_instead():
                    return
        if not self.copying:
            try:
                super().run()
            except Exception as error:  # a missing compiler shows up as one of several distutils errors
                _say(f"compiling the hot modules failed ({error}); installing pure Python")
                return
            self._store()
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(HASHES, indent=1) + "\n")

    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name))
        if self.copying:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.cached[ext.name], target)
        else:
            super().build_extension(ext)
        self.built[ext.name] = target

    def _compile_instead(self) -> bool:
        """Give the cached build's extensions (mypyc's names, no sources) what mypyc makes of the sources."""
        compiled = {ext.name: ext for ext in _compile()}
        if compiled.keys() != {ext.name for ext in self.extensions}:
            if compiled:
                _say("mypyc now makes other extensions than the cached build; installing pure Python")
            return False
        for ext in self.extensions:
            vars(ext).update({k: v for k, v in vars(compiled[ext.name]).items() if not k.startswith("_")})
        return True

    def _store(self) -> None:
        if self.entry is None or NATIVE.source_hashes() != HASHES:  # a source edited mid-build: not this key
            return
        try:
            NATIVE.store_build(self.entry, self.built)
        except Exception as error:
            _say(f"could not keep the build in {self.entry.parent} ({error})")


def _compile() -> list:
    _say("compiling the simulator's hot modules with mypyc (about a minute; CDBSIM_PURE=1 at install skips it)")
    try:
        from mypyc.build import mypycify

        return mypycify([str(NATIVE.source_file(name)) for name in NATIVE.COMPILED], opt_level="3")
    except (Exception, SystemExit) as error:  # mypy reports a type error by exiting
        _say(f"mypyc could not compile the hot modules ({error}); installing pure Python")
        return []


def _extensions() -> list:
    if sys.argv[1:2] in (["egg_info"], ["dist_info"]):  # pip asks for the metadata first: nothing to compile yet
        return []
    if os.environ.get(NATIVE.PURE_ENV, "") not in ("", "0"):
        _say(f"{NATIVE.PURE_ENV} is set: installing pure Python")
        return []
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError:
        _say("mypyc is not available: installing pure Python")
        return []
    try:
        key = NATIVE.build_key(HASHES, mypy_version, hashlib.sha256((ROOT / "setup.py").read_bytes()).hexdigest())
        OptionalBuildExt.entry = entry = NATIVE.cache_root() / key
        cached = NATIVE.cached_build(entry)
        if cached:
            os.utime(entry)  # recently used: kept
            OptionalBuildExt.cached = cached
            _say(f"sources unchanged since an earlier build: reusing it from {entry}")
            return [Extension(name, sources=[]) for name in sorted(cached)]
    except Exception as error:
        _say(f"the build cache is unusable ({error}); compiling")
    return _compile()


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
