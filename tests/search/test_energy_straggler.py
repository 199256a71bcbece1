"""Savings against all-max: Perseus's intrinsic saving and the straggler table, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.errors import SpecError
from trainsim.search.energy.baselines import all_max
from trainsim.search.energy.dag import build_dag
from trainsim.search.energy.frontier import compute_frontier
from trainsim.search.energy.profile import EnergyProfile, InstructionOptions
from trainsim.search.energy.straggler import (
    STRAGGLER_FACTORS,
    intrinsic_saving,
    savings_table,
)

P_BLOCK = 10.0


def profile(forward: dict[float, tuple[float, float]]) -> EnergyProfile:
    """2 stages; forward options as given {MHz: (s, J)}; backward 20 ms, 2 J at 1410 only."""
    fwd = InstructionOptions(freq_mhz=np.array(list(forward), dtype=float),
                             time_s=np.array([v[0] for v in forward.values()]),
                             energy_j=np.array([v[1] for v in forward.values()]))
    bwd = InstructionOptions(freq_mhz=np.array([1410.0]), time_s=np.array([0.020]),
                             energy_j=np.array([2.0]))
    return EnergyProfile(num_stages=2, blocking_power_w=P_BLOCK,
                         options={(s, k): (fwd if k == "forward" else bwd)
                                  for s in (0, 1) for k in ("forward", "backward")})


#: Like the BLOOM profiles' forward (faster at 1560–1575 MHz than at 1740 on A40): 1200 MHz is
#: faster and cheaper than 1410 MHz.
FASTER_BELOW_MAX = {1410.0: (0.010, 1.0), 1200.0: (0.009, 0.9), 1000.0: (0.012, 0.7)}


def test_intrinsic_saving_is_at_the_fastest_plans_time() -> None:
    """2 stages × 1 micro-batch is one chain F0 F1 B1 B0. All-max: T = 60 ms,
    E = 6 J + 10 W·(2·60 − 60) ms = 6.6 J. Fastest plan (forwards at 1200 MHz): T_min = 58 ms,
    E = 5.8 J + 10 W·58 ms = 6.38 J. All-max over 58 ms: 6.6 − 2·10 W·2 ms = 6.56 J, so the
    intrinsic saving is 1 − 6.38/6.56; at the all-max time the same plan waits 2 ms on both
    ranks (6.42 J): 1 − 6.42/6.6."""
    dag = build_dag(profile(FASTER_BELOW_MAX), 1)
    top = all_max(dag)
    assert top.time_s == pytest.approx(0.060) and top.energy_j == pytest.approx(6.6)
    intr = intrinsic_saving(compute_frontier(dag).points, top, blocking_power_w=P_BLOCK,
                            num_stages=2)
    assert intr.time_s == pytest.approx(0.058)
    assert intr.point.energy_j == pytest.approx(6.38)
    assert intr.all_max_energy_at_fastest_j == pytest.approx(6.56)
    assert intr.saving == pytest.approx(1 - 6.38 / 6.56)
    assert intr.saving_at_all_max_time == pytest.approx(1 - 6.42 / 6.6)


def test_monotone_profile_compares_at_the_all_max_time() -> None:
    """When the top clock is the fastest, T_min = T_allmax and both savings coincide."""
    dag = build_dag(profile({1410.0: (0.009, 1.0), 1200.0: (0.010, 0.9),
                             1000.0: (0.012, 0.7)}), 2)
    top = all_max(dag)
    intr = intrinsic_saving(compute_frontier(dag).points, top, blocking_power_w=P_BLOCK,
                            num_stages=2)
    assert intr.time_s == pytest.approx(top.time_s)
    assert intr.saving == pytest.approx(intr.saving_at_all_max_time)
    assert intr.saving > 0


def test_straggler_table_rows_by_hand() -> None:
    """Factors 1.0, 1.1, …, 1.5 of T_allmax = 60 ms. At 1.0 the fastest plan waits 2 ms
    (saving 1 − 6.42/6.6). At 1.5 (T′ = 90 ms) every plan fits; the cheapest, both forwards at
    1000 MHz (T = 64 ms, 5.4 J compute), costs 5.4 + 10·(2·90 − 64) ms = 6.56 J against all-max
    6.6 + 2·10·30 ms = 7.2 J."""
    dag = build_dag(profile(FASTER_BELOW_MAX), 1)
    top = all_max(dag)
    table = savings_table(compute_frontier(dag).points, top, blocking_power_w=P_BLOCK,
                          num_stages=2)
    assert [round(c.slowdown, 9) for c in table] == list(STRAGGLER_FACTORS)
    assert list(STRAGGLER_FACTORS) == [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    assert table[0].saving == pytest.approx(1 - 6.42 / 6.6)
    assert table[-1].point.time_s == pytest.approx(0.064)
    assert table[-1].energy_j == pytest.approx(6.56)
    assert table[-1].all_max_energy_j == pytest.approx(7.2)
    for c in table:
        assert c.point.time_s <= c.deadline_s + 1e-12


def test_intrinsic_saving_needs_points() -> None:
    """An empty frontier is a SpecError, not a crash."""
    dag = build_dag(profile(FASTER_BELOW_MAX), 1)
    with pytest.raises(SpecError, match="no plans"):
        intrinsic_saving([], all_max(dag), blocking_power_w=P_BLOCK, num_stages=2)
