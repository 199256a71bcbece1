"""FSDP2's copy-out (workloads/lowering/layout.py): after each parameter all-gather the compute
stream copies the gathered buffer into the parameters' own tensors (`fsdp_copy_out_traffic`
bytes moved per gathered byte; torchtitan's profile: 2, read once and written once), in every
forward, and in every backward that regathers: not the root unit (embedding, head), which FSDP2
does not reshard after the forward, nor torchtitan's last block."""

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


def _layout(model, **plan_fields):
    fields = {"dp": 8, "global_batch": 8, "micro_batch_size": 1, **plan_fields}
    plan = ParallelPlan.build(model, CLUSTER, **fields)
    return LoweringLayout(model, CLUSTER, plan, DEFAULT_OPTIONS)


def _added(model, **plan_fields):
    """(forward, backward, backward_input, backward_weight) seconds the copy adds to stage 0
    of the plan, and the layout with the copy."""
    plain = _layout(dataclasses.replace(model, fsdp_copy_out_traffic=0.0), **plan_fields)
    copied = _layout(model, **plan_fields)
    a = plain.costs(0, plain.mb_key(0), None)
    b = copied.costs(0, copied.mb_key(0), None)
    return tuple(getattr(b, n).time_s - getattr(a, n).time_s
                 for n in ("forward", "backward", "backward_input", "backward_weight")), copied


def _copy_s(layout, layers, tp: int, ep: int = 1) -> float:
    """The copy of `layers` as the test computes it: 2 x 2 bytes per per-GPU parameter, one
    memory-bound kernel per layer."""
    gpu, cost = CLUSTER.gpu(0), RooflineCostModel()
    total = 0.0
    for layer in layers:
        params = sum(op.params for op in layer.sharded_ops(tp, layout.plan.sp, ep))
        if params:
            total += cost.estimate("elementwise", 0.0, 4.0 * params, gpu, None,
                                   layout.plan.dtype, None).time_s
    return total


def test_torchtitan_profile_sets_the_copy_and_megatron_has_none() -> None:
    assert get_framework("torchtitan").fsdp_copy_out.value == 2
    assert get_framework("megatron").fsdp_copy_out.value == 0
    assert apply_framework(get_model("gpt3-350m"), "torchtitan").fsdp_copy_out_traffic == 2


@pytest.mark.parametrize("tp", [1, 2])
def test_forward_copies_every_layer_backward_skips_the_root_unit_and_last_block(tp) -> None:
    model = dataclasses.replace(get_model("gpt3-350m"), fsdp_copy_out_traffic=2.0)
    (fwd, bwd, bwd_in, bwd_w), layout = _added(model, zero=3, tp=tp, dp=8 // tp)
    layers = layout.stage_graph(0, layout.mb_key(0)).layers
    blocks = [la for la in layers if la.kind not in ("embedding", "head")]
    assert fwd == pytest.approx(_copy_s(layout, layers, tp), rel=1e-9)
    assert bwd == pytest.approx(_copy_s(layout, blocks[:-1], tp), rel=1e-9)
    assert 0 < bwd < fwd
    assert bwd_in == pytest.approx(bwd, rel=1e-9) and bwd_w == 0.0


def test_expert_parallel_copies_only_the_local_experts() -> None:
    model = dataclasses.replace(get_model("gpt-moe-1.3b-8e"), fsdp_copy_out_traffic=2.0)
    (fwd, *_), layout = _added(model, zero=3, ep=8)
    layers = layout.stage_graph(0, layout.mb_key(0)).layers
    local = _copy_s(layout, layers, 1, ep=8)
    assert fwd == pytest.approx(local, rel=1e-9)
    assert local < 0.5 * _copy_s(layout, layers, 1, ep=1)


@pytest.mark.parametrize("fields", [{"zero": 1}, {"zero": 3, "reshard_after_forward": False}])
def test_no_copy_without_per_pass_gathers(fields) -> None:
    model = dataclasses.replace(get_model("gpt3-350m"), fsdp_copy_out_traffic=2.0)
    added, _ = _added(model, **fields)
    assert added == (0.0, 0.0, 0.0, 0.0)


def test_fp32_plans_copy_twice_the_bytes() -> None:
    model = dataclasses.replace(get_model("gpt3-350m"), fsdp_copy_out_traffic=2.0)
    (bf16, *_), _ = _added(model, zero=3, dtype="bf16")
    (fp32, *_), _ = _added(model, zero=3, dtype="fp32")
    assert fp32 > 1.5 * bf16


def test_copy_traffic_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="fsdp_copy_out_traffic"):
        dataclasses.replace(get_model("gpt3-350m"), fsdp_copy_out_traffic=-1.0)
