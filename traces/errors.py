"""The one exception type for bad user input, shared by ``traces`` and ``cdbsim`` (as ``ConfigError``): a one-line
message that the CLI prints as ``error: ...`` with exit code 2."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """Invalid user input: the message is one line and says what to do instead."""


def unknown(kind: str, name: object, valid: Iterable[str]) -> InputError:
    """An error for an unknown name that lists the valid ones."""
    return InputError(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(valid))}")


def require(condition: bool, message: str) -> None:
    """Raise :class:`InputError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise InputError(message)


def require_file(path: Path, what: str) -> None:
    """Refuse a ``path`` that is not a file: missing, or a directory where a file is expected."""
    require(not path.is_dir(), f"{what} {path} is a directory; give a file")
    require(path.is_file(), f"{what} {path} does not exist")


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``; a missing file or non-UTF-8 bytes are a one-line error naming file and line."""
    path = Path(path)
    require_file(path, what)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})") from None


def read_json(path: str | Path, what: str) -> Any:
    """The parsed JSON of ``path``; a missing file or bad JSON is a one-line error naming file and line."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
