"""cdbsim: serving throughput and latency of looped language models under Continuous Depth Batching.

Pure Python (numpy, scipy, pandas, simpy; never torch). The public names load on first use::

    import cdbsim

    result = cdbsim.predict(cdbsim.Experiment(workload={"name": "alpaca", "requests": 100}), baseline=True)
    cdbsim.sweep(exp, grid={"serve.width": [16, 64, 256]})             # one row per point (a DataFrame)
    cdbsim.capacity(exp, tpot_s=0.05, policies=["cb", "refill"])       # the highest rate within the SLOs
"""

from __future__ import annotations

import importlib
from typing import Any

from cdbsim import native

__version__ = "0.1.0"
native.guard()  # the compiled hot modules only while they match their source (cdbsim/native.py)

_LAZY = {  # public name -> the module that defines it
    "Experiment": "cdbsim.planner.experiment",
    "BuiltExperiment": "cdbsim.planner.experiment",
    "ConfigError": "cdbsim.errors",
    "Prediction": "cdbsim.planner.study",
    "predict": "cdbsim.planner.study",
    "sweep": "cdbsim.planner.sweep",
    "capacity": "cdbsim.planner.capacity",
    "SLO": "cdbsim.planner.capacity",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'cdbsim' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
