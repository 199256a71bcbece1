"""DVFS power model: TDP at full load, idle floor, and the Perseus measured trend."""

from __future__ import annotations

import itertools

import pytest

from trainsim.hwmodels.gpus import get_gpu, list_gpus
from trainsim.hwmodels.power import power_model, power_w, scaled_time_s


@pytest.mark.parametrize("name", list_gpus())
def test_full_utilisation_at_max_clock_is_tdp(name: str) -> None:
    """Calibration: a fully SM-bound kernel at the top clock draws TDP."""
    gpu = get_gpu(name)
    assert power_w(gpu, gpu.sm_clock_max_mhz, 1.0) == pytest.approx(gpu.tdp_w)


@pytest.mark.parametrize("name", list_gpus())
def test_power_rises_with_clock_and_stays_between_idle_and_tdp(name: str) -> None:
    """P(f) is non-decreasing in f and bounded by [idle, TDP]."""
    gpu = get_gpu(name)
    powers = [power_w(gpu, f) for f in gpu.frequencies_mhz()]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(powers))
    assert gpu.idle_power_w < powers[0] and powers[-1] <= gpu.tdp_w


def test_dynamic_power_follows_f_v_squared() -> None:
    """Without the cap, dynamic power at f_min is (f_min/f_max)·r² of that at f_max."""
    gpu = get_gpu("A100-SXM4-40GB")
    pm = power_model(gpu)
    expected = pm.idle_power_w + pm.dynamic_power_max_w * (210 / 1410) * pm.v_min_ratio**2
    assert pm.power_w(210) == pytest.approx(expected)


def test_memory_bound_power_does_not_depend_on_clock() -> None:
    """A purely memory-bound kernel (utilisation 0) draws the same power at any clock."""
    gpu = get_gpu("V100-SXM2-32GB")
    assert power_w(gpu, 600, 0.0) == pytest.approx(power_w(gpu, 1530, 0.0))


def test_scaled_time_splits_compute_and_memory() -> None:
    """t(f) = t(fmax)(c·fmax/f + 1 − c): halving the clock doubles only the compute part."""
    gpu = get_gpu("A100-SXM4-40GB")
    assert scaled_time_s(1.0, 0.6, 705, gpu) == pytest.approx(0.6 * 2 + 0.4)
