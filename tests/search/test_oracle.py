"""The Oracle: plan -> Summary through lowering and the fast engine, cached by canonical plan,
with cost from the cluster's price, per-stage busy times, and infeasible plans as error rows."""

from __future__ import annotations

import math

import pytest

from trainsim.errors import PlanError, TrainsimError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.oracle import Oracle, Summary
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

MODEL, CLUSTER = get_model("gpt3-125m"), parse_cluster("4xV100-SXM2-32GB")
PLAN = {"dp": 1, "tp": 1, "pp": 4, "global_batch": 8, "micro_batch_size": 1, "seq_len": 256}


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle(MODEL, CLUSTER)


def test_summary_matches_the_full_simulation(oracle: Oracle) -> None:
    """evaluate() reports the SimResult's iteration time, throughput, memory and energy, and
    samples/s = global batch / iteration time."""
    summary = oracle.evaluate(PLAN)
    result = oracle.simulate(PLAN)
    assert summary.iteration_time_s == result.iteration_time_s
    assert summary.samples_per_s == pytest.approx(8 / result.iteration_time_s)
    assert summary.peak_memory_bytes == max(summary.peak_memory_bytes_per_rank)
    assert len(summary.peak_memory_bytes_per_rank) == len(result.ranks)
    assert summary.energy_j == pytest.approx(result.energy_j)
    assert summary.oom is False and summary.error is None and summary.feasible


def test_cost_is_price_per_hour_times_time(oracle: Oracle) -> None:
    """cost_usd = cluster price per hour × iteration time / 3600."""
    summary = oracle.evaluate(PLAN)
    price = oracle.cluster.price_per_hour_usd
    assert price > 0
    assert summary.cost_usd == pytest.approx(price * summary.iteration_time_s / 3600)


def test_stage_busy_times_cover_every_stage(oracle: Oracle) -> None:
    """One busy time per pipeline stage, each positive and at most the iteration time."""
    summary = oracle.evaluate(PLAN)
    assert len(summary.stage_busy_s) == 4
    assert all(0 < b <= summary.iteration_time_s for b in summary.stage_busy_s)


def test_cache_is_keyed_by_the_canonical_plan() -> None:
    """The same plan as a dict or a ParallelPlan is simulated once; the second is a cache hit."""
    oracle = Oracle(MODEL, CLUSTER)
    first = oracle.evaluate(PLAN)
    plan = ParallelPlan.build(oracle.model, oracle.cluster, **PLAN)
    second = oracle.evaluate(plan)
    assert second is first
    assert oracle.stats.simulated == 1 and oracle.stats.cache_hits == 1
    assert oracle.cache_size() == 1


def test_infeasible_plans_are_error_rows_in_evaluate_many(oracle: Oracle) -> None:
    """evaluate() raises PlanError; evaluate_many() returns a Summary with error and +inf time."""
    bad = {**PLAN, "pp": 3}  # 3 × 1 × 1 GPUs on a 4-GPU cluster
    with pytest.raises(PlanError):
        oracle.evaluate(bad)
    good, err = oracle.evaluate_many([PLAN, bad])
    assert good.error is None
    assert err.error is not None and "PlanError" in err.error
    assert math.isinf(err.iteration_time_s) and not err.feasible
    assert err.to_dict()["iteration_time_s"] is None


def test_simpy_oracle_agrees_with_numba(oracle: Oracle) -> None:
    """The reference engine behind the Oracle gives the same iteration time (1e-9)."""
    ref = Oracle(MODEL, CLUSTER, engine="simpy").evaluate(PLAN)
    assert ref.iteration_time_s == pytest.approx(oracle.evaluate(PLAN).iteration_time_s, rel=1e-9)


def test_unknown_engine_lists_the_valid_ones() -> None:
    """Oracle(engine=...) rejects a typo naming the engines it knows."""
    with pytest.raises(TrainsimError, match="numba"):
        Oracle(MODEL, CLUSTER, engine="numbaa")


def test_summary_to_dict_round_trips_the_plan(oracle: Oracle) -> None:
    """to_dict() carries the plan fields back and is JSON-ready."""
    import json

    data = oracle.evaluate(PLAN).to_dict()
    assert data["plan"]["pp"] == 4
    json.dumps(data, allow_nan=False)
    assert isinstance(Summary(plan_key="{}"), Summary)
