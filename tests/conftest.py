"""Shared test helpers: tiny architectures and request builders."""

from __future__ import annotations

import numpy as np
import pytest

from cdbsim.model.arch import ArchSpec, LayerShape
from traces import Request


def tiny_arch(r_max: int = 4, prelude: int = 0, coda: int = 0, style: str = "ouro") -> ArchSpec:
    layer = LayerShape(hidden=64, intermediate=128, heads=4, kv_heads=4, head_dim=16, style=style)
    return ArchSpec(name=f"tiny-{style}", layer=layer, vocab=97, prelude=prelude, core=2, coda=coda,
                    r_max=r_max, tied_head=style == "huginn")


def make_requests(specs: list[tuple[int, int]], depths: list[list[int]] | None = None,
                  arrivals: list[float] | None = None) -> list[Request]:
    """Requests from (prompt_len, output_len) pairs; depths default to 1 per decoded token."""
    out = []
    for i, (p, o) in enumerate(specs):
        d = depths[i] if depths is not None else [1] * (o - 1)
        out.append(Request(i, p, o, arrivals[i] if arrivals else 0.0, np.asarray(d, dtype=np.int16)))
    return out


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
