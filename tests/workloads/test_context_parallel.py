"""Context parallelism (plan.cp): each sequence split over cp GPUs, ring attention.

- a cp plan occupies dp·cp·tp·pp GPUs and is refused where it is not modelled;
- it conserves the work: the same tokens and model FLOPs per iteration as cp=1, with each
  rank's attention reading the whole sequence (so per-rank attention FLOPs are 1/cp of it);
- it divides activation memory per GPU, and folded and unfolded programs agree.
"""

from __future__ import annotations

import pytest

from trainsim import api
from trainsim.errors import PlanError
from trainsim.simulator.engines import run_program
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.model import build_graph
from trainsim.workloads.plan import ParallelPlan

MODEL = api.load_model("gpt3-125m")


def test_cp_plans_take_dp_cp_tp_pp_gpus_and_state_themselves() -> None:
    cluster = api.load_cluster("1x8xA100-SXM4-80GB")
    plan = ParallelPlan.build(MODEL, cluster, dp=2, cp=2, tp=2, global_batch=8)
    assert plan.gpus == 8 and plan.gpus_of_stage(0) == 8
    assert plan.to_dict()["cp"] == 2
    assert "cp" not in ParallelPlan.build(MODEL, cluster, dp=8, global_batch=8).to_dict()
    program = lower(MODEL, cluster, plan)
    assert program.info.plan["cp"] == 2 and program.info.global_batch == 8
    assert program.info.seq_len == MODEL.seq_len


@pytest.mark.parametrize(("model", "fields", "word"), [
    ("gpt3-125m", {"dp": 4, "cp": 2, "micro_batches": [{"batch_size": 1, "seq_len": 64}]},
     "micro_batches"),
    ("gpt3-125m", {"dp": 4, "cp": 2, "seq_len": 1001}, "divisible"),
    ("t5-770m", {"dp": 4, "cp": 2}, "decoder-only"),
    ("gpt3-125m", {"dp": 2, "cp": 2}, "dp×cp×tp×pp"),
])
def test_cp_is_refused_where_it_is_not_modelled(model: str, fields: dict, word: str) -> None:
    cluster = api.load_cluster("1x8xA100-SXM4-80GB")
    with pytest.raises(PlanError, match=word):
        ParallelPlan.build(api.load_model(model), cluster, global_batch=8, **fields)


def test_eager_attention_cannot_ring() -> None:
    import dataclasses

    eager = dataclasses.replace(MODEL, attention="eager")
    with pytest.raises(PlanError, match="fused attention"):
        ParallelPlan.build(eager, api.load_cluster("2xA100-SXM4-80GB"), dp=1, cp=2,
                           global_batch=2)


def test_cp_conserves_tokens_and_flops_and_splits_attention() -> None:
    cluster1, cluster4 = api.load_cluster("1xA100-SXM4-80GB"), api.load_cluster("4xA100-SXM4-80GB")
    one = lower(MODEL, cluster1, ParallelPlan.build(MODEL, cluster1, global_batch=2))
    four = lower(MODEL, cluster4, ParallelPlan.build(MODEL, cluster4, cp=4, global_batch=2))
    assert four.info.tokens_per_iteration == one.info.tokens_per_iteration
    assert four.info.model_flops_per_iteration == pytest.approx(
        one.info.model_flops_per_iteration, rel=1e-9)
    import dataclasses

    s = MODEL.seq_len
    full = build_graph(MODEL, 1, s).transformer_layers()[0]
    ring = build_graph(dataclasses.replace(MODEL, context_parallel=4), 1, s // 4
                       ).transformer_layers()[0]
    attn = {o.name: o for o in full.ops}["attn.flash"]
    part = {o.name: o for o in ring.ops}["attn.flash"]
    assert part.fwd_flops == pytest.approx(attn.fwd_flops / 4)
    assert part.activation_bytes < attn.activation_bytes / 3  # keeps only its own K, V


def test_cp_divides_memory_and_folding_agrees() -> None:
    cluster = api.load_cluster("1x8xA100-SXM4-80GB")
    base = {"global_batch": 8, "seq_len": 2048}
    no_cp = ParallelPlan.build(MODEL, cluster, dp=8, **base)
    cp4 = ParallelPlan.build(MODEL, cluster, dp=2, cp=4, **base)
    r0 = run_program(lower(MODEL, cluster, no_cp), engine="numba")
    folded = run_program(lower(MODEL, cluster, cp4), engine="numba")
    unfolded = run_program(lower(MODEL, cluster, cp4, LoweringOptions(fold=False)),
                           engine="numba")
    assert folded.iteration_time_s == pytest.approx(unfolded.iteration_time_s, rel=1e-12)
    assert folded.peak_memory_bytes == pytest.approx(unfolded.peak_memory_bytes, rel=1e-12)
    static = lower(MODEL, cluster, cp4).static_memory_bytes[0]
    assert folded.peak_memory_bytes - static < (r0.peak_memory_bytes - static) / 2
