"""`sim energy ...`: GPU frequency plans on the iteration time–energy frontier."""

from __future__ import annotations

import typer

app = typer.Typer(help="GPU frequency plans on the time-energy frontier (Perseus).",
                  no_args_is_help=True)
