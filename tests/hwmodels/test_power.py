"""DVFS power model: TDP at full load, idle floor, and the Perseus measured trend."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainsim.errors import DataFileError
from trainsim.hwmodels.calibration import Calibration, load_calibration
from trainsim.hwmodels.gpus import get_gpu, list_gpus
from trainsim.hwmodels.power import PowerModel, power_model, power_w, scaled_time_s


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


def _model(knee: float | None) -> PowerModel:
    return PowerModel(gpu_name="test", idle_power_w=50.0, tdp_w=1000.0,
                      dynamic_power_max_w=300.0, v_min_ratio=0.7, memory_bound_activity=0.0,
                      f_min_mhz=200.0, f_max_mhz=1400.0, voltage_knee_mhz=knee)


def test_voltage_holds_its_floor_up_to_the_knee_then_rises_linearly() -> None:
    """V(f)/V(f_max) = r up to f_v, linear from r at f_v to 1 at f_max; no knee = linear
    from f_min."""
    pm = _model(1000.0)
    assert pm.voltage_ratio(200.0) == pm.voltage_ratio(1000.0) == pytest.approx(0.7)
    assert pm.voltage_ratio(1200.0) == pytest.approx(0.85)
    assert pm.voltage_ratio(1400.0) == pytest.approx(1.0)
    assert _model(None).voltage_ratio(800.0) == pytest.approx(0.85)
    # below the knee dynamic power falls only with the clock: P_dyn (f/f_max) r^2
    assert pm.power_w(700.0) == pytest.approx(50.0 + 300.0 * 0.5 * 0.49)


def test_knee_outside_the_clock_range_is_refused() -> None:
    with pytest.raises(DataFileError, match="voltage_knee_mhz"):
        _model(1400.0)
    with pytest.raises(DataFileError, match="voltage_knee_mhz"):
        _model(100.0)


@pytest.mark.parametrize("name", list_gpus())
def test_voltage_curve_leaves_power_at_the_top_clock_alone(name: str) -> None:
    """r and f_v act only below f_max, so a fit of them keeps every f_max prediction."""
    pm = power_model(get_gpu(name))
    other = replace(pm, v_min_ratio=0.5, voltage_knee_mhz=(pm.f_min_mhz + pm.f_max_mhz) / 2)
    for u in (0.0, 0.4, 1.0):
        assert other.power_w(None, u) == pm.power_w(None, u)
    assert other.power_w(pm.f_min_mhz) != pm.power_w(pm.f_min_mhz)


def test_calibration_file_keeps_the_voltage_knee(tmp_path: Path) -> None:
    """A calibration file round-trips the knee; one without it means a linear voltage."""
    pm = replace(power_model(get_gpu("A40")), v_min_ratio=0.6, voltage_knee_mhz=900.0)
    path = tmp_path / "cal.json"
    doc = Calibration({}, {"A40": pm}, {"power.A40": "test"}).to_json()
    path.write_text(json.dumps(doc), encoding="utf-8")
    loaded = load_calibration(path).power["A40"]
    assert (loaded.voltage_knee_mhz, loaded.v_min_ratio) == (900.0, 0.6)
    del doc["power"]["A40"]["voltage_knee_mhz"]
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert load_calibration(path).power["A40"].voltage_knee_mhz is None
