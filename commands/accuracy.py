"""`sim accuracy`: trainsim's predictions against published training runs.

Simulates every row of a published-runs CSV (default: the reference data's
published/training_runs.csv), prints predicted vs published per row, the error statistics per
GPU generation, framework, source and overall (throughput and peak memory apart), and the rows
trainsim cannot express yet with the reason; writes a predicted-vs-published scatter (`--plot`)
and optionally the same as JSON (`--json FILE`). Output paths are checked before any work; a
bad CSV path or content is one line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import typer

from trainsim import api
from trainsim.commands.output import check_new_file, counting_bar, dumps, print_table, user_errors
from trainsim.simulator.own_files import make_parent, mark_html
from trainsim.validate.published_runs import (
    MEMORY,
    REF_KINDS,
    THROUGHPUT,
    AccuracyReport,
    PublishedRun,
    result_rows,
    skipped_rows,
    stats_rows,
)

DIV_ID = "trainsim-accuracy"
_TITLES = {THROUGHPUT: "tokens/s per GPU", MEMORY: "peak memory (GiB)"}
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def write_scatter_html(report: AccuracyReport, path: Path) -> None:
    """Predicted vs published, one panel per kind (log axes, the y = x line), one colour per
    source; self-contained HTML with a fixed div id (same inputs, same file)."""
    import plotly.graph_objects as go  # deferred: start-up time (plotly)
    from plotly.subplots import make_subplots

    kinds = [k for k in REF_KINDS if any(r.run.ref_kind == k for r in report.results)] \
        or [THROUGHPUT]
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[_TITLES[k] for k in kinds])
    sources = sorted({r.run.source for r in report.results})
    for col, kind in enumerate(kinds, start=1):
        rows = [r for r in report.results if r.run.ref_kind == kind]
        values = [v for r in rows for v in (r.predicted, r.run.ref_value)] or [1.0]
        low, high = min(values) / 1.3, max(values) * 1.3
        fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", name="y = x",
                                 line={"color": "#888", "dash": "dash"}, showlegend=col == 1),
                      row=1, col=col)
        for i, source in enumerate(sources):
            mine = [r for r in rows if r.run.source == source]
            if mine:
                fig.add_trace(go.Scatter(
                    x=[r.run.ref_value for r in mine], y=[r.predicted for r in mine],
                    mode="markers", name=source, legendgroup=source, showlegend=col == 1,
                    marker={"color": _COLOURS[i % len(_COLOURS)], "size": 9},
                    text=[f"{r.run.name} ({r.run.text('gpu')}): {100 * r.error:+.1f}%"
                          for r in mine], hoverinfo="text"), row=1, col=col)
        fig.update_xaxes(type="log", title_text="published", row=1, col=col)
        fig.update_yaxes(type="log", title_text="predicted", row=1, col=col)
    calibrated = "calibrated" if report.calibrated else "catalog coefficients"
    fig.update_layout(title=f"trainsim vs published runs ({report.csv_path.name}; "
                            f"{calibrated})", height=560)
    make_parent(path).write_text(mark_html(fig.to_html(include_plotlyjs=True, full_html=True,
                                                       div_id=DIV_ID)), encoding="utf-8")


def print_report(report: AccuracyReport) -> None:
    """The three tables: per row, per group, and the rows trainsim cannot express yet."""
    print_table(f"predicted vs published ({report.csv_path})",
                ["source", "run", "GPU", "kind", "published", "predicted", "error", "notes"],
                result_rows(report.results), right=("published", "predicted", "error"))
    print_table("error by group (error = (predicted - published) / published)",
                ["kind", "by", "group", "rows", "MAPE", "mean signed error"],
                stats_rows(report.stats), right=("rows", "MAPE", "mean signed error"))
    if report.not_expressible:
        print_table("rows trainsim cannot express yet", ["line", "source", "run", "kind",
                                                         "reason"],
                    skipped_rows(report.not_expressible), right=("line",))


@user_errors
def accuracy_command(
    csv_path: Path | None = typer.Argument(None, metavar="CSV", help="Published runs in "
                                           "the training_runs.csv schema; default the "
                                           "reference data's published/training_runs.csv."),
    plot: Path = typer.Option(Path("accuracy.html"), "--plot", help="Predicted-vs-published "
                              "scatter (HTML)."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write rows, statistics "
                                         "and left-out rows as JSON to this file."),
    calibration: Path | None = typer.Option(None, "--calibration", help="Calibration file "
                                            "(sim calibrate) whose coefficients replace the "
                                            "catalog's."),
    engine: str = typer.Option("numba", "--engine", help="numba or simpy."),
    force: bool = typer.Option(False, "--force", help="Overwrite --plot / --json files."),
) -> None:
    """Simulate published training runs and print predicted vs published, with MAPE and mean
    signed error per GPU generation, framework and source."""
    check_new_file(plot, force, "--plot")
    check_new_file(json_out, force, "--json")
    with counting_bar("simulating rows") as bar:

        def tick(done: int, total: int, run: PublishedRun) -> None:
            bar(done, total, run.name)

        report = api.accuracy(csv_path, calibration=calibration, engine=engine, on_row=tick)
    print_report(report)
    write_scatter_html(report, plot)
    written = [plot]
    if json_out is not None:
        make_parent(json_out).write_text(dumps(report.to_dict()) + "\n", encoding="utf-8")
        written.append(json_out)
    typer.echo(f"{len(report.results)} rows compared, {len(report.not_expressible)} not "
               f"expressible; wrote {', '.join(str(p) for p in written)}")
