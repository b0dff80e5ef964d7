"""A results cache keyed by what a simulated point is made of, so no point is simulated twice.

The key hashes the resolved experiment, the baseline flag, every file it names, the cdbsim version and sources with
their workload data, and the profiles names resolve from; any change misses the cache. Rows are stored as JSON
(floats round-trip exactly) in one SQLite file, committed as each point finishes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from functools import cache
from pathlib import Path
from typing import Any

from cdbsim.errors import ConfigError
from cdbsim.planner.experiment import Experiment

ROOT = Path(__file__).resolve().parents[2]
CODE_GLOBS = ("cdbsim/**/*.py", "traces/*.py", "traces/data/*")


def default_cache_path() -> Path:
    """``$XDG_CACHE_HOME/cdbsim/points.sqlite`` (``~/.cache`` by default); ``--cache`` sets another."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cdbsim" / "points.sqlite"


@cache
def code_fingerprint() -> str:
    """The cdbsim version and a hash of every source and data file a simulated result depends on."""
    from cdbsim import __version__

    digest = hashlib.sha256(__version__.encode())
    for pattern in CODE_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _file_digest(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        return "missing"
    stat = p.stat()
    return _content_digest(str(p.resolve()), stat.st_mtime_ns, stat.st_size)


@cache
def _content_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def referenced_files(exp: Experiment) -> list[str]:
    """The files an experiment reads besides the shipped ones."""
    names = [exp.arch.hf_config, exp.workload.trace]
    names += [n for n in (exp.arch.name, exp.latency.profile) if str(n).endswith(".json")]
    return sorted(str(n) for n in names if n is not None)


def profiles_fingerprint() -> str:
    """A hash of the profiles that profile names resolve from (:func:`cdbsim.latency.shipped.profile_dir`)."""
    from cdbsim.latency.shipped import profile_dir

    digest = hashlib.sha256()
    for path in sorted(profile_dir().glob("*.json")):
        digest.update(path.name.encode() + b"\0" + _file_digest(path).encode())
    return digest.hexdigest()


def point_key(exp: Experiment, baseline: bool) -> str:
    """The cache key of simulating ``exp`` (and, with ``baseline``, CB on the same requests)."""
    content = {"experiment": exp.to_dict(), "baseline": baseline, "code": code_fingerprint(),
               "profiles": profiles_fingerprint(),
               "files": {name: _file_digest(name) for name in referenced_files(exp)}}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


class PointCache:
    """Rows by point key in a SQLite file (created with its folder on first use)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS points (key TEXT PRIMARY KEY, row TEXT NOT NULL)")
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot use the results cache {self.path} ({exc})") from None

    def get(self, key: str) -> dict[str, Any] | None:
        found = self.db.execute("SELECT row FROM points WHERE key = ?", (key,)).fetchone()
        return json.loads(found[0]) if found else None

    def put(self, key: str, row: dict[str, Any]) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO points VALUES (?, ?)", (key, json.dumps(row)))

    def __len__(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM points").fetchone()[0])

    def close(self) -> None:
        self.db.close()
