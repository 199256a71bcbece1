"""`Bank` (replay.py) against the plain concatenation it stands for: grown tape by tape or in
any chunks, every column holds the tapes' values end to end with the dtype `np.concatenate`
of the non-empty per-tape arrays gives (ints stay ints until a float arrives)."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.workloads.lowering.replay import _CONST, Bank, Tape

_FLAT = {"member_rank": "member_count", "link_idx": "link_count"}


def _tape(rng: np.random.Generator, index: int, floaty: set[str]) -> Tape:
    rows = int(rng.integers(1, 6))
    counts = {n: rng.integers(0, 3, rows).tolist() for n in ("member_count", "link_count",
                                                               "dep_count")}
    values = []
    for c in _CONST:
        if c in counts:
            values.append(counts[c])
            continue
        n = sum(counts[_FLAT[c]]) if c in _FLAT else rows
        ints = rng.integers(0, 40, n).tolist()
        values.append([float(x) + 0.5 for x in ints] if c in floaty else ints)
    deps = tuple((bool(rng.integers(0, 2)), int(rng.integers(0, 4)))
                 for _ in range(sum(counts["dep_count"])))
    free_rows = tuple((int(r), int(rng.integers(0, 2))) for r in
                      rng.choice(rows, size=int(rng.integers(0, 2)), replace=False))
    done = ((0, (int(rng.integers(0, rows)),)),) if rng.integers(0, 2) else ()
    return Tape(index=index, rows=rows, values=tuple(values),
                free=rng.random(rows).tolist(), free_rows=free_rows, deps=deps, inside=None,
                dep_arrays=None, input_shape=(int(rng.integers(0, 3)),), patch=(), done=done,
                recv=(), held=(), per_bucket=(), last_compute=())


def _joined(pieces: list[np.ndarray], dtype: object = None) -> np.ndarray:
    kept = [p for p in pieces if len(p)]
    if not kept:
        return np.zeros(0, dtype) if dtype is not None else np.array([])
    return np.concatenate(kept) if dtype is None else np.concatenate(kept).astype(dtype)


def _starts(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64) if len(counts) \
        else np.zeros(0, np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_a_grown_bank_is_the_tapes_end_to_end(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tapes: list[Tape] = []
    floaty = {"duration_s", "power_w"}
    bank = Bank([])
    while len(tapes) < 40:
        for _ in range(int(rng.integers(0, 4))):  # a chunk of new tapes (maybe none)
            if len(tapes) == 20:  # from here on the stage column holds floats
                floaty.add("stage")
            tapes.append(_tape(rng, len(tapes), floaty))
        bank.grow(tapes)
        at_once = Bank(tapes)
        for grown in (bank, at_once):
            rows = np.array([t.rows for t in tapes], np.int64)
            np.testing.assert_array_equal(grown.rows, rows)
            np.testing.assert_array_equal(grown.row_off, _starts(rows))
            for i, c in enumerate(_CONST):
                want = _joined([np.array(t.values[i]) for t in tapes])
                assert grown.cols[c].dtype == want.dtype, c
                np.testing.assert_array_equal(grown.cols[c], want, err_msg=c)
            for c, n in _FLAT.items():
                np.testing.assert_array_equal(grown.ptr[c], _starts(grown.cols[n]))
            np.testing.assert_array_equal(grown.dep_ptr, _starts(grown.cols["dep_count"]))
            np.testing.assert_array_equal(grown.dep_value, _joined(
                [np.array([v for _, v in t.deps], np.int64) for t in tapes], np.int64))
            np.testing.assert_array_equal(grown.free, _joined(
                [np.array(t.free) for t in tapes], np.float64))
            flags = [r for t, off in zip(tapes, _starts(rows)) for r in
                     (off + row for row, _ in t.free_rows)]
            assert np.flatnonzero(grown.free_flag).tolist() == sorted(flags)
            assert grown.size == len(tapes)
    assert bank.cols["stage"].dtype == np.float64  # promoted when floats arrived
