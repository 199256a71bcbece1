"""DVFS time and power against Perseus' measured per-frequency stage profiles.

Every (model, stage, instruction) sweep of ``shared/data/perseus/stage_profile`` is rebuilt by
trainsim's lowering (search/energy/dvfs_fit.py) and its predicted t(f)/t(f_max) and
P(f)/P(f_max) compared with the measured ones, with the committed coefficients
(hwmodels/data/clock_scaling.json, power.json).

Measured with those coefficients (per-curve RMS over the whole sweep), printed by
``python -m trainsim.search.energy.dvfs_fit ../shared/data/perseus/stage_profile``:
A100-SXM time 0.005–0.024, power 0.017–0.027; A40 time 0.025–0.056, power 0.015–0.028.

Power meets the issue's 0.03 target on both GPUs since the voltage curve has a floor and a knee
(hwmodels/power.py; with a voltage linear from f_min, A100 power reached 0.037 on BLOOM's
forward). A100 time meets it too. A40 time does not, and no model that prices these stages
from their op mix can: GPT-3 and BLOOM stages have the same op classes in the same proportions
(GEMMs of arithmetic intensity ~1700 FLOP/B, 86–89 % of the time), so per-GPU physics predicts
one curve for all of them, while the measured A40 curves lie 0.029–0.054 RMS from their own
mean (`common_curve_spread`): GPT-3's backward slows less than its forward, BLOOM's the other
way round. Two A40 sweeps also get slower as the clock rises, at about the same power (GPT-3's
backward +6 % from 960 to 990 MHz, BLOOM's forward +10 % from 1050 to 1080 MHz), which no
monotone t(f) follows: even three coefficients fitted to that one curve leave BLOOM's forward
at 0.036. A per-op roofline in which a GEMM's memory time (k × its bytes / bandwidth) does not
scale with the clock, p-norm-combined with the compute time, fits k = 15.3, p = 1 and gives
A40 time 0.025–0.057, the same as the clock-bound fraction, for the same reason.

The bounds below are what is reached, so a regression fails; before the fitted time model the
figures were A100 time up to 0.069 and A40 time up to 0.354.
"""

from __future__ import annotations

import pytest

from trainsim.search.energy.dvfs_fit import PERSEUS_GPUS, curve_errors, load_curves

TARGET = 0.03
"""The issue's per-curve RMS target for t(f)/t(f_max) and P(f)/P(f_max)."""
BOUNDS = {"a100_sxm": (TARGET, TARGET), "a40": (0.06, TARGET)}
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
    assert max(e.time_rms for e in errors if e.curve.gpu_key == "a100_sxm") <= TARGET


@pytest.mark.slow
@pytest.mark.parametrize("gpu_key", sorted(PERSEUS_GPUS))
def test_power_meets_the_three_percent_target(errors, gpu_key: str) -> None:
    """The issue's 0.03 RMS target on P(f)/P(f_max), met on every sweep of both GPUs."""
    worst = max((e for e in errors if e.curve.gpu_key == gpu_key), key=lambda e: e.power_rms)
    assert worst.power_rms <= TARGET, worst
