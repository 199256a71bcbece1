"""DVFS time and power against Perseus' measured per-frequency stage profiles.

Every (model, stage, instruction) sweep of ``shared/data/perseus/stage_profile`` is rebuilt by
trainsim's lowering (search/energy/dvfs_fit.py) and its predicted t(f)/t(f_max) and
P(f)/P(f_max) compared with the measured ones, with the committed coefficients
(hwmodels/data/clock_scaling.json, power.json).

Measured with those coefficients (per-curve RMS over the whole sweep): A100-SXM time
0.005–0.024, power 0.025–0.037; A40 time 0.025–0.056, power 0.016–0.027. The issue's target
is 0.03 everywhere: A100 time and A40 power reach it; A100 power misses it on BLOOM's forward
stages (0.037) and A40 time on most curves (the A40 sweeps disagree with each other: GPT-3's
backward slows less than its forward, BLOOM's the other way round, which one set of per-GPU
physics coefficients cannot follow). The bounds below are what is reached, so a regression
fails; before this model the figures were A100 time up to 0.069 and A40 time up to 0.354.
"""

from __future__ import annotations

import pytest

from trainsim.search.energy.dvfs_fit import PERSEUS_GPUS, curve_errors, load_curves

BOUNDS = {"a100_sxm": (0.03, 0.04), "a40": (0.06, 0.03)}
"""Per-curve RMS bounds (time ratio, power ratio) reached by the committed coefficients."""


@pytest.fixture(scope="module")
def errors(shared_subdir):
    curves = load_curves(shared_subdir("perseus/stage_profile"))
    assert {c.gpu_key for c in curves} == set(PERSEUS_GPUS)
    return curve_errors(curves)


@pytest.mark.slow
@pytest.mark.parametrize("gpu_key", sorted(BOUNDS))
def test_every_sweep_within_bounds(errors, gpu_key: str) -> None:
    """Each stage/instruction sweep's predicted time and power ratios stay within BOUNDS."""
    mine = [e for e in errors if e.curve.gpu_key == gpu_key]
    assert len(mine) == 32  # 2 models x 8 stages x 2 instructions
    t_bound, p_bound = BOUNDS[gpu_key]
    worst_t = max(mine, key=lambda e: e.time_rms)
    worst_p = max(mine, key=lambda e: e.power_rms)
    assert worst_t.time_rms <= t_bound, worst_t
    assert worst_p.power_rms <= p_bound, worst_p


@pytest.mark.slow
def test_a100_time_meets_the_three_percent_target(errors) -> None:
    """The issue's 3 % RMS target on t(f)/t(f_max), met on every A100 sweep."""
    assert max(e.time_rms for e in errors if e.curve.gpu_key == "a100_sxm") <= 0.03
