"""The numba engine on hand-checkable programs: stream order, rendezvous, fluid link sharing,
zero-length tasks, deadlock reports, progress callbacks and dispatch from `simulate`."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.errors import SimulationError, TrainsimError
from trainsim.simulator.engine_numba import event_times, run_numba, successors
from trainsim.simulator.program import Program, Task


def _task(name: str, rank: int | tuple[int, ...] = 0, **kw) -> Task:
    ranks = (rank,) if isinstance(rank, int) else rank
    kw.setdefault("kind", "forward")
    kw.setdefault("stream", "compute")
    kw.setdefault("duration_s", 1.0)
    return Task(name=name, ranks=ranks, **kw)


def _times(program: Program) -> list[tuple[float, float]]:
    result = run_numba(program)
    assert result.engine == "numba"
    return [(float(s), float(e)) for s, e in zip(result.start_s, result.end_s, strict=True)]


def test_chain_on_one_stream_sums_durations() -> None:
    """Tasks on one stream run back to back: 0.5 + 1.25 + 2 = 3.75 s."""
    program = Program(
        num_ranks=1,
        tasks=[_task("a", duration_s=0.5), _task("b", duration_s=1.25), _task("c", duration_s=2.0)],
    )
    assert _times(program) == [(0.0, 0.5), (0.5, 1.75), (1.75, 3.75)]


def test_collective_is_a_rendezvous_of_its_members() -> None:
    """An all-reduce on ranks 0 and 1 starts when rank 1's 3 s task ends and lasts 1 s; rank 0's
    next dp task waits for it although rank 0 was free at 1 s."""
    program = Program(
        num_ranks=2,
        tasks=[
            _task("w0", 0, stream="dp"),
            _task("w1", 1, duration_s=3.0, stream="dp"),
            _task("ar", (0, 1), kind="all_reduce", stream="dp"),
            _task("after", 0, stream="dp", duration_s=0.5),
        ],
    )
    assert _times(program) == [(0.0, 1.0), (0.0, 3.0), (3.0, 4.0), (4.0, 4.5)]


def test_two_transfers_sharing_a_link_take_twice_as_long() -> None:
    """1000 bytes over a 100 B/s link alone take 10 s; two at once share it and end at 20 s; a
    0.5 s fixed part (latency) comes first."""
    links = {"nic": 100.0}
    alone = Program(
        num_ranks=2,
        tasks=[_task("p", (0, 1), kind="p2p", stream="pp", duration_s=0.5, comm_bytes=1000.0,
                     links=("nic",))],
        link_bandwidth_bytes_per_s=links,
    )
    assert _times(alone) == [(0.0, 10.5)]
    shared = Program(
        num_ranks=2,
        tasks=[
            _task("a", 0, kind="p2p", stream="pp", duration_s=0.0, comm_bytes=1000.0,
                  links=("nic",)),
            _task("b", 1, kind="p2p", stream="pp", duration_s=0.0, comm_bytes=1000.0,
                  links=("nic",)),
        ],
        link_bandwidth_bytes_per_s=links,
    )
    assert _times(shared) == [(0.0, 20.0), (0.0, 20.0)]


def test_rates_are_recomputed_when_a_transfer_leaves() -> None:
    """Transfers of 500 and 1500 bytes share a 100 B/s link: the small one ends at 10 s (50 B/s),
    then the big one has 1000 bytes left at 100 B/s and ends at 20 s."""
    program = Program(
        num_ranks=1,
        tasks=[
            _task("small", stream="a", duration_s=0.0, comm_bytes=500.0, links=("l",)),
            _task("big", stream="b", duration_s=0.0, comm_bytes=1500.0, links=("l",)),
        ],
        link_bandwidth_bytes_per_s={"l": 100.0},
    )
    assert _times(program) == [(0.0, 10.0), (0.0, 20.0)]


def test_zero_length_tasks_end_at_their_start() -> None:
    """A zero-length task ends the instant it starts and releases its dependant then."""
    program = Program(
        num_ranks=1,
        tasks=[_task("a", duration_s=2.0), _task("z", stream="x", duration_s=0.0, deps=(0,)),
               _task("c", stream="y", duration_s=1.0, deps=(1,))],
    )
    assert _times(program) == [(0.0, 2.0), (2.0, 2.0), (2.0, 3.0)]


def test_empty_program_takes_no_time() -> None:
    """No tasks: iteration time 0."""
    assert run_numba(Program(num_ranks=2)).iteration_time_s == 0.0


def test_stream_order_deadlock_is_reported_with_stuck_ranks() -> None:
    """Ranks 0 and 1 order two collectives differently: SimulationError names both ranks."""
    program = Program(
        num_ranks=2,
        tasks=[
            _task("x", (0, 1), kind="all_reduce", stream="dp"),
            _task("y", (0, 1), kind="all_reduce", stream="dp", deps=(2,)),
            _task("z", 1, stream="dp", deps=(1,)),
        ],
    )
    with pytest.raises(SimulationError, match=r"deadlock: 2 of 3 tasks.*stuck ranks: 0, 1"):
        run_numba(program)


def test_progress_reports_reach_the_task_count() -> None:
    """on_progress is called with increasing counts ending at (n, n)."""
    program = Program(num_ranks=1, tasks=[_task(f"t{i}", duration_s=0.1) for i in range(250)])
    calls: list[tuple[int, int]] = []
    result = run_numba(program, on_progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (250, 250)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    assert result.iteration_time_s == pytest.approx(25.0)


def test_event_times_and_successors_on_frozen_arrays() -> None:
    """event_times works on a FrozenProgram alone; successors reverses the dep lists."""
    program = Program(num_ranks=2, tasks=[_task("a", 0), _task("b", 1, deps=(0,)),
                                          _task("c", 1, deps=(0, 1))])
    frozen = program.freeze()
    start, end = event_times(frozen)
    assert start.tolist() == [0.0, 1.0, 2.0] and end.tolist() == [1.0, 2.0, 3.0]
    ptr, idx = successors(frozen)
    assert idx[ptr[0]:ptr[1]].tolist() == [1, 2] and idx[ptr[1]:ptr[2]].tolist() == [2]


def test_frozen_program_alone_is_rejected_with_a_hint() -> None:
    """run_numba needs the Program for names; a FrozenProgram alone gets a message saying so."""
    frozen = Program(num_ranks=1, tasks=[_task("a")]).freeze()
    with pytest.raises(SimulationError, match="event_times"):
        run_numba(frozen)  # type: ignore[arg-type]


def test_simulate_dispatches_numba_by_default() -> None:
    """run_program runs numba unless told otherwise; an unknown engine lists the valid ones."""
    from trainsim.simulator.engines import ENGINES, run_program

    program = Program(num_ranks=1, tasks=[_task("a")])
    assert "numba" in ENGINES and "simpy" in ENGINES
    assert run_program(program).engine == "numba"
    assert run_program(program, engine="simpy").engine == "simpy"
    with pytest.raises(TrainsimError, match="numba"):
        run_program(program, engine="nmba")
    assert np.isfinite(run_program(program).end_s).all()
