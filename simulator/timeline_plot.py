"""Interactive timeline of a SimResult: tasks per rank × stream, with memory and power under it.

Draw-only (STYLE.md §12). Rows are "rank N · stream", rank 0 on top; bars are coloured by task
kind and carry hover details (name, micro-batch, start, duration, bytes, frequency). The memory
and power panels share the time axis. To stay responsive at ~20k bars every kind is one
horizontal bar trace holding all its bars (numpy arrays, which plotly ships as compact typed
arrays) rather than one shape per bar. The HTML inlines plotly.js (works offline) and uses a fixed
div id, so the same result writes byte-identical files.

Past `timeline_groups.GROUP_THRESHOLD` ranks the page is grouped, so its size follows the number
of pipeline stages, not GPUs: one row set per rank group (`timeline_groups.rank_groups`: a
stage, split by GPU type or batch share), drawn from the group's representative rank, with a
group's point-to-point streams on one "pp" row and a hover line "stage 3 · 640 GPUs, showing
rank 1920"; memory and power one line per group (the max over its ranks, binned to at most
`timeline_groups.MAX_LINE_POINTS` steps), each GPU type's memory capacity a dashed labelled
line, and `focus_rank` (the CLI's `--timeline-rank`) one GPU's own rows in full after its
group's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainsim.simulator.own_files import make_parent, mark_html
from trainsim.simulator.program import KNOWN_KINDS, stream_display_order
from trainsim.simulator.result import SimResult
from trainsim.simulator.timeline_groups import (
    RankGroup,
    group_envelope,
    rank_groups,
    rank_ranges,
    result_rank_of,
    should_group,
)

if TYPE_CHECKING:
    import pandas as pd
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
#: Colours of the grouped view's memory and power lines, one per row set (cycled).
_LINE_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
)
_EXTRA_COLOURS = ("#7f7f7f", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")


#: Point-to-point streams of the lowering ("pp3>4": stage 3 sends to 4); a grouped page draws a
#: group's on one row, `P2P_ROW`.
_P2P_STREAM = r"pp\d+>\d+(?:\.\d+)?"
P2P_ROW = "pp"


def _kind_order(kinds: Sequence[str]) -> list[str]:
    present = set(kinds)
    return [k for k in KNOWN_KINDS if k in present] + sorted(present - set(KNOWN_KINDS))


def timeline_figure(
    result: SimResult,
    *,
    ranks: Sequence[int] | None = None,
    title: str | None = None,
    group: bool | None = None,
    focus_rank: int | None = None,
) -> go.Figure:
    """Build the figure: task bars (top), memory in GiB (middle), rank power in W (bottom).

    Args:
        result: the simulated iteration (expand() it first to draw physical ranks).
        ranks: ranks to draw (default all).
        title: figure title (default: the model name from `program.info` and the iteration time).
        group: draw one row set per rank group (`timeline_groups.rank_groups`) instead of one per
            rank; default: when more than `GROUP_THRESHOLD` ranks are drawn.
        focus_rank: with grouping, also draw this physical rank's own rows in full, after its
            group's (ignored without grouping: every rank has its rows then).
    """
    if group is None:
        group = should_group(result, ranks)
    if group:
        return _grouped_figure(result, ranks=ranks, title=title, focus_rank=focus_rank)
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

    fig, height_px = _three_panels(len(rows), row_px=24, panel_px=180, margin_px=160,
                                   titles=("tasks", "memory (GiB)", "power (W)"))
    labels = np.array(
        [f"rank {r} · {s}" for r, s in zip(frame["rank"], frame["stream"], strict=True)],
        dtype=object,
    )
    _add_bars(fig, frame, labels, None)
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
    _finish_layout(fig, title, height_px, rows, tick_px=10)
    return fig


def _add_bars(fig: go.Figure, frame: pd.DataFrame, labels: np.ndarray,
              notes: np.ndarray | None) -> None:
    """One horizontal bar trace per task kind in the tasks panel; `notes` (one per row of
    `frame`) adds a hover line naming the group a row stands for."""
    import plotly.graph_objects as go

    extra = iter(_EXTRA_COLOURS * 8)
    for kind in _kind_order(list(frame["kind"].unique())):
        mask = (frame["kind"] == kind).to_numpy()
        part = frame[mask]
        freq = np.where(
            np.isnan(part["freq_mhz"].to_numpy()),
            "-",
            part["freq_mhz"].map(lambda f: f"{f:g} MHz").to_numpy(),
        )
        columns = [
            part["name"].to_numpy(dtype=object),
            part["micro_batch"].to_numpy().astype(object),
            part["start_s"].to_numpy().astype(object),
            part["duration_s"].to_numpy().astype(object),
            part["comm_bytes"].to_numpy().astype(object),
            freq.astype(object),
        ]
        note_line = ""
        if notes is not None:
            columns.append(notes[mask])
            note_line = "%{customdata[6]}<br>"
        fig.add_trace(
            go.Bar(
                name=kind,
                orientation="h",
                y=labels[mask],
                base=part["start_s"].to_numpy(),
                x=part["duration_s"].to_numpy(),
                width=0.8,
                marker={"color": KIND_COLOURS.get(kind) or next(extra), "line": {"width": 0}},
                customdata=np.column_stack(columns),
                hovertemplate=(
                    "<b>%{customdata[0]}</b> (" + kind + ")<br>%{y}<br>" + note_line
                    + "micro-batch %{customdata[1]}<br>start %{customdata[2]:.6g} s<br>"
                    "duration %{customdata[3]:.6g} s<br>bytes %{customdata[4]:.4s}<br>"
                    "frequency %{customdata[5]}<extra></extra>"
                ),
                legendgroup="kinds",
            ),
            row=1,
            col=1,
        )


def _finish_layout(fig: go.Figure, title: str, height_px: int, rows: list[str], *,
                   tick_px: int) -> None:
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
        tickfont={"size": tick_px},
        row=1,
        col=1,
    )
    fig.update_xaxes(title_text="time (s)", row=3, col=1)


def _grouped_figure(
    result: SimResult,
    *,
    ranks: Sequence[int] | None,
    title: str | None,
    focus_rank: int | None,
) -> go.Figure:
    """The timeline past GROUP_THRESHOLD ranks: one row set per rank group, drawn from its
    representative rank; memory and power one line per group (max over its ranks); each GPU
    type's memory capacity a dashed line; `focus_rank`'s own rows in full after its group's."""
    import pandas as pd

    groups = rank_groups(result)
    if ranks is not None:
        keep = {int(r) for r in ranks}
        groups = [g for g in groups if keep.intersection(g.ranks)]
    focus = None if focus_rank is None else result_rank_of(result).get(int(focus_rank))
    frame = result.tasks
    # One entry per drawn row set: (prefix, result rank, hover note, ranks its lines cover,
    # what those lines are, whether its point-to-point streams share one row).
    sets: list[tuple[str, int, str, tuple[int, ...], str, bool]] = []
    for g in groups:
        sets.append((f"{g.label} ({g.gpus} GPUs)", g.representative, g.note, g.ranks,
                     f"max of {g.gpus} GPUs (ranks {rank_ranges(g.ranks)})", True))
        if focus is not None and focus in g.ranks:
            name = f"rank {focus_rank}"
            if focus != focus_rank:
                name += f" (program rank {focus})"
            sets.append((name, focus, f"{name}: one GPU of {g.label}, in full", (focus,),
                         "this rank", False))
    rows: list[str] = []
    parts = []
    for prefix, rank, note, _, _, merge in sets:
        part = frame[frame["rank"] == rank]
        shown = part["stream"]
        if merge:  # a group's sends and receives ("pp3>4", "pp4>3", ...) on one "pp" row
            shown = shown.where(~shown.str.fullmatch(_P2P_STREAM), P2P_ROW)
        rows += [f"{prefix} · {s}" for s in stream_display_order(shown.unique())]
        parts.append(part.assign(_row=prefix + " · " + shown,
                                 _note=note + " · stream " + part["stream"]))
    drawn = pd.concat(parts, ignore_index=True) if parts else frame.iloc[:0].assign(
        _row="", _note="")

    fig, height_px = _three_panels(
        len(rows), row_px=18, panel_px=220, margin_px=180,
        titles=("tasks (one row set per rank group, from a representative rank)",
                "memory (GiB, max over each group's ranks)",
                "power (W, max over each group's ranks)"))
    _add_bars(fig, drawn, drawn["_row"].to_numpy(dtype=object),
              drawn["_note"].to_numpy(dtype=object))
    iteration_s = result.iteration_time_s
    palette = _LINE_COLOURS
    for i, (prefix, _, _, members, what, _) in enumerate(sets):
        colour = palette[i % len(palette)]
        for timeline, column, scale, unit, panel in (
            (result.memory_timeline, "bytes", 2**-30, "GiB", 2),
            (result.power_timeline, "power_w", 1.0, "W", 3),
        ):
            t, v = group_envelope(timeline, column, members)
            if len(t) == 0:
                continue
            fmt = ".3f" if unit == "GiB" else ".1f"
            line = _step_line(t, v * scale, iteration_s, prefix,
                              f"{prefix} · {what}<br>%{{y:{fmt}}} {unit} at %{{x:.6g}} s")
            # One legend entry per row set (memory and power toggle together).
            line.update(line={"color": colour}, legend="legend2", legendgroup=prefix,
                        showlegend=panel == 2)
            fig.add_trace(line, row=panel, col=1)
    for label, cap in _capacities(result, groups):
        fig.add_hline(y=cap / 2**30, line={"dash": "dash", "color": "#d62728", "width": 1},
                      annotation_text=label, annotation_position="top left",
                      annotation_font={"size": 10, "color": "#d62728"}, row=2, col=1)
    if title is None:
        model = result.program.info.model
        bits = [] if model is None else [model]
        gpus = sum(g.gpus for g in groups)
        title = " · ".join(bits + [f"iteration {iteration_s:.6g} s",
                                   f"{gpus} GPUs in {len(groups)} groups"])
    _finish_layout(fig, title, height_px, rows, tick_px=9)
    top = fig.layout.yaxis2.domain[1]
    fig.update_layout(legend2={"title": "memory, power", "x": 1.02, "y": top,
                               "yanchor": "top", "font": {"size": 10}})
    return fig


def _capacities(result: SimResult, groups: Sequence[RankGroup]) -> list[tuple[str, float]]:
    """One (label, bytes) per distinct GPU type and finite capacity among the groups."""
    seen: dict[tuple[str | None, float], None] = {}
    for g in groups:
        if np.isfinite(g.capacity_bytes):
            seen.setdefault((g.gpu, g.capacity_bytes), None)
    return [(f"{gpu + ' ' if gpu else ''}capacity {cap / 2**30:.4g} GiB", cap)
            for gpu, cap in sorted(seen, key=lambda k: (k[1], k[0] or ""))]


def write_timeline_html(
    result: SimResult,
    path: str | Path,
    *,
    ranks: Sequence[int] | None = None,
    group: bool | None = None,
    focus_rank: int | None = None,
) -> Path:
    """Write a self-contained HTML timeline (plotly.js inlined, no network) and return the path.

    Past `GROUP_THRESHOLD` ranks (or with `group=True`) the page draws rank groups, not ranks,
    and `focus_rank` adds one physical rank's own rows (see `timeline_figure`)."""
    path = Path(path)
    fig = timeline_figure(result, ranks=ranks, group=group, focus_rank=focus_rank)
    html = fig.to_html(
        include_plotlyjs=True,
        full_html=True,
        div_id=DIV_ID,
        config={"displaylogo": False, "responsive": True},
    )
    make_parent(path).write_text(mark_html(html), encoding="utf-8")
    return path


def _step_line(time_s: np.ndarray, values: np.ndarray, iteration_s: float, name: str,
               hover: str) -> go.Scatter:
    """A per-rank step trace (memory or power) held at its last value to the iteration's end."""
    import plotly.graph_objects as go

    return go.Scatter(x=np.r_[time_s, iteration_s], y=np.r_[values, values[-1:]], mode="lines",
                      line={"shape": "hv", "width": 1}, name=name, showlegend=False,
                      hovertemplate=hover + "<extra></extra>")


def _three_panels(n_rows: int, *, row_px: int, panel_px: int, margin_px: int,
                  titles: tuple[str, str, str]) -> tuple[Any, int]:
    """The page's figure: tasks (n_rows rows), memory and power sharing the time axis; with
    its height in pixels."""
    from plotly.subplots import make_subplots  # deferred: start-up time (plotly)

    task_px = max(320, row_px * n_rows)
    height_px = task_px + 2 * panel_px + margin_px
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=60 / height_px,
                        row_heights=[task_px, panel_px, panel_px], subplot_titles=titles)
    return fig, height_px
