"""`sim pareto`: which mix of rentable GPUs trains a model fastest for the money.

Sweeps cluster compositions (``--gpus A100-SXM4-40GB:0..8x8 A10:0..8x4``: 0 to 8 nodes of
each), plans each with the heterogeneous planner on the Oracle (worker processes, progress bar
on stderr), prints the table with the cost–throughput Pareto front marked, and with ``--out``
writes ``pareto.csv`` and ``pareto.html``. With ``--tokens`` it also names the cheapest
composition that meets ``--deadline-days`` and the fastest within ``--budget-usd``; a limit
that no composition meets exits 1 with how close the best came, and so does a sweep in which no
composition has a plan at all (the table and files are still written).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from trainsim import api
from trainsim.commands.output import check_out_dir, counting_bar, user_errors
from trainsim.search.hetero.objectives import check_limits, limit_miss, parse_prices, run_totals
from trainsim.search.hetero.pareto import ParetoPoint, format_table, write_html, write_table
from trainsim.search.hetero.sweep import beats_halves, compositions, parse_range
from trainsim.search.planner import check_global_batch
from trainsim.search.sweep.executors import default_workers

OUTPUT_FILES = ("pareto.csv", "pareto.html")
MAX_WORKERS = 256

_GPUS = typer.Option(..., "--gpus", help="GPU:LO..HIxG ranges, e.g. --gpus A100-SXM4-40GB:0..8x8 "
                     "A10:0..8x4 (LO to HI nodes of G GPUs; repeat --gpus or list them after it).")
_MORE = typer.Argument(None, help="More GPU ranges (the ones listed after --gpus).",
                       show_default=False)


@user_errors
def pareto_command(
    more: list[str] | None = _MORE,
    model: str = typer.Option(..., "--model", help="Zoo model name or model file."),
    gpus: list[str] = _GPUS,
    global_batch: int = typer.Option(..., "--global-batch", help="Samples per iteration."),
    out: Path | None = typer.Option(None, "--out", help="Folder for pareto.csv and "
                                    "pareto.html."),
    price: list[str] | None = typer.Option(None, "--price", help="GPU=USD per GPU-hour, "
                                           "overriding the catalog (repeatable)."),
    tokens: float | None = typer.Option(None, "--tokens", help="Tokens the run trains on "
                                        "(for --deadline-days / --budget-usd and totals)."),
    deadline_days: float | None = typer.Option(None, "--deadline-days",
                                               help="Pick the cheapest composition that "
                                               "trains --tokens within this many days."),
    budget_usd: float | None = typer.Option(None, "--budget-usd", help="Pick the fastest "
                                            "composition that trains --tokens within this "
                                            "many dollars."),
    workers: int = typer.Option(0, "--workers", help="Worker processes (0: one per CPU)."),
    time_budget_s: float = typer.Option(30.0, "--time-budget-s",
                                        help="Search seconds per composition."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing outputs."),
) -> None:
    """Plan every cluster composition in the ranges; print and write the cost–throughput
    Pareto front."""
    ranges_text = [*gpus, *(more or [])]
    ranges = [parse_range(g) for g in ranges_text]
    specs = compositions(ranges)
    prices = parse_prices(price)
    check_limits(tokens, budget_usd, deadline_days)
    check_global_batch(global_batch)
    if not 0 < time_budget_s <= 86_400:
        raise typer.BadParameter("must be > 0 and at most a day (86400)",
                                 param_hint="--time-budget-s")
    if not 0 <= workers <= MAX_WORKERS:
        raise typer.BadParameter(f"must be 0 (one per CPU) to {MAX_WORKERS}",
                                 param_hint="--workers")
    known = {r.gpu for r in ranges}
    for name in prices:
        if name not in known:
            raise typer.BadParameter(f"{name!r} is not one of the swept GPUs "
                                     f"({', '.join(sorted(known))})", param_hint="--price")
    check_out_dir(out, OUTPUT_FILES, force)  # a folder that cannot be made fails here
    spec = api.load_model(model)  # a bad model fails here, before the sweep
    n_workers = workers if workers > 0 else default_workers()
    finished: list[ParetoPoint] = []
    with counting_bar("pareto", total=len(specs)) as tick:

        def done(point: ParetoPoint) -> None:
            finished.append(point)
            tick(len(finished), None, point.composition)

        points = api.pareto(spec, ranges_text, global_batch=global_batch, prices=prices,
                            workers=n_workers, time_budget_s=time_budget_s, on_done=done)
    title = (f"{spec.name}, global batch {global_batch}: {len(points)} compositions "
             f"({sum(p.has_plan for p in points)} with a plan)")
    Console().print(format_table(points, title=title))
    for mixed, halves in beats_halves(points):
        typer.echo(f"mixed {mixed.composition} costs ${mixed.usd_per_1m_tokens:.4f} per 1M "
                   f"tokens, below each of its halves ("
                   + ", ".join(f"{h.composition} ${h.usd_per_1m_tokens:.4f}" for h in halves)
                   + ")")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_table(points, out / "pareto.csv")
        write_html(points, out / "pareto.html", title)
        typer.echo(f"wrote {out / 'pareto.csv'}, {out / 'pareto.html'}")
    if not any(p.has_plan for p in points):
        typer.echo(f"error: none of the {len(points)} compositions has a plan that fits "
                   f"(global batch {global_batch}); try larger compositions", err=True)
        raise typer.Exit(1)
    if tokens is not None:
        _pick(points, tokens, deadline_days, budget_usd)


def _pick(points: list[ParetoPoint], tokens: float, deadline_days: float | None,
          budget_usd: float | None) -> None:
    """Print what the limits choose; exit 1 with the nearest miss when nothing meets them."""
    rows = [(p, run_totals(tokens, p.tokens_per_s or 0.0, p.usd_per_hour))
            for p in points if p.has_plan]
    if not rows:
        typer.echo("error: no composition has a plan that fits", err=True)
        raise typer.Exit(1)
    meets = [(p, t) for p, t in rows if limit_miss(t, budget_usd, deadline_days) is None]
    if deadline_days is None and budget_usd is None:
        p, t = min(rows, key=lambda r: r[1].usd)
        typer.echo(f"cheapest: {p.composition}: {t.describe()}")
        return
    if not meets:
        key = (lambda r: r[1].days) if deadline_days is not None else (lambda r: r[1].usd)
        p, t = min(rows, key=key)
        typer.echo(f"error: no composition meets the limits; the closest, {p.composition}, "
                   f"{limit_miss(t, budget_usd, deadline_days)}", err=True)
        raise typer.Exit(1)
    if deadline_days is not None:
        p, t = min(meets, key=lambda r: (r[1].usd, r[1].days))
        typer.echo(f"cheapest within {deadline_days:g} days: {p.composition}: {t.describe()}")
    if budget_usd is not None:
        p, t = min(meets, key=lambda r: (r[1].days, r[1].usd))
        typer.echo(f"fastest within ${budget_usd:,.0f}: {p.composition}: {t.describe()}")


__all__ = ["OUTPUT_FILES", "pareto_command"]
