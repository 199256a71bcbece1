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
