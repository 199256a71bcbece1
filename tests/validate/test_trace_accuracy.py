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

_ITERATION_GAPS = {
    "tiny-gpt-pp2": "-13.5 %: stage 1 busy 191.7 ms measured against 167.4 simulated, and the "
                    "pipeline waits follow it",
    "tiny-gpt-tp2": "-20.1 %: the measured all-reduces take ~3 ms each in the training loop "
                    "against ~1.6 ms priced from the profile's (gloo wake-ups, 20 an iteration)",
    "tiny-t5-dp2": "-19.6 %: run whole, tiny-t5 takes x1.35-1.43 its ops timed one by one; the "
                   "committed profile predates the whole-model rows that price it",
}
_KIND_GAPS = {
    "tiny-gpt-pp2": "comm: the pipeline waits follow the under-predicted stage 1",
    "tiny-gpt-tp2": "comm and matmul: the profiled iteration (159 ms) is 31 % longer than the "
                    "timed ones (121 ms); see the iteration gap",
    "tiny-t5-dp2": "cross_entropy: 37 aten ops per call, each ~5.6 us slower under the "
                   "profiler (bench/cpu_ops.py); 0.65 against 0.33 ms per micro-batch",
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


@pytest.mark.xfail(strict=True, reason="three of four traces are outside 10 % (see above)")
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
