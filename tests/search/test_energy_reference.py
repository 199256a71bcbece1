"""Against Perseus's artifact: Lowtime's published frontiers and the paper's saving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainsim.search.energy.baselines import all_max
from trainsim.search.energy.dag import build_dag
from trainsim.search.energy.frontier import compute_frontier, energy_at
from trainsim.search.energy.profile import load_perseus_csv
from trainsim.search.energy.replay import replay

P_BLOCK_A100_W = 83.64  # shared/data/perseus/SOURCES.md


@pytest.fixture(scope="module")
def data(shared_subdir) -> Path:
    """The Perseus reference data (tests/conftest.py: skip if absent, fail under CI)."""
    return shared_subdir("perseus")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt3-175b", "bloom"])
def test_within_half_percent_of_lowtime_mb12(data: Path, model: str) -> None:
    """12 micro-batches: at every iteration time of Lowtime's frontier our frontier (in its
    convention: model energy at quantised time, waiting at blocking power) is ≤ 0.5% above."""
    prof = load_perseus_csv(data / "stage_profile" / f"{model}+a100_sxm_bf16.csv",
                            blocking_power_w=P_BLOCK_A100_W)
    dag = build_dag(prof, 12)
    fr = compute_frontier(dag)
    ref = np.loadtxt(data / "lowtime_frontier_emulation" / "a100_sxm" / f"{model}_bf16_mb12.csv",
                     delimiter=",", skiprows=1)
    gaps = [(energy_at(fr.steps, t, P_BLOCK_A100_W, 8, quantised="model") - e) / e
            for t, e in ref]
    assert max(gaps) <= 0.005
    top = all_max(dag)
    check, _ = replay(dag, top.freq_mhz)
    assert check.replayed_time_s == pytest.approx(top.time_s, rel=1e-9)


def test_intrinsic_saving_gpt3_mb12_matches_paper(data: Path) -> None:
    """GPT-3 175B, A100-SXM, 12 micro-batches: saving at no slowdown within 1 point of
    Perseus's published 15.2%; all-max time = EnvPipe artifact's 28.365 s / 10."""
    prof = load_perseus_csv(data / "stage_profile" / "gpt3-175b+a100_sxm_bf16.csv",
                            blocking_power_w=P_BLOCK_A100_W)
    dag = build_dag(prof, 12)
    top = all_max(dag)
    assert top.time_s == pytest.approx(2.8365, abs=5e-4)
    fr = compute_frontier(dag)
    saving = 1.0 - energy_at(fr.points, top.time_s, P_BLOCK_A100_W, 8) / top.energy_j
    assert abs(saving - 0.152) <= 0.01


def _bench():
    """bench/energy.py as a module (its published Table 6 and the artifact's formula)."""
    import importlib.util
    path = Path(__file__).resolve().parents[2] / "bench" / "energy.py"
    spec = importlib.util.spec_from_file_location("trainsim_bench_energy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = [(model, device, m) for model in ("gpt3-175b", "bloom")
         for device in ("a100_sxm", "a40") for m in (12, 24, 48, 96)]


@pytest.mark.parametrize(("model", "device", "m"), CASES)
def test_published_table6_is_lowtimes_fastest_row(data: Path, model: str, device: str,
                                                  m: int) -> None:
    """Perseus Table 6 is 1 − E(Lowtime's fastest frontier row) / all-max energy counted over
    that row's time, for all 16 published cases (A100: shared/data/perseus; A40: the artifact's
    rows in bench/energy.py), to 1e-5 points: the figures we compare against are this."""
    bench = _bench()
    p_block = bench.P_BLOCK_W[device]
    prof = load_perseus_csv(data / "stage_profile" / f"{model}+{device}_bf16.csv",
                            blocking_power_w=p_block)
    t_q, e_q = bench.lowtime_fastest_row(model, device, m)
    base = bench._all_max_energy_at(prof, m, t_q, p_block, bench.MAX_FREQ_MHZ[device])
    assert 100 * (1 - e_q / base) == pytest.approx(
        bench.PUBLISHED_INTRINSIC_PCT[(model, device, m)], abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "device"), [
    ("gpt3-175b", "a100_sxm"), ("gpt3-175b", "a40"), ("bloom", "a100_sxm"), ("bloom", "a40")])
def test_intrinsic_saving_vs_table6_mb12(data: Path, model: str, device: str) -> None:
    """12 micro-batches, all four emulated profiles: our intrinsic saving (Perseus's
    convention: fastest frontier plan vs all-max over its time) is within 1 point of Table 6,
    and not below it (our frontier is at or under Lowtime's)."""
    c = _bench().intrinsic_case(model, device, 12)
    assert 0 <= c["delta_pp"] <= 1.0
    if c["delta_pp_paper_convention"] is not None:
        assert 0 <= c["delta_pp_paper_convention"] <= 1.0


@pytest.mark.slow
def test_bloom_a40_fastest_plan_beats_all_max(data: Path) -> None:
    """BLOOM A40's forward is faster below the top clock (stage 0: 0.1308 s at 1575 MHz vs
    0.1334 s at 1740 MHz in the profile), so the frontier's fastest plan is every instruction
    at its fastest option, faster than all-max — the time Perseus's intrinsic saving is taken
    at, against all-max counted over that shorter time."""
    from trainsim.search.energy.straggler import intrinsic_saving
    prof = load_perseus_csv(data / "stage_profile" / "bloom+a40_bf16.csv",
                            blocking_power_w=70.38)
    fwd = prof.options[(0, "forward")]
    assert fwd.at(1575)[0] < 0.98 * fwd.at(1740)[0]
    dag = build_dag(prof, 12)
    fastest = np.array([float(prof.options[dag.block_keys[b]].time_s.min()) for b in dag.block])
    top = all_max(dag)
    intr = intrinsic_saving(compute_frontier(dag).points, top, blocking_power_w=70.38,
                            num_stages=8)
    assert intr.time_s == pytest.approx(dag.longest_path(fastest), rel=1e-9)
    assert intr.time_s < 0.995 * top.time_s
    assert intr.all_max_energy_at_fastest_j == pytest.approx(
        top.energy_j - 8 * 70.38 * (top.time_s - intr.time_s))
