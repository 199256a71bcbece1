"""Runs stamped out with numpy (workloads/lowering/stamp.py, chunks.py): the maps that keep a
run's bookkeeping in arrays read like dicts, a chunked builder lays rows out in id order, and
plans of many micro-batches lower to the plain lowering's Program bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.workloads.test_lowering_cache import assert_same_program
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.simulator.task_table import TaskTableBuilder
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.lowering.cache import LoweringCache
from trainsim.workloads.lowering.chunks import FLAT_COLUMNS, ROW_COLUMNS, ChunkedBuilder
from trainsim.workloads.lowering.stamp import SlotMap
from trainsim.workloads.plan import MicroBatch, ParallelPlan
from trainsim.workloads.zoo import get_model


def test_slot_map_reads_array_entries_like_dict_entries() -> None:
    done = SlotMap(2, ids=True)  # keys (stage, pass, micro-batch, unit)
    done[(0, "F", 0, 0)] = [5]
    done.put((0, "F", 0), np.array([1, 2]), np.array([7, 9]))
    assert done[(0, "F", 2, 0)] == [9]
    assert done.get((0, "F", 1, 0)) == [7] and done.get((0, "F", 3, 0), "none") == "none"
    assert (0, "F", 1, 0) in done and (0, "F", 3, 0) not in done
    with pytest.raises(KeyError):
        done[(1, "F", 1, 0)]
    assert done.taken((0, "F", 0), np.array([3, 0]))  # in the dict
    assert done.taken((0, "F", 0), np.array([2]))  # in the array
    assert done.taken((0, "F", 0), np.array([4, 4]))  # repeated
    assert not done.taken((0, "F", 0), np.array([3, 4]))
    # an assignment or setdefault moves the entry out of its array: one place per key
    done[(0, "F", 1, 0)] = [8]
    assert done[(0, "F", 1, 0)] == [8] and done.look((0, "F", 0), np.array([1]))[0] == -1
    ids = done.setdefault((0, "F", 2, 0), [])
    ids.append(10)
    assert done[(0, "F", 2, 0)] == [9, 10]
    held = SlotMap(1, ids=False)  # keys (stage, micro-batch, unit)
    held.put((0, 0), np.array([0, 3]), np.array([1.5, 2.5]))
    assert held.get((0, 3, 0), 0.0) == 2.5 and held.get((0, 1, 0), 0.0) == 0.0
    assert math.isnan(held.look((0, 0), np.array([1, 99]))[1])


def _add(b: TaskTableBuilder, i: int, deps: tuple[int, ...]) -> int:
    return b.add(b.name_template("t%d"), i, b.kind("k"), b.stream("s"), (i % 3,), 0.5 * i, 0.0,
                 (), deps, float(i), 0.0, 1.0, math.nan, i, 0, 0, 0)


def test_chunked_builder_lays_rows_out_in_id_order() -> None:
    plain, chunked = TaskTableBuilder(), ChunkedBuilder()
    for b in (plain, chunked):
        assert _add(b, 0, ()) == 0
        assert _add(b, 1, (0,)) == 1
    # rows 2..4 as a chunk in `chunked`, one by one in `plain`
    for i in range(2, 5):
        _add(plain, i, (i - 1, 0))
    rows = {name: np.array([getattr(plain, name)[i] for i in range(2, 5)])
            for name in ROW_COLUMNS}
    first_dep = sum(plain.dep_count[:2])
    flat = {"member_rank": np.array(plain.member_rank[2:5]), "link_idx": np.zeros(0, int),
            "dep_idx": np.array(plain.dep_idx[first_dep:first_dep + 6])}
    assert set(flat) == set(FLAT_COLUMNS)
    chunked.append_chunk(rows | flat)
    assert len(chunked) == 5
    for b in (plain, chunked):
        assert _add(b, 5, (4, 2)) == 5
        b.add_dep(1, 4)
    a, c = plain.build(), chunked.build()
    assert a.names() == c.names()
    for col in ("name_arg", "member_ptr", "member_rank", "dep_ptr", "dep_idx", "duration_s",
                "mem_alloc_bytes", "freq_mhz", "micro_batch"):
        np.testing.assert_array_equal(getattr(a, col), getattr(c, col), err_msg=col)


_STAGE_PLANS = [
    # Aceso's small case: 4 stages of one GPU, 128 micro-batches, per-stage recompute
    {"dp": 1, "tp": 1, "pp": 4, "micro_batch_size": 1, "global_batch": 128,
     "stage_layers": (6, 7, 6, 5), "stage_recompute": ("full", "selective", "none", "none")},
    {"dp": 2, "tp": 1, "pp": 2, "micro_batch_size": 1, "global_batch": 96},
    {"dp": 1, "tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch": 64,
     "schedule": "zb-h1"},
    {"dp": 1, "tp": 1, "pp": 4, "micro_batch_size": 1, "global_batch": 64,
     "schedule": "interleaved", "virtual_stages": 2},
]


@pytest.mark.parametrize("fields", _STAGE_PLANS, ids=["aceso", "dp", "zb-h1", "interleaved"])
def test_many_micro_batches_stamped_give_the_plain_program(fields: dict) -> None:
    spec, hw = get_model("aceso-gpt-1.3b"), parse_cluster("4xV100-PCIe-32GB")
    plan = ParallelPlan.build(spec, hw, **fields)
    opt, cache = LoweringOptions(), LoweringCache()
    plain = lower(spec, hw, plan, opt)
    assert_same_program(lower(spec, hw, plan, opt, cache=cache), plain)
    assert_same_program(lower(spec, hw, plan, opt, cache=cache), plain)


def test_micro_batches_of_several_shapes_stamped_give_the_plain_program() -> None:
    """Runs over a list of two shapes (not one key: stamped from (tape, micro-batch) tuples)."""
    spec, hw = get_model("aceso-gpt-1.3b"), parse_cluster("4xV100-PCIe-32GB")
    mbs = tuple(MicroBatch(batch_size=1, seq_len=1024 if j % 3 else 512) for j in range(48))
    plan = ParallelPlan.build(spec, hw, dp=1, tp=1, pp=4, micro_batches=mbs)
    opt = LoweringOptions()
    assert_same_program(lower(spec, hw, plan, opt, cache=LoweringCache()),
                        lower(spec, hw, plan, opt))
