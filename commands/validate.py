"""`sim profile`, `sim trace`, `sim validate`: measure reality and the simulator's error.

`register(app)` adds the commands to the `sim` app (cli.py). torch is imported by the
validation modules only when a run starts, so `sim --help` stays fast. Bad input (a file of the wrong
format, a truncated file, an unknown model) raises a TrainsimError, which cli.main turns into
one line and exit code 2; `sim validate` exits 1 when the iteration-time error exceeds
``--max-error``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from trainsim import api
from trainsim.commands.output import check_new_file, echo_json, user_errors
from trainsim.validate.compare import format_report
from trainsim.validate.overlay_plot import write_overlay_html


@user_errors
def profile_command(
    device: str = typer.Option("cpu", "--device", help="cpu (gloo) or cuda (NCCL, one GPU "
                               "per process)."),
    out: Path = typer.Option(Path("profile.csv"), "--out", "-o", help="Profile database (CSV)."),
    model: str = typer.Option("tiny-gpt", "--model", "-m", help="Model(s) whose op shapes to "
                              "time, comma-separated (tiny-gpt,tiny-t5)."),
    micro_batch: int = typer.Option(2, "--micro-batch", help="Micro-batch size of the shapes."),
    processes: int = typer.Option(2, "--processes", help="Worker processes (and collective "
                                  "group size)."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed calls before each measurement."),
    repeats: int = typer.Option(10, "--repeats", help="Timed calls per measurement."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing database."),
) -> None:
    """Time the zoo's op kinds and the collectives on this machine into a profile database."""
    api.check_device(device)
    check_new_file(out, force)
    db = api.profile_ops(model, micro_batch_size=micro_batch, processes=processes, warmup=warmup,
                     repeats=repeats, device=device)
    db.save(out, force=force)
    where = db.meta.get("gpu_name") or db.meta.get("cpu_model")
    typer.echo(f"wrote {out}: {len(db.rows)} measurements ({len(db.collectives())} "
               f"collectives) on {where}")


@user_errors
def trace_command(
    model: str = typer.Option("tiny-gpt", "--model", "-m", help="Validation or zoo model."),
    plan: str = typer.Option("dp2", "--plan", "-p", help="dp2, pp2, tp2 or dp=N,tp=N,pp=N."),
    device: str = typer.Option("cpu", "--device", help="cpu (gloo) or cuda (NCCL, one GPU "
                               "per process)."),
    micro_batch: int = typer.Option(2, "--micro-batch", help="Micro-batch size."),
    micro_batches: int | None = typer.Option(None, "--micro-batches",
                                             help="Micro-batches per iteration (2·pp)."),
    iterations: int = typer.Option(10, "--iterations", help="Measured iterations."),
    warmup: int = typer.Option(3, "--warmup", help="Warm-up iterations (not measured)."),
    out: Path = typer.Option(Path("trace.json"), "--out", "-o", help="Trace file (JSON)."),
    import_path: Path | None = typer.Option(None, "--import", help="Convert this Kineto / "
                                            "torch.profiler Chrome trace instead of running."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing trace."),
) -> None:
    """Run real training iterations with a parallel plan and record a trace."""
    api.check_device(device)
    check_new_file(out, force)
    command = "sim trace " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else ""
    trace = api.record_trace(model, plan, micro_batch_size=micro_batch,
                             num_micro_batches=micro_batches, iterations=iterations,
                             warmup=warmup, device=device, import_path=import_path,
                             command=command)
    trace.save(out, force=force)
    typer.echo(f"wrote {out}: median iteration {1e3 * trace.iteration_time_s:.2f} ms over "
               f"{len(trace.iteration_times_s)} iteration(s)")


@user_errors
def validate_command(
    trace: Path = typer.Argument(..., help="Measured trace (sim trace)."),
    profile: Path | None = typer.Option(None, "--profile", help="Profile database; default "
                                        "profile.csv beside the trace."),
    max_error: float | None = typer.Option(None, "--max-error", min=0.0, help="Exit 1 when |iteration "
                                           "time error| exceeds this fraction (0.05 = 5%)."),
    html: Path | None = typer.Option(None, "--html", help="Write the overlay timeline."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    engine: str = typer.Option("numba", "--engine", help="numba or simpy."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --html file."),
) -> None:
    """Simulate a trace's plan with the profiled cost model and print predicted vs measured."""
    check_new_file(html, force)
    measured, result = api.validate(trace, profile, engine=engine)
    if html is not None:
        write_overlay_html(measured, result, html)
    if as_json:
        echo_json(result.to_dict(), sort_keys=True)
    else:
        typer.echo(format_report(result))
    if max_error is not None and abs(result.iteration_time_error) > max_error:
        if not as_json:
            typer.echo(f"iteration-time error {100 * result.iteration_time_error:+.3g}% exceeds "
                       f"--max-error {100 * max_error:.3g}%", err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the validation commands to `app`."""
    app.command("profile")(profile_command)
    app.command("trace")(trace_command)
    app.command("validate")(validate_command)
