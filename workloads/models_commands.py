"""`sim models ...`: inspect the model zoo and user models."""

from __future__ import annotations

import typer

app = typer.Typer(help="Models in the zoo and user models (YAML, config.json).", no_args_is_help=True)
