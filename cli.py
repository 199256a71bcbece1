"""The `sim` command: a thin typer front end over trainsim's Python API (`trainsim.api`).

Each command group is a module of `commands/` that parses options, checks output paths, calls
the API and renders the result. Any `TrainsimError` becomes one line on stderr and exit code 2,
never a traceback. Heavy libraries (numba, pandas, plotly, torch) load only when a command
needs them, so `sim --help` stays fast.
"""

from __future__ import annotations

import os
import sys

import typer

from trainsim.commands.accuracy import accuracy_command
from trainsim.commands.calibrate import app as calibrate_app
from trainsim.commands.energy import app as energy_app
from trainsim.commands.hw import app as hw_app
from trainsim.commands.microbatch import microbatch_command
from trainsim.commands.models import app as models_app
from trainsim.commands.output import EXIT_BAD_INPUT, error_line, one_line
from trainsim.commands.pareto import pareto_command
from trainsim.commands.search import search_command
from trainsim.commands.simulate import simulate_command
from trainsim.commands.sweep import app as sweep_app
from trainsim.commands.validate import register as register_validation
from trainsim.errors import TrainsimError
from trainsim.simulator.malloc_tuning import keep_freed_memory
from trainsim.workloads.plan_file import TRAINSIM_VERSION

app = typer.Typer(
    name="sim",
    help="trainsim: simulate distributed deep-learning training before renting GPUs.\n\n"
         "Exit codes: 0 ok; 1 a search found no plan that fits, or `sim validate` exceeded "
         "--max-error; 2 bad input (one line naming it); 3 the plan does not fit in memory.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trainsim {TRAINSIM_VERSION}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version,
                                          is_eager=True, help="Print the version and exit.")
             ) -> None:
    """trainsim: simulate distributed deep-learning training before renting GPUs."""


app.add_typer(hw_app, name="hw")
app.add_typer(models_app, name="models")
app.command("simulate")(simulate_command)
app.add_typer(energy_app, name="energy")
app.command("search")(search_command)
app.command("pareto")(pareto_command)
app.add_typer(sweep_app, name="sweep")
app.command("microbatch")(microbatch_command)
app.add_typer(calibrate_app, name="calibrate")
register_validation(app)
app.command("accuracy")(accuracy_command)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turning user errors into exit code 2."""
    if not sys.stdout.isatty():
        # Piped output: rich would fall back to 80 columns and cut names ("A10…"); widen it.
        os.environ.setdefault("COLUMNS", "200")
    keep_freed_memory()  # large programs' arrays reused, not faulted in afresh (malloc_tuning)
    try:
        code = app(args=argv, standalone_mode=False)
    except typer.TyperException as exc:
        # A usage error (bad option value, unknown command): one line, not a panel. (`sim`
        # alone shows the help and ends here with an empty message.)
        message = exc.format_message()
        if message:
            typer.echo(f"error: {one_line(message)} (see sim --help)", err=True)
        raise SystemExit(getattr(exc, "exit_code", EXIT_BAD_INPUT)) from None
    except typer.Abort:
        typer.echo("aborted", err=True)
        raise SystemExit(1) from None
    except (TrainsimError, OSError, UnicodeDecodeError) as exc:
        # A backstop: commands turn user errors into one line themselves (user_errors).
        line = error_line(exc)
        if line is None:
            raise
        typer.echo(f"error: {one_line(line)}", err=True)
        raise SystemExit(EXIT_BAD_INPUT) from None
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
