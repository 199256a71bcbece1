"""The compiled event loop behind `engine_numba`: wait counters, a heap, fluid links.

Everything lives in flat arrays passed in by `engine_numba.event_times` (no Python object per
task), and the few scalars of the loop in one float64 `state` array, so `advance` can stop after
a budget of task ends (for progress bars) and resume where it stopped. Semantics: program.py's
module docstring; order within an instant: engine_numba's docstring.

State slots (`state[...]`):

* ``ST_NOW`` — the current instant;
* ``ST_UPDATED`` — when the transfers' remaining bytes were last drained (`FluidLinks.updated_s`);
* ``ST_NEXT_END`` — earliest completion planned at the last replan (`FluidLinks.next_end_s`);
* ``ST_WAKE`` — the pending wake-up instant, +inf when none;
* ``ST_DIRTY`` — 1 when the set of transfers changed since the last replan;
* ``ST_HEAP``, ``ST_ACTIVE``, ``ST_READY`` — sizes of the fixed-part heap, the transfer list and
  the stack of tasks ready to start now;
* ``ST_ENDED`` — tasks ended so far;
* ``ST_STALE`` — heap entries left stale by re-timing, not yet dropped;
* ``ST_PENDING`` — ranks in `pending` whose count of SM-occupying tasks went to 1 or 0 and
  whose slowed task is still to re-time.

SM sharing (program.py): `sm_busy[r]` counts the SM-occupying tasks running on rank r and
`sm_task[r]` is the slowed task whose fixed part runs there (-1: none). A slowed task keeps its
full-speed work left (`work_left`) as of `work_since`, at rate `work_rate`; when a change of
`sm_busy` changes its rate, the work is drained at the old rate and a new heap entry pushed.
`fixed_end[t]` is the fixed-part end a slowed task's live heap entry carries: an entry whose
time differs is stale and is dropped when it reaches the top (-1 once the fixed part is over).
Only slowed tasks on ranks with φ > 0 get a role (engine_numba), so a program without sharing
runs none of this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

from trainsim.simulator.program import SM_OCCUPIES, SM_SLOWED

(ST_NOW, ST_UPDATED, ST_WAKE, ST_NEXT_END, ST_DIRTY, ST_HEAP, ST_ACTIVE, ST_READY, ST_ENDED,
 ST_STALE, ST_PENDING) = range(11)
STATE_SIZE = 11

F64 = npt.NDArray[np.float64]
"""A float64 array (times, bytes, rates, the state slots)."""
I64 = npt.NDArray[np.int64]
"""An int64 array (task ids, CSR pointers, counters)."""

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(fn: _F) -> _F:
    """`numba.njit(cache=True, nogil=True)`, typed: the compiled function keeps `fn`'s
    signature for the type checker (numba has no type hints of its own)."""
    return cast(_F, numba.njit(cache=True, nogil=True)(fn))


def _jit_inline(fn: _F) -> _F:
    """As `_jit`, inlined into its callers (`inline="always"`)."""
    return cast(_F, numba.njit(cache=True, nogil=True, inline="always")(fn))


@_jit_inline
def _heap_push(heap_time: F64, heap_task: I64, size: int, time: float, task: int) -> int:
    """Sift (time, task) up into the min-heap of `size` entries; return the new size."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        pt = heap_time[parent]
        if pt < time or (pt == time and heap_task[parent] < task):
            break
        heap_time[i] = pt
        heap_task[i] = heap_task[parent]
        i = parent
    heap_time[i] = time
    heap_task[i] = task
    return size + 1


@_jit_inline
def _heap_pop(heap_time: F64, heap_task: I64, size: int) -> int:
    """Remove the root of the heap (caller read it); return the new size."""
    size -= 1
    if size == 0:
        return 0
    time = heap_time[size]
    task = heap_task[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (
            heap_time[right] < heap_time[child]
            or (heap_time[right] == heap_time[child] and heap_task[right] < heap_task[child])
        ):
            child = right
        ct = heap_time[child]
        if ct > time or (ct == time and heap_task[child] > task):
            break
        heap_time[i] = ct
        heap_task[i] = heap_task[child]
        i = child
    heap_time[i] = time
    heap_task[i] = task
    return size


@_jit_inline
def _drain(state: F64, act_rem: F64, act_rate: F64, now: float) -> None:
    """Remaining bytes fall linearly at the current rates up to `now` (clamped at zero)."""
    elapsed = now - state[ST_UPDATED]
    if elapsed > 0:
        for i in range(int(state[ST_ACTIVE])):
            left = act_rem[i] - act_rate[i] * elapsed
            act_rem[i] = max(0.0, left)
    state[ST_UPDATED] = now


@_jit
def _replan(state: F64, act_task: I64, act_rem: F64, act_rate: F64, users: I64, link_ptr: I64,
            link_idx: I64, bandwidth: F64, slot: I64, copies: I64) -> None:
    """Equal-share rates (min over links of bandwidth / users, users counted in copies on the
    physical link: program.py, shared links) and the next wake-up."""
    state[ST_DIRTY] = 0.0
    count = int(state[ST_ACTIVE])
    if count == 0:
        state[ST_NEXT_END] = math.inf
        state[ST_WAKE] = math.inf
        return
    updated = state[ST_UPDATED]
    next_end = math.inf
    for i in range(count):
        t = act_task[i]
        rate = math.inf
        for k in range(link_ptr[t], link_ptr[t + 1]):
            link = link_idx[k]
            share = bandwidth[link] / (users[slot[link]] / copies[link])
            rate = min(rate, share)
        act_rate[i] = rate
        finish = updated + act_rem[i] / rate
        next_end = min(next_end, finish)
    state[ST_NEXT_END] = next_end
    gap = next_end - updated
    state[ST_WAKE] = updated + (max(0.0, gap))


@_jit
def _sm_rate(t: int, member_ptr: I64, member_rank: I64, phi: F64, sm_busy: I64) -> float:
    """The SM rate of task `t`: the lowest over its members (1 − φ where a collective runs)."""
    rate = 1.0
    for m in range(member_ptr[t], member_ptr[t + 1]):
        r = member_rank[m]
        if sm_busy[r] > 0:
            rate = min(rate, 1.0 - phi[r])
    return rate


@_jit
def _retime_pending(now: float, pending: I64, member_ptr: I64, member_rank: I64, phi: F64,
                    sm_busy: I64, sm_task: I64, work_left: F64, work_since: F64,
                    work_rate: F64, fixed_end: F64, heap_time: F64, heap_task: I64,
                    state: F64) -> None:
    """Re-time the slowed tasks on the ranks in `pending` (their count of SM-occupying tasks
    went to 1 or 0 at this instant): drain each one's work at its old rate, push its new end."""
    for i in range(int(state[ST_PENDING])):
        t = sm_task[pending[i]]
        if t < 0 or fixed_end[t] <= now:
            continue  # no slowed task there, or its fixed part ends at this very instant
        rate = _sm_rate(t, member_ptr, member_rank, phi, sm_busy)
        if rate == work_rate[t]:
            continue
        left = work_left[t] - (now - work_since[t]) * work_rate[t]
        work_left[t] = max(0.0, left)
        work_since[t] = now
        work_rate[t] = rate
        finish = now + work_left[t] / rate
        fixed_end[t] = finish
        state[ST_HEAP] = _heap_push(heap_time, heap_task, int(state[ST_HEAP]), finish, t)
        state[ST_STALE] += 1.0
    state[ST_PENDING] = 0.0


@_jit
def _sm_count(t: int, delta: int, member_ptr: I64, member_rank: I64, phi: F64, sm_busy: I64,
              sm_task: I64, pending: I64, state: F64) -> None:
    """Count SM-occupying task `t` in (delta 1) or out (-1) on its ranks; note in `pending` the
    ranks with φ > 0 and a slowed task running whose count went to 1 or 0, for
    `_retime_pending`."""
    k = int(state[ST_PENDING])
    edge = 1 if delta > 0 else 0
    for m in range(member_ptr[t], member_ptr[t + 1]):
        r = member_rank[m]
        sm_busy[r] += delta
        if sm_busy[r] == edge and sm_task[r] >= 0 and phi[r] > 0:
            pending[k] = r
            k += 1
    state[ST_PENDING] = k


@_jit_inline
def _end_task(
    e: int, now: float, member_ptr: I64, member_queue: I64, member_pos: I64, queue_ptr: I64,
    queue_task: I64, succ_ptr: I64, succ_idx: I64, wait: I64, end: F64, stack: I64, state: F64,
) -> None:
    """Task `e` ends now: free its streams and its dependants; queue what became ready."""
    end[e] = now
    state[ST_ENDED] += 1.0
    ready = int(state[ST_READY])
    for m in range(member_ptr[e], member_ptr[e + 1]):
        q = member_queue[m]
        nxt = queue_ptr[q] + member_pos[m] + 1
        if nxt < queue_ptr[q + 1]:
            t = queue_task[nxt]
            wait[t] -= 1
            if wait[t] == 0:
                stack[ready] = t
                ready += 1
    for k in range(succ_ptr[e], succ_ptr[e + 1]):
        t = succ_idx[k]
        wait[t] -= 1
        if wait[t] == 0:
            stack[ready] = t
            ready += 1
    state[ST_READY] = ready


@_jit_inline
def _start_transfer(t: int, now: float, comm: F64, link_ptr: I64, link_idx: I64, act_task: I64,
                    act_rem: F64, act_rate: F64, users: I64, slot: I64, copies: I64,
                    state: F64) -> None:
    """Task `t` enters its transfer phase now with all its bytes left."""
    _drain(state, act_rem, act_rate, now)
    k = int(state[ST_ACTIVE])
    act_task[k] = t
    act_rem[k] = comm[t]
    act_rate[k] = 0.0
    state[ST_ACTIVE] = k + 1
    for j in range(link_ptr[t], link_ptr[t + 1]):
        link = link_idx[j]
        users[slot[link]] += copies[link]
    state[ST_DIRTY] = 1.0


@_jit
def init_state(queue_ptr: I64, queue_task: I64, wait: I64, stack: I64, state: F64) -> None:
    """Count each queue's head as arrived and stack the tasks ready at time 0 (the other arrays
    come initialised; the SM-sharing ones with `sm_busy` 0, `sm_task` -1, `fixed_end` -1).
    It takes only the arrays it touches: each array argument costs numba compile time, which a
    machine's first run pays."""
    for q in range(len(queue_ptr) - 1):
        if queue_ptr[q + 1] > queue_ptr[q]:
            wait[queue_task[queue_ptr[q]]] -= 1
    ready = 0
    for t in range(len(wait) - 1, -1, -1):  # popped from the stack in task-index order
        if wait[t] == 0:
            stack[ready] = t
            ready += 1
    state[:] = 0.0
    state[ST_WAKE] = math.inf
    state[ST_NEXT_END] = math.inf
    state[ST_READY] = ready


def _make_advance(sharing: bool) -> Callable[..., None]:
    """The event loop, compiled with SM sharing (`sharing`) or without: without, numba prunes
    the SM branches (a closure's constant), so a program with no SM-occupying task on a rank
    with φ > 0 (the Quickstart's pipeline) compiles and runs the plain loop alone, and a
    machine's first run does not pay for compiling the SM code it does not use."""

    @_jit
    def advance(
        duration: F64, comm: F64, member_ptr: I64, member_queue: I64, member_pos: I64,
        queue_ptr: I64, queue_task: I64, succ_ptr: I64, succ_idx: I64, link_ptr: I64,
        link_idx: I64, bandwidth: F64, slot: I64, copies: I64, wait: I64, start: F64, end: F64, heap_time: F64,
        heap_task: I64, act_task: I64, act_rem: F64, act_rate: F64, users: I64, stack: I64,
        done_buf: I64, state: F64, role: I64, member_rank: I64, phi: F64, sm_busy: I64,
        sm_task: I64, work_left: F64, work_since: F64, work_rate: F64, fixed_end: F64,
        pending: I64, budget: int | np.int64,
    ) -> None:
        """Run events until `budget` more tasks have ended or nothing is left to run.

        Each round first starts every task that became ready at the current instant (a zero-length
        task ends at once and may ready more), then takes the next event: the transfer wake-up if it
        is not later than the earliest live fixed-part end (completions before starts), else that
        end. SM-occupying tasks are counted in and out at their starts and ends (`_sm_count`); the
        slowed tasks on ranks whose count went to 1 or 0 are re-timed before time moves on: after
        the round's starts, and after an event's ends before the next round's starts
        (`_retime_pending`). Counts only rise among starts and only fall among ends, so this gives
        the rates of re-timing at every change (re-timing at zero elapsed time keeps the work).
        The SM code sits outside `_end_task`: inlined there at three sites it made every event
        about 1.5x slower.
        """
        target = state[ST_ENDED] + budget
        now = state[ST_NOW]
        while True:
            if sharing and state[ST_PENDING] > 0:  # collectives that ended: re-time before anything starts
                _retime_pending(now, pending, member_ptr, member_rank, phi, sm_busy, sm_task,
                                work_left, work_since, work_rate, fixed_end, heap_time, heap_task,
                                state)
            # Start everything ready now; zero-length tasks end at once and may ready more.
            while state[ST_READY] > 0:
                ready = int(state[ST_READY]) - 1
                state[ST_READY] = ready
                t = stack[ready]
                start[t] = now
                sm_role = role[t]
                if sharing and sm_role == SM_OCCUPIES:
                    _sm_count(t, 1, member_ptr, member_rank, phi, sm_busy, sm_task, pending, state)
                if duration[t] > 0:
                    if sharing and sm_role == SM_SLOWED:
                        rate = _sm_rate(t, member_ptr, member_rank, phi, sm_busy)
                        work_left[t] = duration[t]
                        work_since[t] = now
                        work_rate[t] = rate
                        finish = now + duration[t] / rate
                        fixed_end[t] = finish
                        for m in range(member_ptr[t], member_ptr[t + 1]):
                            sm_task[member_rank[m]] = t
                    else:
                        finish = now + duration[t]
                    state[ST_HEAP] = _heap_push(heap_time, heap_task, int(state[ST_HEAP]), finish, t)
                else:
                    # Fixed part over at once: start the transfer, or end (written out here, not
                    # as a helper taking 20 arrays: that call made every event ~15x slower).
                    if comm[t] > 0:
                        _start_transfer(t, now, comm, link_ptr, link_idx, act_task, act_rem,
                                        act_rate, users, slot, copies, state)
                    else:
                        _end_task(t, now, member_ptr, member_queue, member_pos, queue_ptr,
                                  queue_task, succ_ptr, succ_idx, wait, end, stack, state)
            if sharing and state[ST_PENDING] > 0:  # collectives that started now: re-time before time moves
                _retime_pending(now, pending, member_ptr, member_rank, phi, sm_busy, sm_task,
                                work_left, work_since, work_rate, fixed_end, heap_time, heap_task,
                                state)
            if state[ST_ENDED] >= target:
                break
            heap_size = int(state[ST_HEAP])
            if sharing and state[ST_STALE] > 0:  # drop entries of re-timed tasks that reached the top
                while heap_size > 0 and role[heap_task[0]] == SM_SLOWED \
                        and heap_time[0] != fixed_end[heap_task[0]]:
                    heap_size = _heap_pop(heap_time, heap_task, heap_size)
                    state[ST_STALE] -= 1.0
                state[ST_HEAP] = heap_size
            next_fixed = heap_time[0] if heap_size > 0 else math.inf
            if state[ST_DIRTY] > 0 and next_fixed != now:
                # Replan once per instant: with more fixed-part ends at this instant still to come,
                # the rates only matter once time moves.
                _replan(state, act_task, act_rem, act_rate, users, link_ptr, link_idx, bandwidth,
                        slot, copies)
            wake = state[ST_WAKE] if state[ST_DIRTY] == 0 else math.inf
            if next_fixed == math.inf and wake == math.inf:
                break
            if wake <= next_fixed:
                # Transfers planned to finish by next_end finish together now; the others drain.
                now = wake
                next_end = state[ST_NEXT_END]
                updated = state[ST_UPDATED]
                elapsed = now - updated
                kept = 0
                done = 0
                for i in range(int(state[ST_ACTIVE])):
                    t = act_task[i]
                    rem = act_rem[i]
                    rate = act_rate[i]
                    if updated + rem / rate <= next_end:
                        done_buf[done] = t
                        done += 1
                        for j in range(link_ptr[t], link_ptr[t + 1]):
                            link = link_idx[j]
                            users[slot[link]] -= copies[link]
                        continue
                    if elapsed > 0:
                        rem -= rate * elapsed
                        rem = max(rem, 0.0)
                    act_task[kept] = t
                    act_rem[kept] = rem
                    act_rate[kept] = rate
                    kept += 1
                state[ST_UPDATED] = now
                state[ST_ACTIVE] = kept
                state[ST_DIRTY] = 1.0
                state[ST_WAKE] = math.inf
                for i in range(done):
                    _end_task(
                        done_buf[i], now, member_ptr, member_queue, member_pos, queue_ptr,
                        queue_task, succ_ptr, succ_idx, wait, end, stack, state,
                    )  # fmt: skip
                    if sharing and role[done_buf[i]] == SM_OCCUPIES:  # it held SMs: uncount it
                        _sm_count(done_buf[i], -1, member_ptr, member_rank, phi, sm_busy, sm_task,
                                  pending, state)
            else:
                now = next_fixed
                t = heap_task[0]
                state[ST_HEAP] = _heap_pop(heap_time, heap_task, heap_size)
                if sharing and role[t] == SM_SLOWED:
                    fixed_end[t] = -1.0
                    for m in range(member_ptr[t], member_ptr[t + 1]):
                        if sm_task[member_rank[m]] == t:
                            sm_task[member_rank[m]] = -1
                if comm[t] > 0:  # its fixed part is over: transfer, or end
                    _start_transfer(t, now, comm, link_ptr, link_idx, act_task, act_rem, act_rate,
                                    users, slot, copies, state)
                else:
                    _end_task(t, now, member_ptr, member_queue, member_pos, queue_ptr, queue_task,
                              succ_ptr, succ_idx, wait, end, stack, state)
                    if sharing and role[t] == SM_OCCUPIES:
                        _sm_count(t, -1, member_ptr, member_rank, phi, sm_busy, sm_task, pending, state)
            state[ST_NOW] = now
        state[ST_NOW] = now

    return advance


advance = _make_advance(True)
"""The event loop with SM sharing (engine_numba uses it where some task has an SM role)."""
advance_plain = _make_advance(False)
"""The event loop without SM sharing: the same events where no task has an SM role."""
