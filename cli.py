"""The ``cdbsim`` command line: the app, with the command groups of :mod:`commands` on it."""

from __future__ import annotations

import typer

from commands import gpu, planner, study
from commands.common import OneLineErrors

app = typer.Typer(cls=OneLineErrors, add_completion=False, rich_markup_mode=None,
                  help="Predict and measure serving throughput and latency of looped language models "
                       "under Continuous Depth Batching.")


@app.callback(invoke_without_command=True)
def _no_command(context: typer.Context) -> None:
    """``cdbsim`` alone prints its help (not a usage error: nothing was asked for)."""
    if context.invoked_subcommand is None:
        typer.echo(context.get_help())
        raise typer.Exit(0)


for module in (study, planner, gpu):
    module.group.register(app)

if __name__ == "__main__":  # pragma: no cover - python -m cli
    app()
