"""search/bound.py: `plan_bound` never exceeds the engine's iteration time (random 1F1B and
interleaved plans: depths, tp, micro-batches, recompute, uneven stages, clocks), so a plan it
prunes provably cannot beat the best found; and it declines the plans it does not cover."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from trainsim.errors import PlanError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.bound import plan_bound
from trainsim.search.oracle import Oracle
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

MODEL = get_model("gpt3-350m")
CLUSTER = parse_cluster("2x4xA100-SXM4-80GB")


def _random_fields(rng: random.Random) -> dict:
    tp = rng.choice([1, 2, 4])
    pp = rng.choice([1, 2, 4])
    dp = 8 // (tp * pp)
    fields: dict = {"dp": dp, "tp": tp, "pp": pp, "micro_batch_size": rng.choice([1, 2, 4]),
                    "recompute": rng.choice(["none", "selective", "full"]), "seq_len": 512}
    fields["global_batch"] = dp * fields["micro_batch_size"] * rng.choice([2, 4, 6, 8])
    if pp > 1 and rng.random() < 0.4:
        fields["schedule"], fields["virtual_stages"] = "interleaved", 2
    elif pp > 1 and rng.random() < 0.5:
        cuts = sorted(rng.sample(range(1, 24), pp - 1))
        fields["stage_layers"] = [b - a for a, b in zip([0, *cuts], [*cuts, 24])]
    if rng.random() < 0.3:
        fields["freq_mhz"] = rng.choice([1005.0, 1410.0])
    return fields


def _check_bounds(draw: Callable[[], dict | None], plans: int = 3) -> None:
    """`plan_bound` <= the engine on `plans` plans built from `draw()` (None: draw again)."""
    oracle = Oracle(MODEL, CLUSTER)
    checked = 0
    while checked < plans:
        fields = draw()
        if fields is None:
            continue
        try:
            plan = ParallelPlan.build(MODEL, CLUSTER, **fields)
        except PlanError:
            continue
        bound = plan_bound(MODEL, CLUSTER, plan)
        assert bound is not None and bound > 0
        t = oracle.evaluate(plan).iteration_time_s
        assert bound <= t, (plan.to_dict(), bound, t)
        checked += 1


@pytest.mark.parametrize("seed", range(12))
def test_the_bound_never_exceeds_the_engine(seed: int) -> None:
    rng = random.Random(seed)
    _check_bounds(lambda: _random_fields(rng))


@pytest.mark.parametrize("seed", range(3))
def test_the_bound_never_exceeds_the_engine_under_context_parallelism(seed: int) -> None:
    """A cp plan lowers as dp·cp replicas of seq/cp tokens; the bound prices the same (it once
    priced whole sequences, 24-92 % above the engine)."""
    rng = random.Random(100 + seed)

    def draw() -> dict | None:
        fields = _random_fields(rng)
        cp = rng.choice([2, 4])
        if fields["dp"] % cp:
            return None
        fields.pop("stage_layers", None)
        return {**fields, "dp": fields["dp"] // cp, "cp": cp}

    _check_bounds(draw)


def test_the_bound_declines_what_it_does_not_cover() -> None:
    """Zero-bubble schedules, per-replica splits and mixed GPU types get no bound."""
    zb = ParallelPlan.build(MODEL, CLUSTER, dp=2, pp=4, num_micro_batches=4, seq_len=512,
                            schedule="zb-h1")
    assert plan_bound(MODEL, CLUSTER, zb) is None
    mixed = parse_cluster("1x4xA100-SXM4-80GB+1x4xA10")
    plan = ParallelPlan.build(MODEL, mixed, dp=2, pp=4, num_micro_batches=4, seq_len=512)
    assert plan_bound(MODEL, mixed, plan) is None


def test_the_bound_is_tight_on_a_compute_only_pipeline() -> None:
    """With one GPU per stage, no data parallelism and a long pipeline of micro-batches the
    compute path is most of the iteration: the bound is within 25% of the engine."""
    cluster = parse_cluster("1x4xA100-SXM4-80GB")
    plan = ParallelPlan.build(MODEL, cluster, pp=4, num_micro_batches=32, seq_len=512)
    bound = plan_bound(MODEL, cluster, plan)
    t = Oracle(MODEL, cluster).evaluate(plan).iteration_time_s
    assert bound is not None and 0.75 * t <= bound <= t


def test_aceso_with_pruning_finds_the_same_best_plan_in_fewer_evaluations() -> None:
    """A pruned last-hop move is never searched from and provably not better than the plan
    the search improves on, so every climb takes the same steps (here the restarts too: the
    same best plan, fewer evaluations)."""
    from trainsim.search.aceso.planner import AcesoPlanner
    from trainsim.search.planner import SearchSpec, run_search

    model, cluster = get_model("gpt3-125m"), parse_cluster("4xV100-SXM2-32GB")
    spec = SearchSpec(model=model, cluster=cluster, global_batch=8, memory_limit_bytes=8e9,
                      time_budget_s=600)
    plain = run_search(AcesoPlanner(prune=False), spec)
    pruned = run_search(AcesoPlanner(prune=True), spec)
    assert plain.best is not None and pruned.best is not None
    assert pruned.best.summary.plan_key == plain.best.summary.plan_key
    assert pruned.best.summary.samples_per_s == plain.best.summary.samples_per_s
    assert pruned.evaluated < plain.evaluated
