"""Runs of replays on stages of several units (unfolded plans), stamped out with numpy.

stamp.py's `stamp_run` takes runs whose instructions each run on one unit (folded plans). An
unfolded plan lowers every GPU as its own rank, so a stage has one unit per tensor-parallel
group (GPT-3 175B on 1024 GPUs: 8 units of 8 ranks, 200 rows per instruction) and its runs
were replayed instruction by instruction: a few list extensions per instruction, but the
bookkeeping per unit (the task later passes wait for, the transfers the next stage waits for,
the late deps on them) and every row passed through Python lists on the way to the table.
Here a run's rows go to the builder as numpy columns (`ChunkedBuilder.append_chunk`), its
bookkeeping to the maps' arrays (`SlotMap`: one id per unit for `done`, a row of ids per
transfer key for `recv`), and its late deps stay arrays until `_patch_deps` resolves them.

The rows, deps and bookkeeping are those `replay` (replay.py) would give each instruction in
turn (tests/workloads/test_lowering_stamp.py compares whole unfolded programs with the plain
lowering's). Where a tape or an input does not have the form handled here (a unit's pass
leaving several tasks, an entry already present), nothing is appended and the caller replays
one by one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainsim.workloads.lowering.chunks import ChunkedBuilder
from trainsim.workloads.lowering.replay import Bank, Tape
from trainsim.workloads.lowering.stamp import (
    _INPUTS,
    KIND_CODES,
    LateRuns,
    SlotMap,
    _gather,
    _put_sizes,
    _values,
    note_links,
    run_columns,
)


def _unit_form(tape: Tape, units: Sequence[int], nin: int) -> bool:
    """Whether `tape` leaves one task per unit of `units` (in their order) that later passes
    wait for, and waits for `nin` of them per unit."""
    return (len(tape.done) == len(units)
            and all(u == w and len(rows) == 1 for (u, rows), w in zip(tape.done, units))
            and tape.input_shape == (nin,) * len(units))


def stamp_units(b: ChunkedBuilder, bank: Bank, tapes: list[Tape], index: np.ndarray,
                js: np.ndarray, ks: np.ndarray, kinds: np.ndarray, extras: np.ndarray,
                units: dict[int, list[int]], *, late: LateRuns, done: SlotMap, recv: SlotMap,
                held: SlotMap, last_compute: dict[int, int]) -> bool:
    """Append the run of instructions q = 0.. (tape `tapes[index[q]]`, micro-batch `js[q]`,
    stage `ks[q]`, pass `KIND_CODES[kinds[q]]`, extra free `extras[q]`; `units[ks * 4 +
    kinds]` the units each runs on), as `replay` would one by one. Returns False, appending
    nothing, where a tape or an input is not of the form handled (see the module docstring).
    The builder's deferred columns must have been flushed."""
    nin = _INPUTS[kinds]
    pair = ks * 4 + kinds
    at_pair = {p: np.flatnonzero(pair == p) for p in _values(pair)}
    for p, at in at_pair.items():
        if not _unit_form(tapes[int(index[at[0]])], units[p], int(nin[at[0]])) \
                or (index[at] != index[at[0]]).any():
            return False
        for u in units[p]:
            if done.taken((p // 4, KIND_CODES[p % 4], u), js[at]):
                return False
    rows = bank.rows[index]
    base = len(b) + np.cumsum(rows) - rows
    # the done task of each pass and unit first, so later passes in the run read theirs
    put: list[tuple[tuple[int, str, int], np.ndarray]] = []
    for p, at in at_pair.items():
        for u, (row,) in tapes[int(index[at[0]])].done:
            prefix = (p // 4, KIND_CODES[p % 4], u)
            done.put(prefix, js[at], base[at] + row)
            put.append((prefix, js[at]))
    # the inputs, flat per instruction (unit by unit, a unit's earlier passes in order)
    slots = nin * np.array([len(units[p]) for p in pair.tolist()], np.int64)
    in_off = np.cumsum(slots) - slots
    flat_in = np.full(int(slots.sum()), -1, np.int64)
    for p, at in at_pair.items():
        k, need = p // 4, int(nin[at[0]])
        for i, u in enumerate(units[p]):
            for s, before in enumerate(("F", "I")[:need]):
                found = done.look((k, before, u), js[at])
                for q in np.flatnonzero(found < 0).tolist():  # entries in the dict, if any
                    ids = dict.get(done, (k, before, int(js[at[q]]), u))
                    if ids is None or len(ids) != 1:
                        for prefix, pjs in put:  # an input of another form: undo
                            done.clear_slots(prefix, pjs)
                        return False
                    found[q] = ids[0]
                flat_in[in_off[at] + i * need + s] = found
    columns, g, owner = run_columns(bank, index, js)
    dep_counts = bank.cols["dep_count"][g]
    dg = _gather(bank.dep_ptr[g], dep_counts)
    dep_owner = np.repeat(owner, dep_counts)
    inside, value = bank.dep_inside[dg], bank.dep_value[dg]
    if len(flat_in):
        at_in = np.minimum(in_off[dep_owner] + np.where(inside, 0, value), len(flat_in) - 1)
        given = flat_in[at_in]
    else:
        given = np.zeros(len(dg), np.int64)
    columns["dep_idx"] = np.where(inside, base[dep_owner] + value, given)
    for p, at in at_pair.items():
        for u, size in tapes[int(index[at[0]])].held:
            _put_sizes(held, (p // 4, u), js[at], size)
    free = bank.free[g]
    flag = bank.free_flag[g]
    if flag.any():
        fk, fu, fj = ks[owner[flag]], bank.free_unit[g[flag]], js[owner[flag]]
        due = np.empty(len(fk), np.float64)
        width = int(fu.max()) + 1
        combo = fk * width + fu
        for c in _values(combo):  # each (stage, unit) the freeing rows belong to
            k, u = divmod(c, width)
            at = np.flatnonzero(combo == c)
            got = held.look((k, u), fj[at])
            for q in np.flatnonzero(np.isnan(got)).tolist():
                got[q] = dict.get(held, (k, int(fj[at[q]]), u), 0.0)
            due[at] = got
        free = free.copy()
        free[flag] = due + extras[owner[flag]]
    columns["mem_free_bytes"] = free
    b.append_chunk(columns)
    note_links(((tapes[int(index[at[0]])], at) for at in at_pair.values()), base, js,
               late=late, recv=recv, last_compute=last_compute, several_rows=True)
    return True


__all__ = ["stamp_units"]
