"""A lowering with a `LoweringCache` (shared graphs and stage costs, instruction tapes) emits
exactly the Program the plain lowering emits: every task column, link, memory and info field."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from trainsim.hwmodels.cluster import parse_cluster
from trainsim.simulator.program import Program
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.lowering.cache import LoweringCache
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

_SPEC = importlib.util.spec_from_file_location(
    "lowering_regression", Path(__file__).with_name("test_lowering_regression.py"))
assert _SPEC is not None and _SPEC.loader is not None
regression = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(regression)

_COLUMNS = ("name_code", "name_arg", "kind_code", "stream_code", "member_ptr", "member_rank",
            "link_ptr", "link_idx", "dep_ptr", "dep_idx", "duration_s", "comm_bytes",
            "mem_alloc_bytes", "mem_free_bytes", "power_w", "freq_mhz", "micro_batch", "stage",
            "first_layer", "last_layer")


def assert_same_program(a: Program, b: Program) -> None:
    """Bit-for-bit the same program (NaN equal to NaN in freq_mhz)."""
    ta, tb = a.tasks, b.tasks
    for attr in ("name_templates", "kind_names", "stream_names", "link_names"):
        assert getattr(ta, attr) == getattr(tb, attr), attr
    for col in _COLUMNS:
        np.testing.assert_array_equal(getattr(ta, col), getattr(tb, col), err_msg=col)
    assert a.link_bandwidth_bytes_per_s == b.link_bandwidth_bytes_per_s
    assert a.static_memory_bytes == b.static_memory_bytes
    assert a.memory_capacity_bytes == b.memory_capacity_bytes
    assert a.idle_power_w == b.idle_power_w
    assert a.represents == b.represents
    assert a.info == b.info


_SMALL = sorted(k for k in regression.CASES if k != "gpt3-175b-1024")


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("case", _SMALL)
def test_cached_lowering_emits_the_same_program(case: str, fold: bool) -> None:
    model, cluster, fields = regression.CASES[case]
    spec, hw = get_model(model), parse_cluster(cluster)
    plan = ParallelPlan.build(spec, hw, **fields)
    opt = LoweringOptions(fold=fold)
    cache = LoweringCache()
    plain = lower(spec, hw, plan, opt)
    assert_same_program(lower(spec, hw, plan, opt, cache=cache), plain)
    assert_same_program(lower(spec, hw, plan, opt, cache=cache), plain)  # warm cache


def test_a_cache_shared_by_many_plans_changes_none_of_them() -> None:
    """One cache across a planner-like stream (depths, micro-batches, recompute, tp, moved
    layers): each program equals its plain lowering."""
    spec, hw = get_model("gpt3-1.3b"), parse_cluster("8xA100-SXM4-80GB")
    opt, cache = LoweringOptions(), LoweringCache()
    stream = [
        {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 2, "global_batch": 32},
        {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 4, "global_batch": 32,
         "recompute": "full"},
        {"dp": 1, "tp": 2, "pp": 4, "micro_batch_size": 2, "global_batch": 32},
        {"dp": 1, "tp": 2, "pp": 4, "micro_batch_size": 2, "global_batch": 32,
         "stage_layers": (5, 7, 6, 6)},
        {"dp": 1, "tp": 2, "pp": 4, "micro_batch_size": 2, "global_batch": 32,
         "stage_layers": (5, 7, 6, 6), "stage_recompute": ("full", "none", "none", "none")},
        {"dp": 4, "tp": 1, "pp": 2, "micro_batch_size": 1, "global_batch": 32,
         "schedule": "interleaved", "virtual_stages": 2},
    ]
    for fields in stream:
        plan = ParallelPlan.build(spec, hw, **fields)
        assert_same_program(lower(spec, hw, plan, opt, cache=cache), lower(spec, hw, plan, opt))
    assert cache.hits > 0
    chains = len(cache.comm_templates)
    assert chains > 0  # collectives kept with named links, each lowering codes them anew
    plan = ParallelPlan.build(spec, hw, **stream[0])
    assert_same_program(lower(spec, hw, plan, opt, cache=cache), lower(spec, hw, plan, opt))
    assert len(cache.comm_templates) == chains  # all of them found, none planned again


@pytest.mark.parametrize("case", ["1f1b", "hetero", "zero2-1f1b-bucket", "interleaved"])
def test_long_tapes_resolved_with_numpy_give_the_same_program(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tape takes the numpy path (LONG_TAPE = 1): the same program, unfolded."""
    from trainsim.workloads.lowering import replay

    monkeypatch.setattr(replay, "LONG_TAPE", 1)
    model, cluster, fields = regression.CASES[case]
    spec, hw = get_model(model), parse_cluster(cluster)
    plan = ParallelPlan.build(spec, hw, **fields)
    opt = LoweringOptions(fold=False)
    assert_same_program(lower(spec, hw, plan, opt, cache=LoweringCache()), lower(spec, hw, plan, opt))
