"""Runs of replayed instructions stamped out with numpy, their bookkeeping kept in arrays.

A folded plan of many micro-batches (Aceso's GPT-3 1.3B case: 512 per iteration) spends
most of its lowering stamping out instructions from tapes (replay.py), and there the columns
are cheap (numpy, a run at a time) but the bookkeeping was not: each instruction added a few
dict entries — the task later passes wait for (`done`), the bytes its forward holds
(`held`), the transfer the next stage waits for (`recv`), its late deps (`patch`) — each a
tuple key and a list, read back one by one. Here those of a run go to numpy arrays indexed by
micro-batch (`SlotMap`), and its late deps stay arrays until `_patch_deps` resolves them in
one pass (`LateRuns`). The ordinary code keeps reading and writing the same maps as dicts;
an entry lives in one place (the dict or an array), so both see the same contents. The rows
are those `replay` (replay.py) would append instruction by instruction (tests/workloads/
test_lowering_stamp.py compares whole programs with the plain lowering's).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from operator import attrgetter
from typing import Any, cast

import numpy as np

from trainsim.workloads.lowering.chunks import ChunkedBuilder
from trainsim.workloads.lowering.replay import _CONST, Bank, Tape

_ABSENT = object()


def _gather(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Indices start..start+count of every (start, count), concatenated."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    shift = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return shift + np.arange(total, dtype=np.int64)


_KIND_INPUTS = {"F": 0, "B": 1, "I": 1, "W": 2}
"""Inputs of a pass on a one-unit stage whose passes leave one task: none for a forward, the
forward's for a backward, the forward's and the input-gradient pass's for a weight pass."""


class SlotMap(dict[Any, Any]):
    """A dict keyed by tuples with a micro-batch index at position `jpos`, whose entries may
    also live in numpy arrays, one per key prefix (the key without the index): ids (a
    one-element list as a dict value, missing = -1) or sizes (a float, missing = NaN).

    The dict methods lowering uses (`[]`, `get`, `in`, `setdefault`, assignment) see both; an
    assignment moves an entry out of its array, and `put` writes arrays only where the dict
    has none of the keys (`taken` says)."""

    __slots__ = ("_arrays", "_ids", "_in_dict", "_jpos")

    def __init__(self, jpos: int, ids: bool) -> None:
        super().__init__()
        self._jpos = jpos
        self._ids = ids
        self._arrays: dict[Hashable, np.ndarray] = {}
        self._in_dict: dict[Hashable, set[int]] = {}
        """Prefix -> indices of the entries it has in the dict."""

    def _split(self, key: tuple[Any, ...]) -> tuple[tuple[Any, ...], int]:
        p = self._jpos
        return key[:p] + key[p + 1:], key[p]

    def _array_value(self, key: tuple[Any, ...]) -> Any:
        prefix, j = self._split(key)
        arr = self._arrays.get(prefix)
        if arr is None or not 0 <= j < len(arr):
            return _ABSENT
        v = arr[j]
        if arr.ndim == 2:  # several ids per entry (`put_rows`)
            return _ABSENT if v[0] < 0 else v.tolist()
        if self._ids:
            return _ABSENT if v < 0 else [int(v)]
        return _ABSENT if np.isnan(v) else float(v)

    def __missing__(self, key: tuple[Any, ...]) -> Any:
        v = self._array_value(key)
        if v is _ABSENT:
            raise KeyError(key)
        return v

    def get(self, key: Any, default: Any = None) -> Any:
        v = dict.get(self, key, _ABSENT)
        if v is _ABSENT:
            v = self._array_value(key)
        return default if v is _ABSENT else v

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or (
            isinstance(key, tuple) and self._array_value(key) is not _ABSENT)

    def __setitem__(self, key: tuple[Any, ...], value: Any) -> None:
        prefix, j = self._split(key)
        arr = self._arrays.get(prefix)
        if arr is not None and 0 <= j < len(arr):
            arr[j] = -1 if self._ids else np.nan
        self._in_dict.setdefault(prefix, set()).add(j)
        dict.__setitem__(self, key, value)

    def setdefault(self, key: tuple[Any, ...], default: Any = None) -> Any:
        v = dict.get(self, key, _ABSENT)
        if v is _ABSENT:
            v = self._array_value(key)
            if v is _ABSENT:
                v = default
            self[key] = v
        return v

    def array(self, prefix: Hashable) -> np.ndarray | None:
        """The array of `prefix` (None when it has none)."""
        return self._arrays.get(prefix)

    def dict_indices(self, prefix: Hashable) -> set[int]:
        """Indices of `prefix`'s entries in the dict."""
        return self._in_dict.get(prefix, set())

    def look(self, prefix: Hashable, js: np.ndarray) -> np.ndarray:
        """The array values at `js` (missing where the array has none). Entries of several
        ids (`put_rows`) are not read here: where `prefix` has them, every entry is missing
        (so `taken` says True and callers take the dict's path)."""
        arr = self._arrays.get(prefix)
        if arr is not None and arr.ndim == 2:
            return np.full(len(js), -1, np.int64)
        missing = -1 if self._ids else np.nan
        if arr is None:
            return np.full(len(js), missing, np.int64 if self._ids else np.float64)
        inside = js < len(arr)
        if inside.all():
            return cast(np.ndarray, arr[js])
        return np.where(inside, arr[np.minimum(js, len(arr) - 1)], missing)

    def taken(self, prefix: Hashable, js: np.ndarray) -> bool:
        """Whether any key (`prefix`, j in `js`) has an entry, or `js` repeats one."""
        arr = self._arrays.get(prefix)
        if arr is not None and arr.ndim == 2:
            return True
        found = self.look(prefix, js)
        if (found >= 0).any() if self._ids else (~np.isnan(found)).any():
            return True
        return self._clashes(prefix, js)

    def _clashes(self, prefix: Hashable, js: np.ndarray) -> bool:
        """Whether some (`prefix`, j) is in the dict already, or `js` repeats a j."""
        in_dict = self._in_dict.get(prefix)
        if in_dict and not in_dict.isdisjoint(js.tolist()):
            return True
        return len(js) > 1 and int(np.bincount(js).max()) > 1

    def put(self, prefix: Hashable, js: np.ndarray, values: np.ndarray) -> None:
        """Entries (`prefix`, j) = value in the array (none of them may be in the dict)."""
        arr = self._arrays.get(prefix)
        need = int(js.max()) + 1 if len(js) else 0
        if arr is None or len(arr) < need:
            size = max(need, 2 * len(arr) if arr is not None else 0, 64)
            grown = np.full(size, -1 if self._ids else np.nan,
                            np.int64 if self._ids else np.float64)
            if arr is not None:
                grown[:len(arr)] = arr
            self._arrays[prefix] = arr = grown
        arr[js] = values

    def look_rows(self, prefix: Hashable, js: np.ndarray, width: int) -> np.ndarray | None:
        """The entries of `width` ids at `js` as rows (-1 rows where missing); None when
        `prefix` holds entries of another form (one id, or another width)."""
        arr = self._arrays.get(prefix)
        if arr is None:
            return np.full((len(js), width), -1, np.int64)
        if arr.ndim != 2 or arr.shape[1] != width:
            return None
        inside = js < len(arr)
        if inside.all():
            return cast(np.ndarray, arr[js])
        out = np.full((len(js), width), -1, np.int64)
        out[inside] = arr[js[inside]]
        return out

    def rows_taken(self, prefix: Hashable, js: np.ndarray, width: int) -> bool:
        """`taken` for entries of `width` ids (True too where `prefix` holds another form)."""
        found = self.look_rows(prefix, js, width)
        if found is None or (found[:, 0] >= 0).any():
            return True
        return self._clashes(prefix, js)

    def put_rows(self, prefix: Hashable, js: np.ndarray, rows: np.ndarray) -> None:
        """Entries (`prefix`, j) = the ids of a row of `rows` (ids maps only; `rows_taken`
        must have said False)."""
        arr = self._arrays.get(prefix)
        need = int(js.max()) + 1 if len(js) else 0
        if arr is None or len(arr) < need:
            size = max(need, 2 * len(arr) if arr is not None else 0, 64)
            grown = np.full((size, rows.shape[1]), -1, np.int64)
            if arr is not None:
                grown[:len(arr)] = arr
            self._arrays[prefix] = arr = grown
        arr[js] = rows

    def clear_slots(self, prefix: Hashable, js: np.ndarray) -> None:
        """Forget the array entries (`prefix`, j in `js`)."""
        arr = self._arrays.get(prefix)
        if arr is not None:
            arr[js[js < len(arr)]] = -1 if self._ids else np.nan


LateRuns = list[tuple[tuple[Any, ...], np.ndarray, np.ndarray]]
"""Late deps of stamped runs: (recv key prefix, owner rows, micro-batch of each)."""


KIND_CODES = "FBIW"
"""Pass of each code in a run's `kinds` array."""
_INPUTS = np.array([_KIND_INPUTS[k] for k in KIND_CODES], np.int64)


def stamp_tuples(b: ChunkedBuilder, bank: Bank, tapes: list[Tape],
                 run: list[tuple[Tape, int, int, str, float]], **maps: Any) -> bool:
    """`stamp_run` of a run given as (tape, micro-batch, stage, pass, extra free) tuples."""
    n = len(run)
    tape_t, js_t, ks_t, kinds, extras = zip(*run)
    return stamp_run(b, bank, tapes, np.fromiter(map(attrgetter("index"), tape_t), np.int64, n),
                     np.fromiter(js_t, np.int64, n), np.fromiter(ks_t, np.int64, n),
                     np.fromiter(map(KIND_CODES.index, kinds), np.int64, n),
                     np.fromiter(extras, np.float64, n), **maps)


def stamp_run(b: ChunkedBuilder, bank: Bank, tapes: list[Tape], index: np.ndarray,
              js: np.ndarray, ks: np.ndarray, kinds: np.ndarray, extras: np.ndarray, *,
              late: LateRuns, done: SlotMap, recv: SlotMap, held: SlotMap,
              last_compute: dict[int, int]) -> bool:
    """Append the run of instructions q = 0.. (tape `tapes[index[q]]`, micro-batch `js[q]`,
    stage `ks[q]`, pass `KIND_CODES[kinds[q]]`, extra free `extras[q]`), in order: the rows
    and bookkeeping of `replay` on each, the bookkeeping into the maps' arrays and the late
    deps into `late`, the columns built by numpy in one pass (`b.append_chunk`). Returns
    False, appending nothing, where a tape or an input does not have the one-unit form (the
    caller replays one by one). The builder's deferred columns must have been flushed."""
    n = len(index)
    nin = _INPUTS[kinds]
    if (bank.done_row[index] < 0).any() or (bank.inputs[index] != nin).any():
        return False
    rows = bank.rows[index]
    base = len(b) + np.cumsum(rows) - rows
    pair = ks * 4 + kinds
    at_pair = {p: np.flatnonzero(pair == p) for p in _values(pair)}
    for p, at in at_pair.items():
        if done.taken((p // 4, KIND_CODES[p % 4], 0), js[at]):
            return False
    # the done task of each pass first, so later passes in the run read theirs
    done_id = base + bank.done_row[index]
    for p, at in at_pair.items():
        done.put((p // 4, KIND_CODES[p % 4], 0), js[at], done_id[at])
    slots = np.full((n, 2), -1, np.int64)
    for slot, (kind_min, before) in enumerate(((1, "F"), (2, "I"))):
        need = nin >= kind_min
        if not need.any():
            continue
        for k in _values(ks[need]):
            at = np.flatnonzero(need & (ks == k))
            found = done.look((k, before, 0), js[at])
            for q in np.flatnonzero(found < 0).tolist():  # entries in the dict, if any
                ids = dict.get(done, (k, before, int(js[at[q]]), 0))
                if ids is None or len(ids) != 1:
                    for p, pat in at_pair.items():  # an input of another form: undo
                        done.clear_slots((p // 4, KIND_CODES[p % 4], 0), js[pat])
                    return False
                found[q] = ids[0]
            slots[at, slot] = found
    columns, g, owner = run_columns(bank, index, js)
    dep_counts = bank.cols["dep_count"][g]
    dg = _gather(bank.dep_ptr[g], dep_counts)
    dep_owner = np.repeat(owner, dep_counts)
    inside, value = bank.dep_inside[dg], bank.dep_value[dg]
    given = slots[dep_owner, np.where(inside, 0, np.minimum(value, 1))]
    columns["dep_idx"] = np.where(inside, base[dep_owner] + value, given)
    at_tape = {i: np.flatnonzero(index == i) for i in _values(index)}
    for i, at in at_tape.items():
        for u, size in tapes[i].held:
            for k in _values(ks[at]):
                sub = at[ks[at] == k]
                _put_sizes(held, (k, u), js[sub], size)
    free = bank.free[g]
    flag = bank.free_flag[g]
    if flag.any():
        due = np.zeros(n, np.float64)
        for k in _values(ks):
            at = np.flatnonzero(ks == k)
            got = held.look((k, 0), js[at])
            for q in np.flatnonzero(np.isnan(got)).tolist():
                got[q] = dict.get(held, (k, int(js[at[q]]), 0), 0.0)
            due[at] = got
        free = np.where(flag, (due + extras)[owner], free)
    columns["mem_free_bytes"] = free
    b.append_chunk(columns)
    note_links(((tapes[i], at) for i, at in at_tape.items()), base, js, late=late, recv=recv,
               last_compute=last_compute, several_rows=False)
    return True


def note_links(tapes_at: Iterable[tuple[Tape, np.ndarray]], base: np.ndarray, js: np.ndarray,
               *, late: LateRuns, recv: SlotMap, last_compute: dict[int, int],
               several_rows: bool) -> None:
    """Record what a stamped run leaves for later instructions: its late deps (`late`), the
    rows a transfer's receiver waits for (`recv`: one row per micro-batch, or with
    `several_rows` a row of them, in the map's arrays; else a list per key) and each rank's
    last compute task. `tapes_at`: each tape with the run's instructions q that replay it."""
    last: dict[int, tuple[int, int]] = {}
    for tape, at in tapes_at:
        for prows, stage, direction, u in tape.patch:
            pr = np.asarray(prows, np.int64)
            late.append(((stage, direction, u), (base[at][:, None] + pr).ravel(),
                         np.repeat(js[at], len(pr))))
        for stage, direction, u, rrows in tape.recv:
            prefix = (stage, direction, u)
            if several_rows:
                rr = np.asarray(rrows, np.int64)
                if not recv.rows_taken(prefix, js[at], len(rr)):
                    recv.put_rows(prefix, js[at], base[at][:, None] + rr)
                    continue
            elif len(rrows) == 1 and not recv.taken(prefix, js[at]):
                recv.put(prefix, js[at], base[at] + rrows[0])
                continue
            for first, j in zip(base[at].tolist(), js[at].tolist()):
                recv.setdefault((stage, direction, j, u), []).extend([first + r for r in rrows])
        for rank, row in tape.last_compute:
            q = int(at[-1])
            if rank not in last or last[rank][0] < q:
                last[rank] = (q, int(base[q]) + row)
    for rank, (_, tid) in last.items():
        last_compute[rank] = tid


def run_columns(bank: Bank, index: np.ndarray, js: np.ndarray
                ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The `_CONST` columns and the micro-batch columns of a run (tape `index[q]`, micro-batch
    `js[q]`), with each row's place in the bank and its instruction q."""
    rows = bank.rows[index]
    g = _gather(bank.row_off[index], rows)
    owner = np.repeat(np.arange(len(index), dtype=np.int64), rows)
    columns: dict[str, np.ndarray] = {}
    for column in _CONST:
        if column in bank.ptr:
            counts = bank.cols["member_count" if column == "member_rank" else "link_count"][g]
            columns[column] = bank.cols[column][_gather(bank.ptr[column][g], counts)]
        else:
            columns[column] = bank.cols[column][g]
    columns["name_arg"] = columns["micro_batch"] = js[owner]
    return columns, g, owner


def _member(js: np.ndarray, indices: set[int]) -> np.ndarray:
    """Whether each j of `js` is in `indices` (a map's dict entries of one prefix: few, the
    instructions the ordinary code emitted), by one comparison per index."""
    if len(indices) > 8:
        return np.isin(js, np.fromiter(indices, np.int64, len(indices)))
    mine = np.zeros(len(js), bool)
    for j in indices:
        mine |= js == j
    return mine


def _values(a: np.ndarray) -> list[int]:
    """The distinct values of `a` (small non-negative ints), in order."""
    return np.flatnonzero(np.bincount(a)).tolist() if len(a) else []


def _put_sizes(held: SlotMap, prefix: tuple[int, int], js: np.ndarray, size: float) -> None:
    """held[(k, j, u)] = size for every j in `js` (`prefix` = (k, u)), into the dict where it
    has the key already."""
    in_dict = held.dict_indices(prefix)
    if in_dict:
        mine = _member(js, in_dict)
        for j in js[mine].tolist():
            held[(prefix[0], j, prefix[1])] = size
        js = js[~mine]
    held.put(prefix, js, np.full(len(js), size))


def late_deps(late: LateRuns, recv: SlotMap) -> tuple[np.ndarray, np.ndarray]:
    """(owners, deps) of the late deps of stamped runs, each owner's in the order of its
    transfer's list (`_patch_deps`), as arrays."""
    owners: list[np.ndarray] = []
    deps: list[np.ndarray] = []
    for prefix, own, js in late:
        arr = recv.array(prefix)
        if arr is not None and arr.ndim == 2:  # a row of ids per entry (stamp_units.py)
            found = cast(np.ndarray, recv.look_rows(prefix, js, arr.shape[1]))
            hit = found[:, 0] >= 0
            owners.append(np.repeat(own[hit], arr.shape[1]))
            deps.append(found[hit].ravel())
        else:
            ids = recv.look(prefix, js)
            hit = ids >= 0
            owners.append(own[hit])
            deps.append(ids[hit])
        in_dict = recv.dict_indices(prefix)
        if not in_dict or hit.all():
            continue
        stage, direction, u = prefix
        for o, j in zip(own[~hit].tolist(), js[~hit].tolist()):
            if j in in_dict:
                listed = dict.get(recv, (stage, direction, j, u))
                if listed:
                    owners.append(np.full(len(listed), o, np.int64))
                    deps.append(np.asarray(listed, np.int64))
    if not owners:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return (np.concatenate(owners).astype(np.int64, copy=False),
            np.concatenate(deps).astype(np.int64, copy=False))


__all__ = ["KIND_CODES", "LateRuns", "SlotMap", "late_deps", "run_columns", "stamp_run",
           "stamp_tuples"]
