"""`sim sweep`: what-if sweeps of models × clusters × plans or planners × knobs.

`sim sweep SPEC.yaml --out TABLE.parquet` runs every scenario of the spec (search/sweep/spec.py
has the schema; `sim sweep example` runs a built-in one) on local worker processes, or on Ray
with `--executor ray [--address auto|HOST:PORT]`, with a progress bar on stderr, and writes one
Parquet table with a row per scenario, failed ones included. Rerunning the same command
resumes: the rows in the table are kept and only the missing scenarios run (Ctrl-C saves the
finished rows); `--force` starts over. `sim sweep report TABLE.parquet --out page.html` writes
the plotly dashboard.

`sim sweep SPEC` is short for `sim sweep run SPEC`: the group routes a first word that is not
one of its commands (`run`, `report`) to `run`, so a spec file named `report` needs a path
(`./report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from trainsim import api
from trainsim.commands.output import check_new_file, counting_bar, fail, user_errors

EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), once the finished rows are saved."""


class SweepGroup(TyperGroup):
    """A group whose first word, when not one of its commands, is the `run` command's SPEC."""

    # Context and Command are typer's vendored click's (typer._click), hence Any here.
    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "run", self.commands["run"], args
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=SweepGroup, no_args_is_help=True,
    help="What-if sweeps: models × clusters × plans or planners × knobs into one Parquet "
         "table (resumable).\n\n`sim sweep SPEC.yaml --out TABLE.parquet` is short for `sim "
         "sweep run SPEC.yaml ...`; `sim sweep report TABLE.parquet --out page.html` draws "
         "it. `sim sweep example` runs a built-in 48-scenario spec.")

_SPEC = typer.Argument(..., help="Sweep spec YAML (models, clusters, plans or planners, "
                       "knobs), or 'example' for the built-in one.", show_default=False)
_OUT = typer.Option(Path("sweep.parquet"), "--out", help="The Parquet table. An existing "
                    "table is resumed: only missing scenarios run.")
_EXECUTOR = typer.Option("local", "--executor", help="local (worker processes) or ray.")
_ADDRESS = typer.Option(None, "--address", help="With --executor ray: auto (the cluster "
                        "`ray start` made here) or HOST:PORT of a Ray head; none starts a "
                        "local Ray instance.")
_WORKERS = typer.Option(None, "--workers", help="Worker processes (local) or CPUs of a local "
                        "Ray instance; default (or 0) one per CPU.", show_default=False)
_LIMIT = typer.Option(None, "--limit", help="Run at most this many missing scenarios, then "
                      "stop (rerun to continue).", show_default=False)
_FORCE = typer.Option(False, "--force", help="Start over: replace an existing table.")
_DROP_STALE = typer.Option(False, "--drop-stale", help="Drop the table's rows of scenarios "
                           "the spec no longer has, and resume (without it such a table is "
                           "refused).")


@app.command("run")
@user_errors
def run_command(spec: str = _SPEC, out: Path = _OUT, executor: str = _EXECUTOR,
                address: str | None = _ADDRESS, workers: int | None = _WORKERS,
                limit: int | None = _LIMIT, force: bool = _FORCE,
                drop_stale: bool = _DROP_STALE) -> None:
    """Run every scenario of SPEC missing from the table, and write the table."""
    check_new_file(out, True, "--out")
    with counting_bar("sweep") as bar:

        def tick(done: int, total: int) -> None:
            bar(done, total, "scenarios")

        run = api.sweep(spec, out, executor=executor, address=address, workers=workers,
                        force=force, limit=limit, drop_stale=drop_stale, on_progress=tick)
    reused = f", {run.skipped} already in the table" if run.skipped else ""
    dropped = f"; dropped {run.dropped} rows no longer in the spec" if run.dropped else ""
    typer.echo(f"sweep: {run.computed} scenarios computed{reused}{dropped}; "
               f"{run.rows} of {run.total} rows, {run.failed} failed ({run.oom} out of memory)")
    typer.echo(f"wrote {run.path}")
    if run.interrupted:
        typer.echo(f"interrupted: {run.total - run.rows} scenarios left; rerun the same "
                   f"command to finish them", err=True)
        raise typer.Exit(EXIT_INTERRUPTED)
    if not run.finished:
        typer.echo(f"stopped after --limit {limit}: {run.total - run.rows} scenarios left; "
                   f"rerun to continue")


@app.command("report")
@user_errors
def report_command(
    table: Path = typer.Argument(..., help="A sweep table (sim sweep --out).",
                                 show_default=False),
    out: Path | None = typer.Option(None, "--out", help="The HTML page (default: the table's "
                                    "name with .html).", show_default=False),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing page."),
) -> None:
    """Write a self-contained plotly dashboard of a sweep table: throughput, $ and energy per
    token against each knob, Pareto points marked."""
    if out is None and not table.name:
        fail(f"{str(table)!r} is not a sweep table; give a .parquet file")
    page = out if out is not None else table.with_suffix(".html")
    if page.resolve() == table.resolve():
        fail(f"--out {str(page)!r} is the table itself; give an .html path")
    check_new_file(page, force, "--out")
    written = api.sweep_report(table, page)
    typer.echo(f"wrote {written}")


__all__ = ["SweepGroup", "app", "report_command", "run_command"]
