"""Issue 13's bar for the committed CPU traces: `sim validate` within 10 % on iteration time for
every trace (mean |error| ≤ 7 %), and within 20 % for every op kind holding ≥ 5 % of the
measured time (its share of the measured per-kind seconds of the stages' first ranks).

Runs the simulator on the files in traces/ (about a second each). Where the bar is not met yet
the test is an expected failure with the reason measured so far (strict: it fails the day the
bar is met, so the mark is removed then).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.validate.compare import Comparison, compare
from trainsim.validate.profile_db import ProfileDB
from trainsim.validate.trace_record import MeasuredTrace

TRACES = ("tiny-gpt-dp2", "tiny-gpt-pp2", "tiny-gpt-tp2", "tiny-t5-dp2")
ITERATION_BAR = 0.10
MEAN_ITERATION_BAR = 0.07
KIND_SHARE = 0.05
KIND_BAR = 0.20

_ITERATION_GAPS: dict[str, str] = {}
_KIND_GAPS = {
    "tiny-gpt-dp2": "comm +33.0 % (8.78 ms measured on rank 0, 11.68 predicted; rank 1's 11.07 "
                    "ms is +5.5 %): the gradient all-reduce is the noisiest kind: three more "
                    "record.sh runs that evening gave -45.2, +11.8 and -27.4 %; every other "
                    "kind within 23 %, the large ones (matmul +4.9 %, optimizer +1.0 %, cross "
                    "entropy +11.6 %) within 12 %",
}


def _mark(name: str, gaps: dict[str, str]) -> pytest.ParameterSet:
    if name in gaps:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=gaps[name]))
    return pytest.param(name)


@pytest.fixture(scope="module")
def comparisons(traces_dir: Path) -> dict[str, Comparison]:
    db = ProfileDB.load(traces_dir / "profile.csv")
    return {t: compare(MeasuredTrace.load(traces_dir / f"{t}.json"), db) for t in TRACES}


@pytest.mark.parametrize("name", [_mark(t, _ITERATION_GAPS) for t in TRACES])
def test_iteration_time_within_10_percent(comparisons: dict[str, Comparison],
                                          name: str) -> None:
    """|predicted − measured| / measured ≤ 10 % for the median iteration."""
    assert abs(comparisons[name].iteration_time_error) <= ITERATION_BAR


def test_mean_iteration_error_at_most_7_percent(comparisons: dict[str, Comparison]) -> None:
    """Mean |iteration-time error| over the committed traces ≤ 7 %."""
    errors = [abs(c.iteration_time_error) for c in comparisons.values()]
    assert sum(errors) / len(errors) <= MEAN_ITERATION_BAR


def large_kinds(c: Comparison) -> list[dict[str, object]]:
    """The op kinds holding ≥ 5 % of the measured per-kind seconds."""
    total = sum(float(k["measured_s"]) for k in c.kinds)
    return [k for k in c.kinds if total > 0 and float(k["measured_s"]) / total >= KIND_SHARE]


@pytest.mark.parametrize("name", [_mark(t, _KIND_GAPS) for t in TRACES])
def test_large_op_kinds_within_20_percent(comparisons: dict[str, Comparison], name: str) -> None:
    """Every op kind with ≥ 5 % of the measured time is predicted, within 20 %."""
    kinds = large_kinds(comparisons[name])
    assert {k["kind"] for k in kinds} >= {"matmul", "comm"}
    off = {k["kind"]: k["error"] for k in kinds
           if k["error"] is None or abs(float(k["error"])) > KIND_BAR}  # type: ignore[arg-type]
    assert not off, off
