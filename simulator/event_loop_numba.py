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
* ``ST_ENDED`` — tasks ended so far.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

ST_NOW, ST_UPDATED, ST_WAKE, ST_NEXT_END, ST_DIRTY, ST_HEAP, ST_ACTIVE, ST_READY, ST_ENDED = (
    range(9)
)
STATE_SIZE = 9

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
            link_idx: I64, bandwidth: F64) -> None:
    """Equal-share rates (min over links of bandwidth / users) and the next wake-up."""
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
            share = bandwidth[link] / users[link]
            rate = min(rate, share)
        act_rate[i] = rate
        finish = updated + act_rem[i] / rate
        next_end = min(next_end, finish)
    state[ST_NEXT_END] = next_end
    gap = next_end - updated
    state[ST_WAKE] = updated + (max(0.0, gap))


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
                    act_rem: F64, act_rate: F64, users: I64, state: F64) -> None:
    """Task `t` enters its transfer phase now with all its bytes left."""
    _drain(state, act_rem, act_rate, now)
    k = int(state[ST_ACTIVE])
    act_task[k] = t
    act_rem[k] = comm[t]
    act_rate[k] = 0.0
    state[ST_ACTIVE] = k + 1
    for j in range(link_ptr[t], link_ptr[t + 1]):
        users[link_idx[j]] += 1
    state[ST_DIRTY] = 1.0


@_jit
def init_state(
    duration: F64, comm: F64, member_ptr: I64, member_queue: I64, member_pos: I64,
    queue_ptr: I64, queue_task: I64, succ_ptr: I64, succ_idx: I64, link_ptr: I64,
    link_idx: I64, bandwidth: F64, wait: I64, start: F64, end: F64, heap_time: F64,
    heap_task: I64, act_task: I64, act_rem: F64, act_rate: F64, users: I64, stack: I64,
    done_buf: I64, state: F64,
) -> None:
    """Count each queue's head as arrived and stack the tasks ready at time 0."""
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


@_jit
def advance(
    duration: F64, comm: F64, member_ptr: I64, member_queue: I64, member_pos: I64,
    queue_ptr: I64, queue_task: I64, succ_ptr: I64, succ_idx: I64, link_ptr: I64,
    link_idx: I64, bandwidth: F64, wait: I64, start: F64, end: F64, heap_time: F64,
    heap_task: I64, act_task: I64, act_rem: F64, act_rate: F64, users: I64, stack: I64,
    done_buf: I64, state: F64, budget: int | np.int64,
) -> None:
    """Run events until `budget` more tasks have ended or nothing is left to run.

    Each round first starts every task that became ready at the current instant (a zero-length
    task ends at once and may ready more), then takes the next event: the transfer wake-up if it
    is not later than the earliest fixed-part end (completions before starts), else that end.
    """
    target = state[ST_ENDED] + budget
    now = state[ST_NOW]
    while True:
        # Start everything ready now; zero-length tasks end at once and may ready more.
        while state[ST_READY] > 0:
            ready = int(state[ST_READY]) - 1
            state[ST_READY] = ready
            t = stack[ready]
            start[t] = now
            if duration[t] > 0:
                state[ST_HEAP] = _heap_push(
                    heap_time, heap_task, int(state[ST_HEAP]), now + duration[t], t
                )
            else:
                # Fixed part over at once: start the transfer, or end (written out here, not
                # as a helper taking 20 arrays: that call made every event ~15x slower).
                if comm[t] > 0:
                    _start_transfer(t, now, comm, link_ptr, link_idx, act_task, act_rem,
                                    act_rate, users, state)
                else:
                    _end_task(t, now, member_ptr, member_queue, member_pos, queue_ptr,
                              queue_task, succ_ptr, succ_idx, wait, end, stack, state)
        if state[ST_ENDED] >= target:
            break
        heap_size = int(state[ST_HEAP])
        next_fixed = heap_time[0] if heap_size > 0 else math.inf
        if state[ST_DIRTY] > 0 and next_fixed != now:
            # Replan once per instant: with more fixed-part ends at this instant still to come,
            # the rates only matter once time moves.
            _replan(state, act_task, act_rem, act_rate, users, link_ptr, link_idx, bandwidth)
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
                        users[link_idx[j]] -= 1
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
        else:
            now = next_fixed
            t = heap_task[0]
            state[ST_HEAP] = _heap_pop(heap_time, heap_task, heap_size)
            if comm[t] > 0:  # its fixed part is over: transfer, or end
                _start_transfer(t, now, comm, link_ptr, link_idx, act_task, act_rem, act_rate,
                                users, state)
            else:
                _end_task(t, now, member_ptr, member_queue, member_pos, queue_ptr, queue_task,
                          succ_ptr, succ_idx, wait, end, stack, state)
        state[ST_NOW] = now
    state[ST_NOW] = now
