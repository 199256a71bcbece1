"""Compiled helpers for large task tables: a counting sort and a per-row repeat check.

An unfolded program of a thousand GPUs has over a million tasks and several million deps,
members and links (GPT-3 175B on 1024 GPUs: 1.2 M tasks, 4.5 M deps). Grouping those by a
small integer key (deps by the task they wait for, members by their (rank, stream) queue, late
deps after each task's own) is a
stable sort, which numpy does by comparison (timsort) at O(n log n); keys bounded by the task
or queue count sort in one counting pass instead. Checking that no task lists a rank or a link
twice needs no sort at all, only a look along each (short) row. Both give exactly the numpy
results they replace (tests/simulator/test_csr_numba.py); task_table.py and program.py use
them from `task_table.COMPILED_FROM` items on (`COMPILED_FOR_MANY` once the Oracle runs), so
one small program never compiles them.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _counting_order(keys: np.ndarray, num_keys: int) -> np.ndarray:  # pragma: no cover
    starts = np.zeros(num_keys + 1, np.int64)
    for k in keys:
        starts[k + 1] += 1
    for k in range(num_keys):
        starts[k + 1] += starts[k]
    order = np.empty(len(keys), np.int64)
    for i in range(len(keys)):
        k = keys[i]
        order[starts[k]] = i
        starts[k] += 1
    return order


def counting_order(keys: np.ndarray, num_keys: int) -> np.ndarray:
    """`np.argsort(keys, kind="stable")` for integer keys in 0..num_keys-1, in O(n + keys)."""
    return _counting_order(np.ascontiguousarray(keys, dtype=np.int64), int(num_keys))


@njit(cache=True)
def _sorted_within(bounds: np.ndarray, values: np.ndarray) -> np.ndarray:  # pragma: no cover
    out = np.empty(len(values), np.int64)
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        ordered = True  # in order already (a rank's rows by start, as lowering emits them)
        for i in range(lo + 1, hi):
            if not values[i] >= values[i - 1]:  # NaN too: left to the sort
                ordered = False
                break
        if ordered:  # a stable sort leaves it as it is
            for i in range(lo, hi):
                out[i] = i
        elif hi > lo:
            out[lo:hi] = lo + np.argsort(values[lo:hi], kind="mergesort")
    return out


def sorted_within(bounds: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Positions that sort `values` stably within each slice ``bounds[k]:bounds[k+1]``,
    slices kept in place: on rows already grouped by key in order, what
    ``np.lexsort((values, keys))`` gives."""
    return _sorted_within(np.ascontiguousarray(bounds, dtype=np.int64),
                          np.ascontiguousarray(values))


@njit(cache=True)
def _merge_late(dep_ptr: np.ndarray, dep_idx: np.ndarray, late_owner: np.ndarray,
                late_dep: np.ndarray, n: int
                ) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    out_ptr = np.zeros(n + 1, np.int64)
    for t in range(n):
        out_ptr[t + 1] = dep_ptr[t + 1] - dep_ptr[t]
    for t in late_owner:
        out_ptr[t + 1] += 1
    for t in range(n):
        out_ptr[t + 1] += out_ptr[t]
    out = np.empty(out_ptr[n], np.int64)
    fill = np.empty(n, np.int64)
    for t in range(n):
        at = out_ptr[t]
        for i in range(dep_ptr[t], dep_ptr[t + 1]):
            out[at] = dep_idx[i]
            at += 1
        fill[t] = at
    for i in range(len(late_owner)):
        t = late_owner[i]
        out[fill[t]] = late_dep[i]
        fill[t] += 1
    return out_ptr, out


def merge_late(dep_ptr: np.ndarray, dep_idx: np.ndarray, late_owner: np.ndarray,
               late_dep: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The dep CSR with late deps added: each task's own deps (`dep_ptr`, `dep_idx`), then its
    late ones (`late_dep[i]` of task `late_owner[i]`) in the order given: the stable sort by
    owner of both lists end to end, in one counting pass."""
    return _merge_late(np.ascontiguousarray(dep_ptr, dtype=np.int64),
                       np.ascontiguousarray(dep_idx, dtype=np.int64),
                       np.ascontiguousarray(late_owner, dtype=np.int64),
                       np.ascontiguousarray(late_dep, dtype=np.int64), int(n))


@njit(cache=True)
def _first_appearance(codes: np.ndarray, num_codes: int) -> np.ndarray:  # pragma: no cover
    first = np.full(num_codes, len(codes), np.int64)
    seen = 0
    for i in range(len(codes)):
        c = codes[i]
        if first[c] == len(codes):
            first[c] = i
            seen += 1
            if seen == num_codes:
                break
    return first


def first_appearance(codes: np.ndarray, num_codes: int) -> np.ndarray:
    """The codes in 0..num_codes-1 that `codes` holds, in order of first appearance (what
    `np.unique(codes, return_index=True)` sorted by index gives)."""
    first = _first_appearance(np.ascontiguousarray(codes, dtype=np.int64), int(num_codes))
    used = np.flatnonzero(first < len(codes))
    return used[np.argsort(first[used], kind="stable")]


@njit(cache=True)
def _reverse(ptr: np.ndarray, idx: np.ndarray, n: int
             ) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    out_ptr = np.zeros(n + 1, np.int64)
    for d in idx:
        out_ptr[d + 1] += 1
    for k in range(n):
        out_ptr[k + 1] += out_ptr[k]
    fill = out_ptr[:-1].copy()
    out = np.empty(len(idx), np.int64)
    for t in range(len(ptr) - 1):
        for i in range(ptr[t], ptr[t + 1]):
            d = idx[i]
            out[fill[d]] = t
            fill[d] += 1
    return out_ptr, out


def reverse_csr(ptr: np.ndarray, idx: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The CSR of rows listing each value: row d of the result holds, ascending, every row t
    of (`ptr`, `idx`) whose list holds d (once per time it does); values in 0..n-1."""
    return _reverse(np.ascontiguousarray(ptr, dtype=np.int64),
                    np.ascontiguousarray(idx, dtype=np.int64), int(n))


@njit(cache=True)
def _queues(member_ptr: np.ndarray, member_rank: np.ndarray, stream_code: np.ndarray,
            num_streams: int, num_keys: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    n = len(member_ptr) - 1
    m = len(member_rank)
    key = np.empty(m, np.int64)
    task = np.empty(m, np.int64)
    count = np.zeros(num_keys, np.int64)
    for t in range(n):
        for i in range(member_ptr[t], member_ptr[t + 1]):
            k = np.int64(member_rank[i]) * num_streams + stream_code[t]
            key[i] = k
            task[i] = t
            count[k] += 1
    queues = 0
    for k in range(num_keys):
        if count[k]:
            queues += 1
    queue_ptr = np.empty(queues + 1, np.int64)
    queue_keys = np.empty(queues, np.int64)
    index = np.full(num_keys, -1, np.int64)
    fill = np.empty(num_keys, np.int64)
    q, at = 0, 0
    for k in range(num_keys):
        if count[k]:
            index[k] = q
            queue_keys[q] = k
            queue_ptr[q] = at
            fill[k] = at
            at += count[k]
            q += 1
    queue_ptr[queues] = at
    queue_task = np.empty(m, np.int64)
    member_queue = np.empty(m, np.int32)
    member_pos = np.empty(m, np.int64)
    for i in range(m):
        k = key[i]
        q = index[k]
        queue_task[fill[k]] = task[i]
        member_queue[i] = q
        member_pos[i] = fill[k] - queue_ptr[q]
        fill[k] += 1
    return queue_ptr, queue_task, queue_keys, member_queue, member_pos


def queues(member_ptr: np.ndarray, member_rank: np.ndarray, stream_code: np.ndarray,
           num_streams: int, num_ranks: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(queue_ptr, queue_task, queue keys, member_queue, member_pos) of the (rank, stream)
    queues, key = rank * num_streams + stream, as `FrozenProgram.from_program` defines them
    (queues sorted by key, each in task order), in one counting pass."""
    return _queues(np.ascontiguousarray(member_ptr, dtype=np.int64),
                   np.ascontiguousarray(member_rank, dtype=np.int64),
                   np.ascontiguousarray(stream_code, dtype=np.int64), int(num_streams),
                   int(num_streams) * max(int(num_ranks), 1))


@njit(cache=True)
def _rows_with_repeats(ptr: np.ndarray, values: np.ndarray) -> np.ndarray:  # pragma: no cover
    n = len(ptr) - 1
    out = np.zeros(n, np.bool_)
    for t in range(n):
        a, b = ptr[t], ptr[t + 1]
        for i in range(a + 1, b):
            v = values[i]
            for j in range(a, i):
                if values[j] == v:
                    out[t] = True
                    break
            if out[t]:
                break
    return out


def rows_with_repeats(ptr: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per CSR row (`values[ptr[t]:ptr[t+1]]`), whether some value appears twice in it."""
    return _rows_with_repeats(np.ascontiguousarray(ptr, dtype=np.int64),
                              np.ascontiguousarray(values, dtype=np.int64))


__all__ = ["counting_order", "first_appearance", "merge_late", "queues", "reverse_csr", "rows_with_repeats"]


_I = "int64[::1]"
_SIGNATURES = (
    (_counting_order, f"({_I}, int64)"),
    (_sorted_within, f"({_I}, float64[::1])"),
    (_merge_late, f"({_I}, {_I}, {_I}, {_I}, int64)"),
    (_first_appearance, f"({_I}, int64)"),
    (_reverse, f"({_I}, {_I}, int64)"),
    (_queues, f"({_I}, {_I}, {_I}, int64, int64)"),
    (_rows_with_repeats, f"({_I}, {_I})"),
)
"""Each kernel with the argument types task_table.py, program.py, the engine and result.py
call it with (contiguous int64 / float64 arrays, int64 counts)."""
_LOADED = [False]


def load_kernels() -> None:
    """Load (or compile, on a machine's first run) every kernel for the types its callers pass,
    once per process: what their first calls would do, done up front. The Oracle calls it when
    it switches to the compiled passes (`task_table.use_compiled_kernels`), so the load (about
    45 ms from numba's disk cache, 7 kernels) is paid when the Oracle is made, not by whichever
    plan of a search first crosses `COMPILED_FOR_MANY` entries."""
    if _LOADED[0]:
        return
    for kernel, signature in _SIGNATURES:
        kernel.compile(signature)
    _LOADED[0] = True
