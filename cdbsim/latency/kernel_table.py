"""One measured kernel's time over its shape: interpolation in log space, honest extrapolation.

A table holds points ``[d_1, ..., d_n, t]`` on (most of) a rectilinear grid. Between grid points ``log t`` is
interpolated piecewise-linearly against ``log(1 + d)`` one dimension at a time; variant dimensions match exactly.
Outside the grid (or in a hole) the nearest value is carried by the kernel's roofline *proxy*, ``t(q) =
t(edge) * proxy(q) / proxy(edge)``, and every lookup reports how far outside the grid it went (1.0 inside).
A dimension *capped* by an earlier one (a GQA group by the heads that hold it) is read at most at that
dimension's grid value: a point beyond it is no shape at all, so it neither extrapolates nor counts as outside.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

Proxy = Callable[[tuple[float, ...]], float]


@dataclass
class Lookup:
    """A table's time for one query, and how far outside the measured grid it reached (1.0: inside)."""

    seconds: float
    reach: float = 1.0


@dataclass
class KernelTable:
    """Measured times of one kernel on a grid of ``dims``; ``exact`` names the dimensions matched exactly, ``caps``
    each capped dimension and the earlier one that bounds it."""

    name: str
    dims: tuple[str, ...]
    points: list[list[float]]
    proxy: Proxy
    exact: frozenset[str] = frozenset()
    caps: dict[str, str] = field(default_factory=dict)
    _tree: dict = field(init=False, repr=False)
    _cap_of: dict[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError(f"kernel table {self.name} has no points")
        self._cap_of = {self.dims.index(dim): self.dims.index(by) for dim, by in self.caps.items()}
        if any(by >= level for level, by in self._cap_of.items()):
            raise ValueError(f"kernel table {self.name}: a dimension is capped only by an earlier one")
        self._tree = {}
        for row in self.points:
            if len(row) != len(self.dims) + 1:
                raise ValueError(f"kernel table {self.name}: a point needs {len(self.dims)} dimensions and a time")
            node = self._tree
            for x in row[:-2]:
                node = node.setdefault(float(x), {})
            node[float(row[-2])] = float(row[-1])

    def __call__(self, *query: float) -> float:
        return self.lookup(*query).seconds

    def lookup(self, *query: float) -> Lookup:
        if len(query) != len(self.dims):
            raise ValueError(f"kernel table {self.name} takes {len(self.dims)} dimensions, got {len(query)}")
        q = tuple(float(x) for x in query)
        return self._at(self._tree, 0, q)

    def _at(self, node: dict, level: int, q: tuple[float, ...]) -> Lookup:
        if not isinstance(node, dict):
            return Lookup(node)
        keys = sorted(node)
        x = q[level]
        if level in self._cap_of:  # the bounding dimension is already at its grid value on this path
            x = min(x, q[self._cap_of[level]])
            q = _with(q, level, x)
        if self.dims[level] in self.exact:
            if x not in node:
                raise KeyError(f"kernel table {self.name} has no {self.dims[level]} = {x:g} "
                               f"(measured: {', '.join(f'{k:g}' for k in keys)})")
            return self._at(node[x], level + 1, q)
        j = bisect_left(keys, x)
        if j < len(keys) and keys[j] == x:
            return self._at(node[x], level + 1, q)
        if j == 0 or j == len(keys):  # outside the grid along this dimension: carry the edge by the proxy
            edge = keys[0] if j == 0 else keys[-1]
            at_edge = _with(q, level, edge)
            inner = self._at(node[edge], level + 1, at_edge)
            reach = max((x + 1) / (edge + 1), (edge + 1) / (x + 1))
            return Lookup(inner.seconds * (self.proxy(q) / self.proxy(at_edge)), max(reach, inner.reach))
        lo, hi = keys[j - 1], keys[j]
        a, b = self._at(node[lo], level + 1, _with(q, level, lo)), self._at(node[hi], level + 1, _with(q, level, hi))
        w = (math.log1p(x) - math.log1p(lo)) / (math.log1p(hi) - math.log1p(lo))
        seconds = math.exp((1 - w) * math.log(a.seconds) + w * math.log(b.seconds))
        return Lookup(seconds, max(a.reach, b.reach))


def _with(q: tuple[float, ...], level: int, x: float) -> tuple[float, ...]:
    return (*q[:level], x, *q[level + 1:])

