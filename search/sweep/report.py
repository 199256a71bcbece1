"""`sim sweep report`: one self-contained HTML dashboard of a sweep table.

The page (plotly.js inlined: it works offline; a fixed div id: the same table writes the same
bytes) holds one figure:

* top: $ per 1M tokens (x) against tokens/s (y), one colour per model × cluster;
* then one row per knob (the cluster when the spec had no knobs): tokens/s, $ per 1M tokens
  and J per token against the knob's values.

Cost and energy are shown *per token* (the table's `cost_usd` and `energy_j` are per
iteration, over `tokens_per_s × iteration_time_s` tokens), so scenarios with different global
batches compare fairly. Pareto points are marked (a larger star with an outline) in every
panel: a scenario is on its model's front when no other scenario of the same model is at least
as fast, as cheap per token and as frugal per token, and strictly better in one of them
(tokens of different models are different work, so each model has its own front). Failed
and OOM scenarios have no point; a table under the figure counts them by error.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainsim.search.sweep.runner import read_table, table_metadata, table_rows
from trainsim.simulator.own_files import make_parent, mark_html

DIV_ID = "trainsim-sweep"
METRICS = (("tokens_per_s", "tokens/s", "higher is better"),
           ("usd_per_1m_tokens", "$ per 1M tokens", "lower is better"),
           ("j_per_token", "J per token", "lower is better"))
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
_WEBGL_ROWS = 5_000
"""Above this many points, panels draw with WebGL (Scattergl) to stay responsive."""


def _derived(row: dict[str, Any]) -> dict[str, Any] | None:
    """`row` with per-token cost and energy, or None when it has no usable figures."""
    tps, t = row.get("tokens_per_s"), row.get("iteration_time_s")
    if row.get("error") is not None or row.get("oom") or not tps or not t:
        return None
    tokens = tps * t
    return {**row, "usd_per_1m_tokens": (row.get("cost_usd") or 0.0) / tokens * 1e6,
            "j_per_token": (row.get("energy_j") or 0.0) / tokens}


def pareto_flags(points: Sequence[dict[str, Any]]) -> list[bool]:
    """Per point: on its model's front (module docstring) — maximise tokens/s, minimise $ and
    J per token."""

    def better_or_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return (a["tokens_per_s"] >= b["tokens_per_s"]
                and a["usd_per_1m_tokens"] <= b["usd_per_1m_tokens"]
                and a["j_per_token"] <= b["j_per_token"])

    def strictly(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return (a["tokens_per_s"] > b["tokens_per_s"]
                or a["usd_per_1m_tokens"] < b["usd_per_1m_tokens"]
                or a["j_per_token"] < b["j_per_token"])

    by_model: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        by_model.setdefault(p["model"], []).append(i)
    flags = [True] * len(points)
    for members in by_model.values():
        # Sort by tokens/s descending: only a point earlier in this order (as fast or faster)
        # can dominate a later one, so each point is checked against the front so far.
        order = sorted(members, key=lambda i: (-points[i]["tokens_per_s"],
                                               points[i]["usd_per_1m_tokens"],
                                               points[i]["j_per_token"]))
        front: list[int] = []
        for i in order:
            p = points[i]
            if any(better_or_equal(points[j], p) and strictly(points[j], p) for j in front):
                flags[i] = False
            else:
                front.append(i)
    return flags


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:59] + "…"


def _hover(p: dict[str, Any], knobs: Sequence[str], front: bool) -> str:
    lines = [f"<b>#{p['scenario']} {html.escape(p['model'])} on {html.escape(p['cluster'])}"
             f"</b>" + (" ★ Pareto" if front else "")]
    lines += [f"{html.escape(k)} = {html.escape(_short(p.get(k)))}" for k in knobs]
    source = p.get("plan") if p.get("planner") is None else p.get("planner")
    lines.append(f"{'planner' if p.get('planner') else 'plan'}: {html.escape(_short(source))}")
    lines.append(f"{p['tokens_per_s']:,.0f} tokens/s, iteration {p['iteration_time_s']:.4g} s")
    lines.append(f"${p['usd_per_1m_tokens']:,.4g} per 1M tokens, "
                 f"{p['j_per_token']:.4g} J per token")
    lines.append(f"MFU {p['mfu']:.3f}" if p.get("mfu") is not None else "MFU -")
    lines.append(f"peak memory {p['peak_memory_gib']:.2f} GiB")
    return "<br>".join(lines)


def dashboard_figure(rows: Sequence[dict[str, Any]], knobs: Sequence[str], title: str) -> Any:
    """The dashboard's figure (module docstring) for a table's rows."""
    import plotly.graph_objects as go  # deferred: start-up time (plotly)
    from plotly.subplots import make_subplots

    axes = list(knobs) or ["cluster"]
    points = [d for d in (_derived(r) for r in rows) if d is not None]
    flags = pareto_flags(points)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p["model"], p["cluster"]), []).append(i)
    titles = ["$ per 1M tokens vs tokens/s (★: Pareto front of each model)"]
    for axis in axes:
        titles += [f"{label} vs {axis}" for _, label, _ in METRICS]
    specs: list[list[dict[str, Any] | None]] = [[{"colspan": 3}, None, None]]
    specs += [[{}, {}, {}] for _ in axes]
    fig = make_subplots(rows=1 + len(axes), cols=3, specs=specs, subplot_titles=titles,
                        vertical_spacing=min(0.12, 0.5 / (1 + len(axes))),
                        horizontal_spacing=0.07)
    scatter = go.Scattergl if len(points) > _WEBGL_ROWS else go.Scatter
    for g, ((model, cluster), members) in enumerate(groups.items()):
        colour = _COLOURS[g % len(_COLOURS)]
        name = f"{model} on {cluster}"
        sel = [points[i] for i in members]
        front = [flags[i] for i in members]
        marker = {"color": colour, "opacity": 0.85,
                  "symbol": ["star" if f else "circle" for f in front],
                  "size": [14 if f else 7 for f in front],
                  "line": {"color": "#222222", "width": [1.5 if f else 0 for f in front]}}
        hover = [_hover(p, knobs, f) for p, f in zip(sel, front, strict=True)]
        fig.add_trace(scatter(x=[p["usd_per_1m_tokens"] for p in sel],
                              y=[p["tokens_per_s"] for p in sel], mode="markers", name=name,
                              legendgroup=name, marker=marker, hovertext=hover,
                              hoverinfo="text"), row=1, col=1)
        for r, axis in enumerate(axes, start=2):
            x = [_short(p.get(axis)) if not isinstance(p.get(axis), (int, float))
                 or isinstance(p.get(axis), bool) else p.get(axis) for p in sel]
            for c, (metric, _, _) in enumerate(METRICS, start=1):
                fig.add_trace(scatter(x=x, y=[p[metric] for p in sel], mode="markers",
                                      name=name, legendgroup=name, showlegend=False,
                                      marker=marker, hovertext=hover, hoverinfo="text"),
                              row=r, col=c)
    fig.update_xaxes(title_text="$ per 1M tokens (lower is better)", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s (higher is better)", row=1, col=1)
    for r, axis in enumerate(axes, start=2):
        for c, (_, label, _) in enumerate(METRICS, start=1):
            fig.update_xaxes(title_text=axis, row=r, col=c)
            fig.update_yaxes(title_text=label, row=r, col=c)
    fig.update_layout(title=title, template="plotly_white", height=480 + 340 * len(axes),
                      legend={"title": "model on cluster"}, hoverlabel={"namelength": -1})
    return fig


def _failures(rows: Sequence[dict[str, Any]]) -> str:
    """An HTML table of the failed scenarios, counted by error (largest first)."""
    counts = Counter(str(r["error"]) for r in rows if r.get("error") is not None)
    if not counts:
        return "<p>Every scenario ran and fits in memory.</p>"
    body = "".join(f"<tr><td>{n}</td><td>{html.escape(e)}</td></tr>"
                   for e, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:50])
    return ("<table><tr><th>scenarios</th><th>error</th></tr>" + body + "</table>"
            + ("<p>(50 most common errors shown)</p>" if len(counts) > 50 else ""))


_STYLE = ("body{font-family:sans-serif;margin:1.5em;color:#222}"
          "table{border-collapse:collapse;margin:.5em 0}"
          "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:90%}")


def write_report(table_path: str | Path, out: str | Path) -> Path:
    """Write the dashboard of the sweep table at `table_path` to `out` (HTML) and return it."""
    table = read_table(table_path)
    meta = table_metadata(table)
    rows = table_rows(table)
    knobs = [k for k in meta.get("knobs", []) if k in table.column_names]
    total = int(meta.get("scenarios", len(rows)))
    failed = sum(1 for r in rows if r.get("error") is not None)
    oom = sum(1 for r in rows if r.get("oom"))
    name = Path(table_path).name
    title = f"sweep {name}: {len(rows)} of {total} scenarios"
    fig = dashboard_figure(rows, knobs, "")  # the page heading carries the title
    div = fig.to_html(include_plotlyjs=True, full_html=False, div_id=DIV_ID,
                      config={"displaylogo": False, "responsive": True})
    unfinished = (f" The sweep is unfinished: {total - len(rows)} scenarios are missing; "
                  f"rerun <code>sim sweep</code> with the same spec to finish it."
                  if len(rows) < total else "")
    page = (f"<!DOCTYPE html>\n<html>\n<head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n"
            f"<p>{len(rows) - failed} ran and fit in memory, {failed} failed "
            f"({oom} out of memory). Knobs: {html.escape(', '.join(knobs) or 'none')}. "
            f"Cost and energy are per token; ★ marks each model's Pareto front "
            f"(tokens/s, $ per token, J per token).{unfinished}</p>\n{div}\n"
            f"<h2>Failed scenarios</h2>\n{_failures(rows)}\n</body>\n</html>\n")
    path = Path(out)
    make_parent(path).write_text(mark_html(page), encoding="utf-8")
    return path


__all__ = ["DIV_ID", "dashboard_figure", "pareto_flags", "write_report"]
