"""Invariants of the reference engine on random programs (hypothesis): the start rule, bounds from
the critical path and the busiest stream, memory and energy floors, determinism, deadlocks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.errors import SimulationError
from trainsim.simulator.chrome_trace import chrome_trace_json
from trainsim.simulator.critical_path import (
    busiest_stream_s,
    critical_path,
    lower_bound_s,
    predecessors,
)
from trainsim.simulator.engine_simpy import run_simpy, stream_queues
from trainsim.simulator.random_program import random_program

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

programs = st.builds(
    random_program,
    seed=st.integers(0, 2**32 - 1),
    num_ranks=st.integers(1, 6),
    num_tasks=st.integers(0, 250),
    num_streams=st.integers(1, 5),
    num_links=st.integers(1, 4),
    comm_fraction=st.sampled_from([0.0, 0.3, 0.7]),
)


@pytest.mark.slow
@SETTINGS
@given(programs)
def test_start_is_the_last_predecessor_end(program) -> None:
    """Every task starts exactly when its last dep / stream predecessor ends (0 if none), and
    lasts at least its fixed part plus its lone transfer time (sharing only slows transfers)."""
    result = run_simpy(program)
    lone = program.freeze().lone_transfer_s()
    for tid, preds in enumerate(predecessors(program)):
        expected = max((result.end_s[p] for p in preds), default=0.0)
        assert result.start_s[tid] == expected
        task = program.tasks[tid]
        floor = result.start_s[tid] + task.duration_s + lone[tid]
        assert result.end_s[tid] >= floor * (1 - 1e-12)
        if task.comm_bytes == 0:
            assert result.end_s[tid] == result.start_s[tid] + task.duration_s


@pytest.mark.slow
@SETTINGS
@given(programs)
def test_iteration_time_bounds(program) -> None:
    """Iteration time >= the no-sharing critical path and >= the busiest stream's work."""
    result = run_simpy(program)
    assert result.iteration_time_s >= lower_bound_s(program) * (1 - 1e-12)
    assert result.iteration_time_s >= busiest_stream_s(program) * (1 - 1e-12)


@pytest.mark.slow
@SETTINGS
@given(programs)
def test_memory_never_below_static_and_energy_floor(program) -> None:
    """Memory stays >= each rank's static base (never negative); energy >= Σ idle power × time;
    per-rank busy + idle = iteration time."""
    result = run_simpy(program)
    static = np.asarray(program.static_memory_bytes)
    timeline = result.memory_timeline
    assert (timeline["bytes"].to_numpy() >= static[timeline["rank"].to_numpy()] - 1e-9).all()
    floor = sum(program.idle_power_w) * result.iteration_time_s
    assert result.energy_j >= floor * (1 - 1e-12) - 1e-9
    for rank in result.ranks:
        assert rank.busy_s + rank.idle_s == pytest.approx(result.iteration_time_s, abs=1e-9)
        assert 0.0 <= rank.bubble_fraction <= 1.0


@pytest.mark.slow
@SETTINGS
@given(programs)
def test_streams_never_overlap_and_critical_path_is_tight(program) -> None:
    """Tasks of one (rank, stream) run one after another in index order; the critical path is a
    chain where each task starts exactly when the previous one ends, finishing at the end."""
    result = run_simpy(program)
    for queue in stream_queues(program).values():
        ends = result.end_s[queue[:-1]]
        starts = result.start_s[queue[1:]]
        assert (starts >= ends).all()
    chain = critical_path(result)
    if chain:
        assert result.end_s[chain[-1]] == result.iteration_time_s
        for before, after in itertools.pairwise(chain):
            assert result.end_s[before] == result.start_s[after]


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(programs)
def test_same_program_gives_byte_identical_outputs(program) -> None:
    """Two runs of one program give the same summary JSON and the same Chrome trace bytes."""
    first, second = run_simpy(program), run_simpy(program)
    assert first.summary_json() == second.summary_json()
    assert chrome_trace_json(first) == chrome_trace_json(second)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(2, 200))
def test_random_deadlocks_are_reported(seed, num_ranks, num_tasks) -> None:
    """A random program with one cycle closed ends with a deadlock error naming stuck ranks."""
    program = random_program(seed, num_ranks, num_tasks, deadlock=True)
    with pytest.raises(
        SimulationError,
        match=r"deadlock: \d+ of \d+ tasks can never run; "
        r"stuck ranks: \d",
    ):
        run_simpy(program)


def test_random_program_is_deterministic_and_valid() -> None:
    """One seed gives the same program twice; it validates without cycles."""
    first = random_program(7, 4, 300)
    assert first == random_program(7, 4, 300)
    assert first != random_program(8, 4, 300)
    first.validate()
