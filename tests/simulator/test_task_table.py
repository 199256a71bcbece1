"""The columnar task storage: TaskTable / TaskTableBuilder behave exactly like a Task list."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from trainsim.errors import SimulationError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.simulator.engine_simpy import run_simpy
from trainsim.simulator.program import Program, Task
from trainsim.simulator.random_program import random_program
from trainsim.simulator.task_table import TaskTable, TaskTableBuilder
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model


def _columnar(program: Program) -> Program:
    """The same program with its tasks stored as a TaskTable."""
    return dataclasses.replace(program, tasks=TaskTable.from_tasks(program.tasks))


def _lowered(fold: bool) -> Program:
    model, cluster = get_model("gpt3-125m"), parse_cluster("2x2xA100-SXM4-80GB")
    plan = ParallelPlan.build(model, cluster, dp=2, tp=2, pp=1, num_micro_batches=2,
                              seq_len=128, zero=1)
    return lower(model, cluster, plan, LoweringOptions(fold=fold))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_table_round_trips_every_task_field(seed: int) -> None:
    """Tasks stored as columns read back as equal Task objects, field for field (None
    frequencies and empty link/dep tuples included)."""
    program = random_program(seed, 4, 60, num_links=3)
    table = TaskTable.from_tasks(program.tasks)
    assert len(table) == program.num_tasks
    assert list(table) == program.tasks
    assert table[5] == program.tasks[5]
    assert table.names() == [t.name for t in program.tasks]


@pytest.mark.parametrize("seed", [3, 4])
def test_freeze_is_the_same_from_columns_or_objects(seed: int) -> None:
    """freeze() gives identical arrays whether the program holds a Task list or a TaskTable."""
    program = random_program(seed, 3, 80, num_links=4)
    a, b = program.freeze(), _columnar(program).freeze()
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("fold", [True, False])
def test_lowered_program_is_columnar_and_equals_its_object_twin(fold: bool) -> None:
    """Lowering stores its tasks as a TaskTable; copying them into a plain Task list changes
    nothing the engines see: both forms give the same SimPy timeline and frozen arrays."""
    program = _lowered(fold)
    assert isinstance(program.tasks, TaskTable)
    twin = dataclasses.replace(program, tasks=list(program.tasks))
    assert np.array_equal(run_simpy(program).end_s, run_simpy(twin).end_s)
    a, b = program.freeze(), twin.freeze()
    assert np.array_equal(a.dep_idx, b.dep_idx) and np.array_equal(a.link_idx, b.link_idx)
    assert a.kind_names == b.kind_names and a.stream_names == b.stream_names
    program.validate()


def test_builder_formats_names_and_keeps_late_deps_last() -> None:
    """A template name is formatted with its argument (a literal with -1), and deps added with
    add_dep come after the task's own deps, in the order added."""
    b = TaskTableBuilder()
    fwd, lit = b.name_template("s2.F%d"), b.name_template("optimizer")
    kind, stream = b.kind("forward"), b.stream("compute")
    t0 = b.add(fwd, 7, kind, stream, (0,), 1.0, 0.0, (), (), 0.0, 0.0, 0.0, math.nan,
               7, 2, -1, -1)
    t1 = b.add(lit, -1, kind, stream, (0,), 1.0, 0.0, (), (t0,), 0.0, 0.0, 0.0, 1410.0,
               -1, -1, -1, -1)
    t2 = b.add(fwd, 8, kind, stream, (1,), 1.0, 0.0, (), (), 0.0, 0.0, 0.0, math.nan,
               8, 2, -1, -1)
    b.add_dep(t2, t1)
    b.add_dep(t1, t0)  # t0 again, after t1 own dep
    table = b.build()
    assert table.names() == ["s2.F7", "optimizer", "s2.F8"]
    assert table[1].deps == (t0, t0) and table[2].deps == (t1,)
    assert table[0].freq_mhz is None and table[1].freq_mhz == 1410.0


@pytest.mark.parametrize(("change", "message"), [
    ({"ranks": (5,)}, r"rank 5 out of range \(num_ranks=2\)"),
    ({"deps": (9,)}, r"dep 9 out of range"),
    ({"links": ("nowhere",), "comm_bytes": 1.0}, r"unknown link 'nowhere'"),
    ({"duration_s": -1.0}, r"duration_s=-1.0"),
])
def test_columnar_validation_gives_the_object_message(change: dict, message: str) -> None:
    """A bad task in a TaskTable is reported with the same message as in a Task list."""
    tasks = [Task(name="a", kind="forward", ranks=(0,), stream="compute", duration_s=1.0),
             Task(name="b", kind="forward", ranks=(1,), stream="compute", duration_s=1.0)]
    bad = dataclasses.replace(tasks[1], **change) if "duration_s" not in change else \
        Task.__new__(Task)
    if "duration_s" in change:
        for f in dataclasses.fields(Task):
            object.__setattr__(bad, f.name, change.get(f.name, getattr(tasks[1], f.name)))
    program = Program(num_ranks=2, tasks=TaskTable.from_tasks([tasks[0], bad]),
                      link_bandwidth_bytes_per_s={"l": 1.0})
    with pytest.raises(SimulationError, match=message):
        program.validate()
    with pytest.raises(SimulationError, match=message):
        Program(num_ranks=2, tasks=[tasks[0], bad], link_bandwidth_bytes_per_s={"l": 1.0}
                ).validate()
