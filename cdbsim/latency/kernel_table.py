"""One measured kernel's time over its shape: interpolation in log space, honest extrapolation.

A kernel table holds points ``[d_1, ..., d_n, t]`` measured on (most of) a rectilinear grid of its
dimensions: a GEMM's ``m, n, k``, an attention kernel's rows, heads, head size and context. A time between
grid points is interpolated piecewise-linearly in ``log t`` against ``log(1 + d)`` one dimension at a time
(sizes may be 0, as a prefill's cached prefix),
which is exact for power laws (a memory-bound kernel's time grows like its bytes) and follows the measured
kinks of a kernel that switches tiles. Dimensions that name a variant rather than a size (a layer style, a
kernel flavour) are matched exactly.

Outside the grid, or where the grid has a hole, the nearest measured value is carried over by an
analytic *proxy* of the kernel (its roofline time: bytes over bandwidth, FLOPs over matmul rate, plus a
launch): ``t(q) = t(edge) * proxy(q) / proxy(edge)``. Every lookup reports how far it had to go outside
the grid (the largest ratio between a query dimension and the nearest grid value; 1.0 inside), so a
prediction that rests on extrapolation says so.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Proxy = Callable[[tuple[float, ...]], float]


@dataclass
class Lookup:
    """A table's time for one query, and how far outside the measured grid it reached (1.0: inside)."""

    seconds: float
    reach: float = 1.0


@dataclass
class KernelTable:
    """Measured times of one kernel on a grid of ``dims``; ``exact`` names the dimensions matched exactly."""

    name: str
    dims: tuple[str, ...]
    points: list[list[float]]
    proxy: Proxy
    exact: frozenset[str] = frozenset()
    _tree: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError(f"kernel table {self.name} has no points")
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
            return self._carried(node, edge, level, q, reach=max((x + 1) / (edge + 1), (edge + 1) / (x + 1)))
        lo, hi = keys[j - 1], keys[j]
        a, b = self._at(node[lo], level + 1, _with(q, level, lo)), self._at(node[hi], level + 1, _with(q, level, hi))
        w = (math.log1p(x) - math.log1p(lo)) / (math.log1p(hi) - math.log1p(lo))
        seconds = math.exp((1 - w) * math.log(a.seconds) + w * math.log(b.seconds))
        return Lookup(seconds, max(a.reach, b.reach))

    def _carried(self, node: dict, edge: float, level: int, q: tuple[float, ...], reach: float) -> Lookup:
        at_edge = _with(q, level, edge)
        inner = self._at(node[edge], level + 1, at_edge)
        scale = self.proxy(q) / self.proxy(at_edge)
        return Lookup(inner.seconds * scale, max(reach, inner.reach))


def _with(q: tuple[float, ...], level: int, x: float) -> tuple[float, ...]:
    return (*q[:level], x, *q[level + 1:])


def grid_values(points: Sequence[Sequence[float]], dim: int) -> list[float]:
    """The distinct values of dimension ``dim`` among ``points``."""
    return sorted({float(p[dim]) for p in points})
