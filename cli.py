"""The `sim` command: a thin typer front end over trainsim's Python API.

Each command group lives next to the code it drives (`hwmodels/hw_commands.py`,
`workloads/models_commands.py`, ...) and only loads inputs, calls one API function and renders
the result. Any `TrainsimError` becomes one line on stderr and exit code 2, never a traceback.
Heavy imports (numba, pandas, plotly) happen inside commands so `sim --help` stays fast.
"""

from __future__ import annotations

import os
import sys

import typer

from trainsim.errors import TrainsimError
from trainsim.hwmodels.hw_commands import app as hw_app
from trainsim.search.energy_commands import app as energy_app
from trainsim.search.search_commands import search_command
from trainsim.simulator.simulate_command import simulate_command
from trainsim.validate.commands import register as register_validation
from trainsim.workloads.models_commands import app as models_app

app = typer.Typer(
    name="sim",
    help="trainsim: simulate distributed deep-learning training before renting GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(hw_app, name="hw")
app.add_typer(models_app, name="models")
app.command("simulate")(simulate_command)
app.add_typer(energy_app, name="energy")
app.command("search")(search_command)
register_validation(app)


def fail(message: str) -> None:
    """Print one error line to stderr and exit with code 2."""
    typer.echo(f"error: {message}", err=True)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turning user errors into exit code 2."""
    if not sys.stdout.isatty():
        # Piped output: rich would fall back to 80 columns and cut names ("A10…"); widen it.
        os.environ.setdefault("COLUMNS", "200")
    try:
        app(args=argv, standalone_mode=True)
    except TrainsimError as exc:
        fail(str(exc))
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        fail(f"{exc.strerror}: {exc.filename}")
    except UnicodeDecodeError as exc:
        # A binary or wrongly encoded input file: readers open text as UTF-8.
        fail(f"an input file is not UTF-8 text ({exc.reason} at byte {exc.start})")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
