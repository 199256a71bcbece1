"""Straggler-aware plan choice (Perseus §4.3, extrinsic energy bloat).

When another pipeline (a straggler) makes every data-parallel replica wait until T′, a pipeline
that could finish at T ≤ T′ should run the lowest-energy plan with time ≤ T′ and then block:
energy(T′) = E(plan) + N·P_block·(T′ − T(plan)) (all N ranks wait at blocking power). All-max
finishes at T_max and waits T′ − T_max; the saving is measured against that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsim.errors import SpecError
from trainsim.search.energy_frontier import FrontierPoint


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


def savings_table(points: list[FrontierPoint], all_max: FrontierPoint, *,
                  blocking_power_w: float, num_stages: int,
                  factors: tuple[float, ...] = (1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5)
                  ) -> list[StragglerPick]:
    """`pick` for each slowdown factor (Perseus Fig. 9 style)."""
    return [pick(points, all_max, blocking_power_w=blocking_power_w, num_stages=num_stages,
                 slowdown=f) for f in factors]
