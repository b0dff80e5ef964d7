"""Build: the simulator's hot modules (``cdbsim/native.py`` lists them and says why) compiled with mypyc.

Everything else is declared in ``pyproject.toml``. Where the modules cannot be compiled (no C compiler, a
type error mypyc refuses, or ``CDBSIM_PURE=1`` at install time) the install says so and stays pure Python,
which runs the same code about half as fast.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

from setuptools import setup
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


class OptionalBuildExt(build_ext):
    """Compiles the modules; on failure leaves the pure-Python package (no stamp: the source runs)."""

    def run(self) -> None:
        if not self.extensions:
            return
        hashes = NATIVE.source_hashes()
        stamp = Path(self.get_ext_fullpath("cdbsim.native")).parent / NATIVE.STAMP
        stamp.unlink(missing_ok=True)  # an earlier build's stamp must not vouch for this one
        try:
            super().run()
        except Exception as error:  # a missing compiler shows up as one of several distutils errors
            _say(f"compiling the hot modules failed ({error}); installing pure Python")
            return
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(hashes, indent=1) + "\n")


def _extensions() -> list:
    if os.environ.get(NATIVE.PURE_ENV, "") not in ("", "0"):
        _say(f"{NATIVE.PURE_ENV} is set: installing pure Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not available: installing pure Python")
        return []
    try:
        return mypycify([str(NATIVE.source_file(name)) for name in NATIVE.COMPILED], opt_level="3")
    except (Exception, SystemExit) as error:  # mypy reports a type error by exiting
        _say(f"mypyc could not compile the hot modules ({error}); installing pure Python")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
