"""The large-table kernels (simulator/csr_numba.py) and the task-table paths that use them give
exactly what the numpy code they stand in for gives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainsim.simulator import task_table
from trainsim.simulator.csr_numba import counting_order, reverse_csr, rows_with_repeats
from trainsim.simulator.engine_numba import successors
from trainsim.simulator.random_program import random_program
from trainsim.simulator.task_table import TaskTableBuilder


def _csr(rng: np.random.Generator, rows: int, values: int, most: int
         ) -> tuple[np.ndarray, np.ndarray]:
    counts = rng.integers(0, most + 1, rows)
    ptr = np.zeros(rows + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, rng.integers(0, values, int(ptr[-1]))


@pytest.mark.parametrize("seed", range(4))
def test_counting_order_is_a_stable_argsort(seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 37, 5000)
    np.testing.assert_array_equal(counting_order(keys, 37), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("seed", range(4))
def test_reverse_csr_matches_the_sorted_reverse(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ptr, idx = _csr(rng, 300, 300, 5)
    out_ptr, out = reverse_csr(ptr, idx, 300)
    owner = np.repeat(np.arange(300), np.diff(ptr))
    np.testing.assert_array_equal(out, owner[np.argsort(idx, kind="stable")])
    np.testing.assert_array_equal(np.diff(out_ptr), np.bincount(idx, minlength=300))


@pytest.mark.parametrize("compiled_from", [0, 10**12], ids=["compiled", "numpy"])
def test_successors_of_a_program(compiled_from: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_table, "_THRESHOLD", [compiled_from])
    frozen = random_program(3, 4, 200).freeze()
    ptr, idx = successors(frozen)
    owner = np.repeat(np.arange(frozen.num_tasks), np.diff(frozen.dep_ptr))
    np.testing.assert_array_equal(idx, owner[np.argsort(frozen.dep_idx, kind="stable")])
    np.testing.assert_array_equal(ptr[1:], np.cumsum(np.bincount(frozen.dep_idx,
                                                                 minlength=frozen.num_tasks)))
    assert ptr[-1] == len(frozen.dep_idx)


@pytest.mark.parametrize("seed", range(4))
def test_rows_with_repeats_matches_the_sorted_check(seed: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    ptr, values = _csr(rng, 2000, 40, 6)
    owner = np.repeat(np.arange(2000), np.diff(ptr))
    monkeypatch.setattr(task_table, "_THRESHOLD", [10**12])
    want = task_table._repeats(ptr, values, owner, 2000)  # numpy
    assert want.any() and not want.all()
    np.testing.assert_array_equal(rows_with_repeats(ptr, values), want)
    monkeypatch.setattr(task_table, "_THRESHOLD", [0])  # the compiled path through the table code
    np.testing.assert_array_equal(task_table._repeats(ptr, values, owner, 2000), want)


@pytest.mark.parametrize("seed", range(3))
def test_late_deps_merge_as_a_stable_sort_by_owner(seed: int) -> None:
    """Each task's own deps first, then its late deps in the order added (the old sort)."""
    rng = np.random.default_rng(seed)
    b = TaskTableBuilder()
    n = 400
    for t in range(n):
        deps = sorted(rng.choice(t, size=min(t, int(rng.integers(0, 4))), replace=False)) \
            if t else []
        b.add(0, -1, 0, 0, (0,), 1.0, 0.0, (), [int(d) for d in deps], 0.0, 0.0, 0.0,
              float("nan"), -1, -1, -1, -1)
    for _ in range(900):
        t = int(rng.integers(1, n))
        b.add_dep(t, int(rng.integers(0, t)))
    table = b.build()
    owner = np.r_[np.repeat(np.arange(n), b.dep_count), b.late_owner]
    order = np.argsort(owner, kind="stable")
    np.testing.assert_array_equal(table.dep_idx, np.r_[b.dep_idx, b.late_dep][order])
    np.testing.assert_array_equal(np.diff(table.dep_ptr), np.bincount(owner, minlength=n))


@pytest.mark.parametrize("seed", range(3))
def test_freezing_with_the_counting_sort_gives_the_same_queues(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _assert_compiled_queues_match_numpy(random_program(seed, 6, 400), monkeypatch)


def _assert_compiled_queues_match_numpy(prog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Freezing `prog` with the compiled kernels (threshold 0) and with numpy (threshold out of
    reach) gives the same queue arrays, dtypes included."""
    monkeypatch.setattr(task_table, "_THRESHOLD", [10**12])
    want = prog.freeze()
    monkeypatch.setattr(task_table, "_THRESHOLD", [0])
    got = prog.freeze()
    for name in ("member_queue", "member_pos", "queue_ptr", "queue_task", "queue_rank",
                 "queue_stream"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        assert getattr(got, name).dtype == getattr(want, name).dtype, name


def test_queues_of_an_unfolded_lowering_match_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real program (several streams, collectives over many ranks): the compiled queues
    equal numpy's."""
    from trainsim.hwmodels.cluster import parse_cluster
    from trainsim.workloads.lowering import LoweringOptions, lower
    from trainsim.workloads.plan import ParallelPlan
    from trainsim.workloads.zoo import get_model

    model, cluster = get_model("gpt3-350m"), parse_cluster("2x4xA100-SXM4-80GB")
    plan = ParallelPlan.build(model, cluster, dp=2, tp=2, pp=2, num_micro_batches=4,
                              seq_len=256)
    _assert_compiled_queues_match_numpy(lower(model, cluster, plan, LoweringOptions(fold=False)),
                                        monkeypatch)


def test_the_numba_oracle_turns_the_compiled_passes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """One program stays on numpy below COMPILED_FROM entries; an Oracle on the numba engine
    (many programs) moves the threshold to COMPILED_FOR_MANY, one on SimPy does not."""
    from trainsim.api import load_cluster, load_model
    from trainsim.search.oracle import Oracle

    monkeypatch.setattr(task_table, "_THRESHOLD", [task_table.COMPILED_FROM])
    model, cluster = load_model("gpt3-125m"), load_cluster("4xV100-SXM2-32GB")
    assert not task_table.compiled(task_table.COMPILED_FOR_MANY)
    Oracle(model, cluster, engine="simpy")
    assert not task_table.compiled(task_table.COMPILED_FOR_MANY)
    Oracle(model, cluster)
    assert task_table.compiled(task_table.COMPILED_FOR_MANY)
    assert not task_table.compiled(task_table.COMPILED_FOR_MANY - 1)


def test_sorted_within_is_lexsort_on_rows_grouped_by_key() -> None:
    """Rows grouped by rank in task order (a stable counting pass), then a stable sort by
    start within each rank: the order ``np.lexsort((start, rank))`` gives, ties included."""
    from trainsim.simulator.csr_numba import counting_order, sorted_within

    rng = np.random.default_rng(5)
    rank = rng.integers(0, 50, 20_000)
    start = rng.integers(0, 300, 20_000).astype(np.float64)  # many ties
    by_rank = counting_order(rank, 50)
    np.testing.assert_array_equal(by_rank, np.argsort(rank, kind="stable"))
    bounds = np.searchsorted(rank[by_rank], np.arange(51))
    got = by_rank[sorted_within(bounds, start[by_rank])]
    np.testing.assert_array_equal(got, np.lexsort((start, rank)))


def test_sorted_within_leaves_slices_in_order_and_sorts_the_rest() -> None:
    """Slices already in order (ties included: lowering emits a rank's rows by start) stay
    as they are, the others are sorted stably, and a NaN slice is left to the sort: the same
    positions as one stable sort per slice."""
    from trainsim.simulator.csr_numba import sorted_within

    rng = np.random.default_rng(11)
    pieces = [np.sort(rng.integers(0, 20, 300)).astype(np.float64),  # in order, many ties
              rng.integers(0, 20, 300).astype(np.float64),  # not
              np.array([1.0, np.nan, 2.0, 0.5]), np.array([3.0]), np.zeros(0)]
    values = np.concatenate(pieces)
    bounds = np.concatenate(([0], np.cumsum([len(x) for x in pieces])))
    want = np.concatenate([lo + np.argsort(x, kind="stable")
                           for lo, x in zip(bounds[:-1], pieces)])
    np.testing.assert_array_equal(sorted_within(bounds, values), want)


def test_lean_result_is_the_same_on_either_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-rank records (busy, energy, memory) of a random program are identical whether
    the result's orders come from the compiled passes or from numpy's sorts."""
    from trainsim.simulator.engine_numba import event_times
    from trainsim.simulator.result import lean_result

    prog = random_program(11, 6, 500)
    frozen = prog.freeze()
    start, end = event_times(frozen)
    monkeypatch.setattr(task_table, "_THRESHOLD", [10**12])
    want = lean_result(prog, start, end, engine="numba", frozen=frozen).ranks
    monkeypatch.setattr(task_table, "_THRESHOLD", [0])
    assert lean_result(prog, start, end, engine="numba", frozen=frozen).ranks == want
