"""What a sweep runs: a grid of experiment fields (every combination) applied to a list of explicit points.

A grid is ``{"serve.width": [16, 64], ...}`` (``--grid`` options or a ``[grid]`` table), points are
``[{"arch.name": ..., "arch.split": ...}, ...]`` (``[[points]]`` tables). Points are outermost, then the grid's
fields in order, the last varying fastest; every key and value is checked before anything runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdbsim.errors import ConfigError, require
from cdbsim.planner.experiment import Experiment
from cdbsim.planner.options import plain

Assignment = tuple[str, Any]


def _checked(key: str, value: Any, source: str) -> Any:
    """``value`` parsed to the type of field ``key``; errors name ``source``."""
    return Experiment().override({key: value}, source=source).get(key)


def flat_table(table: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A TOML table keyed ``section.field`` either way it is written (``serve.width = ...`` nests, the
    quoted ``"serve.width" = ...`` does not)."""
    out = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            for name, inner in value.items():
                require(not isinstance(inner, Mapping), f"{source}: {key}.{name} is a table; expected values of "
                                                        f"a field section.field")
                out[f"{key}.{name}"] = inner
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Grid:
    """The fields swept and their values (``axes``), and the explicit points the grid is applied to."""

    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    points: tuple[tuple[Assignment, ...], ...] = ()

    @classmethod
    def of(cls, grid: Mapping[str, Sequence[Any]] | None = None,
           points: Sequence[Mapping[str, Any]] | None = None, source: str = "grid") -> Grid:
        """A checked grid: known fields, values of their types, no field in both grid and a point, at least one
        point."""
        axes = []
        for key, values in (grid or {}).items():
            if isinstance(values, str | bytes) or not isinstance(values, Sequence):
                raise ConfigError(f"{source}: {key}: expected a list of values, got {values!r}")
            require(len(values) > 0, f"{source}: {key} has no values")
            parsed = tuple(_checked(key, v, source) for v in values)
            twice = [plain(v) for i, v in enumerate(parsed) if v in parsed[:i]]
            if twice:
                raise ConfigError(f"{source}: {key} lists {twice[0]!r} twice")
            axes.append((key, parsed))
        explicit = []
        for i, point in enumerate(points or ()):
            if not isinstance(point, Mapping):
                raise ConfigError(f"{source}: point {i + 1} must be a table of section.field = value, got {point!r}")
            explicit.append(tuple((key, _checked(key, value, f"{source}: point {i + 1}"))
                                  for key, value in point.items()))
        both = sorted({k for p in explicit for k, _ in p} & {k for k, _ in axes})
        require(not both, f"{source}: {', '.join(both)} is set both by the grid and by a point; set it in one place")
        require(bool(axes or explicit), "the grid is empty: give fields to sweep (--grid section.field=v1,v2 or "
                                        "a [grid] table) or explicit points ([[points]])")
        return cls(tuple(axes), tuple(explicit))

    @classmethod
    def from_options(cls, options: Sequence[str], table: Mapping[str, Any] | None = None,
                     points: Sequence[Mapping[str, Any]] | None = None, file: str | None = None) -> Grid:
        """A grid from ``--grid section.field=v1,v2`` options over the ``[grid]`` and ``[[points]]`` tables of
        ``file`` (an option replaces the file's values of its field)."""
        if points is not None and not isinstance(points, Sequence):
            raise ConfigError(f"{file}: [[points]] must be an array of tables, got {points!r}")
        label = f"{file}: " if file else ""
        grid = flat_table(table or {}, f"{label}[grid]")
        flat_points = [flat_table(p, f"{label}[[points]]") if isinstance(p, Mapping) else p for p in points or ()]
        if grid or flat_points:
            cls.of(grid, flat_points, source=f"{label}[grid]")
        given: set[str] = set()
        for option in options:
            key, eq, values = option.partition("=")
            key = key.strip()
            require(bool(eq) and bool(key), f"--grid: expected section.field=v1,v2,..., got {option!r}")
            require(key not in given, f"--grid: {key} is given twice")
            given.add(key)
            grid[key] = [v.strip() for v in values.split(",")] if values.strip() else []
        return cls.of(grid, flat_points, "--grid")

    # ----- the points --------------------------------------------------------------------------------
    @property
    def fields(self) -> list[str]:
        """The fields that vary: those of the explicit points (first seen first), then the grid's."""
        keys = dict.fromkeys(k for p in self.points for k, _ in p)
        keys.update(dict.fromkeys(k for k, _ in self.axes))
        return list(keys)

    def __len__(self) -> int:
        return max(len(self.points), 1) * math.prod(len(values) for _, values in self.axes)

    def assignments(self) -> Iterator[dict[str, Any]]:
        """Each point's settings, in sweep order (a generator: a large grid is never held in memory)."""
        keys = [k for k, _ in self.axes]
        for point in self.points or ((),):
            for combination in itertools.product(*(values for _, values in self.axes)):
                yield {**dict(point), **dict(zip(keys, combination, strict=True))}

    def experiments(self, base: Experiment) -> Iterator[Experiment]:
        """``base`` with each point's settings applied, in sweep order."""
        for assignment in self.assignments():
            yield base.override(assignment, source="grid")
