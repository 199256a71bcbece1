"""FSDP2's copy-out (workloads/lowering/layout.py): after each parameter all-gather the compute
stream copies the gathered buffer into the parameters' own tensors, `fsdp_copy_out_bytes` per
parameter, in every forward and backward that regathers; torchtitan's profile sets 4 bytes."""

from __future__ import annotations

import dataclasses

import pytest

from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.workloads.framework import apply_framework, get_framework
from trainsim.workloads.lowering.layout import LoweringLayout
from trainsim.workloads.lowering.options import DEFAULT_OPTIONS
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

CLUSTER = parse_cluster_spec("1x8xA100-SXM4-80GB")


def _costs(model, **plan_fields):
    plan = ParallelPlan.build(model, CLUSTER, dp=8, global_batch=8, micro_batch_size=1,
                              **plan_fields)
    layout = LoweringLayout(model, CLUSTER, plan, DEFAULT_OPTIONS)
    return layout.costs(0, layout.mb_key(0), None), layout


def test_torchtitan_profile_sets_the_copy_and_megatron_has_none() -> None:
    assert get_framework("torchtitan").fsdp_copy_out.value == 4
    assert get_framework("megatron").fsdp_copy_out.value == 0
    assert apply_framework(get_model("gpt3-350m"), "torchtitan").fsdp_copy_out_bytes == 4


def test_zero3_passes_pay_one_memory_bound_copy_per_layer() -> None:
    model = dataclasses.replace(get_model("gpt3-350m"), fsdp_copy_out_bytes=4.0)
    plain, _ = _costs(dataclasses.replace(model, fsdp_copy_out_bytes=0.0), zero=3)
    copied, layout = _costs(model, zero=3)
    gpu = CLUSTER.gpu(0)
    cost = RooflineCostModel()
    expected = sum(cost.estimate("elementwise", 0.0, 4.0 * la.params, gpu, None, "bf16",
                                 None).time_s
                   for la in layout.stage_graph(0, layout.mb_key(0)).layers if la.params)
    assert expected > 0
    for name in ("forward", "backward", "backward_input"):
        added = getattr(copied, name).time_s - getattr(plain, name).time_s
        assert added == pytest.approx(expected, rel=1e-9), name
    assert copied.backward_weight == plain.backward_weight
    assert copied.backward.time_s == pytest.approx(
        copied.backward_input.time_s + copied.backward_weight.time_s)


@pytest.mark.parametrize("fields", [{"zero": 1}, {"zero": 3, "reshard_after_forward": False}])
def test_no_copy_without_per_pass_gathers(fields) -> None:
    model = dataclasses.replace(get_model("gpt3-350m"), fsdp_copy_out_bytes=4.0)
    plain, _ = _costs(dataclasses.replace(model, fsdp_copy_out_bytes=0.0), **fields)
    copied, _ = _costs(model, **fields)
    assert copied == plain


def test_copy_bytes_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="fsdp_copy_out_bytes"):
        dataclasses.replace(get_model("gpt3-350m"), fsdp_copy_out_bytes=-1.0)
