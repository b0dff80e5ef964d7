"""Inputs of a serving run: requests (prompt length, output length, arrival) and per-token exit depths. No torch;
names load on first use (PEP 562), so ``import traces`` costs numpy alone."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traces.build import build_trace
    from traces.errors import InputError
    from traces.exits import EXIT_MODELS, ExitModel
    from traces.io import read_trace, write_trace
    from traces.request import Request
    from traces.workloads import WORKLOADS, length_model

_HOME = {"build_trace": "traces.build", "InputError": "traces.errors", "EXIT_MODELS": "traces.exits",
         "ExitModel": "traces.exits", "read_trace": "traces.io", "write_trace": "traces.io",
         "Request": "traces.request", "WORKLOADS": "traces.workloads", "length_model": "traces.workloads"}

__all__ = ["EXIT_MODELS", "WORKLOADS", "ExitModel", "InputError", "Request", "build_trace", "length_model",
           "read_trace", "write_trace"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'traces' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
