"""The time–energy frontier against brute force on tiny pipelines, monotonicity, replay."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from trainsim.search.energy.baselines import all_max, envpipe, zeus_global, zeus_per_stage
from trainsim.search.energy.dag import build_dag
from trainsim.search.energy.frontier import compute_frontier, energy_at, frontier_steps
from trainsim.search.energy.profile import EnergyProfile, InstructionOptions
from trainsim.search.energy.replay import replay
from trainsim.search.energy.straggler import pick

P_BLOCK = 10.0


def tiny_profile(energies: dict[tuple[int, str], list[float]]) -> EnergyProfile:
    """2 stages; forward 2/3/4 ms, backward 4/5/6 ms at 1410/1200/1000 MHz."""
    times = {"forward": [0.002, 0.003, 0.004], "backward": [0.004, 0.005, 0.006]}
    return EnergyProfile(num_stages=2, blocking_power_w=P_BLOCK, options={
        key: InstructionOptions(freq_mhz=np.array([1410.0, 1200.0, 1000.0]),
                                time_s=np.array(times[key[1]]), energy_j=np.array(e))
        for key, e in energies.items()})


CONVEX = {(0, "forward"): [1.0, 0.8, 0.7], (0, "backward"): [2.0, 1.7, 1.55],
          (1, "forward"): [1.2, 0.9, 0.75], (1, "backward"): [2.2, 1.8, 1.6]}


def brute_force(dag) -> list[tuple[float, float]]:
    """Pareto set of (time, energy) over every frequency combination."""
    freqs = [1410.0, 1200.0, 1000.0]
    pts = sorted((round(t, 12), e) for t, e in (dag.evaluate(np.array(c)) for c in
                 itertools.product(freqs, repeat=dag.num_nodes)))
    out, best = [], float("inf")
    for t, e in pts:
        if e < best - 1e-12:
            out.append((t, e))
            best = e
    return out


@pytest.mark.slow
@pytest.mark.parametrize("polish", [False, True])
def test_tiny_dag_equals_brute_force(polish: bool) -> None:
    """2 stages × 2 micro-batches, convex options one unit apart: at every Pareto time of the
    brute-force enumeration (3^8 plans) our frontier has exactly the brute-force energy."""
    dag = build_dag(tiny_profile(CONVEX), 2)
    fr = compute_frontier(dag, polish=polish)
    exact = brute_force(dag)
    assert len(fr.points) == len(exact)
    for (t, e), p in zip(sorted(exact, reverse=True), fr.points):
        assert p.time_s == pytest.approx(t, abs=1e-12)
        assert p.energy_j == pytest.approx(e, rel=1e-12)


@pytest.mark.slow
def test_random_convex_instances_equal_brute_force() -> None:
    """Random convex effective-energy options (seeded): frontier energy = brute force at every
    brute-force Pareto time."""
    rng = np.random.default_rng(7)
    for _ in range(4):
        energies = {}
        for key in CONVEX:
            d1, d2 = sorted(rng.uniform(0.05, 0.5, 2), reverse=True)
            top = rng.uniform(1.0, 3.0)
            base = 0.002 if key[1] == "forward" else 0.004
            # effective cost c = E − P·t strictly convex and decreasing in t
            c = [top, top - d1, top - d1 - d2]
            energies[key] = [c[k] + P_BLOCK * (base + 0.001 * k) for k in range(3)]
        dag = build_dag(tiny_profile(energies), 2)
        fr = compute_frontier(dag, polish=False)
        for t, e in brute_force(dag):
            assert energy_at(fr.points, t, P_BLOCK, 2) == pytest.approx(e, rel=1e-12)


def test_frontier_is_monotone_and_spans_all_max() -> None:
    """Slowest first: time falls and energy rises along the list; the fastest plan is as fast
    as all-max and no more energy-hungry."""
    dag = build_dag(tiny_profile(CONVEX), 3)
    fr = compute_frontier(dag)
    times = [p.time_s for p in fr.points]
    energies = [p.energy_j for p in fr.points]
    assert times == sorted(times, reverse=True) and len(set(times)) == len(times)
    assert energies == sorted(energies)
    top = all_max(dag)
    assert fr.points[-1].time_s == pytest.approx(top.time_s)
    assert fr.points[-1].energy_j <= top.energy_j


def test_steps_yield_one_record_each() -> None:
    """The planner iterates: the start, then one record per unit of makespan removed."""
    dag = build_dag(tiny_profile(CONVEX), 2)
    steps = list(frontier_steps(dag))
    assert steps[0].iteration == 0
    assert [s.iteration for s in steps] == list(range(len(steps)))
    assert all(a.makespan_units > b.makespan_units for a, b in itertools.pairwise(steps))
    assert list(frontier_steps(dag, max_steps=2))[-1].iteration == 2


def test_replay_equals_prediction() -> None:
    """Every frontier plan replayed by the SimPy engine has the predicted time and energy."""
    dag = build_dag(tiny_profile(CONVEX), 3)
    for p in compute_frontier(dag).points:
        check, _ = replay(dag, p.freq_mhz)
        assert check.ok
        assert check.replayed_time_s == pytest.approx(p.time_s, rel=1e-9)
        assert check.replayed_energy_j == pytest.approx(p.energy_j, rel=1e-9)


def test_all_max_time_is_1f1b_critical_path() -> None:
    """All-max on uniform stages: (m + p − 1)·(F + B) per the 1F1B bubble formula
    (Narayanan et al. 2021): 2 stages, 3 micro-batches, F 2 ms, B 4 ms → 4 × 6 ms."""
    dag = build_dag(tiny_profile({k: v for k, v in CONVEX.items()}), 3)
    assert all_max(dag).time_s == pytest.approx(4 * 0.006)


def test_baselines_and_straggler() -> None:
    """ZeusGlobal's sweep has one plan per clock; ZeusPerStage and EnvPipe are no faster than
    all-max; the straggler pick at T′ finishes by T′ and never costs more than all-max."""
    dag = build_dag(tiny_profile(CONVEX), 3)
    top = all_max(dag)
    assert len(zeus_global(dag).sweep) == 3
    assert zeus_per_stage(dag).point.time_s >= top.time_s - 1e-12
    env = envpipe(dag).point
    assert env.time_s <= top.time_s + 1e-12 and env.energy_j <= top.energy_j
    fr = compute_frontier(dag)
    for factor in (1.0, 1.2, 1.5):
        choice = pick(fr.points, top, blocking_power_w=P_BLOCK, num_stages=2, slowdown=factor)
        assert choice.point.time_s <= factor * top.time_s + 1e-12
        assert 0.0 <= choice.saving < 1.0


def test_compute_frontier_reports_each_step_and_the_total() -> None:
    """`on_step` sees every crashing step in order; each announces where crashing ends (the
    all-fastest makespan: 2 stages × 2 micro-batches at F 2 ms, B 4 ms → (2 + 2 − 1) × 6 ms =
    18 units of 1 ms), and the last step reaches it, so a progress bar's total is
    makespan_units − final_makespan_units of the first step."""
    dag = build_dag(tiny_profile(CONVEX), 2)
    seen = []
    fr = compute_frontier(dag, on_step=seen.append)
    assert [s.iteration for s in seen] == list(range(len(seen)))
    assert len(seen) == len(fr.steps)
    assert {s.final_makespan_units for s in seen} == {18}
    assert seen[-1].makespan_units == 18
    assert seen[0].makespan_units - seen[0].final_makespan_units == len(seen) - 1


@pytest.mark.parametrize("kwargs", [{"slowdown": float("inf")}, {"slowdown": float("nan")},
                                    {"slowdown": 0.9}, {"deadline_s": float("inf")},
                                    {"deadline_s": float("nan")}, {"deadline_s": -1.0}])
def test_straggler_refuses_non_finite_or_too_small_targets(kwargs) -> None:
    """An infinite T′ makes every energy infinite (and the saving NaN): a slowdown must be a
    finite number >= 1 and a deadline a finite time > 0, else a SpecError naming the option."""
    from trainsim.errors import SpecError

    dag = build_dag(tiny_profile(CONVEX), 2)
    top = all_max(dag)
    with pytest.raises(SpecError, match="--straggler|--deadline-s"):
        pick(compute_frontier(dag).points, top, blocking_power_w=P_BLOCK, num_stages=2,
             **kwargs)
