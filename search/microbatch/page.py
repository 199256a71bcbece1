"""The `sim microbatch` page: lengths, the micro-batches each method formed, one timeline.

Three figures on one self-contained HTML page (plotly.js inlined once): a histogram of the
samples' input (and target) lengths; for the first iteration, every micro-batch each method
formed as a point (x: its padded length, y: its samples, size: its padded tokens) so padding
and batching differences are visible at a glance; and the engine's timeline of that iteration
under the fastest method.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from trainsim.search.microbatch.planner import MethodResult
from trainsim.simulator.own_files import make_parent, mark_html
from trainsim.simulator.result import SimResult
from trainsim.simulator.timeline_plot import timeline_figure
from trainsim.workloads.lengths import LengthDataset

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def overview_figure(dataset: LengthDataset, results: Sequence[MethodResult], title: str
                    ) -> go.Figure:
    """Length histogram (left) and the first iteration's micro-batches per method (right)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6],
                        subplot_titles=("sample lengths (tokens)",
                                        "micro-batches of iteration 0 (size: padded tokens)"))
    fig.add_trace(go.Histogram(x=dataset.lengths(), name="input length", nbinsx=60,
                               marker_color="#4c78a8", opacity=0.8), row=1, col=1)
    if dataset.encoder_decoder:
        fig.add_trace(go.Histogram(x=dataset.targets(), name="target length", nbinsx=60,
                                   marker_color="#f58518", opacity=0.6), row=1, col=1)
    for i, r in enumerate(results):
        if not r.iterations or r.iterations[0].batching is None:
            continue
        shapes = np.array(r.iterations[0].batching.shapes(), dtype=float)
        padded = shapes[:, 1] * (shapes[:, 2] + shapes[:, 3])
        text = [f"{r.method}: replica {int(d)}, {int(b)} x {int(s)}"
                + (f"+{int(t)}" if t else "") + " tokens" for d, b, s, t in shapes]
        fig.add_trace(go.Scatter(
            x=shapes[:, 2], y=shapes[:, 1], mode="markers", name=r.method, text=text,
            hoverinfo="text", marker={"color": _COLOURS[i % len(_COLOURS)],
                                      "size": 6 + 18 * np.sqrt(padded / padded.max()),
                                      "opacity": 0.6, "line": {"width": 0.5}}),
            row=1, col=2)
    fig.update_xaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="samples", row=1, col=1)
    fig.update_xaxes(title_text="padded length", type="log", row=1, col=2)
    fig.update_yaxes(title_text="samples per micro-batch", type="log", row=1, col=2)
    fig.update_layout(title=title, barmode="overlay", height=480, template="plotly_white")
    return fig


def write_page(path: str | Path, dataset: LengthDataset, results: Sequence[MethodResult],
               timeline: SimResult | None, title: str) -> Path:
    """One HTML file: the overview and (when given) the replayed iteration's timeline."""
    parts = [overview_figure(dataset, results, title).to_html(
        include_plotlyjs=True, full_html=False, div_id="trainsim-microbatch",
        config={"displaylogo": False})]
    if timeline is not None:
        parts.append(timeline_figure(timeline).to_html(
            include_plotlyjs=False, full_html=False, div_id="trainsim-microbatch-timeline",
            config={"displaylogo": False}))
    html = ("<html><head><meta charset=\"utf-8\"><title>" + escape(title)
            + "</title></head><body>"
            + "\n".join(parts) + "</body></html>")
    out = Path(path)
    make_parent(out).write_text(mark_html(html), encoding="utf-8")
    return out


__all__ = ["overview_figure", "write_page"]
