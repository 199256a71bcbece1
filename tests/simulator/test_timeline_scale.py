"""Timelines and traces of many ranks (issue 18, item 6): rank groups, the grouped page, rank
selections for Chrome traces, and `sim simulate --timeline-rank / --trace-ranks`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainsim import api
from trainsim.cli import main
from trainsim.errors import SpecError
from trainsim.simulator.chrome_trace import to_chrome_trace
from trainsim.simulator.engine_simpy import run_simpy
from trainsim.simulator.random_program import random_program
from trainsim.simulator.result import SimResult
from trainsim.simulator.timeline_groups import (
    GROUP_THRESHOLD,
    RankSelection,
    check_rank,
    default_trace_groups,
    rank_groups,
    rank_ranges,
    step_envelope,
)
from trainsim.simulator.timeline_plot import timeline_figure, write_timeline_html

MODEL, CLUSTER = "gpt3-125m", "8x8xA100-SXM4-80GB"
PLAN = {"tp": 2, "pp": 4, "dp": 8, "global_batch": 32, "seq_len": 256}


def _run(unfold: bool, **overrides: object) -> SimResult:
    spec, hw = api.load_model(MODEL), api.load_cluster(CLUSTER)
    plan = api.make_plan(spec, hw, None, **{**PLAN, **overrides})
    return api.simulate(spec, hw, plan, unfold=unfold)


@pytest.fixture(scope="module")
def unfolded() -> SimResult:
    """64 GPUs, each its own rank: 4 stages × 16 GPUs."""
    return _run(True)


@pytest.fixture(scope="module")
def folded() -> SimResult:
    return _run(False)


def test_groups_are_stages_with_their_gpus(unfolded: SimResult) -> None:
    """An unfolded 64-GPU run falls into one group per pipeline stage, 16 GPUs each, drawn from
    its lowest rank; the groups cover every rank once."""
    groups = rank_groups(unfolded)
    assert [g.label for g in groups] == ["stage 0", "stage 1", "stage 2", "stage 3"]
    assert [g.position for g in groups] == [0, 1, 2, 3]
    assert all(g.gpus == 16 and len(g.ranks) == 16 for g in groups)
    assert all(g.representative == min(g.ranks) for g in groups)
    assert sorted(r for g in groups for r in g.ranks) == list(range(64))
    assert {g.gpu for g in groups} == {"A100-SXM4-80GB"}
    assert groups[3].note == f"stage 3 · 16 GPUs, showing rank {groups[3].representative}"


def test_expanded_and_folded_results_group_alike(unfolded: SimResult, folded: SimResult) -> None:
    """A folded run's program ranks (each standing for 16 GPUs) and its expand() form the same
    stage groups as the unfolded run."""
    for result in (folded, folded.expand()):
        groups = rank_groups(result)
        assert [g.label for g in groups] == [g.label for g in rank_groups(unfolded)]
        assert [g.gpus for g in groups] == [16] * 4
    fig = timeline_figure(folded, group=True, focus_rank=40)
    owner = next(rec.rank for rec in folded.ranks if 40 in rec.represents)
    assert f"rank 40 (program rank {owner}) · compute" in fig.layout.yaxis.categoryarray


def test_grouped_page_draws_representatives_capacity_and_focus(unfolded: SimResult) -> None:
    """Past the threshold: bars only from each group's representative and the focus rank, rows
    labelled by stage and GPU count, a hover line naming the group, one memory line per row set
    (legend2) and a labelled capacity line."""
    assert len(unfolded.ranks) > GROUP_THRESHOLD
    groups = rank_groups(unfolded)
    fig = timeline_figure(unfolded, focus_rank=37)
    bars = [t for t in fig.data if t.type == "bar"]
    reps = {g.representative for g in groups}
    expected = unfolded.tasks[unfolded.tasks["rank"].isin(reps | {37})]
    assert sum(len(t.x) for t in bars) == len(expected)
    rows = list(fig.layout.yaxis.categoryarray)
    assert rows[0] == "stage 0 (16 GPUs) · compute"
    assert "rank 37 · compute" in rows
    assert any(r.endswith(" · pp") for r in rows)  # a group's sends/receives share one row
    assert not any(">" in r for r in rows if not r.startswith("rank 37"))
    assert all("customdata[6]" in t.hovertemplate for t in bars)
    notes = {str(n) for t in bars for n in np.asarray(t.customdata)[:, 6]}
    assert any(n.startswith("stage 0 · 16 GPUs, showing rank 0") for n in notes)
    memory = [t for t in fig.data if t.type == "scatter" and t.xaxis == "x2"]
    assert len(memory) == len(groups) + 1 and all(t.legend == "legend2" for t in memory)
    texts = [a.text for a in fig.layout.annotations]
    assert "A100-SXM4-80GB capacity 80 GiB" in texts
    assert "64 GPUs in 4 groups" in fig.layout.title.text


def test_group_memory_line_is_the_max_over_its_ranks(unfolded: SimResult) -> None:
    """Each group's memory line peaks at its ranks' largest peak."""
    fig = timeline_figure(unfolded)
    memory = [t for t in fig.data if t.type == "scatter" and t.xaxis == "x2"]
    for group, line in zip(rank_groups(unfolded), memory, strict=True):
        peak = max(unfolded.ranks[r].peak_memory_bytes for r in group.ranks) / 2**30
        assert max(line.y) == pytest.approx(peak)


def test_small_results_keep_the_per_rank_page() -> None:
    """At or below the threshold the page is drawn per rank, as before: no groups, no legend2,
    one memory and one power line per rank."""
    result = run_simpy(random_program(5, 4, 300))
    fig = timeline_figure(result, focus_rank=2)
    assert fig.layout.yaxis.categoryarray[0].startswith("rank 0 · compute")
    assert len([t for t in fig.data if t.type == "scatter"]) == 2 * result.program.num_ranks
    assert "legend2" not in fig.layout.to_plotly_json()


def test_page_size_does_not_grow_with_gpus(tmp_path: Path, unfolded: SimResult) -> None:
    """Twice the data-parallel replicas (same work per replica): the grouped page stays the
    same size within a few per cent."""
    spec, hw = api.load_model(MODEL), api.load_cluster("16x8xA100-SXM4-80GB")
    plan = api.make_plan(spec, hw, None, **{**PLAN, "dp": 16, "global_batch": 64})
    bigger = api.simulate(spec, hw, plan, unfold=True)
    small = write_timeline_html(unfolded, tmp_path / "a.html").stat().st_size
    large = write_timeline_html(bigger, tmp_path / "b.html").stat().st_size
    assert len(bigger.ranks) == 128
    assert abs(large - small) / small < 0.05


def test_step_envelope_is_the_pointwise_max() -> None:
    """Max of two step functions, and beyond max_points a binned envelope that keeps the peak."""
    times = np.array([0.0, 2.0, 0.0, 1.0, 3.0])
    values = np.array([1.0, 5.0, 2.0, 0.0, 7.0])
    t, v = step_envelope(times, values, np.array([0, 2, 5]))
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert v.tolist() == [2.0, 1.0, 5.0, 7.0]
    n = 10_000
    times = np.arange(n, dtype=float)
    values = np.where(np.arange(n) == 4321, 99.0, np.arange(n) % 7)
    t, v = step_envelope(times, values, np.array([0, n]), max_points=100)
    assert len(t) == 100 and v.max() == 99.0


def test_rank_selection_parses_and_checks() -> None:
    """all, ranks, ranges and stages parse; malformed items, backward ranges and numbers past
    the run's size raise one-line SpecErrors."""
    assert RankSelection.parse("all").everything
    sel = RankSelection.parse("0, 8,16-31,stage:2")
    assert sel.spans == ((0, 0), (8, 8), (16, 31)) and sel.stage_spans == ((2, 2),)
    sel.check(64, 4)
    for bad in ("abc", "1,,2", "-1", "stage:", "3-", "0-1-2"):
        with pytest.raises(SpecError, match="is not a rank"):
            RankSelection.parse(bad)
    with pytest.raises(SpecError, match="runs backwards"):
        RankSelection.parse("9-3")
    with pytest.raises(SpecError, match="rank 99999 is out of range; this run has 64 GPUs"):
        RankSelection.parse("99999").check(64, 4)
    with pytest.raises(SpecError, match="stage 4 is out of range"):
        RankSelection.parse("stage:4").check(64, 4)
    with pytest.raises(SpecError, match="out of range"):
        check_rank(-1, 64)
    assert rank_ranges([5, 0, 1, 2, 9, 10]) == "0-2, 5, 9-10"
    assert rank_ranges(list(range(0, 100, 2)), limit=2) == "0, 2, … (50 ranges)"


def test_rank_selection_resolves_on_unfolded_and_folded(unfolded: SimResult,
                                                        folded: SimResult) -> None:
    """Ranks and stages pick result ranks; on a folded result a physical rank picks the program
    rank that stands for it."""
    groups = rank_groups(unfolded)
    assert RankSelection.parse("stage:1").resolve(unfolded) == sorted(groups[1].ranks)
    assert RankSelection.parse("3,5-6").resolve(unfolded) == [3, 5, 6]
    assert RankSelection.parse("all").resolve(unfolded) == list(range(64))
    owner = next(rec.rank for rec in folded.ranks if 40 in rec.represents)
    assert RankSelection.parse("40").resolve(folded) == [owner]


def test_chrome_trace_keeps_the_chosen_ranks(unfolded: SimResult) -> None:
    """A trace of some ranks holds only their processes and events, named with their notes."""
    groups, line = default_trace_groups(unfolded)
    assert groups is not None and line is not None and "--trace-ranks all" in line
    reps = [g.representative for g in groups]
    doc = to_chrome_trace(unfolded, ranks=reps, notes={reps[0]: "stands for stage 0"})
    assert {e["pid"] for e in doc["traceEvents"]} == set(reps)
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert names[0].endswith("· stands for stage 0")
    assert doc["otherData"]["ranks_in_trace"] == 4
    full = to_chrome_trace(unfolded)
    assert len({e["pid"] for e in full["traceEvents"]}) == 64
    assert "ranks_in_trace" not in full["otherData"]
    assert default_trace_groups(run_simpy(random_program(5, 4, 300))) == (None, None)


UNFOLDED_CLI = ["--model", MODEL, "--cluster", CLUSTER, "--tp", "2", "--pp", "4", "--dp", "8",
                "--global-batch", "32", "--seq-len", "256", "--unfold", "--json"]


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", *args])
    out = capsys.readouterr()
    return exit_info.value.code or 0, out.out, out.err


def test_cli_traces_representatives_by_default_and_says_so(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Past 32 ranks `--trace` keeps one rank per stage group and prints how to get all;
    `--trace-ranks stage:0` keeps that stage's ranks; `--timeline-rank` draws its rank."""
    code, _, err = _cli(capsys, *UNFOLDED_CLI, "--trace", str(tmp_path / "t.json"),
                        "--timeline", str(tmp_path / "t.html"), "--timeline-rank", "63")
    assert code == 0 and "--trace-ranks all" in err
    doc = json.loads((tmp_path / "t.json").read_text())
    assert len({e["pid"] for e in doc["traceEvents"]}) == 4
    assert "rank 63 \\u00b7 compute" in (tmp_path / "t.html").read_text()
    code, _, err = _cli(capsys, *UNFOLDED_CLI, "--trace", str(tmp_path / "s.json"),
                        "--trace-ranks", "stage:0")
    assert code == 0 and "--trace-ranks all" not in err
    doc = json.loads((tmp_path / "s.json").read_text())
    assert len({e["pid"] for e in doc["traceEvents"]}) == 16


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace-ranks", "99999"], "rank 99999 is out of range; this run has 64 GPUs"),
        (["--trace-ranks", "abc"], "'abc' is not a rank"),
        (["--trace-ranks", "stage:9"], "stage 9 is out of range"),
        (["--timeline-rank", "-1"], "--timeline-rank -1 must be a GPU rank >= 0"),
        (["--timeline-rank", "64"], "--timeline-rank 64 is out of range"),
    ],
)
def test_cli_bad_rank_options_fail_in_one_line(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, args: list[str],
                                               message: str) -> None:
    """Bad --trace-ranks / --timeline-rank: exit 2, one line, nothing written."""
    outputs = ["--trace", str(tmp_path / "t.json"), "--timeline", str(tmp_path / "t.html")]
    code, out, err = _cli(capsys, *UNFOLDED_CLI, *outputs, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err
    assert list(tmp_path.iterdir()) == []


def test_cli_rank_options_need_their_output(capsys: pytest.CaptureFixture[str]) -> None:
    """--trace-ranks without --trace (and --timeline-rank without --timeline) is an error."""
    code, _, err = _cli(capsys, *UNFOLDED_CLI, "--trace-ranks", "0")
    assert code == 2 and "--trace-ranks needs --trace" in err
    code, _, err = _cli(capsys, *UNFOLDED_CLI, "--timeline-rank", "0")
    assert code == 2 and "--timeline-rank needs --timeline" in err
