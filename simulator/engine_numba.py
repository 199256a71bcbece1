"""The fast engine: the reference engine's semantics as one numba-compiled event loop.

`run_numba` replays a Program exactly as `engine_simpy.run_simpy` does (program.py's module
docstring is the contract both follow) but over the flat arrays of `Program.freeze()`, with no
Python object per task. The loop keeps

* a *wait counter* per task: unfinished deps plus member ranks whose stream has not yet reached
  it (the stream's previous task has not ended). A task starts the instant its counter reaches 0,
  so a start is `max(end of deps, end of the stream predecessor on every member)`, the rule of
  program.py, and a collective is a rendezvous of its members;
* a binary heap of fixed-part ends keyed by (time, task index);
* the fluid links (`event_loop_numba`): transfers in their transfer phase with bytes left and
  rate `min over links of bandwidth / users` (users counted in copies on the physical link:
  program.py, shared links), recomputed after every instant at which the set of
  transfers changed, and one pending wake-up at the earliest completion;
* SM sharing: per rank the number of SM-occupying collectives running and the slowed
  compute-stream task in its fixed part; when a collective's start or end changes that task's
  rate, its work left is drained at the old rate and a new heap entry pushed, the old entry
  becoming stale (skipped when it reaches the top). The floating-point steps are the
  reference's (`work − (now − since) × rate`, `now + work / rate`).

Order within an instant follows the reference: the pending transfer wake-up (SimPy's URGENT
event) runs before fixed-part ends at the same time, so completions come before starts; the
rates are replanned once per instant, which gives the same rates as replanning after every
start because bytes do not drain at zero elapsed time. Floating-point operations are the
reference's own (`now + duration`, `updated + remaining / rate`, `now + max(next_end - now, 0)`)
so both engines give the same times, bit for bit in practice and to 1e-9 relative by contract.

Compiled code is cached on disk (`cache=True`): numba writes it to `__pycache__` beside this
file, or, where that is read-only (a system-wide site-packages), to the user-wide cache
(`~/.cache/numba` on Linux) or the folder named by `NUMBA_CACHE_DIR`; so only the first `sim`
command after an install pays compilation. Every array is cast to one canonical dtype first, so
one compiled specialisation serves every program.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trainsim.errors import SimulationError
from trainsim.simulator.csr_numba import reverse_csr
from trainsim.simulator.engine_simpy import deadlock_error
from trainsim.simulator.event_loop_numba import (
    ST_ENDED,
    STATE_SIZE,
    advance,
    advance_plain,
    init_state,
)
from trainsim.simulator.program import SM_OCCUPIES, FrozenProgram, Program
from trainsim.simulator.result import SimResult, build_result
from trainsim.simulator.task_table import compiled

#: Task ends between two progress reports when `on_progress` is given (about 1% of tasks).
_PROGRESS_PARTS = 100


def successors(frozen: FrozenProgram) -> tuple[np.ndarray, np.ndarray]:
    """Reverse the dependency CSR: task d's dependants are `succ_idx[succ_ptr[d]:succ_ptr[d+1]]`.

    A task listing the same dep twice appears twice, matching its wait count. Compiled from
    `task_table.compiled` deps on (csr_numba.py); numpy's stable argsort below, the same result.
    """
    n = frozen.num_tasks
    if compiled(len(frozen.dep_idx)):
        return reverse_csr(frozen.dep_ptr, frozen.dep_idx, n)
    counts = np.diff(frozen.dep_ptr)
    owner = np.repeat(np.arange(n, dtype=np.int64), counts)
    dep = frozen.dep_idx.astype(np.int64)
    succ_idx = owner[np.argsort(dep, kind="stable")]
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dep, minlength=n), out=succ_ptr[1:])
    return succ_ptr, succ_idx


def event_times(
    frozen: FrozenProgram, *, on_progress: Callable[[int, int], None] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Run the compiled event loop; return per-task (start_s, end_s), NaN where never run.

    Args:
        frozen: the program as arrays (`Program.freeze()`).
        on_progress: called with (tasks ended, total tasks) about every 1% of tasks.

    Returns:
        Start and end time per task id; both NaN for tasks a deadlock kept from running (the
        caller decides how to report it: `run_numba` raises the reference's SimulationError).
    """
    n = frozen.num_tasks
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    if n == 0:
        return start, end
    i64 = np.int64
    succ_ptr, succ_idx = successors(frozen)
    # read only in the loop: no copy where the frozen array already has the canonical dtype
    member_ptr = np.ascontiguousarray(frozen.member_ptr, dtype=i64)
    member_queue = np.ascontiguousarray(frozen.member_queue, dtype=i64)
    member_pos = np.ascontiguousarray(frozen.member_pos, dtype=i64)
    queue_ptr = np.ascontiguousarray(frozen.queue_ptr, dtype=i64)
    queue_task = np.ascontiguousarray(frozen.queue_task, dtype=i64)
    link_ptr = np.ascontiguousarray(frozen.link_ptr, dtype=i64)
    link_idx = np.ascontiguousarray(frozen.link_idx, dtype=i64)
    duration = np.ascontiguousarray(frozen.duration_s, dtype=np.float64)
    comm = np.ascontiguousarray(frozen.comm_bytes, dtype=np.float64)
    bandwidth = np.ascontiguousarray(frozen.link_bandwidth_bytes_per_s, dtype=np.float64)
    slot = np.ascontiguousarray(frozen.link_slot, dtype=i64)
    copies = np.ascontiguousarray(frozen.link_copies, dtype=i64)
    num_comm = int(np.count_nonzero(comm > 0))
    state = np.zeros(STATE_SIZE, dtype=np.float64)
    wait = np.diff(frozen.dep_ptr).astype(i64) + np.diff(member_ptr)
    member_rank = frozen.member_rank.astype(i64)
    phi = np.ascontiguousarray(frozen.comm_sm_fraction, dtype=np.float64)
    # SM roles only where they can matter: a task none of whose ranks has φ > 0 neither slows
    # nor is slowed (so a program without φ runs the old loop's work alone).
    sharing = phi > 0
    retimes = 0
    if not sharing.any():
        role = np.zeros(n, dtype=i64)
    else:
        role = frozen.sm_role.astype(i64)
        if not sharing.all():
            role[~np.logical_or.reduceat(sharing[member_rank], member_ptr[:-1])] = 0
        # Every change of a rank's SM rate may push one more heap entry (the old goes stale).
        retimes = 2 * int(np.diff(member_ptr)[role == SM_OCCUPIES].sum())
    heap_time = np.empty(n + retimes, dtype=np.float64)
    heap_task = np.empty(n + retimes, dtype=i64)
    ranks = frozen.num_ranks
    sm_busy, sm_task, pending = (np.zeros(ranks, i64), np.full(ranks, -1, i64),
                                 np.zeros(ranks, i64))
    work_left, work_since, work_rate, fixed_end = (np.zeros(n), np.zeros(n), np.ones(n),
                                                   np.full(n, -1.0))
    act_task = np.empty(max(num_comm, 1), dtype=i64)
    act_rem = np.empty(max(num_comm, 1), dtype=np.float64)
    act_rate = np.empty(max(num_comm, 1), dtype=np.float64)
    users = np.zeros(max(len(bandwidth), 1), dtype=i64)  # per physical link: no more slots
    stack = np.empty(n, dtype=i64)
    done_buf = np.empty(max(num_comm, 1), dtype=i64)
    arrays = (
        duration, comm, member_ptr, member_queue, member_pos, queue_ptr, queue_task,
        succ_ptr, succ_idx, link_ptr, link_idx, bandwidth, slot, copies,
        wait, start, end, heap_time, heap_task, act_task, act_rem, act_rate, users, stack,
        done_buf, state, role, member_rank, phi, sm_busy, sm_task, work_left, work_since,
        work_rate, fixed_end, pending,
    )  # fmt: skip
    init_state(queue_ptr, queue_task, wait, stack, state)
    # The SM code only where it can act: without an SM-occupying task no task is slowed.
    loop = advance if (role == SM_OCCUPIES).any() else advance_plain
    if on_progress is None:
        loop(*arrays, np.int64(n + 1))
        return start, end
    step = max(n // _PROGRESS_PARTS, 1)
    while True:  # the loop stops early only when nothing is left to run
        target = int(state[ST_ENDED]) + step
        loop(*arrays, np.int64(step))
        on_progress(int(state[ST_ENDED]), n)
        if int(state[ST_ENDED]) < target or int(state[ST_ENDED]) == n:
            break
    return start, end


def run_numba(
    program: Program | FrozenProgram,
    *,
    frozen: FrozenProgram | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Replay `program` with the compiled engine and return its SimResult.

    Args:
        program: the program to run. A FrozenProgram alone is not enough for a SimResult (task
            names live on the Program); pass the Program and give `frozen` to reuse arrays, or
            call `event_times(frozen)` for the bare times.
        frozen: `program.freeze()` if already computed (saves flattening it again).
        on_progress: called with (tasks ended, total tasks) about every 1% of tasks.

    Raises:
        SimulationError: the program is inconsistent (bad rank, dep, link) or deadlocks; the
            deadlock report is the reference engine's (`engine_simpy.deadlock_error`).
    """
    if isinstance(program, FrozenProgram):
        raise SimulationError(
            "run_numba needs the Program (task names, info) to build a SimResult; pass "
            "run_numba(program, frozen=frozen), or use event_times(frozen) for start/end arrays"
        )
    fp = frozen if frozen is not None else program.freeze()
    if fp.num_tasks != program.num_tasks or fp.num_ranks != program.num_ranks:
        raise SimulationError(
            f"run_numba: frozen program has {fp.num_tasks} tasks on {fp.num_ranks} ranks but the "
            f"program has {program.num_tasks} on {program.num_ranks}; freeze this program"
        )
    start, end = event_times(fp, on_progress=on_progress)
    if fp.num_tasks and np.isnan(end).any():
        raise deadlock_error(program, ~np.isnan(end))
    return build_result(program, start, end, engine="numba", frozen=fp)
