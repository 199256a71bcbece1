"""The unfolded fast path (issue 15): runs on stages of several units stamped with numpy
(workloads/lowering/stamp_units.py), late deps kept as arrays and merged by a counting pass,
freezing without copies, and the per-rank figures computed over whole arrays
(simulator/result.py). Each gives what the plain code gives: the same Program bit for bit, the
same per-rank records as the per-rank loop it replaced, on folded and unfolded plans, a
heterogeneous cluster, and plans with data-parallel collectives (the SM-sharing event loop)."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from tests.workloads.test_lowering_cache import assert_same_program
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.simulator import task_table
from trainsim.simulator.engine_numba import event_times, run_numba
from trainsim.simulator.program import SM_OCCUPIES, FrozenProgram, Program
from trainsim.simulator.random_program import random_program
from trainsim.simulator.result import RankRecord, lean_result
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.lowering.cache import LoweringCache
from trainsim.workloads.lowering.stamp import SlotMap
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

_CASES = {
    # dp 2 x tp 2 x pp 2 over 8 GPUs: two units a stage unfolded, dp all-reduces
    "dp-tp-pp": ("gpt3-350m", "2x4xA100-SXM4-80GB",
                 {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch": 32,
                  "seq_len": 512}),
    "recompute": ("gpt3-350m", "2x4xA100-SXM4-80GB",
                  {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch": 32,
                   "seq_len": 512, "recompute": "full"}),
    "interleaved": ("gpt3-350m", "2x4xA100-SXM4-80GB",
                    {"dp": 2, "pp": 4, "micro_batch_size": 1, "global_batch": 32,
                     "seq_len": 512, "schedule": "interleaved", "virtual_stages": 2}),
    "hetero": ("gpt3-350m", "1x4xA100-SXM4-40GB+1x4xA10",
               {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch": 32,
                "seq_len": 512}),
}


def _lowered(case: str, fold: bool, cache: LoweringCache | None) -> Program:
    model, cluster, fields = _CASES[case]
    spec, hw = get_model(model), parse_cluster(cluster)
    plan = ParallelPlan.build(spec, hw, **fields)
    return lower(spec, hw, plan, LoweringOptions(fold=fold), cache=cache)


@pytest.mark.parametrize("fold", [False, True], ids=["unfolded", "folded"])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_stamped_runs_give_the_plain_program(case: str, fold: bool) -> None:
    plain = _lowered(case, fold, None)
    cache = LoweringCache()
    assert_same_program(_lowered(case, fold, cache), plain)
    assert_same_program(_lowered(case, fold, cache), plain)  # a warm cache too


def test_unfolded_runs_are_stamped_with_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unfolded cases above do go through `stamp_units` (else they test nothing new)."""
    lower_module = importlib.import_module("trainsim.workloads.lowering.lower")
    calls: list[bool] = []
    real = lower_module.stamp_units

    def spy(*args: object, **kwargs: object) -> bool:
        calls.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return calls[-1]

    monkeypatch.setattr(lower_module, "stamp_units", spy)
    _lowered("dp-tp-pp", False, LoweringCache())
    assert calls and all(calls)


def test_slot_map_keeps_rows_of_ids() -> None:
    recv = SlotMap(2, ids=True)  # keys (stage, direction, micro-batch, unit)
    assert not recv.rows_taken((1, "F", 0), np.array([0, 2]), 3)
    recv.put_rows((1, "F", 0), np.array([0, 2]), np.array([[4, 5, 6], [7, 8, 9]]))
    assert recv[(1, "F", 2, 0)] == [7, 8, 9] and recv.get((1, "F", 1, 0)) is None
    assert recv.rows_taken((1, "F", 0), np.array([2]), 3)
    assert recv.rows_taken((1, "F", 0), np.array([1]), 2)  # another width: not these rows
    assert recv.taken((1, "F", 0), np.array([1]))  # nor one id per entry
    recv.setdefault((1, "F", 0, 0), []).append(10)  # moves the entry to the dict
    assert recv[(1, "F", 0, 0)] == [4, 5, 6, 10]
    rows = recv.look_rows((1, "F", 0), np.array([0, 2, 70]), 3)
    assert rows is not None and rows.tolist() == [[-1, -1, -1], [7, 8, 9], [-1, -1, -1]]


def test_late_deps_merge_compiled_as_the_stable_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_table, "_THRESHOLD", [10**12])
    a = _lowered("dp-tp-pp", False, LoweringCache())
    monkeypatch.setattr(task_table, "_THRESHOLD", [0])
    assert_same_program(_lowered("dp-tp-pp", False, LoweringCache()), a)


def _records_by_rank_loop(program: Program, fp: FrozenProgram, start: np.ndarray,
                          end: np.ndarray) -> list[RankRecord]:
    """The per-rank figures as the loop before issue 15 worked them out, rank by rank."""
    n = fp.num_tasks
    iteration_s = float(end.max()) if n else 0.0
    row_task = np.repeat(np.arange(n), np.diff(fp.member_ptr))
    row_rank = fp.member_rank.astype(np.int64)
    row_start, row_end = start[row_task], end[row_task]
    row_len = row_end - row_start
    stream = fp.stream_code[row_task]
    powered = fp.stream_powered[stream]
    row_energy = np.where(powered, fp.power_w[row_task] * row_len, 0.0)
    compute = fp.stream_names.index("compute") if "compute" in fp.stream_names else -1
    records = []
    for rank in range(fp.num_ranks):
        mine = row_rank == rank
        ev: list[tuple[float, int, int, float]] = []
        for r in np.flatnonzero(mine).tolist():
            t = int(row_task[r])
            alloc, free = float(fp.mem_alloc_bytes[t]), float(fp.mem_free_bytes[t])
            if alloc:
                ev.append((float(row_start[r]), 1, t, alloc))
            if free:
                ev.append((float(row_end[r]), 0 if row_len[r] > 0 else 2, t, -free))
        ev.sort()
        static, cap = float(fp.static_memory_bytes[rank]), float(fp.memory_capacity_bytes[rank])
        running = np.cumsum(np.concatenate(([static], [e[3] for e in ev])))
        peak = float(running.max())
        over = np.flatnonzero(running > cap)
        times = np.concatenate(([0.0], [e[0] for e in ev]))
        rows = np.flatnonzero(mine & powered)
        busy = 0.0
        if len(rows):
            order = np.argsort(row_start[rows], kind="stable")
            s, e = row_start[rows][order], row_end[rows][order]
            reach = np.maximum.accumulate(e)
            prev = np.concatenate((s[:1], reach[:-1]))
            busy = float(np.maximum(e - np.maximum(s, prev), 0.0).sum())
        idle = max(iteration_s - busy, 0.0)
        energy = float(row_energy[rows].sum()) + float(fp.idle_power_w[rank]) * idle
        on = mine & (stream == compute)
        bubble = 1.0 - float(row_len[on].sum()) / iteration_s if iteration_s > 0 else 0.0
        records.append(RankRecord(
            rank=rank, represents=tuple(program.represents[rank]), busy_s=busy, idle_s=idle,
            bubble_fraction=max(bubble, 0.0), peak_memory_bytes=peak,
            memory_capacity_bytes=cap, oom=len(over) > 0,
            oom_time_s=float(times[over[0]]) if len(over) else None,
            oom_excess_bytes=peak - cap if len(over) else 0.0, energy_j=energy))
    return records


def _assert_same_records(got: list[RankRecord], want: list[RankRecord]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for name in ("rank", "represents", "busy_s", "idle_s", "peak_memory_bytes",
                     "memory_capacity_bytes", "oom", "oom_time_s", "oom_excess_bytes",
                     "energy_j"):
            assert getattr(a, name) == getattr(b, name), (a.rank, name)
        assert math.isclose(a.bubble_fraction, b.bubble_fraction, rel_tol=1e-12, abs_tol=1e-15)


@pytest.mark.parametrize("fold", [False, True], ids=["unfolded", "folded"])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_rank_records_match_the_rank_by_rank_loop(case: str, fold: bool) -> None:
    program = _lowered(case, fold, LoweringCache())
    fp = program.freeze()
    start, end = event_times(fp)
    if case == "dp-tp-pp":  # the SM-sharing loop ran: a collective held SMs beside compute
        assert (fp.sm_role == SM_OCCUPIES).any() and (fp.comm_sm_fraction > 0).any()
    want = _records_by_rank_loop(program, fp, start, end)
    lean = lean_result(program, start, end, engine="numba", frozen=fp)
    _assert_same_records(lean.ranks, want)
    assert run_numba(program, frozen=fp).ranks == lean.ranks


@pytest.mark.parametrize("seed", range(4))
def test_rank_records_match_on_random_programs(seed: int) -> None:
    """Random programs: zero-length tasks, ties, out-of-memory ranks, idle ranks."""
    program = random_program(seed, 5, 300, memory_capacity_bytes=3e9 if seed % 2 else None)
    fp = program.freeze()
    start, end = event_times(fp)
    lean = lean_result(program, start, end, engine="numba", frozen=fp)
    _assert_same_records(lean.ranks, _records_by_rank_loop(program, fp, start, end))


def _assert_same_frozen(a: FrozenProgram, b: FrozenProgram) -> None:
    for name in FrozenProgram.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), name
        else:
            assert x == y, name


@pytest.mark.parametrize("seed", range(3))
def test_freezing_compiled_or_with_numpy_gives_the_same_arrays(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled first-appearance codes, queues and repeat checks of a large table give the
    arrays numpy gives a small one (thresholds moved instead of building a million tasks)."""
    prog = random_program(seed, 6, 400)
    monkeypatch.setattr(task_table, "_THRESHOLD", [10**9])
    plain = prog.freeze()
    monkeypatch.setattr(task_table, "_THRESHOLD", [0])
    _assert_same_frozen(prog.freeze(), plain)


def test_a_repeated_rank_is_found_as_before() -> None:
    """The packed sort of `_repeats` flags the rows the lexsort flagged."""
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 5, 300)
    ptr = np.r_[0, np.cumsum(counts)]
    values = rng.integers(0, 6, int(counts.sum()))
    owner = np.repeat(np.arange(300), counts)
    order = np.lexsort((values, owner))
    o, v = owner[order], values[order]
    want = np.zeros(300, bool)
    want[o[1:][(o[1:] == o[:-1]) & (v[1:] == v[:-1])]] = True
    assert want.any() and not want.all()
    np.testing.assert_array_equal(task_table._repeats(ptr, values, owner, 300), want)
