"""Overlap as frameworks do it: bucketed gradient reduction behind the backward (on or off, a
plan field), ZeRO-3 / FSDP parameter gathers prefetched layer by layer behind the compute."""

from __future__ import annotations

import pytest

from trainsim import api
from trainsim.errors import PlanError
from trainsim.workloads.plan import ParallelPlan

CLUSTER = "4x8xA100-SXM4-80GB"
PLAN = {"pp": 1, "micro_batch_size": 4, "seq_len": 1024}


def _run(dp: int, **fields: object):
    return api.simulate("gpt3-1.3b", CLUSTER if dp > 8 else f"1x{dp}xA100-SXM4-80GB",
                        {**PLAN, "dp": dp, "global_batch": 4 * dp, **fields})


def _busy(result, name_part: str) -> float:
    t = result.tasks
    rows = t[t["name"].str.contains(name_part, regex=False) & (t["rank"] == 0)]
    return float(rows["duration_s"].sum())


@pytest.mark.slow
def test_overlap_off_exposes_the_whole_reduction() -> None:
    """Without overlap the iteration is at least the overlapped one plus most of the
    reduction; with one replica there is nothing to reduce and the flag changes nothing."""
    on, off = _run(32), _run(32, overlap_grad_reduce=False)
    reduce_s = _busy(off, ".dp")
    assert reduce_s > 0
    assert off.iteration_time_s >= on.iteration_time_s + 0.5 * reduce_s
    assert _run(1).iteration_time_s == _run(1, overlap_grad_reduce=False).iteration_time_s


@pytest.mark.slow
def test_overlapped_reduction_still_exposes_its_last_bucket() -> None:
    """The last bucket is reduced after the backward ends: more replicas, more time."""
    assert _run(32).iteration_time_s > _run(1).iteration_time_s


@pytest.mark.slow
def test_zero3_gathers_run_behind_the_compute() -> None:
    """FSDP's layer-by-layer prefetch: most of the gather time is hidden, so the iteration is
    far shorter than compute plus gathers, yet not shorter than the ZeRO-0 compute alone
    minus its all-reduce."""
    z3 = _run(32, zero=3)
    gathers = _busy(z3, "gather")
    assert gathers > 0.1 * z3.iteration_time_s
    compute = _busy(z3, ".F") + _busy(z3, ".B")
    assert z3.iteration_time_s < compute + 0.5 * gathers
    assert z3.iteration_time_s >= compute


def test_overlap_flag_is_a_plan_field() -> None:
    """Round trip through plan dicts; omitted when on (the default), so old plans print as
    before; a non-boolean is a one-line PlanError naming it."""
    assert "overlap_grad_reduce" not in ParallelPlan(dp=2).to_dict()
    off = ParallelPlan.from_dict({"dp": 2, "overlap_grad_reduce": False})
    assert ParallelPlan.from_dict(off.to_dict()) == off
    with pytest.raises(PlanError, match="plan.overlap_grad_reduce"):
        ParallelPlan.from_dict({"overlap_grad_reduce": "yes"})


def test_fsdp_without_resharding_gathers_once_per_step_and_keeps_it() -> None:
    """reshard_after_forward=False (torchtitan with pipeline parallelism): each stage gathers
    its parameters once, by its first forward, instead of before every pass, and holds them
    (static memory grows by the gathered weights) with the gradients they accumulate
    unsharded, allocated at each stage's first backward, in the reduction's bytes."""
    from trainsim.workloads.lowering import lower

    model, cluster = api.load_model("gpt3-350m"), api.load_cluster("2x4xA100-SXM4-80GB")
    fields = {"dp": 4, "pp": 2, "zero": 3, "global_batch": 32, "micro_batch_size": 2,
              "seq_len": 512, "dtype": "bf16"}
    progs = {}
    for reshard in (True, False):
        plan = ParallelPlan.build(model, cluster, reshard_after_forward=reshard, **fields)
        progs[reshard] = lower(model, cluster, plan)
    def gathers(prog):
        return [t for t in prog.tasks if ".gather" in t.name and not t.name.endswith(".rest")]
    kept, per_pass = gathers(progs[False]), gathers(progs[True])
    micro = 32 // (4 * 2)
    assert len({(t.stage, t.name.split(".")[1]) for t in kept}) == 2  # one per stage, F only
    assert all(".F" in t.name.split(".")[1] or "F" in t.name.split(".")[1] for t in kept)
    assert len(per_pass) > len(kept) * micro  # every forward and backward gathered before
    layout_params = [progs[False].static_memory_bytes[r] - progs[True].static_memory_bytes[r]
                     for r in range(progs[False].num_ranks)]
    assert all(x > 0 for x in layout_params)
    tasks = list(progs[False].tasks)
    allocs = [i for i, t in enumerate(tasks) if t.name.endswith(".grads.alloc")]
    assert {tasks[i].stage for i in allocs} == {0, 1} and not any(
        t.name.endswith(".grads.alloc") for t in progs[True].tasks)
    for i in allocs:  # ahead of the stage's first backward on the rank's compute stream
        t = tasks[i]
        first_b = min(j for j, u in enumerate(tasks) if u.stage == t.stage
                      and u.kind == "backward" and u.ranks == t.ranks)
        assert i < first_b and t.duration_s == 0.0 and t.mem_alloc_bytes > 0
    plan = ParallelPlan.build(model, cluster, reshard_after_forward=False, **fields)
    assert "reshard_after_forward" in plan.to_dict()
    assert "reshard_after_forward" not in ParallelPlan.build(model, cluster, **fields).to_dict()
    with pytest.raises(PlanError, match="reshard_after_forward"):
        ParallelPlan.build(model, cluster, reshard_after_forward="no", **fields)


def test_unsharded_gradients_are_held_on_stages_of_their_own_sizes() -> None:
    """`stage_gpus` plans (plan dp 1, each stage its own dp) keep them too (review)."""
    from trainsim.workloads.lowering import lower

    model, cluster = api.load_model("gpt3-350m"), api.load_cluster("2x4xA100-SXM4-80GB")
    plan = ParallelPlan.build(model, cluster, pp=2, stage_gpus=(6, 2), zero=3,
                              reshard_after_forward=False, global_batch=48,
                              micro_batch_size=12)
    allocs = [t for t in lower(model, cluster, plan).tasks if t.name.endswith(".grads.alloc")]
    assert {t.stage for t in allocs} == {0, 1}
