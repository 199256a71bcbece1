"""A distributed optimizer's parameter all-gather behind the next forward
(`ParallelPlan.overlap_param_gather`, Megatron-LM's --overlap-param-gather): only the first
bucket, max(40M, 1M x dp) parameters, stays exposed after the optimizer step."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim import api
from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.simulator.engines import run_program
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.lowering.gradient_sync import PARAM_BUCKET_PARAMS
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

CLUSTER = parse_cluster_spec("1x8xA100-SXM4-80GB")
SPEC = get_model("gpt3-1.3b")


def _gathers(overlap: bool, zero: int = 1):
    plan = ParallelPlan.build(SPEC, CLUSTER, dp=8, zero=zero, global_batch=16,
                              micro_batch_size=2, overlap_param_gather=overlap)
    program = lower(SPEC, CLUSTER, plan, LoweringOptions())
    t = program.tasks
    names = np.asarray(t.name_templates)[t.name_code]
    picked = np.flatnonzero(names == "params.all_gather")
    return program, picked


def test_only_the_first_bucket_is_gathered_on_the_critical_path() -> None:
    full, full_ids = _gathers(False)
    over, over_ids = _gathers(True)
    assert len(full_ids) == len(over_ids) == 1
    ratio = over.tasks.comm_bytes[over_ids[0]] / full.tasks.comm_bytes[full_ids[0]]
    local = SPEC.parameters()  # dp only: every GPU holds the whole model
    assert ratio == pytest.approx(PARAM_BUCKET_PARAMS / local, rel=0.02)
    assert run_program(over).iteration_time_s < run_program(full).iteration_time_s


def test_the_flag_is_left_out_of_plans_that_do_not_set_it() -> None:
    plan = ParallelPlan.build(SPEC, CLUSTER, dp=8, zero=1, global_batch=16, micro_batch_size=2)
    assert "overlap_param_gather" not in plan.to_dict()
    on = plan.replace(overlap_param_gather=True)
    assert ParallelPlan.from_dict(on.to_dict()) == on


def test_nemo_overlaps_and_megatron_does_not_by_default() -> None:
    hw = api.load_cluster("1x8xA100-SXM4-80GB")
    fields = {"dp": 8, "zero": 1, "global_batch": 16}
    assert api.make_plan(SPEC, hw, None, framework="nemo", **fields).overlap_param_gather
    assert not api.make_plan(SPEC, hw, None, framework="megatron",
                             **fields).overlap_param_gather


@pytest.mark.parametrize(("zero", "overlap"), [(0, True), (3, True), (1, False)])
def test_it_needs_a_distributed_optimizer_with_overlapped_gradients(zero: int,
                                                                    overlap: bool) -> None:
    from trainsim.errors import PlanError

    with pytest.raises(PlanError, match="overlap_param_gather needs"):
        ParallelPlan.build(SPEC, CLUSTER, dp=8, zero=zero, global_batch=16, micro_batch_size=2,
                           overlap_grad_reduce=overlap, overlap_param_gather=True)


def test_megatron_flags_name_the_overlaps() -> None:
    from trainsim.search.exports import to_megatron_flags

    plan = ParallelPlan.build(SPEC, CLUSTER, dp=8, zero=1, global_batch=16, micro_batch_size=2,
                              overlap_param_gather=True)
    flags = to_megatron_flags(plan, SPEC)
    assert "--overlap-grad-reduce" in flags and "--overlap-param-gather" in flags
    off = to_megatron_flags(plan.replace(overlap_grad_reduce=False,
                                         overlap_param_gather=False), SPEC)
    assert "--overlap" not in off


def test_deepspeed_overlaps_gradients_under_zero3_only() -> None:
    hw = api.load_cluster("1x8xA100-SXM4-80GB")
    plans = {z: api.make_plan(SPEC, hw, None, framework="deepspeed", dp=8, zero=z,
                              global_batch=16) for z in (0, 1, 3)}
    assert [plans[z].overlap_grad_reduce for z in (0, 1, 3)] == [False, False, True]
