"""Input mode (b): frequency plans from trainsim's own DVFS model, replayed through `lower()`.

A frontier plan becomes `ParallelPlan.instruction_freq_mhz`, is lowered and simulated, and the
simulated iteration time and energy equal the planner's prediction.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from trainsim.errors import SpecError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.energy.baselines import all_max
from trainsim.search.energy.dag import build_dag
from trainsim.search.energy.frontier import compute_frontier
from trainsim.search.energy.lowered import (
    LoweredExtras,
    all_max_freq,
    frequency_plan,
    no_slowdown,
    predict,
    replay_lowered,
)
from trainsim.search.energy.profile import profile_from_model
from trainsim.workloads.lowering import LoweringOptions, lower, stage_layout
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

MODEL, CLUSTER, M = "gpt3-125m", "4xA100-SXM4-80GB", 8
COMM_FREE = LoweringOptions(communication=False, optimizer_step=False)
#: Exact-arithmetic agreement: the engine sums the same numbers in another order.
RTOL = 1e-9


@pytest.fixture(scope="module")
def case():
    spec, hw = get_model(MODEL), parse_cluster(CLUSTER)
    plan = ParallelPlan.build(spec, hw, pp=4, micro_batch_size=1, num_micro_batches=M,
                              schedule="1f1b")
    dag = build_dag(profile_from_model(spec, hw, plan), M)
    return spec, hw, plan, dag, compute_frontier(dag)


def _picks(dag, fr):
    top = all_max(dag)
    free = min((p for p in fr.points if p.time_s <= top.time_s + 1e-12),
               key=lambda p: p.energy_j)
    return {"all-max": top, "no-slowdown": free, "slowest": fr.points[0],
            "middle": fr.points[len(fr.points) // 2]}


def test_stage_layout_hook_matches_the_lowering(case) -> None:
    """`stage_layout` (the public hook) partitions every graph layer once, in order, over 4
    stages on ranks 0-3, and its None-clock costs equal the max-clock costs."""
    spec, hw, plan, _, _ = case
    gpu = hw.gpu(0)
    lay = stage_layout(spec, hw, plan, (None, float(gpu.sm_clock_max_mhz)))
    flat = [i for s in lay.stage_layers for i in s]
    assert flat == sorted(flat) == list(range(len(flat)))
    assert lay.stage_to_rank == (0, 1, 2, 3)
    assert lay.stage_gpu_ranks == ((0,), (1,), (2,), (3,))
    assert lay.micro_batch_shapes == ((1, spec.seq_len),) * M and lay.folded
    a, b = lay.costs[(1, None)], lay.costs[(1, float(gpu.sm_clock_max_mhz))]
    assert a.forward.time_s == b.forward.time_s and a.backward.energy_j == b.backward.energy_j


def test_model_profile_options(case) -> None:
    """Every supported A100 clock is an option, fastest first; lower clocks are slower; the
    blocking power is the A100's measured 83.64 W (one GPU per stage)."""
    _, hw, _, dag, _ = case
    opts = dag.profile.options[(0, "forward")]
    assert opts.freq_mhz.tolist() == sorted(hw.gpu(0).frequencies_mhz(), reverse=True)
    assert np.all(np.diff(opts.time_s) > 0)
    assert dag.profile.blocking_power_w == pytest.approx(83.64)


@pytest.mark.parametrize("name", ["all-max", "no-slowdown", "slowest", "middle"])
def test_frontier_plans_replay_exactly_without_comm(case, name: str) -> None:
    """Comm-free lowering (no transfers, no optimizer step) of a frontier plan set through
    instruction_freq_mhz simulates to the planner's own time and energy (DAG evaluate)."""
    spec, hw, plan, dag, fr = case
    point = _picks(dag, fr)[name]
    check, result = replay_lowered(dag, point.freq_mhz, spec, hw, plan, options=COMM_FREE,
                                   rtol=RTOL)
    assert check.predicted_time_s == pytest.approx(point.time_s, rel=RTOL)
    assert check.predicted_energy_j == pytest.approx(point.energy_j, rel=RTOL)
    assert result.iteration_time_s == pytest.approx(point.time_s, rel=RTOL)
    assert result.energy_j == pytest.approx(point.energy_j, rel=RTOL)


def test_lowered_tasks_run_at_the_planned_clocks(case) -> None:
    """Each compute task of the lowered program carries its instruction's planned clock; the
    recompute-free backward task "s2.B5" runs at the plan's "2B5" clock."""
    spec, hw, plan, dag, fr = case
    point = _picks(dag, fr)["middle"]
    planned = {dag.label(i): float(point.freq_mhz[i]) for i in range(dag.num_nodes)}
    program = lower(spec, hw, frequency_plan(dag, point.freq_mhz, plan), COMM_FREE)
    seen = 0
    for task in program.tasks:
        label = task.name[1:].replace(".", "")  # "s2.B5" -> "2B5"
        assert task.freq_mhz == planned[label]
        seen += 1
    assert seen == dag.num_nodes
    assert len(set(planned.values())) > 1


@pytest.mark.parametrize("name", ["all-max", "no-slowdown", "slowest"])
def test_default_lowering_matches_prediction(case, name: str) -> None:
    """Default lowering adds stage-to-stage transfers and the Adam step; the prediction adds
    them as fixed edge delays and per-rank tails. Stated tolerance 1e-6 (exact unless two
    transfers share a link at once); here they agree to rounding, and the lowered iteration
    is longer than the DAG's by at least the optimizer step."""
    spec, hw, plan, dag, fr = case
    point = _picks(dag, fr)[name]
    check, _ = replay_lowered(dag, point.freq_mhz, spec, hw, plan, rtol=1e-6)
    assert check.replayed_time_s == pytest.approx(check.predicted_time_s, rel=RTOL)
    assert check.replayed_energy_j == pytest.approx(check.predicted_energy_j, rel=RTOL)
    extras = LoweredExtras.from_program(dag, lower(spec, hw, plan))
    assert len(extras.edge_delay_s) == 2 * 3 * M  # F and B over 3 boundaries
    assert check.replayed_time_s >= point.time_s + extras.step_time_s.min()


def test_no_slowdown_once_lowered(case) -> None:
    """The lowered no-slowdown plan is no slower than lowered all-max and saves energy
    (transfer delays can make a DAG-tied frontier plan slower; it is tightened)."""
    spec, hw, plan, dag, fr = case
    extras = LoweredExtras.from_program(dag, lower(spec, hw, plan))
    free = no_slowdown(dag, [p.freq_mhz for p in fr.points[::-1][:8]], extras)
    t_top, e_top = predict(dag, all_max_freq(dag), extras)
    t, e = predict(dag, free, extras)
    assert t <= t_top * (1 + 1e-12) and e < 0.9 * e_top


@pytest.mark.slow
def test_folded_data_parallel_counts_every_gpu() -> None:
    """pp 4 × dp 2 on 8 GPUs: each folded stage stands for 2 GPUs, so options and blocking
    power are doubled (2 × 83.64 W), and a frontier plan with the optimizer step (no
    communication) still simulates to the prediction; default lowering's data-parallel
    all-reduce is refused by the prediction with a one-line error."""
    spec, hw = get_model(MODEL), parse_cluster("8xA100-SXM4-80GB")
    plan = ParallelPlan.build(spec, hw, pp=4, dp=2, micro_batch_size=1, num_micro_batches=4,
                              schedule="1f1b")
    prof = profile_from_model(spec, hw, plan)
    assert prof.blocking_power_w == pytest.approx(2 * 83.64)
    one = profile_from_model(spec, parse_cluster(CLUSTER), ParallelPlan.build(
        spec, parse_cluster(CLUSTER), pp=4, micro_batch_size=1, num_micro_batches=4,
        schedule="1f1b"))
    assert prof.options[(2, "backward")].energy_j == pytest.approx(
        2 * one.options[(2, "backward")].energy_j, rel=1e-12)
    dag = build_dag(prof, 4)
    point = compute_frontier(dag).points[0]
    check, _ = replay_lowered(dag, point.freq_mhz, spec, hw, plan,
                              options=LoweringOptions(communication=False), rtol=RTOL)
    assert check.replayed_energy_j > point.energy_j  # plus the optimizer step
    with pytest.raises(SpecError, match="all_reduce") as info:
        LoweredExtras.from_program(dag, lower(spec, hw, plan))
    assert "\n" not in str(info.value)


def test_profile_rejects_other_schedules() -> None:
    """The planner's DAG is 1F1B: a GPipe plan is refused naming the schedule."""
    spec, hw = get_model(MODEL), parse_cluster(CLUSTER)
    plan = ParallelPlan.build(spec, hw, pp=4, micro_batch_size=1, num_micro_batches=4,
                              schedule="gpipe")
    with pytest.raises(SpecError, match="gpipe"):
        profile_from_model(spec, hw, plan)


@pytest.mark.slow
def test_cli_model_mode_writes_plans_sim_simulate_runs(tmp_path) -> None:
    """`sim energy frontier --model ... --out DIR` writes plan_all_max.json and
    plan_no_slowdown.json; `sim simulate --plan` on each reproduces the predicted time and
    energy, and the no-slowdown plan is no slower and cheaper."""
    from trainsim.cli import app as sim_app
    from trainsim.commands.energy import app
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["frontier", "--model", MODEL, "--cluster", CLUSTER,
                                   "--pp", "4", "--microbatches", str(M), "--out", str(out),
                                   "--json"])
    assert res.exit_code == 0, res.output
    low = json.loads(res.output)["lowered"]
    for key in ("all_max", "no_slowdown"):
        ran = CliRunner().invoke(sim_app, ["simulate", "--model", MODEL, "--cluster", CLUSTER,
                                           "--plan", str(out / f"plan_{key}.json"), "--json"])
        assert ran.exit_code == 0, ran.output
        doc = json.loads(ran.output)
        assert doc["iteration_time_s"] == pytest.approx(low[key]["predicted_time_s"], rel=1e-6)
        assert doc["energy_j"] == pytest.approx(low[key]["predicted_energy_j"], rel=1e-6)
    assert low["no_slowdown"]["simulated_time_s"] <= low["all_max"]["simulated_time_s"] * (
        1 + 1e-12)
    assert low["saving"] > 0.1


def test_t5s_tied_all_reduce_over_three_stages_is_predicted() -> None:
    """T5 770M on 4 stages all-reduces the word table's gradients once over stages 0, 1 and 3
    (gradient_sync.py `tied_sync`): the three-rank task is read off the program (it used to
    be read only as a two-rank one) and the prediction still equals the replay."""
    spec, hw = get_model("t5-770m"), parse_cluster(CLUSTER)
    plan = ParallelPlan.build(spec, hw, pp=4, micro_batch_size=1, num_micro_batches=4,
                              schedule="1f1b")
    dag = build_dag(profile_from_model(spec, hw, plan), 4)
    extras = LoweredExtras.from_program(dag, lower(spec, hw, plan))
    assert extras.tied_sync is not None and extras.tied_sync[0] == (0, 1, 3)
    check, _ = replay_lowered(dag, all_max_freq(dag), spec, hw, plan, extras=extras)
    assert check.replayed_time_s == pytest.approx(check.predicted_time_s, rel=RTOL)
    assert check.replayed_energy_j == pytest.approx(check.predicted_energy_j, rel=RTOL)
