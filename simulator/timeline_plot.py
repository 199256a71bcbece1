"""Interactive timeline of a SimResult: tasks per rank × stream, with memory and power under it.

Draw-only (STYLE.md §12). Rows are "rank N · stream", rank 0 on top; bars are coloured by task
kind and carry hover details (name, micro-batch, start, duration, bytes, frequency). The memory
and power panels share the time axis. To stay responsive at ~20k bars every kind is one
horizontal bar trace holding all its bars (numpy arrays, which plotly ships as compact typed
arrays) rather than one shape per bar. The HTML inlines plotly.js (works offline) and uses a fixed
div id, so the same result writes byte-identical files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainsim.simulator.own_files import mark_html
from trainsim.simulator.program import KNOWN_KINDS, stream_display_order
from trainsim.simulator.result import SimResult

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: Fixed div id of the written HTML (plotly would otherwise draw a random one).
DIV_ID = "trainsim-timeline"

#: Colour per built-in task kind (compute warm/cool by direction, communication greys/purples).
KIND_COLOURS: dict[str, str] = {
    "forward": "#1f77b4",
    "backward": "#2ca02c",
    "backward_input": "#98df8a",
    "backward_weight": "#17becf",
    "recompute": "#aec7e8",
    "optimizer": "#ff7f0e",
    "p2p": "#8c564b",
    "all_reduce": "#d62728",
    "all_gather": "#9467bd",
    "reduce_scatter": "#e377c2",
    "all_to_all": "#bcbd22",
}
_EXTRA_COLOURS = ("#7f7f7f", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")


def _kind_order(kinds: Sequence[str]) -> list[str]:
    present = set(kinds)
    return [k for k in KNOWN_KINDS if k in present] + sorted(present - set(KNOWN_KINDS))


def timeline_figure(
    result: SimResult, *, ranks: Sequence[int] | None = None, title: str | None = None
) -> go.Figure:
    """Build the figure: task bars (top), memory in GiB (middle), rank power in W (bottom).

    Args:
        result: the simulated iteration (expand() it first to draw physical ranks).
        ranks: ranks to draw (default all).
        title: figure title (default: the model name from `program.info` and the iteration time).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    frame = result.tasks
    mem, power = result.memory_timeline, result.power_timeline
    if ranks is not None:
        keep = {int(r) for r in ranks}
        frame = frame[frame["rank"].isin(keep)]
        mem = mem[mem["rank"].isin(keep)]
        power = power[power["rank"].isin(keep)]
    streams = stream_display_order(frame["stream"].unique())
    stream_pos = {s: i for i, s in enumerate(streams)}
    pairs = sorted(
        {(int(r), s) for r, s in zip(frame["rank"], frame["stream"], strict=True)},
        key=lambda rs: (rs[0], stream_pos[rs[1]]),
    )
    rows = [f"rank {r} · {s}" for r, s in pairs]

    task_px, panel_px = max(320, 24 * len(rows)), 180
    height_px = task_px + 2 * panel_px + 160
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=60 / height_px,
        row_heights=[task_px, panel_px, panel_px],
        subplot_titles=("tasks", "memory (GiB)", "power (W)"),
    )
    labels = np.array(
        [f"rank {r} · {s}" for r, s in zip(frame["rank"], frame["stream"], strict=True)],
        dtype=object,
    )
    extra = iter(_EXTRA_COLOURS * 8)
    for kind in _kind_order(list(frame["kind"].unique())):
        mask = (frame["kind"] == kind).to_numpy()
        part = frame[mask]
        freq = np.where(
            np.isnan(part["freq_mhz"].to_numpy()),
            "-",
            part["freq_mhz"].map(lambda f: f"{f:g} MHz").to_numpy(),
        )
        custom = np.column_stack(
            [
                part["name"].to_numpy(dtype=object),
                part["micro_batch"].to_numpy().astype(object),
                part["start_s"].to_numpy().astype(object),
                part["duration_s"].to_numpy().astype(object),
                part["comm_bytes"].to_numpy().astype(object),
                freq.astype(object),
            ]
        )
        fig.add_trace(
            go.Bar(
                name=kind,
                orientation="h",
                y=labels[mask],
                base=part["start_s"].to_numpy(),
                x=part["duration_s"].to_numpy(),
                width=0.8,
                marker={"color": KIND_COLOURS.get(kind) or next(extra), "line": {"width": 0}},
                customdata=custom,
                hovertemplate=(
                    "<b>%{customdata[0]}</b> (" + kind + ")<br>%{y}<br>"
                    "micro-batch %{customdata[1]}<br>start %{customdata[2]:.6g} s<br>"
                    "duration %{customdata[3]:.6g} s<br>bytes %{customdata[4]:.4s}<br>"
                    "frequency %{customdata[5]}<extra></extra>"
                ),
                legendgroup="kinds",
            ),
            row=1,
            col=1,
        )
    iteration_s = result.iteration_time_s
    for rank in sorted(set(mem["rank"])):
        part = mem[mem["rank"] == rank]
        fig.add_trace(_step_line(part["time_s"].to_numpy(), part["bytes"].to_numpy() / 2**30,
                                 iteration_s, f"rank {rank} memory",
                                 f"rank {rank}<br>%{{y:.3f}} GiB at %{{x:.6g}} s"), row=2, col=1)
    for rank in sorted(set(power["rank"])):
        part = power[power["rank"] == rank]
        fig.add_trace(_step_line(part["time_s"].to_numpy(), part["power_w"].to_numpy(),
                                 iteration_s, f"rank {rank} power",
                                 f"rank {rank}<br>%{{y:.1f}} W at %{{x:.6g}} s"), row=3, col=1)
    if title is None:
        model = result.program.info.model
        bits = [] if model is None else [model]
        title = " · ".join(bits + [f"iteration {iteration_s:.6g} s"])
    fig.update_layout(
        title=title,
        barmode="overlay",
        bargap=0.1,
        template="plotly_white",
        height=height_px,
        legend={"title": "task kind"},
        hoverlabel={"namelength": -1},
    )
    fig.update_yaxes(
        categoryorder="array",
        categoryarray=rows,
        autorange="reversed",
        tickmode="array",
        tickvals=rows,
        tickfont={"size": 10},
        row=1,
        col=1,
    )
    fig.update_xaxes(title_text="time (s)", row=3, col=1)
    return fig


def write_timeline_html(
    result: SimResult, path: str | Path, *, ranks: Sequence[int] | None = None
) -> Path:
    """Write a self-contained HTML timeline (plotly.js inlined, no network) and return the path."""
    path = Path(path)
    fig = timeline_figure(result, ranks=ranks)
    html = fig.to_html(
        include_plotlyjs=True,
        full_html=True,
        div_id=DIV_ID,
        config={"displaylogo": False, "responsive": True},
    )
    path.write_text(mark_html(html), encoding="utf-8")
    return path


def _step_line(time_s: np.ndarray, values: np.ndarray, iteration_s: float, name: str,
               hover: str) -> go.Scatter:
    """A per-rank step trace (memory or power) held at its last value to the iteration's end."""
    import plotly.graph_objects as go

    return go.Scatter(x=np.r_[time_s, iteration_s], y=np.r_[values, values[-1:]], mode="lines",
                      line={"shape": "hv", "width": 1}, name=name, showlegend=False,
                      hovertemplate=hover + "<extra></extra>")
