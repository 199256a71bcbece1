"""The Program IR: task checks, program validation, builder and freeze() to struct-of-arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainsim.errors import SimulationError
from trainsim.simulator.program import Program, Task


def _task(name: str, rank: int | tuple[int, ...] = 0, **kw) -> Task:
    ranks = (rank,) if isinstance(rank, int) else rank
    kw.setdefault("kind", "forward")
    kw.setdefault("stream", "compute")
    kw.setdefault("duration_s", 1.0)
    return Task(name=name, ranks=ranks, **kw)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"duration_s": -1.0}, "duration_s=-1.0"),
        ({"duration_s": math.nan}, "duration_s=nan"),
        ({"ranks": ()}, "ranks=()"),
        ({"ranks": (1, 1)}, "repeated rank"),
        ({"comm_bytes": 10.0}, "needs at least one link"),
        ({"links": ("a", "a")}, "distinct"),
        ({"mem_free_bytes": -5.0}, "mem_free_bytes=-5.0"),
        ({"kind": ""}, "kind=''"),
    ],
)
def test_task_rejects_bad_fields(fields: dict, message: str) -> None:
    """A Task with a negative/NaN number, no or repeated ranks, or bytes without links fails."""
    base = {"name": "t", "kind": "forward", "ranks": (0,), "stream": "compute", "duration_s": 1.0}
    base.update(fields)
    with pytest.raises(SimulationError, match=message):
        Task(**base)


def test_program_defaults_fill_per_rank_fields() -> None:
    """Empty per-rank fields mean static 0, capacity inf, idle 0 and identity folding."""
    program = Program(num_ranks=3)
    assert program.static_memory_bytes == (0.0, 0.0, 0.0)
    assert program.memory_capacity_bytes == (math.inf,) * 3
    assert program.idle_power_w == (0.0, 0.0, 0.0)
    assert program.represents == ((0,), (1,), (2,))
    assert program.powered_streams == frozenset({"compute"})
    assert program.num_physical_ranks == 3


def test_program_rejects_wrong_per_rank_lengths() -> None:
    """A per-rank list of the wrong length names the field and the expected length."""
    with pytest.raises(SimulationError, match="idle_power_w has 1 entries, expected num_ranks=2"):
        Program(num_ranks=2, idle_power_w=[10.0])


def test_program_rejects_overlapping_represents() -> None:
    """Folding groups must be disjoint sets of physical ranks."""
    with pytest.raises(SimulationError, match="represents"):
        Program(num_ranks=2, represents=[(0, 1), (1, 2)])


def test_validate_names_the_task_with_an_out_of_range_rank() -> None:
    """A member rank >= num_ranks is reported with the task id and name."""
    program = Program(num_ranks=2, tasks=[_task("a"), _task("b", 5)])
    with pytest.raises(SimulationError, match=r"task 1 'b': rank 5 out of range \(num_ranks=2\)"):
        program.validate()


def test_validate_rejects_unknown_link_and_bad_deps() -> None:
    """Unknown link ids, out-of-range deps and self-deps are each reported with the task."""
    unknown = Program(
        num_ranks=1,
        tasks=[_task("x", comm_bytes=1.0, links=("nvl0",))],
        link_bandwidth_bytes_per_s={"nic0": 1e9},
    )
    with pytest.raises(SimulationError, match=r"task 0 'x': unknown link 'nvl0' \(known: nic0\)"):
        unknown.validate()
    with pytest.raises(SimulationError, match="dep 7 out of range"):
        Program(num_ranks=1, tasks=[_task("a", deps=(7,))]).validate()
    with pytest.raises(SimulationError, match="depends on itself"):
        Program(num_ranks=1, tasks=[_task("a", deps=(0,))]).validate()


def test_validate_allows_forward_deps_but_finds_cycles() -> None:
    """A dep on a later index is fine; a dependency cycle is named task by task."""
    forward = Program(num_ranks=2, tasks=[_task("a", 0, deps=(1,)), _task("b", 1)])
    forward.validate()
    cyclic = Program(
        num_ranks=3,
        tasks=[_task("a", 0, deps=(2,)), _task("b", 1, deps=(0,)), _task("c", 2, deps=(1,))],
    )
    with pytest.raises(SimulationError, match="dependency cycle 0 'a' -> 2 'c' -> 1 'b' -> 0 'a'"):
        cyclic.validate()
    cyclic.validate(check_cycles=False)  # engines report it as a deadlock instead


def test_freeze_packs_tasks_into_csr_arrays() -> None:
    """freeze() gives member, dep, link and queue CSR arrays that match the tasks by hand."""
    program = Program(
        num_ranks=2,
        tasks=[
            _task("f0", 0, freq_mhz=1410.0),  # queue (0, compute)
            _task("f1", 1),  # queue (1, compute)
            _task(
                "ar",
                (0, 1),
                kind="all_reduce",
                stream="dp",
                deps=(0, 1),  # (0, dp), (1, dp)
                comm_bytes=8.0,
                links=("b", "a"),
            ),
            _task("o0", 0, kind="optimizer", deps=(2,)),  # (0, compute)
        ],
        link_bandwidth_bytes_per_s={"a": 2.0, "b": 4.0},
        powered_streams=frozenset({"compute"}),
    )
    fp = program.freeze()
    assert fp.num_tasks == 4 and fp.num_ranks == 2
    assert fp.kind_names == ("forward", "all_reduce", "optimizer")
    assert fp.kind_code.tolist() == [0, 0, 1, 2]
    assert fp.stream_names == ("compute", "dp")
    assert fp.stream_powered.tolist() == [True, False]
    assert fp.member_ptr.tolist() == [0, 1, 2, 4, 5]
    assert fp.member_rank.tolist() == [0, 1, 0, 1, 0]
    assert fp.dep_ptr.tolist() == [0, 0, 0, 2, 3]
    assert fp.dep_idx.tolist() == [0, 1, 2]
    assert fp.link_names == ("a", "b")
    assert fp.link_idx.tolist() == [1, 0]
    assert fp.link_bandwidth_bytes_per_s.tolist() == [2.0, 4.0]
    # Queues sorted by (rank, stream code): (0,compute)=[0,3], (0,dp)=[2], (1,compute)=[1], (1,dp)=[2]
    assert fp.queue_ptr.tolist() == [0, 2, 3, 4, 5]
    assert fp.queue_task.tolist() == [0, 3, 2, 1, 2]
    assert fp.queue_rank.tolist() == [0, 0, 1, 1]
    assert fp.queue_stream.tolist() == [0, 1, 0, 1]
    assert fp.member_queue.tolist() == [0, 2, 1, 3, 0]
    assert fp.member_pos.tolist() == [0, 0, 0, 0, 1]
    assert fp.freq_mhz[0] == 1410.0 and np.isnan(fp.freq_mhz[1])
    assert fp.lone_transfer_s().tolist() == [0.0, 0.0, 4.0, 0.0]  # 8 bytes over the 2 B/s link


def test_freeze_of_an_empty_program() -> None:
    """An empty program freezes to empty arrays with one-element pointer arrays."""
    fp = Program(num_ranks=2).freeze()
    assert fp.num_tasks == 0
    assert fp.member_ptr.tolist() == [0] and fp.queue_ptr.tolist() == [0]
    assert fp.static_memory_bytes.tolist() == [0.0, 0.0]


def test_task_accepts_lists_and_stores_tuples() -> None:
    """ranks, links and deps given as lists are stored as tuples (hashable, immutable)."""
    task = Task(
        name="t", kind="p2p", ranks=[0, 1], stream="pp", duration_s=0.0, links=["l"], deps=[3]
    )
    assert (task.ranks, task.links, task.deps) == ((0, 1), ("l",), (3,))
