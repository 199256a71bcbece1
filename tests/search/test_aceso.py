"""aceso: every move keeps an Aceso plan valid (hypothesis), and the search never returns a plan
worse than its start or than grid's best on the same Oracle."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.aceso.moves import (
    RECOMPUTE_LADDER,
    AcesoConfig,
    AcesoStage,
    check_config,
    moves,
)
from trainsim.search.aceso.planner import AcesoPlanner
from trainsim.search.grid import GridPlanner
from trainsim.search.oracle import Oracle
from trainsim.search.planner import SearchSpec, run_search
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

MODEL, CLUSTER = "gpt3-125m", "8xV100-SXM2-32GB"
CTX = {"num_gpus": 8, "gpus_per_node": 8, "num_layers": 12, "global_batch": 64, "heads": 12}


@st.composite
def configs(draw) -> AcesoConfig:
    """Valid configs: a power-of-two GPU split of 8, layers split of 12, tp | gpus."""
    splits = draw(st.sampled_from([(8,), (4, 4), (4, 2, 2), (2, 2, 4), (2, 2, 2, 2),
                                   (4, 2, 1, 1), (1, 1, 2, 4), (2, 1, 1, 4)]))
    cut = sorted(draw(st.lists(st.integers(1, 11), min_size=len(splits) - 1,
                               max_size=len(splits) - 1, unique=True)))
    bounds = [0, *cut, 12]
    stages = []
    for i, g in enumerate(splits):
        tp = draw(st.sampled_from([t for t in (1, 2, 4) if g % t == 0 and 12 % t == 0]))
        rc = draw(st.sampled_from(RECOMPUTE_LADDER))
        stages.append(AcesoStage(layers=bounds[i + 1] - bounds[i], gpus=g, tp=tp, recompute=rc))
    cfg = AcesoConfig(stages=tuple(stages), micro_batch_size=draw(st.sampled_from([8, 16])))
    assert check_config(cfg, **CTX)
    return cfg


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), data=st.data())
def test_every_move_keeps_the_plan_valid(cfg: AcesoConfig, data) -> None:
    """Each move conserves GPUs (8) and layers (12), keeps powers of two, and any move that
    check_config accepts builds a ParallelPlan the model and cluster accept."""
    model, cluster = get_model(MODEL), parse_cluster(CLUSTER)
    b = data.draw(st.integers(0, len(cfg.stages) - 1))
    memory = data.draw(st.booleans())
    for move in moves(cfg, b, memory_bound=memory):
        new = move.config
        assert sum(s.gpus for s in new.stages) == 8
        assert sum(s.layers for s in new.stages) == 12
        assert all(s.layers >= 1 and s.gpus & (s.gpus - 1) == 0 for s in new.stages)
        if check_config(new, **CTX):
            ParallelPlan.build(model, cluster, **new.to_fields(64))


def _spec(**kw) -> SearchSpec:
    base = {"model": get_model(MODEL), "cluster": parse_cluster("4xV100-SXM2-32GB"),
            "global_batch": 32,
            "time_budget_s": 6.0, "memory_limit_bytes": 6e9}
    return SearchSpec(**(base | kw))


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle(get_model(MODEL), parse_cluster("4xV100-SXM2-32GB"))


@pytest.mark.slow
def test_aceso_never_worse_than_its_start_or_grids_best(oracle: Oracle) -> None:
    """Seeded with grid's best, aceso's best is at least as fast, and at least as fast as
    every seed it evaluated (both on the same Oracle)."""
    grid = run_search(GridPlanner(micro_batch_sizes=(1, 2, 4, 8)), _spec(time_budget_s=60),
                      oracle=oracle)
    assert grid.best is not None
    aceso = run_search(AcesoPlanner(starts=(grid.best.plan,)), _spec(), oracle=oracle)
    assert aceso.best is not None
    assert aceso.best.summary.samples_per_s >= grid.best.summary.samples_per_s
    starts = [r for r in aceso.log if r.note.startswith(("seed", "start")) and r.fits]
    assert starts and all(aceso.best.score <= r.score for r in starts)
    assert aceso.best.fits and aceso.best.summary.peak_memory_bytes <= 6e9


@pytest.mark.slow
def test_aceso_logs_its_moves_and_stops_on_budget(oracle: Oracle) -> None:
    """The log names seeds and moves (hop depth), and the search ends within its budget plus
    one evaluation (it checks the clock before each)."""
    result = run_search(AcesoPlanner(), _spec(time_budget_s=2.0), oracle=oracle)
    notes = [r.note for r in result.log]
    assert any(n.startswith("seed") for n in notes)
    assert any("(hop" in n for n in notes)
    assert result.search_s < 2.0 + 5.0


def _cfg(*layers: int, gpus: int = 1) -> AcesoConfig:
    return AcesoConfig(stages=tuple(AcesoStage(layers=n, gpus=gpus) for n in layers),
                       micro_batch_size=4)


def test_rebalance_splits_layers_in_proportion_to_stage_speed() -> None:
    """Two stages of 4 layers taking 3 s and 1 s run 4/3 and 4 layers/s; 8 layers in that
    proportion are 2 and 6 (equal times if per-layer time holds); balanced stays put."""
    from trainsim.search.aceso.planner import rebalance

    new = rebalance(_cfg(4, 4), (3.0, 1.0))
    assert new is not None and [s.layers for s in new.stages] == [2, 6]
    assert rebalance(_cfg(4, 4), (1.0, 1.0)) is None
    # Largest remainder: 3 stages of 1000 layers, speeds 1:1:2 → 750, 750, 1500.
    deep = rebalance(_cfg(1000, 1000, 1000), (2.0, 2.0, 1.0))
    assert deep is not None and [s.layers for s in deep.stages] == [750, 750, 1500]
    # Every stage keeps a layer even when one is far slower.
    tiny = rebalance(_cfg(2, 2, 2), (1000.0, 1.0, 1.0))
    assert tiny is not None and min(s.layers for s in tiny.stages) >= 1
    assert sum(s.layers for s in tiny.stages) == 6


def test_balance_moves_are_sized_from_the_oracle_figures() -> None:
    """Time-bound: k = (busy_b − busy_j) / (t_b + t_j) layers go to the neighbour (stage 0 with
    10 layers in 10 s, stage 1 with 10 in 2 s: t = 1 and 0.2, k = 8 / 1.2 ≈ 7). Memory-bound at
    twice the limit: ⌈10 × (1 − 1/2)⌉ = 5 layers leave."""
    from trainsim.search.aceso.planner import balance_moves

    cfg = _cfg(10, 10)
    names = [m.name for m in balance_moves(cfg, 0, busy_s=(10.0, 2.0), memory_ratios=(),
                                           memory_bound=False)]
    assert names == ["rebalance", "migrate7 s0->s1"]
    mem = list(balance_moves(cfg, 0, busy_s=(), memory_ratios=(2.0, 0.5), memory_bound=True))
    assert [m.name for m in mem] == ["migrate5 s0->s1"]
    assert [s.layers for s in mem[0].config.stages] == [5, 15]


@pytest.mark.slow
def test_aceso_never_evaluates_a_plan_twice(oracle: Oracle) -> None:
    """Every evaluation of a search is a distinct plan: moves back to a visited config (a
    migration and its reverse, mbs*2 then mbs/2) are skipped, not re-run."""
    result = run_search(AcesoPlanner(), _spec(time_budget_s=30.0, global_batch=16),
                        oracle=oracle)
    keys = [r.summary.plan_key for r in result.log]
    assert len(keys) > 10 and len(set(keys)) == len(keys)


def test_seen_finds_a_plan_given_as_fields(oracle: Oracle) -> None:
    """`SearchState.seen` matches a dict of plan fields to the record of the same plan (keyed
    by the checked plan's canonical JSON, defaults included)."""
    from trainsim.search.planner import SearchState

    state = SearchState(_spec(), oracle)
    fields = {"pp": 2, "dp": 1, "tp": 1, "stage_gpus": [2, 2], "stage_layers": [6, 6],
              "micro_batch_size": 4, "global_batch": 32}
    assert state.seen(fields) is None
    record = state.evaluate(fields, "x")
    assert state.seen(dict(fields)) is record
    assert state.seen({"pp": 5, "global_batch": 32}) is None


@pytest.mark.slow
def test_a_given_start_is_evaluated_first_and_the_climb_starts_at_the_best(oracle: Oracle
                                                                          ) -> None:
    """With a start given (bench and CLI pass grid's best), it is the first evaluation (so the
    search never reports less than it), the balanced seeds follow, and the first hop leaves
    from the best plan among the start and the seeds."""
    start = {"pp": 2, "dp": 2, "tp": 1, "micro_batch_size": 2, "global_batch": 32,
             "recompute": "none"}
    result = run_search(AcesoPlanner(starts=(start,)), _spec(time_budget_s=30.0),
                        oracle=oracle)
    log = result.log
    assert log[0].note == "start (given)"
    first_hop = next(i for i, r in enumerate(log) if "(hop" in r.note)
    assert all(r.note.startswith("seed") for r in log[1:first_hop])
    starts = [r for r in log[:first_hop] if r.fits]
    best = max(starts, key=lambda r: r.summary.samples_per_s)
    assert result.best.summary.samples_per_s >= best.summary.samples_per_s
    assert result.best.summary.samples_per_s >= log[0].summary.samples_per_s


@pytest.mark.slow
@pytest.mark.parametrize("limit_bytes", [6e9, 3e9])
def test_seeds_reach_the_best_uniform_plan_of_each_depth(oracle: Oracle,
                                                         limit_bytes: float) -> None:
    """From its own seeds only (no grid start), aceso's seed of each pipeline depth is as fast
    as the best fitting uniform tp = 1 grid plan of that depth (Megatron's plan with the best
    micro-batch and recompute none/full, found by brute force over grid's points), and the
    search ends at least there: a deep model's search no longer starts from a micro-batch
    of two samples per replica. With a 3 GB limit full recompute is needed at some depths."""
    spec = _spec(time_budget_s=60.0, memory_limit_bytes=limit_bytes)
    grid = run_search(GridPlanner(), spec, oracle=oracle)
    aceso = run_search(AcesoPlanner(max_restarts=0, max_hops=0), spec, oracle=oracle)

    def best_by_depth(records, prefix: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for r in records:
            if r.fits and r.note.startswith(prefix) and (prefix == "seed" or " tp=1 " in r.note):
                pp = int(r.note.split("pp=")[1].split()[0])
                out[pp] = max(out.get(pp, 0.0), r.summary.samples_per_s)
        return out

    uniform = best_by_depth(grid.log, "grid")
    seeds = best_by_depth(aceso.log, "seed")
    assert uniform and set(uniform) <= set(seeds)
    for pp, samples_per_s in uniform.items():
        assert seeds[pp] >= samples_per_s * (1 - 1e-9), pp
    assert aceso.best is not None
    assert aceso.best.summary.samples_per_s >= max(uniform.values()) * (1 - 1e-9)


def test_seed_probe_sizes_the_micro_batch_by_memory(oracle: Oracle) -> None:
    """At one depth (pp = 1, dp = 4: two samples per replica is micro-batch 8), the
    full-recompute probe doubles the micro-batch while plans fit and stops at the first one
    over the limit (6 GB); when the seed itself is over (3 GB) it halves to one sample per
    replica instead. The no-recompute probe starts at one sample per replica."""
    def probes(limit_bytes: float) -> list[tuple[int, str, bool]]:
        result = run_search(AcesoPlanner(seeds=(1,), max_restarts=0, max_hops=0),
                            _spec(time_budget_s=60.0, memory_limit_bytes=limit_bytes),
                            oracle=oracle)
        return [(int(r.note.split("mbs=")[1].split()[0]), r.note.split("rc=")[1], r.fits)
                for r in result.log if r.note.startswith("seed")]

    roomy = probes(6e9)
    full = [(m, ok) for m, rc, ok in roomy if rc == "full"]
    assert [m for m, _ in full] == [8 * 2**k for k in range(len(full))] and len(full) >= 2
    assert all(ok for _, ok in full[:-1]) and not full[-1][1]
    assert [m for m, rc, _ in roomy if rc == "none"][:1] == [4]
    tight = [(m, ok) for m, rc, ok in probes(3e9) if rc == "full"]
    assert tight == [(8, False), (4, True)]
