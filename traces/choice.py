"""Closed sets of names a user picks from (a policy, a stage, a KV layout, ...): enums equal to their string values,
so they round-trip through JSON, CSV, TOML and f-strings; :meth:`Choice.parse` lists the valid names on a miss."""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from traces.errors import unknown

C = TypeVar("C", bound="Choice")


class Choice(str, Enum):
    """Base of the project's string enums; subclasses may name aliases and what they are called."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def aliases(cls) -> dict[str, str]:
        """Other spellings users may type, mapped to a member's value."""
        return {}

    @classmethod
    def what(cls) -> str:
        """What one member is called in an error message."""
        return cls.__name__.lower()

    @classmethod
    def parse(cls: type[C], name: str | C) -> C:
        """The member called ``name`` (or one of its aliases), or a one-line error listing the valid names."""
        if isinstance(name, cls):
            return name
        try:
            return cls(cls.aliases().get(name, name))
        except (ValueError, TypeError):  # TypeError: a list from a JSON file, not a name at all
            raise unknown(cls.what(), name, [m.value for m in cls]) from None
