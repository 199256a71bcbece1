"""`sim hw ...`: inspect the hardware catalog and clusters."""

from __future__ import annotations

import typer

app = typer.Typer(help="GPUs, nodes, NICs and clusters in the hardware catalog.", no_args_is_help=True)
