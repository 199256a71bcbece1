"""The numba engine is the reference engine's twin (hypothesis): on random programs and on random
valid plans lowered from small models, both give the same task start/end times (1e-9 relative),
iteration time, per-rank peak memory and energy, and both report the same deadlocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.errors import PlanError, SimulationError
from trainsim.simulator.engine_numba import run_numba
from trainsim.simulator.engine_simpy import run_simpy
from trainsim.simulator.random_program import random_program
from trainsim.simulator.result import SimResult

RTOL = 1e-9
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

programs = st.builds(
    random_program,
    seed=st.integers(0, 2**32 - 1),
    num_ranks=st.integers(1, 8),
    num_tasks=st.integers(0, 300),
    num_streams=st.integers(1, 5),
    num_links=st.integers(1, 4),
    comm_fraction=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
    max_deps=st.integers(0, 4),
    dep_window=st.integers(1, 40),
    memory_capacity_bytes=st.sampled_from([None, 2000.0, 1e6]),
)


def assert_same(ref: SimResult, fast: SimResult) -> None:
    """Times to RTOL, and the derived per-rank figures likewise."""
    np.testing.assert_allclose(fast.start_s, ref.start_s, rtol=RTOL, atol=0)
    np.testing.assert_allclose(fast.end_s, ref.end_s, rtol=RTOL, atol=0)
    assert fast.iteration_time_s == pytest.approx(ref.iteration_time_s, rel=RTOL, abs=0)
    for a, b in zip(ref.ranks, fast.ranks, strict=True):
        assert b.peak_memory_bytes == a.peak_memory_bytes
        assert b.oom == a.oom
        assert b.energy_j == pytest.approx(a.energy_j, rel=RTOL, abs=1e-12)
    assert fast.energy_j == pytest.approx(ref.energy_j, rel=RTOL, abs=1e-12)


@pytest.mark.slow
@SETTINGS
@given(programs)
def test_random_programs_give_identical_times_memory_and_energy(program) -> None:
    """Random DAGs over random streams, collectives, shared links and memory deltas: both engines
    agree on every start and end, the iteration time, per-rank peak memory and energy."""
    assert_same(run_simpy(program), run_numba(program))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(2, 120))
def test_deadlocking_programs_are_reported_by_both(seed, num_ranks, num_tasks) -> None:
    """A program with a dependency + stream-order cycle raises SimulationError in both engines,
    with the same report (stuck ranks, head tasks, wait cycle)."""
    program = random_program(seed, num_ranks, num_tasks, deadlock=True)
    with pytest.raises(SimulationError) as ref:
        run_simpy(program)
    with pytest.raises(SimulationError) as fast:
        run_numba(program)
    assert str(fast.value) == str(ref.value)
    assert str(ref.value).startswith("deadlock:")


_MODELS = ("gpt3-125m", "bert-base")
_CLUSTERS = ("4xV100-SXM2-32GB", "8xA100-SXM4-40GB", "2x4xA100-SXM4-80GB", "1x4xA100-SXM4-80GB+1x4xV100-SXM2-32GB")


@st.composite
def lowered_plans(draw: st.DrawFn):
    """(model, cluster, plan fields, fold) for a plan the checks may still reject."""
    model = draw(st.sampled_from(_MODELS))
    cluster = draw(st.sampled_from(_CLUSTERS))
    gpus = 8 if cluster != "4xV100-SXM2-32GB" else 4
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 4]))
    if tp * pp > gpus:
        pp = 1
    dp = gpus // (tp * pp)
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "zb-h1", "interleaved"]))
    fields = {
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "schedule": schedule,
        "micro_batch_size": draw(st.sampled_from([1, 2])),
        "num_micro_batches": draw(st.integers(1, 6)),
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "zero": draw(st.sampled_from([0, 1, 2, 3])),
        "seq_len": draw(st.sampled_from([128, 512])),
    }
    if schedule == "interleaved":
        fields["virtual_stages"] = 2
    return model, cluster, fields, draw(st.booleans())


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lowered_plans())
def test_lowered_plans_give_identical_results(case) -> None:
    """Random valid plans (dp/tp/pp, schedule, recompute, ZeRO, folded or not) on small models
    and clusters, including a mixed V100/A100 one, run identically on both engines."""
    from trainsim.api import load_cluster as resolve_cluster
    from trainsim.api import load_model as resolve_model
    from trainsim.workloads.lowering import LoweringOptions, lower
    from trainsim.workloads.plan import ParallelPlan

    model_name, cluster_name, fields, fold = case
    spec, hw = resolve_model(model_name), resolve_cluster(cluster_name)
    try:
        plan = ParallelPlan.build(spec, hw, **fields)
    except PlanError:
        return  # an invalid combination (e.g. tp not dividing heads): nothing to compare
    program = lower(spec, hw, plan, LoweringOptions(fold=fold))
    ref, fast = run_simpy(program), run_numba(program)
    assert_same(ref, fast)
    assert fast.to_summary_dict()["num_tasks"] == program.num_tasks
