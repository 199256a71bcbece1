"""Aceso's per-op degree moves: every move (per-op ones included) keeps the plan valid
(hypothesis), op groups come heaviest first, and configs carry per-op degrees to and from
ParallelPlan fields."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.search.aceso.moves import (
    RECOMPUTE_LADDER,
    AcesoConfig,
    AcesoStage,
    check_config,
    config_of,
    moves,
    op_groups,
    set_op_tp,
)
from trainsim.workloads.plan import ParallelPlan

MODEL, CLUSTER = "gpt3-125m", "8xV100-SXM2-32GB"
CTX = {"num_gpus": 8, "gpus_per_node": 8, "num_layers": 12, "global_batch": 64, "heads": 12}


@functools.cache
def _model_cluster():
    from trainsim.hwmodels.cluster import parse_cluster
    from trainsim.workloads.zoo import get_model

    return get_model(MODEL), parse_cluster(CLUSTER)


@functools.cache
def _groups() -> tuple[tuple[str, ...], ...]:
    return op_groups(_model_cluster()[0])


@st.composite
def configs(draw) -> AcesoConfig:
    """Valid configs of 8 GPUs and 12 layers whose stages may run op groups at own degrees."""
    splits = draw(st.sampled_from([(8,), (4, 4), (4, 2, 2), (2, 2, 4), (2, 2, 2, 2),
                                   (4, 2, 1, 1), (1, 1, 2, 4)]))
    cut = sorted(draw(st.lists(st.integers(1, 11), min_size=len(splits) - 1,
                               max_size=len(splits) - 1, unique=True)))
    bounds = [0, *cut, 12]
    mbs = draw(st.sampled_from([8, 16]))
    stages = []
    for i, g in enumerate(splits):
        degrees = [t for t in (1, 2, 4) if g % t == 0 and 12 % t == 0]
        tp = draw(st.sampled_from(degrees))
        op_tp = tuple((op, t) for group in _groups()
                      for t in [draw(st.sampled_from(degrees))] for op in group)
        stages.append(AcesoStage(layers=bounds[i + 1] - bounds[i], gpus=g, tp=tp,
                                 recompute=draw(st.sampled_from(RECOMPUTE_LADDER)),
                                 op_tp=op_tp))
    cfg = AcesoConfig(stages=tuple(stages), micro_batch_size=mbs)
    assert check_config(cfg, **CTX)
    return cfg


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), data=st.data())
def test_every_move_keeps_the_plan_valid_with_per_op_degrees(cfg: AcesoConfig, data) -> None:
    """Each move (per-op degree moves included) conserves GPUs and layers, keeps powers of
    two and per-op degrees dividing their stage's GPUs, and any move check_config accepts
    builds a ParallelPlan (per-op degrees and all) the model and cluster accept."""
    model, cluster = _model_cluster()
    b = data.draw(st.integers(0, len(cfg.stages) - 1))
    memory = data.draw(st.booleans())
    names = set()
    for move in moves(cfg, b, memory_bound=memory, op_groups=_groups()):
        names.add(move.name.split(" ")[0])
        new = move.config
        assert sum(s.gpus for s in new.stages) == 8
        assert sum(s.layers for s in new.stages) == 12
        assert all(s.layers >= 1 and s.gpus & (s.gpus - 1) == 0 for s in new.stages)
        assert all(s.gpus % t == 0 and t != s.tp for s in new.stages for _, t in s.op_tp)
        if check_config(new, **CTX):
            plan = ParallelPlan.build(model, cluster, **new.to_fields(64))
            assert config_of(plan, 12) == new
    if not memory and cfg.stages[b].gpus > 1:  # a group can always go up or down
        assert names & {"op-tp*2", "op-tp/2"}


def test_op_groups_come_heaviest_first() -> None:
    """Per block, attention costs 8sh² + 4s²h forward FLOPs per sample and the MLP 16sh²
    (Narayanan et al. 2021 §5.1): attention is heavier when s > 2h. gpt3-125m (s 2048,
    h 768) lists attention first; gpt3-1.3b (h 2048) the MLP first."""
    from trainsim.workloads.zoo import get_model

    small = op_groups(get_model("gpt3-125m"))
    assert [g[0].split(".")[0] for g in small] == ["attn", "mlp"]
    assert small[1] == ("mlp.norm", "mlp.fc1", "mlp.gelu", "mlp.fc2", "mlp.residual")
    assert [g[0].split(".")[0] for g in op_groups(get_model("gpt3-1.3b"))] == ["mlp", "attn"]


def test_set_op_tp_and_fields() -> None:
    """Raising the MLP of stage 0 to tp 2 adds stage_op_tp to the fields; lowering it back to
    the stage's tp removes the entries, and the fields are those of a one-degree config."""
    mlp = ("mlp.fc1", "mlp.gelu", "mlp.fc2")
    cfg = AcesoConfig(stages=(AcesoStage(layers=6, gpus=4), AcesoStage(layers=6, gpus=4)),
                      micro_batch_size=8)
    up = set_op_tp(cfg, 0, mlp, 2)
    assert up is not None and up.stages[0].degree("mlp.fc1") == 2
    assert up.to_fields(64)["stage_op_tp"] == [dict.fromkeys(mlp, 2), {}]
    down = set_op_tp(up, 0, mlp, 1)
    assert down == cfg and "stage_op_tp" not in down.to_fields(64)
    assert set_op_tp(cfg, 0, mlp, 8) is None  # 8 does not divide the stage's 4 GPUs
    # tp-2 stages with a pipeline micro-batch of 2 (dp 2, one sample each) are valid; an op
    # at tp 1 would run on 4 replicas, which cannot split 2 samples
    pairs = AcesoConfig(stages=(AcesoStage(layers=6, gpus=4, tp=2),
                                AcesoStage(layers=6, gpus=4, tp=2)), micro_batch_size=2)
    assert check_config(pairs, **CTX)
    split = set_op_tp(pairs, 0, mlp, 1)
    assert split is not None and not check_config(split, **CTX)
