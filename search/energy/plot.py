"""Plotly HTML for the energy planner: the frontier, baselines as points, and the timeline of a
chosen plan coloured by SM frequency. Draws only; the numbers come from the planner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trainsim.search.energy.baselines import Baseline
from trainsim.search.energy.dag import InstructionDag
from trainsim.search.energy.point import FrontierPoint
from trainsim.simulator.own_files import mark_html


def frontier_figure(dag: InstructionDag, points: list[FrontierPoint], baselines: list[Baseline],
                    chosen: FrontierPoint, *, title: str = "") -> Any:
    """Two panels: time–energy frontier with baselines; timeline of `chosen` by frequency."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, row_heights=[0.55, 0.45], vertical_spacing=0.12,
                        subplot_titles=("Iteration time–energy frontier",
                                        f"Plan at {chosen.time_s:.4f} s, {chosen.energy_j:.1f} J"))
    fig.add_trace(go.Scatter(x=[p.time_s for p in points], y=[p.energy_j for p in points],
                             mode="lines+markers", marker={"size": 3}, name="frontier"),
                  row=1, col=1)
    symbols = ["x", "diamond", "square", "triangle-up", "star"]
    for k, b in enumerate(baselines):
        if b.sweep:
            fig.add_trace(go.Scatter(x=[p.time_s for p in b.sweep],
                                     y=[p.energy_j for p in b.sweep], mode="markers",
                                     marker={"symbol": symbols[k % 5], "size": 6},
                                     name=f"{b.name} (sweep)"), row=1, col=1)
        else:
            fig.add_trace(go.Scatter(x=[b.point.time_s], y=[b.point.energy_j], mode="markers",
                                     marker={"symbol": symbols[k % 5], "size": 11},
                                     name=b.name), row=1, col=1)
    t, _ = dag.node_time_energy(chosen.freq_mhz)
    finish = dag.finish_times(t)
    start = finish - t
    fmin, fmax = float(np.min(chosen.freq_mhz)), float(np.max(chosen.freq_mhz))
    fig.add_trace(go.Bar(
        base=start, x=t, y=[f"stage {int(s)}" for s in dag.stage], orientation="h",
        text=[dag.label(i)[len(str(int(dag.stage[i]))):] for i in range(dag.num_nodes)],
        hovertext=[f"{dag.label(i)} {chosen.freq_mhz[i]:.0f} MHz {t[i] * 1e3:.2f} ms"
                   for i in range(dag.num_nodes)],
        marker={"color": chosen.freq_mhz, "colorscale": "RdBu_r", "cmin": fmin,
                "cmax": max(fmax, fmin + 1), "colorbar": {"title": "MHz", "y": 0.22,
                                                          "len": 0.45}},
        name="instructions", showlegend=False), row=2, col=1)
    fig.update_xaxes(title_text="iteration time (s)", row=1, col=1)
    fig.update_yaxes(title_text="iteration energy (J)", row=1, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    fig.update_yaxes(autorange="reversed", row=2, col=1)
    fig.update_layout(title=title, height=900, bargap=0.2)
    return fig


def write_html(fig: Any, path: str) -> None:
    """Self-contained HTML (plotly.js inlined), stable div id for byte-identical output."""
    html = fig.to_html(include_plotlyjs=True, full_html=True, div_id="energy-frontier")
    Path(path).write_text(mark_html(html), encoding="utf-8")
