"""Output paths: checked before any work starts (:func:`check_file`, :func:`check_dir`), written under a temporary
name and renamed into place when complete (:func:`atomic_file`, :func:`atomic_dir`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdbsim.errors import ConfigError, require

if TYPE_CHECKING:
    import pyarrow as pa


def staging_name(path: Path, tag: str = "tmp") -> Path:
    """A unique hidden name in ``path``'s directory that keeps its extension (writers pick formats by it)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.{tag}{path.suffix}")


def _check_writable_dir(directory: Path, option: str, target: Path) -> None:
    """``directory`` exists, is a directory, and a file can really be created in it."""
    require(directory.exists(), f"{option} {target}: directory {directory} does not exist")
    require(directory.is_dir(), f"{option} {target}: {directory} is a file, not a directory")
    probe = staging_name(directory / "probe", "probe")
    try:
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{option} {target}: cannot write in {directory} ({exc.strerror or exc})") from None


def check_file(path: str | Path, option: str, suffixes: Iterable[str]) -> Path:
    """``path`` as a file this command may write: one of ``suffixes``, not a directory, in a writable
    directory that exists. ``option`` names the flag in the error."""
    path = Path(path)
    suffixes = tuple(suffixes)
    require(not path.is_dir(), f"{option} {path}: is a directory; give a file name ending in {suffixes[0]}")
    require(path.suffix.lower() in suffixes, f"{option} {path}: must end in {' or '.join(suffixes)}")
    require(not path.exists() or path.is_file(), f"{option} {path}: exists and is not a regular file")
    _check_writable_dir(path.parent, option, path)
    return path


def check_dir(path: str | Path, option: str, entries: Iterable[str] = ()) -> Path:
    """``path`` as a directory this command may write into (created if missing; its parent must exist),
    and each of ``entries`` below it free to be a directory (not an existing file)."""
    path = Path(path)
    if path.exists():
        require(path.is_dir(), f"{option} {path}: is a file, not a directory")
        _check_writable_dir(path, option, path)
    else:
        _check_writable_dir(path.parent, option, path)
    for entry in entries:
        sub = path / entry
        require(not sub.exists() or sub.is_dir(), f"{option} {path}: {sub} is a file, not a directory")
    return path


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path (same directory and extension) to write; rename it to ``path`` on success,
    delete it on failure."""
    path = Path(path)
    temporary = staging_name(path, "tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory to fill; on success it replaces ``path`` (an older directory there is
    removed only after the new one is in place), on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = staging_name(path, "tmp")
    temporary.mkdir()
    try:
        yield temporary
        old = staging_name(path, "old") if path.exists() else None
        if old is not None:
            os.replace(path, old)
        os.replace(temporary, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


BATCH_ROWS = 128


@contextmanager
def row_writer(schema: pa.Schema, parquet: str | Path | None = None,
               csv: str | Path | None = None) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Yield ``add(row)`` for rows of ``schema``, written to a Parquet and/or a CSV file (either may be None):
    moved into place when the block ends, removed if it fails."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    kinds = [(parquet, "--out", ".parquet", partial(pq.ParquetWriter, compression="zstd")),
             (csv, "--csv", ".csv", pcsv.CSVWriter)]
    chosen = [(check_file(path, what, (suffix,)), make) for path, what, suffix, make in kinds if path is not None]
    staged = [(target, staging_name(target)) for target, _ in chosen]
    writers: list[Any] = []
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        if batch and writers:
            table = pa.Table.from_pylist(batch, schema=schema)
            for writer in writers:
                writer.write_table(table)
        batch.clear()

    def add(row: dict[str, Any]) -> None:
        batch.append(row)
        if len(batch) >= BATCH_ROWS:
            flush()

    try:
        for (_, make), (_, temporary) in zip(chosen, staged, strict=True):
            writers.append(make(temporary, schema))
        yield add
        flush()
        while writers:
            writers.pop(0).close()
        for target, temporary in staged:
            os.replace(temporary, target)
    except BaseException:
        for writer in writers:
            with contextlib.suppress(Exception):  # the file is removed next either way
                writer.close()
        for _, temporary in staged:
            temporary.unlink(missing_ok=True)
        raise
