"""Overlay timeline: the measured iteration above, the predicted one below, same time axis.

Draw-only (STYLE.md §12). Top panel: the op spans of the trace's profiled iteration, one row
per measured rank, coloured by op kind. Bottom panel: the simulated tasks, one row per program
rank and stream, coloured by task kind. The HTML inlines plotly.js and uses a fixed div id, so
the same inputs write the same file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainsim.simulator.own_files import make_parent, mark_html

DIV_ID = "trainsim-overlay"
_COLOURS = ("#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#98df8a")


def overlay_figure(trace: Any, comparison: Any) -> Any:
    """Two stacked panels of horizontal bars (module docstring)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    measured_ms = 1e3 * comparison.iteration_time_measured_s
    predicted_ms = 1e3 * comparison.iteration_time_predicted_s
    titles = (f"measured (profiled iteration; median unprofiled {measured_ms:.1f} ms)",
              f"predicted ({predicted_ms:.1f} ms)")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=titles)
    colour: dict[str, str] = {}

    def col(kind: str) -> str:
        if kind not in colour:
            colour[kind] = _COLOURS[len(colour) % len(_COLOURS)]
        return colour[kind]

    shown: set[str] = set()
    for kind in sorted({e["kind"] for e in trace.events}):
        evs = [e for e in trace.events if e["kind"] == kind]
        fig.add_trace(go.Bar(
            x=[e["dur_us"] * 1e-3 for e in evs], base=[e["ts_us"] * 1e-3 for e in evs],
            y=[f"rank {e['rank']}" for e in evs], orientation="h", name=kind,
            marker_color=col(kind), legendgroup=kind, showlegend=kind not in shown,
            hovertext=[e["name"] for e in evs]), row=1, col=1)
        shown.add(kind)
    tasks = comparison.result.tasks if comparison.result is not None else None
    if tasks is not None:
        for kind in sorted(tasks["kind"].unique()):
            rows = tasks[tasks["kind"] == kind]
            fig.add_trace(go.Bar(
                x=(rows["duration_s"] * 1e3).tolist(), base=(rows["start_s"] * 1e3).tolist(),
                y=[f"rank {r} · {s}" for r, s in zip(rows["rank"], rows["stream"], strict=True)],
                orientation="h", name=kind, marker_color=col(kind), legendgroup=kind,
                showlegend=kind not in shown, hovertext=rows["name"].tolist()), row=2, col=1)
            shown.add(kind)
    fig.update_layout(barmode="overlay", height=700, title=f"{comparison.model}: measured vs "
                      f"predicted", xaxis2_title="time (ms)")
    fig.update_yaxes(autorange="reversed")
    return fig


def write_overlay_html(trace: Any, comparison: Any, path: str | Path) -> None:
    """Write the overlay as a self-contained HTML file."""
    fig = overlay_figure(trace, comparison)
    make_parent(path).write_text(mark_html(fig.to_html(include_plotlyjs=True, full_html=True,
                                                       div_id=DIV_ID)), encoding="utf-8")
