"""Textbook pipeline facts, checked on lowered programs run by the SimPy reference engine.

Stages are made exactly uniform by lowering with communication, embedding/head and the
optimizer step switched off (`LoweringOptions`), so every stage runs the same forward time F and
backward time B and the papers' closed forms hold exactly:

* GPipe and 1F1B take (m + p − 1)(F + B), so each rank's compute stream idles
  (p − 1)/(m + p − 1) of the iteration (Huang et al. 2019; Narayanan et al. 2021 §2.2.1);
* interleaved 1F1B with v chunks per rank idles (p − 1)/(v·m + p − 1) (Narayanan et al. 2021,
  §2.2.2);
* ZB-H1 idles less than 1F1B (Qi et al. 2024, §3.1);
* 1F1B holds at most min(p − s, m) micro-batches of activations on stage s, GPipe all m
  (Narayanan et al. 2021 §2.2.1);
* full recompute runs each stage's forward again before its backward, so every 1F1B "slot"
  grows from F + B to 2F + B and the iteration by exactly (m + p − 1)·F.
"""

from __future__ import annotations

import pytest

from trainsim.errors import SimulationError, SpecError, TrainsimError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.simulator.engine_simpy import run_simpy
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

UNIFORM = LoweringOptions(communication=False, embedding_and_head=False, optimizer_step=False)
MODEL = "gpt3-350m"  # 24 blocks: divisible by every p·v used below
SEQ = 256


def _run(p: int, **plan):
    model, cluster = get_model(MODEL), parse_cluster(f"{p}xA100-SXM4-80GB")
    built = ParallelPlan.build(model, cluster, pp=p, seq_len=SEQ, **plan)
    program = lower(model, cluster, built, UNIFORM)
    return program, run_simpy(program)


def _task(program, name: str, rank: int):
    return next(t for t in program.tasks if t.name == name and t.ranks == (rank,))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 5), (4, 4), (4, 8), (3, 7)])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m) -> None:
    """Every rank's compute stream idles exactly (p−1)/(m+p−1) of the iteration."""
    _, result = _run(p, num_micro_batches=m, schedule=schedule)
    expected = (p - 1) / (m + p - 1)
    for rank in result.ranks:
        assert rank.bubble_fraction == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (2, 6, 3), (4, 4, 3), (3, 6, 2)])
def test_interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1(p, m, v) -> None:
    """With v model chunks per rank the bubble shrinks to (p−1)/(v·m+p−1)."""
    _, result = _run(p, num_micro_batches=m, schedule="interleaved", virtual_stages=v)
    expected = (p - 1) / (v * m + p - 1)
    for rank in result.ranks:
        assert rank.bubble_fraction == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 4)])
def test_zero_bubble_h1_idles_less_than_1f1b(p, m) -> None:
    """Deferring the weight-gradient halves fills the cool-down: ZB-H1's bubble < 1F1B's, and
    both do the same work (F + I + W = F + B per micro-batch)."""
    _, zb = _run(p, num_micro_batches=m, schedule="zb-h1")
    _, ofob = _run(p, num_micro_batches=m, schedule="1f1b")
    assert zb.bubble_fraction < ofob.bubble_fraction
    assert zb.iteration_time_s < ofob.iteration_time_s
    busy = lambda r: r.tasks.query("stream == 'compute'")["duration_s"].sum()
    assert busy(zb) == pytest.approx(busy(ofob), rel=1e-9)


def test_1f1b_iteration_time_is_m_plus_p_minus_1_slots() -> None:
    """1F1B on uniform stages takes (m + p − 1)·(F + B), F and B one stage's task times."""
    program, result = _run(4, num_micro_batches=6, schedule="1f1b")
    f = _task(program, "s0.F0", 0).duration_s
    b = _task(program, "s0.B0", 0).duration_s
    assert result.iteration_time_s == pytest.approx((6 + 4 - 1) * (f + b), rel=1e-12)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 2), (3, 3)])
def test_1f1b_keeps_at_most_p_minus_s_micro_batches(p, m) -> None:
    """Peak − static memory on stage s is min(p−s, m) micro-batches of activations, one
    micro-batch being s·b·h·34 + 4·a·s·b bytes per layer (Korthikanti et al. 2022, Table 2,
    with flash attention: no s² term, the fp32 logsumexp instead)."""
    program, result = _run(p, num_micro_batches=m, schedule="1f1b")
    spec = get_model(MODEL)
    h, a = spec.hidden, spec.num_heads
    per_layer = SEQ * 1 * h * 34 + 4 * a * SEQ * 1
    per_mb = per_layer * spec.num_layers / p
    for s, rank in enumerate(result.ranks):
        held = rank.peak_memory_bytes - program.static_memory_bytes[s]
        assert held == pytest.approx(min(p - s, m) * per_mb, rel=1e-12)


def test_gpipe_keeps_all_m_micro_batches() -> None:
    """GPipe runs every forward before any backward, so each stage holds all m micro-batches."""
    program, result = _run(4, num_micro_batches=6, schedule="gpipe")
    per_mb = _task(program, "s0.F0", 0).mem_alloc_bytes
    for s, rank in enumerate(result.ranks):
        assert rank.peak_memory_bytes - program.static_memory_bytes[s] == pytest.approx(6 * per_mb)


def test_full_recompute_trades_memory_for_one_more_forward() -> None:
    """Full recompute keeps only each block's input (2·s·b·h bytes) and lengthens the 1F1B
    iteration by exactly (m + p − 1)·F; selective recompute lands in between on both counts."""
    p, m = 4, 6
    base_prog, base = _run(p, num_micro_batches=m, schedule="1f1b")
    full_prog, full = _run(p, num_micro_batches=m, schedule="1f1b", recompute="full")
    _, sel = _run(p, num_micro_batches=m, schedule="1f1b", recompute="selective")
    f = _task(base_prog, "s0.F0", 0).duration_s
    assert _task(full_prog, "s0.R0", 0).duration_s == pytest.approx(f, rel=1e-12)
    assert full.iteration_time_s - base.iteration_time_s == pytest.approx((m + p - 1) * f,
                                                                          rel=1e-9)
    spec = get_model(MODEL)
    kept = _task(full_prog, "s0.F0", 0).mem_alloc_bytes
    assert kept == 2 * SEQ * spec.hidden * spec.num_layers / p
    assert full.peak_memory_bytes < sel.peak_memory_bytes < base.peak_memory_bytes
    assert base.iteration_time_s < sel.iteration_time_s < full.iteration_time_s


def test_deadlocking_explicit_order_names_the_stuck_ranks() -> None:
    """An explicit order where each rank waits for the other (rank 0 runs its backward before
    the forward rank 1 needs) is rejected when the plan is lowered, naming both ranks."""
    order = (("0F0", "0B0"), ("1B0", "1F0"))
    model, cluster = get_model("gpt3-125m"), parse_cluster("2xA100-SXM4-80GB")
    plan = ParallelPlan.build(model, cluster, pp=2, schedule="explicit", order=order,
                              num_micro_batches=1)
    with pytest.raises(TrainsimError) as err:
        lower(model, cluster, plan)
    assert isinstance(err.value, SpecError | SimulationError)
    text = str(err.value)
    assert "rank 0" in text and "rank 1" in text
