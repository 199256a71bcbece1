"""Per-op tensor-parallel degrees in a ParallelPlan (`op_tp` for every stage, `stage_op_tp`
per stage): JSON round trip, which stages have per-op degrees, and one-line errors naming the
field."""

from __future__ import annotations

import json

import pytest

from trainsim.errors import PlanError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

MODEL, CLUSTER = get_model("gpt3-125m"), parse_cluster("4xV100-SXM2-32GB")
BASE = {"pp": 2, "stage_gpus": (2, 2), "stage_tp": (1, 2), "micro_batch_size": 4,
        "global_batch": 16}


def test_stage_op_tp_round_trips_through_json() -> None:
    """A plan with per-stage per-op degrees serialises as a list of maps and parses back equal;
    `op_tp_of_stage` merges `op_tp` with the stage's map (the stage's map wins)."""
    plan = ParallelPlan.build(MODEL, CLUSTER, **BASE, op_tp={"attn.qkv": 2},
                              stage_op_tp=({"mlp.fc1": 2, "mlp.gelu": 2}, {"attn.qkv": 1}))
    data = json.loads(plan.to_json())
    assert data["stage_op_tp"] == [{"mlp.fc1": 2, "mlp.gelu": 2}, {"attn.qkv": 1}]
    assert data["op_tp"] == {"attn.qkv": 2}
    again = ParallelPlan.from_json(plan.to_json())
    assert again == plan
    assert again.op_tp_of_stage(0) == {"attn.qkv": 2, "mlp.fc1": 2, "mlp.gelu": 2}
    assert again.op_tp_of_stage(1) == {"attn.qkv": 1}


def test_has_op_tp_only_where_a_degree_differs_from_the_stages() -> None:
    """Stage 0 (tp 1) with mlp.fc1 at 2 has per-op degrees; stage 1 (tp 2) naming mlp.fc1 at 2
    does not (it is a one-degree stage); plans without the fields never do."""
    plan = ParallelPlan.build(MODEL, CLUSTER, **BASE, op_tp={"mlp.fc1": 2})
    assert plan.has_op_tp(0) and not plan.has_op_tp(1)
    plain = ParallelPlan.build(MODEL, CLUSTER, **BASE)
    assert not plain.has_op_tp(0) and not plain.has_op_tp(1)
    assert ParallelPlan.build(MODEL, CLUSTER, tp=2, dp=2, micro_batch_size=2,
                              op_tp={"mlp.fc1": 4}).has_op_tp(0)


@pytest.mark.parametrize(("fields", "message"), [
    ({"stage_op_tp": [{"mlp.fc1": 2}]}, r"plan\.stage_op_tp has 1 maps but pp=2"),
    ({"stage_op_tp": [{"mlp.fc1": "x"}, {}]},
     r"plan\.stage_op_tp\[0\]\['mlp\.fc1'\]='x' must be a positive integer"),
    ({"stage_op_tp": {"mlp.fc1": 2}}, r"plan\.stage_op_tp=.* must be a list with one map"),
    ({"stage_op_tp": [{"mlp.fc1": 4}, {}]},
     r"plan\.stage_op_tp\[0\]\['mlp\.fc1'\]=4 must divide stage 0's 2 GPUs"),
    ({"stage_tp": (2, 2), "micro_batch_size": 1, "stage_op_tp": [{}, {"mlp.fc1": 1}]},
     (r"plan\.stage_op_tp\[1\]\['mlp\.fc1'\]=1: the op runs on 2 data-parallel replicas "
      r"\(stage 1's 2 GPUs / 1\), which must divide the stage's micro-batch of 1 samples")),
    ({"stage_op_tp": [{"mlp.fc9": 2}, {}]}, r"plan\.stage_op_tp\[0\]\['mlp\.fc9'\]: .*mlp\.fc"),
    ({"op_tp": {"attn.qkv": 2}, "zero": 1}, r"plan\.op_tp .*plan\.zero=1"),
])
def test_bad_per_op_degrees_are_refused_naming_the_field(fields: dict, message: str) -> None:
    """Wrong length, type, a degree not dividing the stage's GPUs, an op whose replicas do not
    split the micro-batch, an unknown op name, ZeRO with per-op degrees: each a one-line
    PlanError naming the field."""
    with pytest.raises(PlanError, match=message) as info:
        ParallelPlan.build(MODEL, CLUSTER, **(BASE | fields))
    assert "\n" not in str(info.value)


def test_degree_must_divide_the_heads() -> None:
    """gpt3-125m has 12 heads: an op at degree 8 on an 8-GPU stage is refused by name."""
    with pytest.raises(PlanError, match=r"plan\.op_tp\['attn\.qkv'\]=8 does not divide "
                                        r"model\.num_heads=12"):
        ParallelPlan.build(MODEL, parse_cluster("8xV100-SXM2-32GB"), pp=1, stage_gpus=(8,),
                           micro_batch_size=8, op_tp={"attn.qkv": 8})
