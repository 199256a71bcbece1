"""SM sharing (program.py): compute-stream work slows to 1 − φ while a collective runs on its
rank. Hand-computed cases in both engines, the twins agree on random programs with φ, and φ = 0
keeps the old timing rule (a fixed part ends at exactly start + duration)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.errors import SimulationError
from trainsim.simulator.critical_path import lower_bound_s
from trainsim.simulator.engine_numba import run_numba
from trainsim.simulator.engine_simpy import run_simpy
from trainsim.simulator.program import SM_OCCUPIES, SM_SLOWED, Program, sm_roles
from trainsim.simulator.random_program import random_program
from trainsim.simulator.task import Task

RTOL = 1e-9
ENGINES = (run_simpy, run_numba)
MS = 1e-3


def _program(tasks: list[Task], phi: float, num_ranks: int = 1) -> Program:
    return Program(num_ranks=num_ranks, tasks=tasks, link_bandwidth_bytes_per_s={"nv": 1e9},
                   comm_sm_fraction=[phi] * num_ranks)


def _compute(name: str, ms: float, rank: int = 0, deps: tuple[int, ...] = ()) -> Task:
    return Task(name=name, kind="backward", ranks=(rank,), stream="compute",
                duration_s=ms * MS, deps=deps)


def _collective(name: str, ms: float, ranks: tuple[int, ...] = (0,), deps: tuple[int, ...] = (),
                stream: str = "dp", kind: str = "all_reduce") -> Task:
    return Task(name=name, kind=kind, ranks=ranks, stream=stream, duration_s=ms * MS, deps=deps)


@pytest.mark.parametrize("engine", ENGINES)
def test_compute_with_a_4ms_collective_beside_it(engine) -> None:
    """10 ms of compute with a 4 ms collective from t = 0, φ = 0.25: 3 ms of work get done in
    the first 4 ms, the other 7 ms at full speed, so the compute ends at 11 ms; the collective
    itself is not slowed."""
    result = engine(_program([_compute("c", 10), _collective("ar", 4)], 0.25))
    assert result.end_s[0] == pytest.approx(11 * MS, rel=RTOL)
    assert result.end_s[1] == pytest.approx(4 * MS, rel=RTOL)


@pytest.mark.parametrize("engine", ENGINES)
def test_compute_starting_during_a_collective_and_overlapping_collectives(engine) -> None:
    """A collective over [2, 6] ms (it waits for a 2 ms task on another stream) and compute from
    0: 2 + 3 ms of work by 6 ms, 5 left: ends at 11 ms. Two collectives over [0, 4] and [2, 8]
    slow it once, not twice: 6 ms of work by 8 ms, ends at 12 ms. Compute that starts at 1 ms
    inside a collective over [0, 4] runs at 0.75 until 4: 2.25 ms done, ends at 11.75 ms."""
    late = [_compute("c", 10), _compute("pre", 2, deps=()), _collective("ar", 4, deps=(1,))]
    late[1] = dataclasses.replace(late[1], stream="aux")
    assert engine(_program(late, 0.25)).end_s[0] == pytest.approx(11 * MS, rel=RTOL)
    two = [_compute("c", 10), _collective("ar", 4), _compute("pre", 2),
           _collective("ag", 6, deps=(2,), stream="tp", kind="all_gather")]
    two[2] = dataclasses.replace(two[2], stream="aux")
    assert engine(_program(two, 0.25)).end_s[0] == pytest.approx(12 * MS, rel=RTOL)
    inside = [_collective("ar", 4), _compute("pre", 1), _compute("c", 10, deps=(1,))]
    inside[1] = dataclasses.replace(inside[1], stream="aux")
    assert engine(_program(inside, 0.25)).end_s[2] == pytest.approx(11.75 * MS, rel=RTOL)


@pytest.mark.parametrize("engine", ENGINES)
def test_transfer_phase_counts_and_other_ranks_and_kinds_do_not(engine) -> None:
    """A collective holds SMs through its transfer phase too (1 ms fixed + 3 ms of bytes: 4 ms);
    a collective on another rank, a p2p transfer and a compute-stream task's own rank-mates on
    other streams do not slow it."""
    tasks = [_compute("c", 10), Task(name="ar", kind="all_reduce", ranks=(0,), stream="dp",
                                     duration_s=1 * MS, comm_bytes=3e6, links=("nv",))]
    assert engine(_program(tasks, 0.25)).end_s[0] == pytest.approx(11 * MS, rel=RTOL)
    others = [_compute("c", 10), _collective("ar", 4, ranks=(1,)),
              _collective("p", 4, ranks=(0, 1), kind="p2p", stream="pp"),
              Task(name="opt", kind="optimizer", ranks=(0,), stream="aux", duration_s=4 * MS)]
    assert engine(_program(others, 0.25, num_ranks=2)).end_s[0] == pytest.approx(10 * MS,
                                                                                rel=RTOL)


@pytest.mark.parametrize("engine", ENGINES)
def test_phi_zero_keeps_the_old_times_exactly(engine) -> None:
    """With φ = 0 (and with no collective) a compute task ends at exactly start + duration."""
    tasks = [_compute("c", 10), _collective("ar", 4), _compute("d", 3.3)]
    for phi in (0.0, 0.25):
        alone = engine(_program([tasks[0], tasks[2]], phi))
        assert list(alone.end_s) == [10 * MS, 10 * MS + 3.3 * MS]
    plain = engine(_program(tasks, 0.0))
    assert list(plain.end_s) == [10 * MS, 4 * MS, 10 * MS + 3.3 * MS]


def test_roles_follow_kind_stream_and_length() -> None:
    """Occupying: collective kinds with time or bytes; slowed: other compute-stream tasks."""
    tasks = [_compute("c", 1), _collective("ar", 1), _collective("z", 0),
             _collective("p", 1, ranks=(0,), kind="p2p"), _collective("x", 1, stream="compute")]
    roles = sm_roles(_program(tasks, 0.1)).tolist()
    assert roles == [SM_SLOWED, SM_OCCUPIES, 0, 0, SM_OCCUPIES]


def test_phi_must_be_below_one() -> None:
    """A collective cannot hold every SM: φ >= 1 (or negative) is refused with the rank named."""
    with pytest.raises(SimulationError, match=r"comm_sm_fraction\[0\]"):
        _program([_compute("c", 1)], 1.0)
    with pytest.raises(SimulationError, match=r"comm_sm_fraction\[0\]"):
        _program([_compute("c", 1)], -0.1)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), num_ranks=st.integers(1, 6),
       num_tasks=st.integers(0, 200), num_streams=st.integers(2, 5),
       phi=st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9]), min_size=6, max_size=6))
def test_engines_agree_with_sm_sharing(seed, num_ranks, num_tasks, num_streams, phi) -> None:
    """Random programs (collectives on comm streams overlapping compute) with random per-rank
    φ: both engines give the same starts and ends (1e-9 relative) and the same energy; sharing
    never makes a compute task's fixed part shorter than its duration, nor the iteration
    shorter than the critical path at full speed."""
    base = random_program(seed, num_ranks, num_tasks, num_streams=num_streams)
    program = dataclasses.replace(base, comm_sm_fraction=phi[:num_ranks])
    ref, fast = run_simpy(program), run_numba(program)
    np.testing.assert_allclose(fast.start_s, ref.start_s, rtol=RTOL, atol=0)
    np.testing.assert_allclose(fast.end_s, ref.end_s, rtol=RTOL, atol=0)
    assert fast.energy_j == pytest.approx(ref.energy_j, rel=RTOL, abs=1e-12)
    assert ref.iteration_time_s >= lower_bound_s(program) * (1 - 1e-12)
    roles = sm_roles(program)
    slowed = (roles == SM_SLOWED) & (program.table().comm_bytes == 0)
    span = fast.end_s[slowed] - fast.start_s[slowed]
    assert np.all(span >= program.table().duration_s[slowed] * (1 - RTOL))


def test_progress_reports_do_not_change_shared_times() -> None:
    """The compiled loop stopped every ~1% of tasks (a progress bar) and resumed gives the same
    times with sharing on: pending re-timings survive the pause."""
    program = dataclasses.replace(random_program(7, 4, 400, num_streams=4),
                                  comm_sm_fraction=[0.25, 0.5, 0.1, 0.0])
    calls: list[int] = []
    paused = run_numba(program, on_progress=lambda done, total: calls.append(done))
    assert len(calls) > 10
    assert paused.end_s.tolist() == run_numba(program).end_s.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_the_plain_loop_equals_the_shared_one_without_collectives(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program with φ > 0 but no SM-occupying task runs on the loop compiled without the SM
    code (engine_numba picks it); forcing the SM loop gives the same times to the bit."""
    from trainsim.simulator import engine_numba

    base = random_program(seed, 3, 200)
    kept = [i for i, role in enumerate(sm_roles(base)) if role != SM_OCCUPIES]
    assert 0 < len(kept) < len(base.tasks)
    index = {old: new for new, old in enumerate(kept)}
    tasks = [dataclasses.replace(base.tasks[i], deps=tuple(
        index[d] for d in base.tasks[i].deps if d in index)) for i in kept]
    prog = dataclasses.replace(base, tasks=tasks, comm_sm_fraction=[0.25] * base.num_ranks)
    plain = run_numba(prog)
    monkeypatch.setattr(engine_numba, "advance_plain", engine_numba.advance)
    shared = run_numba(prog)
    assert plain.tasks[["start_s", "end_s"]].equals(shared.tasks[["start_s", "end_s"]])
