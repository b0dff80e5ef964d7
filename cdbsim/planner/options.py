"""Typed settings declared as dataclass fields: each with its default, flags, help and range, parsed from text,
TOML or Python values alike; a wrong value is a one-line :class:`~cdbsim.errors.ConfigError`."""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from functools import cache
from pathlib import Path
from types import NoneType
from typing import Any, ClassVar

from cdbsim.errors import ConfigError, unknown


def option(default: Any, help: str, *flags: str, minimum: float | None = None, above: float | None = None,
           maximum: float | None = None) -> Any:
    """A field with its help, flags (``--field-name`` unless given) and range (``>= minimum``, ``> above``,
    ``<= maximum``; ``None``, where allowed, passes)."""
    return field(default=default, metadata={"help": help, "flags": flags, "minimum": minimum, "above": above,
                                            "maximum": maximum})


def check_range(value: Any, metadata: Mapping[str, Any]) -> None:
    """Refuse a value outside its field's declared range with a one-line :class:`ConfigError`."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    minimum, above, maximum = metadata.get("minimum"), metadata.get("above"), metadata.get("maximum")
    if minimum is not None and value < minimum:
        raise ConfigError(f"must be >= {minimum:g}, got {value:g}")
    if above is not None and value <= above:
        raise ConfigError(f"must be > {above:g}, got {value:g}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"must be <= {maximum:,}, got {value:,}")


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``, else ``(hint, False)``."""
    args = typing.get_args(hint)
    if NoneType in args:
        return next(a for a in args if a is not NoneType), True
    return hint, False


def allowed(hint: Any) -> str:
    """What a value of ``hint`` may be, in words (for error messages)."""
    base, optional = unwrap_optional(hint)
    if isinstance(base, type) and issubclass(base, Enum):
        words = "one of " + ", ".join(m.value for m in base)
    else:
        words = {bool: "true or false", int: "an integer", float: "a number", Path: "a file path",
                 str: "text"}[base]
    return f"{words} (or none)" if optional else words


def parse_value(value: Any, hint: Any) -> Any:
    """``value`` as a ``hint`` (str, int, float, bool, Path, an enum, or one of those | None); text is parsed,
    ``none`` or empty text clears an optional field, and a misfit raises a one-line :class:`ConfigError`."""
    base, optional = unwrap_optional(hint)
    text = value.strip() if isinstance(value, str) else None
    if optional and (value is None or (text is not None and text.lower() in ("", "none", "null"))):
        return None
    if isinstance(base, type) and issubclass(base, Enum):
        if isinstance(value, base):
            return value
        if hasattr(base, "parse"):  # the enum's own aliases and one-line error
            return base.parse(value)
        try:
            return base(value)
        except ValueError:
            raise unknown(base.__name__.lower(), str(value), [m.value for m in base]) from None
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if text is not None and text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
        elif base is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if text is not None:
                return int(text)
        elif base is float:
            number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else (
                float(text) if text is not None else None)
            if number is not None and math.isfinite(number):
                return number
            if number is not None:
                raise ConfigError(f"expected a finite number, got {value!r}")
        elif base is str and isinstance(value, str):
            return value
        elif base is Path and isinstance(value, str | Path):
            return Path(value)
    except ConfigError:
        raise
    except ValueError:
        pass
    raise ConfigError(f"expected {allowed(hint)}, got {value!r}")


def plain(value: Any) -> Any:
    """A field value as JSON/TOML holds it: enums by their value, paths as text."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


def toml_value(value: Any) -> str:
    """A value as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("-inf" if value < 0 else "inf") if math.isinf(value) else "nan" if math.isnan(value) else repr(value)
    # a JSON string is a TOML basic string, once DEL (raw in JSON, not in TOML) is escaped too
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def where(source: str | None) -> str:
    """``source: `` to prefix an error with, or nothing."""
    return f"{source}: " if source else ""


class Section:
    """Base of the experiment's sections (named ``NAME``): each field holds a value of its declared type."""

    NAME: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = section_hints(type(self))
        for f in fields(self):  # type: ignore[arg-type]
            value = parse_value(getattr(self, f.name), hints[f.name])
            try:
                check_range(value, f.metadata)
            except ConfigError as exc:
                raise ConfigError(f"{self.NAME}.{f.name}: {exc}") from None
            object.__setattr__(self, f.name, value)

    def updated(self, values: Mapping[str, Any], section: str, source: str | None = None) -> Section:
        """A copy with ``values`` set; an unknown key or a value of the wrong type names ``source``."""
        hints = section_hints(type(self))
        parsed = {}
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(f"{where(source)}unknown key {section}.{key}; valid keys of [{section}]: "
                                  f"{', '.join(sorted(hints))}")
            try:
                parsed[key] = parse_value(value, hints[key])
                check_range(parsed[key], self.__dataclass_fields__[key].metadata)  # type: ignore[attr-defined]
            except ConfigError as exc:
                raise ConfigError(f"{where(source)}{section}.{key}: {exc}") from None
        return replace(self, **parsed)  # type: ignore[type-var]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]


@cache
def section_hints(cls: type) -> dict[str, Any]:
    """The declared type of each field of a section (class constants left out)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


@dataclass(frozen=True)
class Setting:
    """One field of an experiment as a command line sees it."""

    section: str
    name: str
    hint: Any
    default: Any
    flags: tuple[str, ...]
    help: str

    @property
    def key(self) -> str:
        """``section.field``, as ``--set`` names it."""
        return f"{self.section}.{self.name}"

    @property
    def param(self) -> str:
        """A Python identifier unique across sections (``serve__width``), for generated functions."""
        return f"{self.section}__{self.name}"

