"""Exports: the best plan as trainsim JSON, Aceso's config JSON (round trip), Megatron-LM flags
for uniform plans only."""

from __future__ import annotations

import pytest

from trainsim.errors import SpecError
from trainsim.search.exports import from_aceso_config, to_aceso_config, to_megatron_flags
from trainsim.search.oracle import Oracle
from trainsim.workloads.plan import ParallelPlan


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle("aceso-gpt-1.3b", "4xV100-PCIe-32GB")


def test_aceso_config_round_trips(oracle: Oracle) -> None:
    """A non-uniform plan → Aceso config → plan fields gives back the same ParallelPlan; the
    config counts 1 + 13·layers ops on stage 0 and 13·layers + 2 on the last (GPT)."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, pp=3, stage_gpus=(1, 1, 2),
                              stage_tp=(1, 1, 2), stage_layers=(7, 9, 8), micro_batch_size=2,
                              global_batch=64, stage_recompute=("full", "selective", "none"))
    config = to_aceso_config(plan, oracle.model, oracle.cluster)
    assert config["num_ops_in_each_stage"] == [1 + 13 * 7, 13 * 9, 13 * 8 + 2]
    assert config["num_gpus"] == [1, 1, 2]
    assert config["model_parallel_size_of_each_op"][2][0] == 2
    assert config["resharding_stages"] == [False, False, True]
    back = ParallelPlan.build(oracle.model, oracle.cluster, **from_aceso_config(config,
                                                                                oracle.model))
    assert back == plan


def test_uniform_plan_round_trips_in_aceso_form(oracle: Oracle) -> None:
    """A Megatron plan (dp=2, pp=2, mbs 1) exports with micro_batch_size 2 (Aceso's pipeline
    micro-batch) and imports as stage_gpus=(2, 2) — the same iteration on the Oracle."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, dp=2, pp=2, micro_batch_size=1,
                              global_batch=8, recompute="full")
    config = to_aceso_config(plan, oracle.model)
    assert config["micro_batch_size"] == 2
    fields = from_aceso_config(config, oracle.model)
    assert fields["stage_gpus"] == [2, 2] and fields["stage_recompute"] == ["full", "full"]
    a, b = oracle.evaluate(plan), oracle.evaluate(fields)
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s)


def test_megatron_flags_for_uniform_plans_only(oracle: Oracle) -> None:
    """tp=2 pp=2 full recompute → Megatron's flag names; a non-uniform plan is refused."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, tp=2, pp=2, micro_batch_size=4,
                              global_batch=64, recompute="full")
    flags = to_megatron_flags(plan, oracle.model)
    assert "--tensor-model-parallel-size 2" in flags
    assert "--pipeline-model-parallel-size 2" in flags
    assert "--micro-batch-size 4" in flags and "--global-batch-size 64" in flags
    assert "--recompute-granularity full" in flags
    uneven = ParallelPlan.build(oracle.model, oracle.cluster, pp=2, dp=2, micro_batch_size=1,
                                global_batch=8, stage_layers=(10, 14))
    with pytest.raises(SpecError, match="uniform"):
        to_megatron_flags(uneven, oracle.model)


def test_trainsim_json_round_trips(oracle: Oracle) -> None:
    """ParallelPlan JSON (what --out writes as best_plan.json) parses back to the same plan."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, pp=2, stage_gpus=(2, 2),
                              micro_batch_size=2, global_batch=8,
                              stage_recompute=("full", ("attn.score",)))
    assert ParallelPlan.from_json(plan.to_json()) == plan
