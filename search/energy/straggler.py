"""Savings against all-max: intrinsic (no straggler) and straggler-aware plan choice (Perseus).

Intrinsic saving (Perseus, Chung et al. SOSP'24, §6.2 and Table 6, "intrinsic energy bloat"):
the frontier's fastest plan, at its iteration time T_min, against all-max with its energy
counted over the same T_min. Iteration energy is Σ_i E_i + P_block·(N·T − Σ_i t_i), so
all-max over a window T is E_allmax + N·P_block·(T − T_allmax). The artifact computes exactly
this from Lowtime's fastest frontier row (github.com/ml-energy/zeus evaluation.ipynb; it
reproduces Table 6 to every printed digit from sosp24_data, A100 and A40). T_min is below
T_allmax whenever some clock under the maximum is faster than the maximum (measured profiles
are not monotone at the top: the BLOOM profiles' forward runs 2% faster at 1560–1575 MHz than
at 1740 MHz on A40, 0.2–0.4% at 1395 MHz on A100), and then the comparison is at T_min, not
at T_allmax: the slack between T_min and T_allmax is not credited to the planner.

Stragglers (§4.3, extrinsic energy bloat): when another pipeline makes every data-parallel
replica wait until T′, a pipeline that could finish at T ≤ T′ should run the lowest-energy plan
with time ≤ T′ and then block: energy(T′) = E(plan) + N·P_block·(T′ − T(plan)) (all N ranks
wait at blocking power). All-max finishes at T_allmax and waits T′ − T_allmax; the saving is
measured against that, for T′ = slowdown × T_allmax (so slowdown 1.0 is the saving at the
all-max time, which differs from the intrinsic saving when T_min < T_allmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsim.errors import SpecError
from trainsim.search.energy.point import FrontierPoint


@dataclass(frozen=True, kw_only=True, slots=True)
class StragglerPick:
    """The plan chosen for a straggler's iteration time, and its savings vs all-max."""

    deadline_s: float
    """T′: the straggler's iteration time."""
    slowdown: float
    """T′ / T_allmax."""
    point: FrontierPoint
    """Chosen plan (time ≤ T′)."""
    energy_j: float
    """Plan energy + blocking energy of the wait until T′."""
    all_max_energy_j: float
    """All-max energy + blocking energy of its wait until T′."""

    @property
    def saving(self) -> float:
        """1 − energy_j / all_max_energy_j."""
        return 1.0 - self.energy_j / self.all_max_energy_j


def pick(points: list[FrontierPoint], all_max: FrontierPoint, *, blocking_power_w: float,
         num_stages: int, slowdown: float | None = None,
         deadline_s: float | None = None) -> StragglerPick:
    """Lowest-energy plan finishing by T′ (= slowdown × T_allmax, or `deadline_s`).

    Raises:
        SpecError: neither or both of slowdown/deadline_s, a slowdown that is not a finite
            number >= 1, a deadline that is not a finite number > 0, or T′ below the all-max
            time.
    """
    if (slowdown is None) == (deadline_s is None):
        raise SpecError("give exactly one of --straggler (slowdown factor) and --deadline-s")
    if slowdown is not None:
        # `not x >= 1` also refuses NaN; an infinite T′ makes every energy infinite.
        if not (math.isfinite(slowdown) and slowdown >= 1.0):
            raise SpecError(f"--straggler slowdown={slowdown!r} must be a finite number >= 1.0")
        deadline = slowdown * all_max.time_s
    else:
        deadline = float(deadline_s)  # type: ignore[arg-type]
        if not (math.isfinite(deadline) and deadline > 0):
            raise SpecError(f"--deadline-s {deadline_s!r} must be a finite number of seconds "
                            f"> 0")
        if not deadline >= all_max.time_s * (1 - 1e-12):
            raise SpecError(f"deadline_s={deadline_s!r} is below the all-max iteration time "
                            f"{all_max.time_s:.6g} s: no plan is that fast")
    wait = num_stages * blocking_power_w
    best, best_e = all_max, all_max.energy_j + wait * max(0.0, deadline - all_max.time_s)
    for p in [*points]:
        if p.time_s <= deadline + 1e-12:
            e = p.energy_j + wait * (deadline - p.time_s)
            if e < best_e:
                best, best_e = p, e
    return StragglerPick(deadline_s=deadline, slowdown=deadline / all_max.time_s, point=best,
                         energy_j=best_e,
                         all_max_energy_j=all_max.energy_j
                         + wait * max(0.0, deadline - all_max.time_s))


#: Slowdown factors T′/T_allmax of the straggler savings table (the issue's 1.0–1.5).
STRAGGLER_FACTORS: tuple[float, ...] = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)


def savings_table(points: list[FrontierPoint], all_max: FrontierPoint, *,
                  blocking_power_w: float, num_stages: int,
                  factors: tuple[float, ...] = STRAGGLER_FACTORS) -> list[StragglerPick]:
    """`pick` for each slowdown factor: the saving vs all-max as the straggler slows."""
    return [pick(points, all_max, blocking_power_w=blocking_power_w, num_stages=num_stages,
                 slowdown=f) for f in factors]


@dataclass(frozen=True, kw_only=True, slots=True)
class IntrinsicSaving:
    """Perseus's intrinsic saving: the fastest frontier plan vs all-max over the same time."""

    point: FrontierPoint
    """The frontier's fastest plan (least energy among the fastest)."""
    all_max: FrontierPoint
    """The all-max plan."""
    all_max_energy_at_fastest_j: float
    """All-max energy counted over the fastest plan's time: E_allmax + N·P_block·(T_min −
    T_allmax) (below E_allmax when T_min < T_allmax)."""
    at_all_max_time: StragglerPick
    """The lowest-energy plan finishing by T_allmax, waiting the rest (straggler factor 1.0)."""

    @property
    def time_s(self) -> float:
        """T_min: the fastest frontier plan's iteration time."""
        return self.point.time_s

    @property
    def saving(self) -> float:
        """1 − E(fastest plan) / all-max energy over T_min (Perseus Table 6)."""
        return 1.0 - self.point.energy_j / self.all_max_energy_at_fastest_j

    @property
    def saving_at_all_max_time(self) -> float:
        """The saving at T′ = T_allmax (straggler factor 1.0)."""
        return self.at_all_max_time.saving


def intrinsic_saving(points: list[FrontierPoint], all_max: FrontierPoint, *,
                     blocking_power_w: float, num_stages: int) -> IntrinsicSaving:
    """Perseus's intrinsic saving of a frontier (module docstring), and the saving at T_allmax.

    Raises:
        SpecError: no frontier points.
    """
    if not points:
        raise SpecError("the frontier has no plans: no intrinsic saving to report")
    fastest = min(points, key=lambda p: (p.time_s, p.energy_j))
    if fastest.time_s > all_max.time_s:  # all-max itself is a plan: never slower than it
        fastest = all_max
    base = all_max.energy_j + num_stages * blocking_power_w * (fastest.time_s - all_max.time_s)
    return IntrinsicSaving(
        point=fastest, all_max=all_max, all_max_energy_at_fastest_j=base,
        at_all_max_time=pick(points, all_max, blocking_power_w=blocking_power_w,
                             num_stages=num_stages, slowdown=1.0))
