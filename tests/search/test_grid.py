"""grid: Megatron-LM's uniform baseline finds the true optimum of its space (brute force), reports
plans that do not build or do not fit as infeasible, and the planner frame ranks, logs, stops on
its budget and returns the best so far on Ctrl-C."""

from __future__ import annotations

import itertools

import pytest

from trainsim.errors import SpecError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.grid import GridPlanner
from trainsim.search.oracle import Oracle
from trainsim.search.planner import SearchSpec, SearchState, fits, run_search
from trainsim.workloads.zoo import get_model

MODEL, CLUSTER = get_model("gpt3-125m"), parse_cluster("4xV100-SXM2-32GB")


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle(MODEL, CLUSTER)


def _spec(**kw) -> SearchSpec:
    base = {"model": MODEL, "cluster": CLUSTER, "global_batch": 16, "time_budget_s": 120.0,
            "top_k": 3}
    return SearchSpec(**(base | kw))


def test_grid_finds_the_brute_force_optimum(oracle: Oracle) -> None:
    """Best grid plan = the max samples/s over every dp×tp×pp×mbs×recompute point evaluated
    independently (brute force over the same Oracle), among plans that fit."""
    planner = GridPlanner(micro_batch_sizes=(1, 2, 4))
    result = run_search(planner, _spec(), oracle=oracle)
    best = 0.0
    for tp, pp in itertools.product((1, 2, 4), (1, 2, 4)):
        if tp * pp > 4:
            continue
        dp = 4 // (tp * pp)
        for mbs, rc in itertools.product((1, 2, 4), ("none", "full")):
            if 16 % (dp * mbs):
                continue
            s = oracle.evaluate({"dp": dp, "tp": tp, "pp": pp, "micro_batch_size": mbs,
                                 "global_batch": 16, "recompute": rc})
            if fits(s, None):
                best = max(best, s.samples_per_s)
    assert result.best is not None
    assert result.best.summary.samples_per_s == pytest.approx(best)
    scores = [r.score for r in result.ranked]
    assert scores == sorted(scores) and len(result.ranked) == 3


def test_over_memory_plans_are_reported_infeasible(oracle: Oracle) -> None:
    """With a 2 GB limit every plan's weights+optimizer (125M × 16 B / stage) or activations
    exceed it for some points; those are logged with fits=False and never ranked."""
    result = run_search(GridPlanner(micro_batch_sizes=(1, 4)),
                        _spec(memory_limit_bytes=2e9), oracle=oracle)
    over = [r for r in result.log if not r.fits]
    assert over, "expected plans over a 2 GB limit"
    assert all(r.summary.peak_memory_bytes > 2e9 or r.summary.error for r in over)
    assert all(r.fits and r.summary.peak_memory_bytes <= 2e9 for r in result.ranked)


def test_plans_that_do_not_build_are_logged_with_their_error() -> None:
    """A model whose 12 heads tp=8 cannot divide: tp=8 points carry a PlanError message."""
    o = Oracle(get_model("gpt3-125m"), parse_cluster("8xV100-SXM2-32GB"))
    result = run_search(GridPlanner(micro_batch_sizes=(1,), recompute=("none",)),
                        _spec(cluster=o.cluster), oracle=o)
    bad = [r for r in result.log if r.summary.error]
    assert bad and all("tp=8" in r.summary.error for r in bad)
    assert all(not r.fits for r in bad)


def test_time_budget_and_interrupt_return_best_so_far(oracle: Oracle) -> None:
    """A spent budget stops the generator; KeyboardInterrupt mid-search returns the best
    seen so far with interrupted=True."""
    ticks = iter(range(1000))
    state = SearchState(_spec(time_budget_s=3.0), oracle, clock=lambda: float(next(ticks)))
    records = list(GridPlanner(micro_batch_sizes=(1, 2)).steps(state))
    assert 0 < len(records) <= 3

    seen = []

    def stop(record) -> None:
        seen.append(record)
        if len(seen) == 4:
            raise KeyboardInterrupt

    result = run_search(GridPlanner(micro_batch_sizes=(1, 2)), _spec(), oracle=oracle,
                        on_record=stop)
    assert result.interrupted and result.evaluated == 4
    fitting = [r for r in seen if r.fits]
    assert result.best is not None and fitting
    assert result.best.score == min(r.score for r in fitting)


def test_spec_rejects_bad_inputs() -> None:
    """Unknown objectives and non-positive batches are user errors naming the field."""
    with pytest.raises(SpecError, match="objective"):
        _spec(objective="speed")
    with pytest.raises(SpecError, match="global_batch"):
        _spec(global_batch=0)


def test_objectives_rank_by_cost_and_energy(oracle: Oracle) -> None:
    """objective=energy ranks by J/iteration ascending; cost by USD/iteration ascending."""
    for objective, attr in (("energy", "energy_j"), ("cost", "cost_usd")):
        result = run_search(GridPlanner(micro_batch_sizes=(2,), recompute=("none",)),
                            _spec(objective=objective), oracle=oracle)
        values = [getattr(r.summary, attr) for r in result.ranked]
        assert values == sorted(values)


@pytest.mark.parametrize("top_k", [1, 3])
def test_pruning_keeps_the_ranked_plans(oracle: Oracle, top_k: int) -> None:
    """Pruning by the proven bound skips candidates (most of them here) but the ranked plans,
    their order and figures are those of the exhaustive grid; every candidate is either
    evaluated or counted as pruned."""
    spec = _spec(top_k=top_k)
    full = run_search(GridPlanner(prune=False), spec, oracle=oracle)
    pruned = run_search(GridPlanner(), spec, oracle=oracle)
    assert full.pruned == 0 and pruned.pruned > 0
    assert pruned.evaluated + pruned.pruned == full.evaluated
    assert [(r.note, r.summary.to_dict()) for r in pruned.ranked] == \
        [(r.note, r.summary.to_dict()) for r in full.ranked]
    assert pruned.to_dict()["pruned"] == pruned.pruned


def test_pruning_is_off_for_the_energy_objective(oracle: Oracle) -> None:
    """The bound is on time; energy is not monotone in time, so nothing is pruned there."""
    result = run_search(GridPlanner(micro_batch_sizes=(1, 2)), _spec(objective="energy"),
                        oracle=oracle)
    assert result.pruned == 0


def test_degrees_the_batch_does_not_divide_over_are_reported(oracle: Oracle) -> None:
    """Global batch 6 on 4 GPUs: dp=4 (tp 1, pp 1) was dropped without a trace; now one
    infeasible record says it was skipped and why, and a given micro-batch size that does not
    divide a replica's 3 samples (mbs 2 at dp 2) likewise."""
    result = run_search(GridPlanner(micro_batch_sizes=(1, 2), recompute=("none",)),
                        _spec(global_batch=6), oracle=oracle)
    skipped = {r.note: r for r in result.log if "skipped" in r.note}
    dp4 = skipped["grid dp=4 tp=1 pp=1 skipped: global batch 6 does not divide over dp=4"]
    assert not dp4.fits and "not divisible" in (dp4.summary.error or "")
    assert "grid dp=2 tp=1 pp=2 mbs=2 skipped: 3 samples per replica do not divide into " \
           "micro-batches of 2" in skipped
    assert all(not r.fits and r.summary.error for r in skipped.values())
    assert {r.plan.dp for r in result.ranked if r.plan is not None} <= {1, 2}
