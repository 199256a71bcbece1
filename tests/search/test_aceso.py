"""aceso: every move keeps an Aceso plan valid (hypothesis), and the search never returns a plan
worse than its start or than grid's best on the same Oracle."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.search.aceso import AcesoPlanner
from trainsim.search.aceso_moves import (
    RECOMPUTE_LADDER,
    AcesoConfig,
    AcesoStage,
    check_config,
    moves,
)
from trainsim.search.grid import GridPlanner
from trainsim.search.oracle import Oracle
from trainsim.search.planner import SearchSpec, run_search
from trainsim.workloads.plan import ParallelPlan

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), data=st.data())
def test_every_move_keeps_the_plan_valid(cfg: AcesoConfig, data) -> None:
    """Each move conserves GPUs (8) and layers (12), keeps powers of two, and any move that
    check_config accepts builds a ParallelPlan the model and cluster accept."""
    from trainsim.hwmodels.cluster import parse_cluster
    from trainsim.workloads.zoo import get_model

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
    base = {"model": MODEL, "cluster": "4xV100-SXM2-32GB", "global_batch": 32,
            "time_budget_s": 6.0, "memory_limit_bytes": 6e9}
    return SearchSpec(**(base | kw))


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle(MODEL, "4xV100-SXM2-32GB")


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


def test_aceso_logs_its_moves_and_stops_on_budget(oracle: Oracle) -> None:
    """The log names seeds and moves (hop depth), and the search ends within its budget plus
    one evaluation (it checks the clock before each)."""
    result = run_search(AcesoPlanner(), _spec(time_budget_s=2.0), oracle=oracle)
    notes = [r.note for r in result.log]
    assert any(n.startswith("seed") for n in notes)
    assert any("(hop" in n for n in notes)
    assert result.search_s < 2.0 + 5.0
