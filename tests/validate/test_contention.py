"""The shared-CPU blend: compute tasks between their solo and all-at-once times by overlap.

Hand-built two-rank programs whose fixed points can be solved on paper (validate/contention.py:
d = solo + φ·(pair − solo), φ the share of a task's interval covered by the other rank's
compute).
"""

from __future__ import annotations

import math

import pytest

from trainsim.simulator.program import Program
from trainsim.simulator.task import Task
from trainsim.validate.contention import blend


def _program(durations: dict[str, float], *, chained: bool,
             represents: tuple[tuple[int, ...], ...] = ()) -> Program:
    """Task A on rank 0 and task B on rank 1 (B after A when `chained`)."""
    tasks = [Task(name="A", kind="forward", ranks=(0,), stream="compute",
                  duration_s=durations["A"]),
             Task(name="B", kind="forward", ranks=(1,), stream="compute",
                  duration_s=durations["B"], deps=(0,) if chained else ())]
    return Program(num_ranks=2, tasks=tasks, represents=represents)


def test_tasks_that_never_overlap_run_at_solo_speed() -> None:
    """B waits for A: neither ever computes beside the other, so both take their solo time
    (1 s each, not the all-at-once 2 s): iteration 2 s."""
    out = blend(_program({"A": 2.0, "B": 2.0}, chained=True),
                _program({"A": 1.0, "B": 1.0}, chained=True))
    assert out.result.iteration_time_s == pytest.approx(2.0, rel=1e-3)
    assert out.overlap == pytest.approx((0.0, 0.0), abs=1e-6)


def test_tasks_that_always_overlap_keep_the_all_at_once_time() -> None:
    """A and B start together and are equally long: fully overlapped, the profile's
    all-at-once time (2 s) stands."""
    out = blend(_program({"A": 2.0, "B": 2.0}, chained=False),
                _program({"A": 1.0, "B": 1.0}, chained=False))
    assert out.result.iteration_time_s == pytest.approx(2.0, rel=1e-3)
    assert out.overlap == pytest.approx((1.0, 1.0), rel=1e-3)


def test_partial_overlap_solves_the_fixed_point() -> None:
    """A (solo 2, pair 4) beside a shorter B (solo 1, pair 2): B is always overlapped (2 s);
    A is overlapped for B's 2 s of its length d, so d = 2 + (2/d)·2, i.e. d = 1 + √5."""
    out = blend(_program({"A": 4.0, "B": 2.0}, chained=False),
                _program({"A": 2.0, "B": 1.0}, chained=False))
    assert out.result.iteration_time_s == pytest.approx(1 + math.sqrt(5), rel=1e-3)
    assert out.overlap[1] == pytest.approx(1.0, rel=1e-3)


def test_folded_ranks_always_count_as_overlapped() -> None:
    """A program rank standing for two processes (folded twins) computes beside its twin: the
    all-at-once time stands even though no other program rank computes then."""
    twins = ((0, 2), (1, 3))
    out = blend(_program({"A": 2.0, "B": 2.0}, chained=True, represents=twins),
                _program({"A": 1.0, "B": 1.0}, chained=True, represents=twins))
    assert out.result.iteration_time_s == pytest.approx(4.0, rel=1e-3)
