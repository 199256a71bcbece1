"""Invariants of lowered plans (hypothesis): random valid plans over small zoo models and small
clusters, lowered and run by the SimPy reference engine.

* the iteration is never shorter than the critical path at no-sharing task lengths, nor than
  the busiest (rank, stream) FIFO's work (simulator/critical_path.py);
* memory never falls below zero (nor below the static weights/grads/optimizer states);
* energy is at least every physical GPU's idle power over the whole iteration;
* the same input gives byte-identical summary JSON and Chrome trace;
* folding identical ranks does not change the iteration time on one homogeneous node.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trainsim.errors import PlanError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.simulator.chrome_trace import chrome_trace_json
from trainsim.simulator.critical_path import busiest_stream_s, lower_bound_s
from trainsim.simulator.engine_simpy import run_simpy
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

MODELS = ("gpt3-125m", "bert-base", "llama2-7b", "t5-770m", "gpt-moe-350m-128e")
CLUSTERS = ("4xV100-SXM2-32GB", "8xA100-SXM4-40GB", "2x4xA10", "2x2xA100-SXM4-80GB",
            "1x4xA100-SXM4-40GB@dgx-a100+1x4xA10")
HOMOGENEOUS_NODES = ("4xV100-SXM2-32GB", "8xA100-SXM4-40GB", "4xA10")
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@functools.cache
def _cluster(spec: str):
    return parse_cluster(spec)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def lowered(draw, clusters=CLUSTERS):
    """A (model, cluster, plan) that passes ParallelPlan.check, and its lowered program."""
    model = get_model(draw(st.sampled_from(MODELS)))
    cluster = _cluster(draw(st.sampled_from(clusters)))
    n = cluster.num_gpus
    tp = draw(st.sampled_from(_divisors(n)))
    pp = draw(st.sampled_from(_divisors(n // tp)))
    dp = n // (tp * pp)
    fields = {"dp": dp, "tp": tp, "pp": pp, "num_micro_batches": draw(st.integers(1, 4)),
                  "micro_batch_size": draw(st.sampled_from([1, 2])),
                  "schedule": draw(st.sampled_from(["gpipe", "1f1b", "zb-h1"])),
                  "recompute": draw(st.sampled_from(["none", "selective", "full"])),
                  "zero": draw(st.integers(0, 3)), "sp": tp > 1 and draw(st.booleans())}
    if model.family != "wresnet":
        fields["seq_len"] = draw(st.sampled_from([64, 128]))
    if getattr(model, "num_experts", 0) and dp > 1:
        fields["ep"] = draw(st.sampled_from([e for e in _divisors(dp * tp)
                                             if model.num_experts % e == 0][:3]))
    try:
        plan = ParallelPlan.build(model, cluster, **fields)
    except PlanError:
        assume(False)
    return model, cluster, plan


@pytest.mark.slow
@SETTINGS
@given(lowered())
def test_lowered_plans_respect_bounds_memory_and_energy(case) -> None:
    """Iteration ≥ critical path and ≥ busiest stream; memory ≥ 0 (≥ static) at every event;
    energy ≥ Σ idle power × iteration time over physical GPUs."""
    model, cluster, plan = case
    program = lower(model, cluster, plan)
    result = run_simpy(program)
    t = result.iteration_time_s
    assert t >= lower_bound_s(program) * (1 - 1e-9)
    assert t >= busiest_stream_s(program) * (1 - 1e-9)
    mem = result.memory_timeline
    assert (mem["bytes"] >= -1e-6).all()
    for rank in range(program.num_ranks):
        rows = mem[mem["rank"] == rank]["bytes"]
        assert rows.min() >= program.static_memory_bytes[rank] * (1 - 1e-12) - 1e-6
    floor = sum(program.idle_power_w[r] * t * len(program.represents[r])
                for r in range(program.num_ranks))
    assert result.energy_j >= floor * (1 - 1e-9)


@settings(SETTINGS, max_examples=8)
@given(lowered())
def test_same_plan_gives_byte_identical_outputs(case) -> None:
    """Lowering and running twice gives the same summary JSON and Chrome trace, byte for byte."""
    model, cluster, plan = case
    first = run_simpy(lower(model, cluster, plan))
    second = run_simpy(lower(model, cluster, ParallelPlan.from_json(plan.to_json())))
    assert first.summary_json() == second.summary_json()
    assert chrome_trace_json(first) == chrome_trace_json(second)


@pytest.mark.slow
@settings(SETTINGS, max_examples=40)
@given(lowered(clusters=HOMOGENEOUS_NODES))
def test_folded_equals_unfolded_on_a_homogeneous_node(case) -> None:
    """On one node of one GPU type every tensor-parallel group and data-parallel replica is
    identical and loads its links like every other, so folding them keeps the iteration time
    (to 1e-9 relative). (Across nodes, folded collectives meeting on a NIC share it per copy,
    program.py's shared links: tests/simulator/test_shared_links.py.)"""
    model, cluster, plan = case
    folded = run_simpy(lower(model, cluster, plan))
    unfolded = run_simpy(lower(model, cluster, plan, LoweringOptions(fold=False)))
    assert folded.iteration_time_s == pytest.approx(unfolded.iteration_time_s, rel=1e-9)
    assert folded.peak_memory_bytes == pytest.approx(unfolded.peak_memory_bytes, rel=1e-9)
