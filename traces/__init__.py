"""Inputs of a serving run: requests (prompt length, output length, arrival) and per-token exit depths.

No torch here: traces are read, built and written with numpy, scipy and pandas only.
"""

from traces.build import build_trace
from traces.errors import InputError
from traces.exits import EXIT_MODELS, ExitModel
from traces.io import read_trace, write_trace
from traces.request import Request, total_output_tokens
from traces.workloads import WORKLOADS, length_model

__all__ = ["EXIT_MODELS", "WORKLOADS", "ExitModel", "InputError", "Request", "build_trace",
           "length_model", "read_trace", "total_output_tokens", "write_trace"]
