"""Critical paths: lower bounds on a Program's iteration time and the chain that set a result's.

A task cannot start before every predecessor has ended, where predecessors are its deps and,
on each member rank, the previous task on its stream (program.py). Replacing each task's length
by its length with no link sharing (fixed part + comm_bytes / bottleneck bandwidth) gives a
lower bound on every task's end: the longest path through that graph (the classic critical path
method, Kelley & Walker 1959). Sharing only slows tasks (links slow transfers, collectives
holding SMs slow compute), so the simulated iteration time is always at least `lower_bound_s`,
and at least any one stream's total work (`busiest_stream_s`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from trainsim.errors import SimulationError
from trainsim.simulator.program import Program
from trainsim.simulator.result import SimResult


def predecessors(program: Program) -> list[list[int]]:
    """Per task: its deps plus, on each member rank, the previous task on its stream."""
    preds = [list(task.deps) for task in program.tasks]
    last: dict[tuple[int, str], int] = {}
    for tid, task in enumerate(program.tasks):
        for rank in task.ranks:
            prev = last.get((rank, task.stream))
            if prev is not None:
                preds[tid].append(prev)
            last[(rank, task.stream)] = tid
    return preds


def topological_order(program: Program) -> list[int]:
    """Task ids so every predecessor comes first; raises SimulationError if there is none."""
    preds = predecessors(program)
    succs: dict[int, list[int]] = defaultdict(list)
    indegree = [0] * len(preds)
    for tid, ps in enumerate(preds):
        for p in ps:
            succs[p].append(tid)
            indegree[tid] += 1
    ready = [t for t, d in enumerate(indegree) if d == 0]
    order: list[int] = []
    while ready:
        tid = ready.pop()
        order.append(tid)
        for s in succs[tid]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    if len(order) != len(preds):
        raise SimulationError(
            f"program: {len(preds) - len(order)} tasks lie on or behind a cycle of deps and "
            "stream order (the program deadlocks)"
        )
    return order


def lower_bound_s(program: Program) -> float:
    """Longest predecessor chain with each task at its no-sharing length (a bound from below)."""
    lone = program.freeze().lone_transfer_s() if program.tasks else np.zeros(0)
    preds = predecessors(program)
    finish = np.zeros(len(preds))
    for tid in topological_order(program):
        ready = max((finish[p] for p in preds[tid]), default=0.0)
        finish[tid] = ready + program.tasks[tid].duration_s + lone[tid]
    return float(finish.max()) if len(finish) else 0.0


def busiest_stream_s(program: Program) -> float:
    """Largest total no-sharing work on one (rank, stream) FIFO."""
    lone = program.freeze().lone_transfer_s() if program.tasks else np.zeros(0)
    work: dict[tuple[int, str], float] = defaultdict(float)
    for tid, task in enumerate(program.tasks):
        for rank in task.ranks:
            work[(rank, task.stream)] += task.duration_s + lone[tid]
    return max(work.values(), default=0.0)


def critical_path(result: SimResult) -> list[int]:
    """Task ids of the chain that ended last, first task first.

    Walks back from the last task to end: each step takes the predecessor whose end equals the
    task's start (the latest one; the lowest id on ties), until a task had no predecessor.
    """
    program = result.program
    if not program.tasks:
        return []
    preds = predecessors(program)
    end = result.end_s
    tid = int(np.flatnonzero(end == end.max())[0])
    chain = [tid]
    while preds[tid]:
        latest = max(end[p] for p in preds[tid])
        tid = min(p for p in preds[tid] if end[p] == latest)
        chain.append(tid)
    return chain[::-1]
