"""What every command shares: one-line errors, options generated from the experiment fields, and tables, JSON
or CSV on stdout."""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from cdbsim.errors import ConfigError, require
from cdbsim.planner.experiment import Experiment, read_toml, settings
from cdbsim.planner.options import Setting, plain, unwrap_optional

try:
    from typer import TyperException as UsageFailure  # typer >= 0.2x parses with its own copy of click
except ImportError:  # pragma: no cover - older typer: click's exceptions
    from click import ClickException as UsageFailure


def error_line(message: str) -> None:
    """Print ``error: message`` as one line on stderr (newlines in a message are folded)."""
    Console(stderr=True).print(f"error: {' '.join(str(message).split())}", markup=False, highlight=False,
                               soft_wrap=True)


def refuse_empty_values(argv: list[str]) -> None:
    """Refuse an option given an empty value (``--out=``, ``--out ''``): a slip that would make a path ``.``."""
    for i, token in enumerate(argv):
        option, eq, value = token.partition("=")
        if token.startswith("--") and eq and not value:
            raise UsageFailure(f"{option}: empty value")
        if token == "" and i > 0 and argv[i - 1].startswith("--") and "=" not in argv[i - 1]:
            raise UsageFailure(f"{argv[i - 1]}: empty value")


def similar_options(name: str, options: list[str], most: int = 3) -> list[str]:
    """The options ``name`` (an unknown one) most likely meant: those containing it or contained in it (``--rate``:
    ``--target-rate``), and near spellings (``--widht``: ``--width``), closest first."""
    word = name.lstrip("-").lower()

    def score(option: str) -> float:
        other = option.lstrip("-").lower()
        if len(word) >= 3 and (word in other or (len(other) >= 3 and other in word)):
            return 1.0 + min(len(word), len(other)) / max(len(word), len(other))
        same_start = word[:1] == other[:1]
        return difflib.SequenceMatcher(None, word, other).ratio() if same_start else 0.0

    scored = sorted(((score(o), o) for o in dict.fromkeys(options)), key=lambda pair: -pair[0])
    return [option for value, option in scored if value >= 0.75][:most]


def usage_message(exc: Exception) -> str:
    """click's usage error as one line; an unknown option suggests the command's options it most resembles
    (click's own guesses are near spellings only: ``--rate`` got ``--core, --style``)."""
    name, context = getattr(exc, "option_name", None), getattr(exc, "ctx", None)
    if not (hasattr(exc, "possibilities") and name and context is not None):
        return exc.format_message()  # type: ignore[attr-defined]
    options = [o for p in context.command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
    close = similar_options(name, options)
    hint = f"did you mean {' or '.join(close)}?" if close else f"see {context.command_path} --help"
    return f"No such option: {name}; {hint}"


class OneLineErrors(TyperGroup):
    """The command group, printing click's own usage errors (an option that does not parse, a missing value,
    an unknown option) as the same one-line ``error: ...`` with exit code 2 as every other bad input."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            refuse_empty_values(list(kwargs.get("args") or (args[0] if args else None) or sys.argv[1:]))
            code = super().main(*args, standalone_mode=False, **kwargs)
        except UsageFailure as exc:
            error_line(usage_message(exc))
            sys.exit(2)
        except typer.Abort:
            error_line("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def friendly(command: Callable) -> Callable:
    """Turn bad-input exceptions into a one-line error with exit code 2, and refuse options that exclude
    each other (``--json`` with ``--csv``) before the command does any work."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            require(not (kwargs.get("as_json") and kwargs.get("as_csv")), "give --json or --csv, not both")
            return command(*args, **kwargs)
        except ConfigError as exc:
            message = str(exc)
        except ImportError as exc:
            message = f"{exc}; install the GPU extra: pip install 'cdbsim[gpu]'"
        except OSError as exc:  # a disk that fills or a path that vanishes mid-run: nothing half-written stays
            message = f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}"
        except MemoryError:
            message = "ran out of memory; use fewer requests (-n) or a smaller model"
        error_line(message)
        raise typer.Exit(2)

    return wrapper


def comma_list(text: str, option: str) -> list[str]:
    """The names of a comma-separated option, blanks dropped; none at all (``--policies ,``) is an error."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    require(bool(names), f"{option}: no names in {text!r}; give one or more, separated by commas")
    return names


STUDY = ("arch", "serve", "workload", "exits", "latency")  # the sections of a command that simulates
RATE_SEARCHED = ("serve.policy", "workload.rate", "workload.trace")  # fields rate-sweep and capacity set themselves
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", metavar="FILE.toml",
    help="An experiment TOML file ([arch], [serve], [workload], [exits], [latency]); flags override it.")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", metavar="SECTION.FIELD=VALUE",
    help="Set any experiment field, e.g. serve.width=128 (repeatable; overrides --config and flags).")]
EXPLICIT = ("COMMANDLINE", "ENVIRONMENT")  # where a value the user gave comes from (click's ParameterSource)


def _parameter(setting: Setting, default: Any) -> inspect.Parameter:
    """A command parameter for one experiment field: its flags, help and the command's default. Enum
    fields take text (the experiment parses it, with aliases and a one-line error listing the choices)."""
    hint = setting.hint
    base, optional = unwrap_optional(hint)
    if isinstance(base, type) and issubclass(base, Enum):
        hint, default = (str | None) if optional else str, plain(default)
    option = typer.Option(*setting.flags, help=setting.help)
    return inspect.Parameter(setting.param, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[hint, option])


@dataclass(frozen=True)
class FileTables:
    """Tables of an experiment file that a command reads itself (``[grid]``), and the file's name."""

    source: str | None
    tables: dict[str, Any]


def experiment_options(*selected: str, exclude: tuple[str, ...] = (),
                       defaults: Mapping[str, Any] | None = None,
                       tables: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Give a command the options of the experiment fields ``selected`` (a section, ``"serve"``, or a field,
    ``"serve.width"``, minus ``exclude``) plus ``--config`` and ``--set``, and call it with the :class:`Experiment`
    as ``exp``. Precedence: ``defaults`` (the command's own) < config file < flags < --set. ``tables`` of the config
    file (``[grid]``) are passed as ``tables``; a ``given`` parameter gets the ``section.field`` keys the user set."""
    chosen = [s for s in settings() if (s.section in selected or s.key in selected) and s.key not in exclude]
    defaults = dict(defaults or {})
    passed = ("exp", "tables", "given")

    def decorate(command: Callable) -> Callable:
        accepted = inspect.signature(command).parameters
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in inspect.signature(command, eval_str=True).parameters.values() if p.name not in passed]
        generated = [_parameter(s, defaults.get(s.key, s.default)) for s in chosen]
        extra = [inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ConfigOpt),
                 inspect.Parameter("assignments", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=SetOpt),
                 inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            config, assignments, context = kwargs.pop("config"), kwargs.pop("assignments"), kwargs.pop("context")
            flags: dict[str, Any] = {}
            for s in chosen:
                value, source = kwargs.pop(s.param), context.get_parameter_source(s.param)
                if source is not None and source.name in EXPLICIT:
                    flags[s.key] = value
            data = read_toml(config) if config is not None else {}
            own_tables = {name: data.pop(name) for name in tables if name in data}
            exp = Experiment().override(defaults).merge(data, source=str(config))
            exp = exp.override(flags, source=None).override(assignments or [])
            given = {*flags, *(f"{section}.{name}" for section, values in data.items()
                               if isinstance(values, Mapping) for name in values),
                     *(a.partition("=")[0].strip() for a in assignments or [])}
            exp.refuse_unused(given)
            if "given" in accepted:
                kwargs["given"] = frozenset(given)
            if tables:
                kwargs["tables"] = FileTables(str(config) if config is not None else None, own_tables)
            return command(exp=exp, **kwargs)

        parameters = [*generated, *extra, *own]
        wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper

    return decorate


class CommandGroup:
    """The commands of one module, put on the app by :meth:`register` in the order they are defined."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, Callable]] = []

    def command(self, name: str, *fields: str, **options: Any) -> Callable[[Callable], Callable]:
        """Declare the command ``name``: :func:`friendly`, and :func:`experiment_options` of ``fields``, if any."""

        def decorate(function: Callable) -> Callable:
            wrapped = friendly(experiment_options(*fields, **options)(function) if fields else function)
            self.commands.append((name, wrapped))
            return wrapped

        return decorate

    def register(self, app: typer.Typer) -> None:
        for name, function in self.commands:
            app.command(name)(function)


console = Console(width=None if sys.stdout.isatty() else 150)
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
CsvOut = Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")]


def json_ready(value: Any) -> Any:
    """``value`` with every NaN or infinite number as None (``null``: strict JSON has no NaN)."""
    if isinstance(value, Mapping):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, float | int) and not isinstance(value, bool):
        return value if math.isfinite(value) else None
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy number
        return json_ready(value.item())
    return value


def json_text(document: Any, default: Callable[[Any], Any] = float) -> str:
    """``document`` as strict JSON (NaN written ``null``), indented, with a newline."""
    return json.dumps(json_ready(document), indent=2, default=default, allow_nan=False) + "\n"


def emit(rows: Any, title: str, as_json: bool = False, as_csv: bool = False, caption: str | None = None) -> None:
    """Print ``rows`` (a list of dicts; with ``as_json`` any JSON document) as a rich table, JSON or CSV."""
    if as_json:
        sys.stdout.write(json_text(rows))
        return
    if as_csv:
        import pandas as pd

        sys.stdout.write(pd.DataFrame(rows).to_csv(index=False))
        return
    table = Table(title=title, caption=caption)
    for key in rows[0] if rows else []:
        table.add_column(key, justify="right" if isinstance(rows[0][key], int | float) else "left")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    console.print(table)


def emit_data(as_json: bool, as_csv: bool, rows: list[dict], document: Any) -> bool:
    """With ``--json`` print ``document``, with ``--csv`` ``rows``; whether either was asked for."""
    if as_json or as_csv:
        emit(rows if as_csv else document, "", as_json, as_csv)
    return as_json or as_csv


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)

