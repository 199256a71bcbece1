"""`sim profile`, `sim trace`, `sim validate`: measure reality and the simulator's error.

`register(app)` adds the commands to the `sim` app (cli.py).
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the validation commands to `app`."""
