"""Cost–throughput Pareto front over cluster compositions, as a table, a CSV and a plotly page.

The heterogeneous planner prices each composition (a mix of node groups) and finds its best plan;
no single composition is best, since the cheapest per token is rarely the fastest. This module
only ranks and draws those results (the caller computes the figures): which compositions are on
the front (none cheaper per token *and* faster), a CSV for further analysis, a rich table for the
terminal and a self-contained HTML scatter where mixed and homogeneous clusters are told apart.
"""

from __future__ import annotations

import csv
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from trainsim.simulator.own_files import mark_html

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: Fixed div id of the written HTML, so the same points write byte-identical files.
DIV_ID = "trainsim-hetero-pareto"
#: Columns of `write_table`'s CSV, in order.
CSV_COLUMNS = ("composition", "gpus", "mixed", "tokens_per_s", "iteration_time_s",
               "usd_per_hour", "usd_per_1m_tokens", "on_front", "plan", "error")
#: Marker symbol per kind of composition (legend name, symbol, colour).
_KINDS = (("homogeneous", "circle", "#1f77b4"), ("mixed", "diamond", "#ff7f0e"))
_PLAN_CHARS = 60
"""Plan text longer than this is cut in the printed table (the CSV keeps it whole)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ParetoPoint:
    """One priced composition and its best plan (figures None when no plan fits)."""

    composition: str
    """Cluster spec, e.g. "1x8xA100-SXM4-40GB+2x4xA10"."""
    gpus: tuple[tuple[str, int], ...]
    """(GPU type, count) per type, e.g. (("A100-SXM4-40GB", 8), ("A10", 8))."""
    mixed: bool
    """More than one GPU type."""
    tokens_per_s: float | None
    iteration_time_s: float | None
    usd_per_hour: float
    """Price of the whole composition per hour."""
    usd_per_1m_tokens: float | None
    """usd_per_hour / 3600 / tokens_per_s * 1e6."""
    plan: str
    """One-line plan description shown on hover ("" when none)."""
    error: str | None = None
    """Why there is no plan (no fit, OOM, ...)."""

    @property
    def has_plan(self) -> bool:
        """Both figures the front compares are there and finite, and the rate positive: a NaN
        or zero rate would otherwise win or tie comparisons it should not."""
        t, c = self.tokens_per_s, self.usd_per_1m_tokens
        return (t is not None and c is not None and math.isfinite(t) and math.isfinite(c)
                and t > 0)


def pareto_mask(points: Sequence[ParetoPoint]) -> list[bool]:
    """True for points no other planned point beats: cheaper-or-equal per token and at least as
    fast, one of them strictly. Identical figures are all kept (the user picks among equals);
    points without a plan are never on the front.

    One sort and a sweep by cost: a point survives when it is the fastest at its cost and faster
    than everything strictly cheaper."""
    mask = [False] * len(points)
    planned = sorted((i for i, p in enumerate(points) if p.has_plan),
                     key=lambda i: points[i].usd_per_1m_tokens or 0.0)
    best_cheaper = float("-inf")
    k = 0
    while k < len(planned):
        cost = points[planned[k]].usd_per_1m_tokens
        group = []
        while k < len(planned) and points[planned[k]].usd_per_1m_tokens == cost:
            group.append(planned[k])
            k += 1
        fastest = max(points[i].tokens_per_s or 0.0 for i in group)
        if fastest > best_cheaper:
            for i in group:
                mask[i] = points[i].tokens_per_s == fastest
        best_cheaper = max(best_cheaper, fastest)
    return mask


def _gpus_text(point: ParetoPoint, sep: str = "+") -> str:
    return sep.join(f"{gpu}x{count}" for gpu, count in point.gpus)


def _cell(value: float | bool | str | None) -> str:
    """CSV text: empty for None, lowercase booleans, repr floats (they read back exactly)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def write_table(points: Sequence[ParetoPoint], path: str | Path) -> None:
    """CSV with one row per point in the given order, columns `CSV_COLUMNS`."""
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for p, front in zip(points, pareto_mask(points), strict=True):
            writer.writerow([_cell(v) for v in (
                p.composition, _gpus_text(p), p.mixed, p.tokens_per_s, p.iteration_time_s,
                p.usd_per_hour, p.usd_per_1m_tokens, front, p.plan, p.error)])


def _ordered(points: Sequence[ParetoPoint]) -> list[tuple[ParetoPoint, bool]]:
    """Front first, then other planned points, both cheapest per token first; then the rest in
    the given order (sorted is stable)."""
    pairs = list(zip(points, pareto_mask(points), strict=True))
    return sorted(pairs, key=lambda pf: (not pf[1], not pf[0].has_plan,
                                         pf[0].usd_per_1m_tokens or 0.0))


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def format_table(points: Sequence[ParetoPoint], *, title: str | None = None) -> Table:
    """A rich table of every point, front points (★) first; a point without a plan shows its
    error in the plan column."""
    table = Table(title=title)
    for name, right in (("", False), ("composition", False), ("GPUs", False), ("tok/s", True),
                        ("s/iter", True), ("$/h", True), ("$/1M tok", True), ("plan", False)):
        table.add_column(name, justify="right" if right else "left")
    for p, front in _ordered(points):
        plan = p.plan if p.has_plan else f"no plan: {p.error or 'unknown'}"
        if len(plan) > _PLAN_CHARS:
            plan = plan[: _PLAN_CHARS - 1] + "…"
        table.add_row("★" if front else "", p.composition, _gpus_text(p, " + "),
                      _num(p.tokens_per_s, ",.0f"), _num(p.iteration_time_s, ".4g"),
                      f"{p.usd_per_hour:,.2f}", _num(p.usd_per_1m_tokens, ",.4g"), plan)
    return table


def _hover(p: ParetoPoint, front: bool) -> str:
    lines = [f"<b>{html.escape(p.composition)}</b>" + (" ★ Pareto front" if front else ""),
             f"GPUs: {html.escape(_gpus_text(p, ' + '))}",
             f"{p.tokens_per_s:,.0f} tokens/s", f"${p.usd_per_1m_tokens:,.4g} per 1M tokens",
             f"${p.usd_per_hour:,.2f} per hour", f"plan: {html.escape(p.plan)}"]
    return "<br>".join(lines)


def pareto_figure(points: Sequence[ParetoPoint], title: str) -> go.Figure:
    """Scatter of $ per 1M tokens (x) against tokens/s (y): one trace per kind of composition
    (its own marker symbol and legend entry), front points larger and outlined and joined by a
    step line. Points without a plan are left out (the table lists them)."""
    import plotly.graph_objects as go  # deferred: start-up time (plotly)

    mask = pareto_mask(points)
    fig = go.Figure()
    for name, symbol, colour in _KINDS:
        kind = [(p, f) for p, f in zip(points, mask, strict=True)
                if p.has_plan and p.mixed == (name == "mixed")]
        if not kind:
            continue
        fig.add_trace(go.Scatter(
            x=[p.usd_per_1m_tokens for p, _ in kind], y=[p.tokens_per_s for p, _ in kind],
            mode="markers", name=name, hovertext=[_hover(p, f) for p, f in kind],
            hoverinfo="text",
            marker={"symbol": symbol, "color": colour, "opacity": 0.9,
                    "size": [15 if f else 9 for _, f in kind],
                    "line": {"color": "#222222", "width": [2 if f else 0 for _, f in kind]}}))
    front = sorted((p for p, f in zip(points, mask, strict=True) if f),
                   key=lambda p: (p.usd_per_1m_tokens or 0.0, p.tokens_per_s or 0.0))
    if front:
        # "hv": from each front point the best rate stays flat until the next costlier one.
        fig.add_trace(go.Scatter(
            x=[p.usd_per_1m_tokens for p in front], y=[p.tokens_per_s for p in front],
            mode="lines", name="Pareto front", hoverinfo="skip",
            line={"shape": "hv", "color": "#2ca02c", "width": 2, "dash": "dot"}))
    fig.update_layout(title=title, template="plotly_white", height=650,
                      xaxis_title="$ per 1M tokens (lower is better)",
                      yaxis_title="tokens/s (higher is better)",
                      legend={"title": "composition"}, hoverlabel={"namelength": -1})
    return fig


def write_html(points: Sequence[ParetoPoint], path: str | Path, title: str) -> None:
    """Self-contained HTML (plotly.js inlined: works offline) with a fixed div id, so the same
    points write byte-identical files."""
    html_text = pareto_figure(points, title).to_html(
        include_plotlyjs=True, full_html=True, div_id=DIV_ID,
        config={"displaylogo": False, "responsive": True})
    Path(path).write_text(mark_html(html_text), encoding="utf-8")
