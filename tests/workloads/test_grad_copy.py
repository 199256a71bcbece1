"""Gradient copies around the data-parallel reduction (workloads/lowering/gradient_sync.py,
`ModelSpec.grad_copy_traffic`): each bucket's gradients copied into its reduction buffer before
it (the first 2 bytes per gradient byte; the buffer held from then on) and the result copied
back after it (the rest; the buffer freed), on streams of their own, so buckets still overlap
the backward and later passes do not queue behind a reduction."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.simulator.engines import run_program
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.lowering.gradient_sync import GRAD_COPY_STREAMS
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.stage_costs import optimizer_bytes_per_param
from trainsim.workloads.zoo import get_model

CLUSTER = parse_cluster_spec("1x4xV100-PCIe-32GB")
MODEL = get_model("gpt3-350m")
ONE_BUCKET = LoweringOptions(dp_bucket_bytes=1e15)


def _program(traffic: float, options: LoweringOptions = ONE_BUCKET, **fields):
    plan = ParallelPlan.build(MODEL, CLUSTER, **{"dp": 2, "pp": 2, "global_batch": 8,
                                                 "micro_batch_size": 2, **fields})
    model = dataclasses.replace(MODEL, grad_copy_traffic=traffic)
    return lower(model, CLUSTER, plan, options), plan


def _tasks(program, kind: str) -> np.ndarray:
    t = program.tasks
    return np.flatnonzero(t.kind_code == t.kind_names.index(kind)) if kind in t.kind_names \
        else np.zeros(0, np.int64)


def _deps(program, task: int) -> list[int]:
    t = program.tasks
    return t.dep_idx[t.dep_ptr[task]:t.dep_ptr[task + 1]].tolist()


def _name(program, task: int) -> str:
    t = program.tasks
    return t.name_templates[t.name_code[task]]


def _stream(program, task: int) -> str:
    t = program.tasks
    return t.stream_names[t.stream_code[task]]


def _time(traffic: float, **kw) -> float:
    return run_program(_program(traffic, **kw)[0], engine="numba").iteration_time_s


def test_no_copy_without_traffic_or_data_parallelism() -> None:
    assert len(_tasks(_program(0.0)[0], "grad_copy")) == 0
    assert len(_tasks(_program(6.0, dp=1, pp=4)[0], "grad_copy")) == 0


def test_copies_wrap_every_reduction_at_the_stated_traffic() -> None:
    program, plan = _program(6.0)
    # the tied embedding's all-reduce between first and last stage reduces the two copies'
    # gradients in place (Megatron-LM's embedding group): no copies around it
    reductions = [r for r in _tasks(program, "all_reduce")
                  if not _name(program, r).startswith("embedding.")]
    assert len(reductions) == plan.pp  # one bucket per stage, folded
    copies = _tasks(program, "grad_copy")
    gpu, cost = CLUSTER.gpu(0), RooflineCostModel()
    grad = optimizer_bytes_per_param(plan.dtype)[1]
    ins = [c for c in copies if _name(program, c).endswith("copy_in")]
    outs = [c for c in copies if _name(program, c).endswith("copy_out")]
    assert len(ins) == len(outs) == plan.pp
    assert {_stream(program, c) for c in ins} == {GRAD_COPY_STREAMS[0]}
    assert {_stream(program, c) for c in outs} == {GRAD_COPY_STREAMS[1]}
    t = program.tasks
    for red in reductions:
        stage = int(t.stage[red])
        params = program.static_memory_bytes[stage] / sum(optimizer_bytes_per_param(plan.dtype))
        (cin,) = [c for c in ins if c in _deps(program, red)]
        (cout,) = [c for c in outs if red in _deps(program, c)]
        for task, moved in ((cin, 2.0), (cout, 4.0)):
            want = cost.estimate("copy", 0.0, moved * grad * params, gpu, None, plan.dtype,
                                 None).time_s
            assert t.duration_s[task] == pytest.approx(want, rel=1e-9)
        # the buffer: held from the copy-in, freed by the copy-out
        assert t.mem_alloc_bytes[cin] == pytest.approx(grad * params)
        assert t.mem_free_bytes[cout] == pytest.approx(grad * params)
        optimizer = [o for o in _tasks(program, "optimizer") if cout in _deps(program, o)]
        assert len(optimizer) == 1


def test_copy_in_alone_below_two_bytes_holds_no_buffer() -> None:
    program, _ = _program(1.5)
    copies = _tasks(program, "grad_copy")
    assert copies.size and all(_name(program, c).endswith("copy_in") for c in copies)
    assert not program.tasks.mem_alloc_bytes[copies].any()


def test_copies_lengthen_the_iteration_by_no_more_than_they_take() -> None:
    """With several buckets and an interleaved schedule the copies add at most their own time
    (they do not hold back the backward's buckets or the other virtual stage's passes)."""
    options = LoweringOptions(dp_bucket_bytes=2**20)
    for fields in ({}, {"schedule": "interleaved", "virtual_stages": 2, "global_batch": 16}):
        program, _ = _program(6.0, options, **fields)
        assert len({_name(program, c) for c in _tasks(program, "grad_copy")}) > 4
        plain = _time(0.0, options=options, **fields)
        copied = _time(6.0, options=options, **fields)
        copy_s = program.tasks.duration_s[_tasks(program, "grad_copy")].sum()
        assert plain < copied <= plain + copy_s


def test_copy_back_of_a_reduce_scatter_covers_the_rank_s_shard() -> None:
    """Under ZeRO-1 each rank copies back only its 1/dp of the reduced gradients."""
    full, plan = _program(6.0)
    shard, _ = _program(6.0, zero=1)
    gpu, cost = CLUSTER.gpu(0), RooflineCostModel()
    grad = optimizer_bytes_per_param(plan.dtype)[1]
    for stage in range(plan.pp):
        params = full.static_memory_bytes[stage] / sum(optimizer_bytes_per_param(plan.dtype))
        (out,) = [c for c in _tasks(shard, "grad_copy") if _name(shard, c) ==
                  f"s{stage}.dp.copy_out"]
        want = cost.estimate("copy", 0.0, 4.0 * grad * params / plan.dp, gpu, None,
                             plan.dtype, None).time_s
        assert shard.tasks.duration_s[out] == pytest.approx(want, rel=1e-9)


def test_traffic_out_of_range_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="grad_copy_traffic"):
        dataclasses.replace(MODEL, grad_copy_traffic=-1.0)
