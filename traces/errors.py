"""The one exception type for bad user input, shared by ``traces`` and ``cdbsim``.

Anything a user can get wrong (an unknown preset, K > W, a malformed trace file) raises
:class:`InputError` with a single-line message. The CLI turns it into ``error: ...`` on stderr and exit
code 2; library users can catch it like any ``ValueError``. It lives in ``traces`` because imports point
one way (``cdbsim`` -> ``traces``); ``cdbsim.errors`` re-exports it as ``ConfigError``.
"""

from __future__ import annotations

from collections.abc import Iterable


class InputError(ValueError):
    """Invalid user input: the message is one line and says what to do instead."""


def unknown(kind: str, name: str, valid: Iterable[str]) -> InputError:
    """An error for an unknown name that lists the valid ones."""
    return InputError(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(valid))}")


def require(condition: bool, message: str) -> None:
    """Raise :class:`InputError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise InputError(message)
