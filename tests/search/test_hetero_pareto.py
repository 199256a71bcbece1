"""The heterogeneous planner's cost–throughput Pareto front: which points are on it, the CSV, the
rich table, the plotly figure and its page in headless Chromium."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from rich.console import Console

from trainsim.search.hetero.pareto import (
    CSV_COLUMNS,
    DIV_ID,
    ParetoPoint,
    format_table,
    pareto_figure,
    pareto_mask,
    write_html,
    write_table,
)


def _point(name: str, tokens: float | None, cost: float | None, *, mixed: bool = False,
           plan: str = "", error: str | None = None) -> ParetoPoint:
    gpus = (("A100-SXM4-40GB", 8), ("A10", 8)) if mixed else (("A100-SXM4-40GB", 8),)
    return ParetoPoint(composition=name, gpus=gpus, mixed=mixed, tokens_per_s=tokens,
                       iteration_time_s=1e6 / tokens if tokens else None,
                       usd_per_hour=40.0 if mixed else 30.0, usd_per_1m_tokens=cost,
                       plan=plan or ("" if tokens is None else f"tp=2 pp=4 dp=1 [{name}]"),
                       error=error)


def _sample() -> list[ParetoPoint]:
    """Three front points (one mixed), one dominated of each kind, one without a plan."""
    return [
        _point("cheap", 1000.0, 1.0),
        _point("dominated", 900.0, 1.5),
        _point("mid-mixed", 2000.0, 2.0, mixed=True),
        _point("mixed-dominated", 1500.0, 2.5, mixed=True),
        _point("fast", 3000.0, 4.0),
        _point("oom", None, None, mixed=True, error="OOM on stage 0"),
    ]


def test_front_drops_dominated_and_planless_points() -> None:
    """Cheaper-and-faster beats; equal cost but slower, or equal rate but dearer, is dominated;
    a point without a plan is never on the front, even if its (absent) figures would win."""
    assert pareto_mask(_sample()) == [True, False, True, False, True, False]
    points = [
        _point("a", 100.0, 2.0),
        _point("same-cost-slower", 90.0, 2.0),
        _point("same-rate-dearer", 100.0, 3.0),
        _point("faster-dearer", 110.0, 3.0),
        _point("none", None, None, error="no fit"),
    ]
    assert pareto_mask(points) == [True, False, False, True, False]
    assert pareto_mask([_point("a", 100.0, 2.0), _point("dearer", 100.0, 3.0)]) == [True, False]


def test_front_keeps_ties_and_handles_edge_cases() -> None:
    """Identical figures are all on the front; one planned point is its own front; nothing
    planned means no front; a zero rate is not a plan."""
    twins = [_point("x", 500.0, 1.0), _point("y", 500.0, 1.0), _point("z", 400.0, 1.0)]
    assert pareto_mask(twins) == [True, True, False]
    assert pareto_mask([_point("solo", 10.0, 9.0)]) == [True]
    assert pareto_mask([_point("n", None, None, error="no fit")]) == [False]
    assert pareto_mask([]) == []
    assert pareto_mask([_point("zero", 0.0, 5.0), _point("p", 1.0, 50.0)]) == [False, True]


def test_front_matches_brute_force_on_a_grid() -> None:
    """The sort-and-sweep mask equals the pairwise definition on points with many equal costs
    and rates."""
    points = [_point(f"p{i}", float(1 + (i * 7) % 5), float((i * 3) % 4) + 0.5)
              for i in range(40)]
    figures = [(p.usd_per_1m_tokens or 0.0, p.tokens_per_s or 0.0) for p in points]

    def dominated(cost: float, rate: float) -> bool:
        return any(c <= cost and r >= rate and (c, r) != (cost, rate) for c, r in figures)

    expected = [not dominated(c, r) for c, r in figures]
    assert pareto_mask(points) == expected
    assert 0 < sum(expected) < len(points)


def test_csv_round_trip(tmp_path: Path) -> None:
    """One row per point in input order, the documented columns, on_front as the mask, floats
    that read back exactly and empty cells for missing figures."""
    points = _sample()
    path = tmp_path / "pareto.csv"
    write_table(points, path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        rows = list(reader)
    assert [r["composition"] for r in rows] == [p.composition for p in points]
    assert [r["on_front"] == "true" for r in rows] == pareto_mask(points)
    assert {r["on_front"] for r in rows} == {"true", "false"}
    assert rows[2]["gpus"] == "A100-SXM4-40GBx8+A10x8" and rows[2]["mixed"] == "true"
    assert float(rows[0]["tokens_per_s"]) == points[0].tokens_per_s
    assert rows[5]["tokens_per_s"] == "" and rows[5]["error"] == "OOM on stage 0"
    assert rows[4]["plan"] == points[4].plan


def test_table_lists_front_first_with_a_star() -> None:
    """Front rows come first, cheapest first, starred; then the other planned ones; the
    planless row last, showing its error."""
    console = Console(width=250, record=True)
    console.print(format_table(_sample()))
    lines = [ln for ln in console.export_text().splitlines()
             if any(name in ln for name in ("cheap", "dominated", "mixed", "fast", "oom"))]
    names = [re.findall(r"cheap|mixed-dominated|dominated|mid-mixed|fast|oom", ln)[0]
             for ln in lines]
    assert names == ["cheap", "mid-mixed", "fast", "dominated", "mixed-dominated", "oom"]
    assert ["★" in ln for ln in lines] == [True, True, True, False, False, False]
    assert "OOM on stage 0" in lines[-1]


def test_figure_tells_mixed_from_homogeneous_and_hovers_the_plan() -> None:
    """Two marker traces with different symbols (one legend entry each), front markers larger,
    a step line through the front, hover text with the plan; planless points not drawn."""
    points = _sample()
    fig = pareto_figure(points, "test")
    markers = [t for t in fig.data if t.mode == "markers"]
    assert sorted(t.name for t in markers) == ["homogeneous", "mixed"]
    assert len({t.marker.symbol for t in markers}) == 2
    assert sum(len(t.x) for t in markers) == 5
    mixed = next(t for t in markers if t.name == "mixed")
    assert list(mixed.marker.size) == [15, 9]  # mid-mixed on the front, the other not
    hover = " ".join(h for t in markers for h in t.hovertext)
    assert points[2].plan in hover and "A100-SXM4-40GBx8 + A10x8" in hover
    front = next(t for t in fig.data if t.name == "Pareto front")
    assert front.line.shape == "hv"
    assert list(front.x) == [1.0, 2.0, 4.0] and list(front.y) == [1000.0, 2000.0, 3000.0]


def test_figure_with_one_kind_only() -> None:
    """Homogeneous points only: one marker trace, still a front line."""
    fig = pareto_figure([_point("a", 1.0, 1.0), _point("b", 2.0, 3.0)], "t")
    assert [t.name for t in fig.data] == ["homogeneous", "Pareto front"]


def test_html_is_self_contained_and_byte_identical(tmp_path: Path) -> None:
    """plotly.js is inlined (no script src), the div id is fixed, the generator marker is in,
    and two writes of the same points are byte-identical."""
    write_html(_sample(), tmp_path / "a.html", "pareto")
    write_html(_sample(), tmp_path / "b.html", "pareto")
    first = (tmp_path / "a.html").read_bytes()
    assert first == (tmp_path / "b.html").read_bytes()
    text = first.decode()
    assert re.findall(r"<script[^>]*\bsrc=", text) == []
    assert f'id="{DIV_ID}"' in text and 'content="trainsim"' in text
    assert "Plotly.newPlot" in text and len(first) > 1_000_000


def test_html_renders_in_headless_chromium(tmp_path: Path, render_dom) -> None:
    """Headless Chromium runs the page without an uncaught JS error, and plotly drew it: one
    marker per planned point, the front line and both legend entries in the rendered DOM."""
    page = tmp_path / "pareto.html"
    write_html(_sample(), page, "pareto")
    dom, errors = render_dom(page, 900)
    assert not errors, errors
    assert 'class="main-svg"' in dom
    assert len(re.findall(r'<path class="point"', dom)) == 5
    assert "Pareto front" in dom and "homogeneous" in dom and "mixed" in dom
