"""`mailroom delivery …`: operator commands for the delivery pipeline."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="Operate the delivery pipeline.")
