"""Errors for bad user input (one line, exit code 2 in the CLI); see :mod:`traces.errors`."""

from traces.errors import InputError as ConfigError
from traces.errors import read_json, read_text, require, unknown

__all__ = ["ConfigError", "read_json", "read_text", "require", "unknown"]
