"""Instruction tapes: emit a pipeline instruction once, then stamp its rows out again.

Every instruction of one block (stage, pass, micro-batch shape, clock, buckets — lower.py's
`_Block`) appends the same rows to the task table but for four things: the ids (shifted by
where it starts), the micro-batch (name argument and `micro_batch` column), the deps on what
came before it (the previous pass of the same micro-batch: its inputs), and the memory its last
backward frees (what its forward holds). So the first instruction of a block is emitted by
lowering's ordinary code and recorded as a `Tape` — its rows' columns, each dep as "row r of
this instruction" or "input slot s", and the bookkeeping it did (which tasks later passes, the
gradient reduction, the optimizer step and the stage-boundary patches wait for) — and every
later one is `replay`ed: a few list extensions instead of one Python call per task. A run of
consecutive replays on a one-unit stage (folded plans: every pass leaves one task the next
waits for) is stamped out at once by stamp.py's `stamp_run`, its columns gathered with numpy
from all tapes laid end to end (`Bank`).

A block is taped only where its rows depend on nothing else (no ZeRO-3 gathers, expert-parallel
or per-op tensor-parallel collectives, whose deps reach outside the instruction), and a tape is
replayed only onto inputs of the recorded shape; anything else runs the ordinary code. The
replayed rows are the rows the ordinary code would append (tests/workloads/
test_lowering_cache.py compares whole programs with and without tapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from trainsim.simulator.task_table import TaskTableBuilder
from trainsim.workloads.lowering.chunks import stamped_rows

LONG_TAPE = 256
"""Deps from which a replay resolves them with numpy rather than a list comprehension."""

_CONST = ("name_code", "kind_code", "stream_code", "member_count", "member_rank", "link_count",
          "link_idx", "dep_count", "duration_s", "comm_bytes", "mem_alloc_bytes", "power_w",
          "freq_mhz", "stage", "first_layer", "last_layer")
"""Builder columns a replay copies as recorded (`member_rank`, `link_idx`: flat values)."""


@dataclass(frozen=True, slots=True)
class Tape:
    """One recorded instruction (ids relative to its first row; `slot` = index into the flat
    list of its inputs, unit by unit)."""

    index: int
    """Its place in the lowering's list of tapes (`Bank`)."""
    rows: int
    """Rows it appends."""
    values: tuple[list[Any], ...]
    """The `_CONST` columns' recorded values."""
    free: list[float]
    """The `mem_free_bytes` column as recorded (free rows are set again on replay)."""
    free_rows: tuple[tuple[int, int], ...]
    """(row, unit) of each row that frees the micro-batch's held memory (its last backward)."""
    deps: tuple[tuple[bool, int], ...]
    """Every dep in order: (True, row) inside the instruction, (False, slot) an input."""
    inside: tuple[int, ...] | None
    """The deps' rows when every dep is inside the instruction (the fast case), else None."""
    dep_arrays: tuple[np.ndarray, np.ndarray] | None
    """`deps` as (inside?, row or slot) arrays when it is long (numpy resolves it faster)."""
    input_shape: tuple[int, ...]
    """Length of each unit's input list."""
    patch: tuple[tuple[tuple[int, ...], Any, Any, int], ...]
    """(rows, stage, direction, unit): rows with a late dep on a stage-boundary transfer, in
    the order the ordinary code adds them (one entry per run of rows waiting on one key)."""
    done: tuple[tuple[int, tuple[int, ...]], ...]
    """(unit, rows) each unit's later passes wait for."""
    recv: tuple[tuple[int, Any, int, tuple[int, ...]], ...]
    """(stage, direction, unit, rows) of what the neighbouring stage waits for."""
    held: tuple[tuple[int, float], ...]
    """(unit, bytes) of memory a forward holds until the last backward."""
    per_bucket: tuple[tuple[int, int, int], ...]
    """(bucket, program rank, row) of each gradient bucket's compute task."""
    last_compute: tuple[tuple[int, int], ...]
    """(program rank, row) of each rank's last compute task after the instruction."""


def record(b: TaskTableBuilder, t0: int, inputs: list[list[int]], *, free_rows: list[tuple[int, int]],
           patch: list[tuple[int, tuple[Any, ...]]], done: dict[int, list[int]],
           recv: dict[tuple[Any, ...], list[int]], held: list[tuple[int, float]],
           per_bucket: list[dict[int, int]],
           last_compute: dict[int, int], j: int, index: int) -> Tape | None:
    """The tape of the instruction that appended rows `t0..` of `b` from `inputs` (per unit,
    the ids it waited for), with the bookkeeping it did; None when it cannot be replayed (a dep
    or a result outside the instruction and its inputs, or an input id in two slots)."""
    lt = t0 - stamped_rows(b)  # t0's place in the builder's lists
    n = len(b.kind_code) - lt
    if n == 0:
        return None
    if any(x != j for x in b.name_arg[lt:]) or any(x != j for x in b.micro_batch[lt:]):
        return None
    slot_of: dict[int, int] = {}
    flat = [x for row in inputs for x in row]
    for s, x in enumerate(flat):
        if x in slot_of:
            return None
        slot_of[x] = s
    first_dep = len(b.dep_idx) - sum(b.dep_count[lt:])
    deps: list[tuple[bool, int]] = []
    for d in b.dep_idx[first_dep:]:
        if d >= t0:
            deps.append((True, d - t0))
        elif d in slot_of:
            deps.append((False, slot_of[d]))
        else:
            return None

    def rel(ids: list[int]) -> tuple[int, ...] | None:
        if any(x < t0 for x in ids):
            return None
        return tuple(x - t0 for x in ids)

    done_rel = []
    for u, ids in done.items():
        r = rel(ids)
        if r is None:
            return None
        done_rel.append((u, r))
    recv_rel = []
    for key, ids in recv.items():
        r = rel(ids)
        if r is None or key[2] != j:
            return None
        recv_rel.append((key[0], key[1], key[3], r))
    patch_rel: list[tuple[list[int], Any, Any, int]] = []
    for tid, key in patch:
        if tid < t0 or key[2] != j:
            return None
        if patch_rel and patch_rel[-1][1:] == (key[0], key[1], key[3]):
            patch_rel[-1][0].append(tid - t0)
        else:
            patch_rel.append(([tid - t0], key[0], key[1], key[3]))
    values = tuple(getattr(b, c)[_start(b, c, lt):] for c in _CONST)
    inside = tuple(v for _, v in deps) if all(i for i, _ in deps) else None
    arrays = None
    if inside is None and len(deps) >= LONG_TAPE:
        arrays = (np.array([i for i, _ in deps], bool), np.array([v for _, v in deps], np.int64))
    return Tape(index=index, rows=n, values=values, free=b.mem_free_bytes[lt:], free_rows=tuple(free_rows),
                deps=tuple(deps), inside=inside, dep_arrays=arrays, input_shape=tuple(len(x) for x in inputs),
                patch=tuple((tuple(r), st, d, u) for r, st, d, u in patch_rel), done=tuple(done_rel), recv=tuple(recv_rel),
                held=tuple(held),
                per_bucket=tuple((bk, p, tid - t0) for bk, d in enumerate(per_bucket)
                                 for p, tid in d.items()),
                last_compute=tuple((p, tid - t0) for p, tid in last_compute.items()
                                   if tid >= t0))


def replay(b: TaskTableBuilder, tape: Tape, inputs: list[list[int]], j: int, k: int, kind: str,
           extra_free: float, pending: list[tuple[list[Any], ...]], *,
           patch: list[tuple[int, tuple[int, ...], tuple[Any, ...]]],
           done: dict[tuple[Any, ...], list[int]], recv: dict[tuple[Any, ...], list[int]],
           held: dict[tuple[int, int, int], float], per_bucket: list[dict[int, int]] | None,
           last_compute: dict[int, int]) -> None:
    """Append `tape`'s rows for micro-batch `j` of stage `k` after `inputs` (per unit, of the
    recorded shape) and do its bookkeeping (the `_CONST` columns go to `pending`, for `flush`
    to append before the builder is next used otherwise): a row that frees the micro-batch frees what its
    forward holds plus `extra_free`; `per_bucket` None when no reduction reads the buckets.
    The compute history ZeRO-3 reads is not kept (tapes are used only without ZeRO-3).
    `tape` must have been recorded on `b` (its column `extend`s are `b`'s)."""
    base = len(b.name_arg) + stamped_rows(b)  # the deferred columns (`pending`) may lag
    pending.append(tape.values)
    js = [j] * tape.rows
    b.name_arg.extend(js)
    b.micro_batch.extend(js)
    if tape.inside is not None:
        b.dep_idx.extend([base + v for v in tape.inside])
    elif tape.dep_arrays is not None:  # a long tape (unfolded): resolve its deps with numpy
        inside, value = tape.dep_arrays
        given = np.fromiter((x for row in inputs for x in row), np.int64)
        b.dep_idx.extend(np.where(inside, value + base,
                                  given[np.where(inside, 0, value)] if len(given) else 0
                                  ).tolist())
    else:
        flat = [x for row in inputs for x in row]
        b.dep_idx.extend([base + v if inside else flat[v] for inside, v in tape.deps])
    for u, size in tape.held:
        held[(k, j, u)] = size
    if tape.free_rows:
        col = list(tape.free)
        for row, u in tape.free_rows:
            col[row] = held.get((k, j, u), 0.0) + extra_free
        b.mem_free_bytes.extend(col)
    else:
        b.mem_free_bytes.extend(tape.free)
    for rows, stage, direction, u in tape.patch:
        patch.append((base, rows, (stage, direction, j, u)))
    for u, rows in tape.done:
        done[(k, kind, j, u)] = [base + r for r in rows]
    for stage, direction, u, rows in tape.recv:
        recv.setdefault((stage, direction, j, u), []).extend([base + r for r in rows])
    if per_bucket is not None:
        for bucket, p, row in tape.per_bucket:
            per_bucket[bucket][p] = base + row
    for p, row in tape.last_compute:
        last_compute[p] = base + row


def flush(b: TaskTableBuilder, pending: list[tuple[list[Any], ...]]) -> None:
    """Append the `_CONST` columns of the replays in `pending` to `b` (one pass per column)
    and empty it."""
    if not pending:
        return
    for i, column in enumerate(_CONST):
        getattr(b, column).extend(chain.from_iterable(map(itemgetter(i), pending)))
    pending.clear()


def _start(b: TaskTableBuilder, column: str, t0: int) -> int:
    """Where rows `t0..` begin in a builder column (flat columns: after the earlier rows')."""
    if column == "member_rank":
        return len(b.member_rank) - sum(b.member_count[t0:])
    if column == "link_idx":
        return len(b.link_idx) - sum(b.link_count[t0:])
    return t0


__all__ = ["Bank", "Tape", "flush", "record", "replay"]


class Bank:
    """Every tape of one lowering as numpy columns, to stamp out a run of replays at once
    (stamp.py); grown when tapes are added (`grow`: only the new tapes are converted and
    appended, so a lowering that adds tapes stage by stage does not re-join the old ones)."""

    def __init__(self, tapes: list[Tape]) -> None:
        self.size = 0
        self.rows = np.zeros(0, np.int64)
        self.row_off = np.zeros(0, np.int64)
        self.cols: dict[str, np.ndarray] = {c: np.array([]) for c in _CONST}
        self.free = np.zeros(0)
        self.free_flag = np.zeros(0, bool)
        self.free_unit = np.zeros(0, np.int64)
        """The unit of each row that frees its micro-batch's held memory (-1: none)."""
        self.ptr = {c: np.zeros(0, np.int64) for c in ("member_rank", "link_idx")}
        self.dep_ptr = np.zeros(0, np.int64)
        self.dep_inside = np.zeros(0, bool)
        self.dep_value = np.zeros(0, np.int64)
        self.done_row = np.zeros(0, np.int64)
        self.inputs = np.zeros(0, np.int64)
        """Inputs of each tape on its one unit (-1: several units)."""
        self._total = {c: 0 for c in ("rows", "member_count", "link_count", "dep_count")}
        self.grow(tapes)

    def grow(self, tapes: list[Tape]) -> Bank:
        """Take in `tapes[self.size:]` (the tapes added since); returns itself."""
        new = tapes[self.size:]
        self.size = len(tapes)
        if not new:
            return self
        pieces = [{c: np.array(t.values[i]) for i, c in enumerate(_CONST)} for t in new]
        rows = np.array([t.rows for t in new], np.int64)
        first = self._total["rows"]
        self.rows = np.concatenate((self.rows, rows))
        self.row_off = np.concatenate((self.row_off, first + _starts(rows)))
        cols = {c: _joined([self.cols[c]] + [p[c] for p in pieces]) for c in _CONST}
        for c, n in (("member_rank", "member_count"), ("link_idx", "link_count")):
            counts = cols[n][len(self.cols[n]):]
            self.ptr[c] = np.concatenate((self.ptr[c], self._total[n] + _starts(counts)))
            self._total[n] += int(counts.sum())
        counts = cols["dep_count"][len(self.cols["dep_count"]):]
        self.dep_ptr = np.concatenate((self.dep_ptr, self._total["dep_count"] + _starts(counts)))
        self._total["dep_count"] += int(counts.sum())
        self.cols = cols
        added = int(rows.sum())
        flag = np.zeros(added, bool)
        unit = np.full(added, -1, np.int64)
        for t, off in zip(new, _starts(rows).tolist()):
            for row, u in t.free_rows:
                flag[off + row] = True
                unit[off + row] = u
        self._total["rows"] += added
        self.free = np.concatenate([self.free] + [np.array(t.free, np.float64) for t in new])
        self.free_flag = np.concatenate((self.free_flag, flag))
        self.free_unit = np.concatenate((self.free_unit, unit))
        self.dep_inside = np.concatenate(
            [self.dep_inside] + [np.array([i for i, _ in t.deps], bool) for t in new])
        self.dep_value = np.concatenate(
            [self.dep_value] + [np.array([v for _, v in t.deps], np.int64) for t in new])
        self.done_row = np.concatenate((self.done_row, np.array(
            [t.done[0][1][0] if len(t.done) == 1 and t.done[0][0] == 0
             and len(t.done[0][1]) == 1 else -1 for t in new], np.int64)))
        self.inputs = np.concatenate((self.inputs, np.array(
            [t.input_shape[0] if len(t.input_shape) == 1 else -1 for t in new], np.int64)))
        return self


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each of `counts`' runs starts, laid end to end from 0."""
    out = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def _joined(pieces: list[np.ndarray]) -> np.ndarray:
    """The tapes' arrays of one column end to end (empty ones left out, so they do not turn
    an integer column into floats): the array of all their values."""
    kept = [p for p in pieces if len(p)]
    return np.concatenate(kept) if kept else np.array([])
