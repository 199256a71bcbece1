"""The tied word embedding across pipeline stages (gradient_sync.py `tied_sync`): the last
stage keeps a copy of the weight its LM head reads, and the two copies' gradients are
all-reduced between the first and the last stage after the backward, before both optimizer
steps (Megatron-LM's embedding group)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.simulator.engines import run_program
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.stage_costs import optimizer_bytes_per_param
from trainsim.workloads.zoo import get_model

CLUSTER = parse_cluster_spec("1x8xV100-PCIe-32GB")


def _program(model: str, fold: bool = True, **fields):
    spec = get_model(model)
    plan = ParallelPlan.build(spec, CLUSTER, **{"global_batch": 16, "micro_batch_size": 2,
                                                **fields})
    return lower(spec, CLUSTER, plan, LoweringOptions(fold=fold)), plan, spec


def _named(program, name: str) -> np.ndarray:
    t = program.tasks
    return np.flatnonzero(np.array(t.name_templates)[t.name_code] == name)


def _members(program, task: int) -> tuple[int, ...]:
    t = program.tasks
    return tuple(int(r) for r in t.member_rank[t.member_ptr[task]:t.member_ptr[task + 1]])


def _deps(program, task: int) -> set[int]:
    t = program.tasks
    return set(t.dep_idx[t.dep_ptr[task]:t.dep_ptr[task + 1]].tolist())


@pytest.mark.parametrize("fold", [True, False])
def test_one_all_reduce_per_pipeline_between_first_and_last_stage(fold: bool) -> None:
    program, plan, spec = _program("gpt3-350m", fold, dp=2, tp=2, pp=2)
    syncs = _named(program, "embedding.all_reduce")
    stage_of = {g: s for s, gpus in enumerate(program.represents) for g in gpus} \
        if fold else None
    # unfolded: one per (replica, tp index) = dp·tp pairs; folded: one task standing for them
    assert len(syncs) == (1 if fold else plan.dp * plan.tp)
    t = program.tasks
    copy_params = spec.vocab_size * spec.hidden / plan.tp
    for task in syncs:
        members = _members(program, task)
        assert len(members) == 2
        if not fold:  # GPU i of stage 0 with GPU i of stage 1 (4 GPUs a stage)
            assert members[1] - members[0] == 4
        else:
            assert stage_of is not None
        # the copy's gradients, one 2-rank all-reduce: one ring step each way
        grad = optimizer_bytes_per_param(plan.dtype)[1]
        assert t.comm_bytes[task] > 0
        assert t.comm_bytes[task] <= copy_params * grad * 1.0001
    # both optimizer steps wait for it
    steps = _named(program, "optimizer")
    waiting = {int(s) for s in steps if _deps(program, int(s)) & set(syncs.tolist())}
    assert len(waiting) == 2 * len(syncs)


def test_none_without_a_pipeline_or_without_tied_weights() -> None:
    assert len(_named(_program("gpt3-350m", dp=8)[0], "embedding.all_reduce")) == 0
    assert len(_named(_program("llama2-7b", pp=8, global_batch=8, micro_batch_size=1)[0],
                      "embedding.all_reduce")) == 0


def test_it_costs_time_and_folded_equals_unfolded() -> None:
    folded = run_program(_program("gpt3-350m", True, dp=2, pp=4)[0], engine="numba")
    unfolded = run_program(_program("gpt3-350m", False, dp=2, pp=4)[0], engine="numba")
    assert folded.iteration_time_s == pytest.approx(unfolded.iteration_time_s, rel=1e-12)
    # the same model untied: the head's own weight, no all-reduce, a shorter step
    spec = dataclasses.replace(get_model("gpt3-350m"), tied_embeddings=False)
    plan = ParallelPlan.build(spec, CLUSTER, dp=2, pp=4, global_batch=16, micro_batch_size=2)
    untied = run_program(lower(spec, CLUSTER, plan, LoweringOptions()), engine="numba")
    assert untied.iteration_time_s < folded.iteration_time_s


def test_a_v_shaped_schedule_keeps_no_copy_beside_the_embedding() -> None:
    """ZBV puts the head's chunk on the first stage, beside the embedding: no copy there (its
    parameters counted once) and nothing to all-reduce."""
    spec = get_model("gpt3-350m")
    cluster = parse_cluster_spec("1x4xA100-SXM4-80GB")
    fields = {"pp": 4, "global_batch": 8, "micro_batch_size": 1, "virtual_stages": 2}
    zbv = lower(spec, cluster, ParallelPlan.build(
        spec, cluster, schedule="torch:ScheduleZBVZeroBubble", **fields), LoweringOptions())
    plain = lower(spec, cluster, ParallelPlan.build(spec, cluster, schedule="interleaved",
                                                    **fields), LoweringOptions())
    assert len(_named(zbv, "embedding.all_reduce")) == 0
    assert len(_named(plain, "embedding.all_reduce")) == 1
    # the interleaved head's last stage holds a copy of the V x h weight (16 bytes a
    # parameter: weight, gradient, Adam states); ZBV's first stage, holding the head, does
    # not hold a second one (the stages differ by a final norm's few parameters otherwise)
    copy = spec.vocab_size * spec.hidden * 16
    assert abs(zbv.static_memory_bytes[0] - plain.static_memory_bytes[0]) < 0.01 * copy
    assert plain.static_memory_bytes[3] - zbv.static_memory_bytes[3] == \
        pytest.approx(copy, rel=0.01)


def test_stages_of_different_sizes_reduce_every_copy() -> None:
    spec = get_model("gpt3-350m")
    plan = ParallelPlan.build(spec, CLUSTER, pp=2, stage_gpus=(2, 6), global_batch=24,
                              micro_batch_size=6)
    program = lower(spec, CLUSTER, plan, LoweringOptions(fold=False))
    members = [_members(program, int(t)) for t in _named(program, "embedding.all_reduce")]
    assert sorted(h for _, h in members) == [2, 3, 4, 5, 6, 7]
    assert {e for e, _ in members} == {0, 1}


@pytest.mark.parametrize("stage_layers", [(23, 25), (22, 26)])
def test_a_t5_head_stage_holding_the_decoder_embedding_keeps_its_copy(
        stage_layers: tuple[int, int]) -> None:
    """T5's decoder embedding reuses the encoder's table (no parameters of its own), so a last
    stage that also runs it still needs its copy of the tied weight and its all-reduce. It
    used to count as holding the embedding: with 25 or 26 of T5 770M's 48 layers on the last
    stage (the decoder's embedding among them) the copy's weight, gradient and optimizer
    states (33 M parameters: 0.53 GB) and the all-reduce vanished, so the stage needed less
    memory than with 24 layers."""
    program, _, _ = _program("t5-770m", dp=4, pp=2, stage_layers=stage_layers)
    even, _, _ = _program("t5-770m", dp=4, pp=2, stage_layers=(24, 24))
    assert len(_named(program, "embedding.all_reduce")) == \
        len(_named(even, "embedding.all_reduce")) > 0
    assert program.static_memory_bytes[1] > even.static_memory_bytes[1]


def test_a_t5_stage_running_the_decoders_embedding_alone_keeps_a_copy() -> None:
    """A stage that runs T5's decoder embedding without the encoder's reads the word table
    all the same: it keeps a copy, reduced with the owner's (Megatron-LM's split rank is in
    the embedding group), and a stage running both the decoder's embedding and the head keeps
    one copy, not two. T5 770M on 4 stages: stage 1 runs the decoder's embedding (it held no
    copy and was not reduced: only stage 3, the head's, was)."""
    from trainsim.workloads.model import build_graph
    from trainsim.workloads.op_work import shared_params

    program, plan, spec = _program("t5-770m", dp=2, pp=4)
    groups = {_members(program, int(t)) for t in _named(program, "embedding.all_reduce")}
    assert groups == {(0, 1, 3)}  # folded: one program rank per stage
    table = spec.vocab_size * spec.hidden
    assert program.static_memory_bytes[1] > table * sum(optimizer_bytes_per_param(plan.dtype))
    readers = [la for la in build_graph(spec, 1, 64).layers if la.shared_params]
    assert {la.name for la in readers} == {"decoder_embedding", "head"}
    assert shared_params(readers, 1) == table


@pytest.mark.parametrize("fold", [True, False])
def test_t5s_three_copies_are_reduced_by_one_all_reduce(fold: bool) -> None:
    """T5 770M on 4 stages keeps the word table on stage 0 (the encoder's embedding), stage 1
    (the decoder's) and stage 3 (the head): Megatron-LM's embedding group holds the three
    stages' ranks (first, split and last rank of each pipeline), and their gradients are
    summed by one all-reduce over it, not by two pairwise all-reduces (0, 1) and (0, 3),
    which moved the copy twice through stage 0 (2 x 62.7 MB a GPU, where one 3-rank ring
    moves 4/3 x 62.7 = 83.5 MB) and left stage 1's copy without stage 3's gradient."""
    program, plan, spec = _program("t5-770m", fold, dp=2, pp=4)
    syncs = _named(program, "embedding.all_reduce")
    groups = sorted(_members(program, int(t)) for t in syncs)
    # unfolded: GPU i of stages 0, 1 and 3 (2 GPUs a stage) for each replica i
    assert groups == ([(0, 1, 3)] if fold else [(0, 2, 6), (1, 3, 7)])
    table = spec.vocab_size * spec.hidden * optimizer_bytes_per_param(plan.dtype)[1]
    for task in syncs:  # a 3-rank ring: 2 (n - 1) / n of the copy over each GPU's link
        assert program.tasks.comm_bytes[task] == pytest.approx(table * 4 / 3, rel=1e-6)
    steps = _named(program, "optimizer")
    waiting = {int(s) for s in steps if _deps(program, int(s)) & set(syncs.tolist())}
    assert len(waiting) == 3 * len(syncs)
