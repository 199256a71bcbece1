"""The search methods by name: `sim search --method` and `trainsim.api.search` pick one here.

A registry above the planner frame: each planner package imports the frame (records, state,
scoring), and this module imports the planners, so every dependency runs one way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainsim.errors import SpecError, unknown_name
from trainsim.search.aceso.planner import AcesoPlanner
from trainsim.search.grid import GridPlanner
from trainsim.search.hetero.planner import HeteroPlanner
from trainsim.search.planner import Planner

PLANNERS: dict[str, Callable[..., Planner]] = {
    "grid": GridPlanner, "aceso": AcesoPlanner,
    "hetero": lambda **o: HeteroPlanner(name="hetero", **o),
    "fasop": lambda **o: HeteroPlanner(name="fasop", **o),
    "uniform": lambda **o: HeteroPlanner(name="uniform", **o)}
"""Search method -> planner factory (keyword options pass through)."""

EVALUATION_BUDGET_METHODS = ("hetero", "fasop", "uniform")
"""Methods whose planner takes a budget counted in Oracle evaluations (`max_evals`, `sim search
--max-evals`) next to the wall-clock one."""


def get_planner(method: str, **options: Any) -> Planner:
    """The planner named `method` (a key of PLANNERS: grid, aceso, or for clusters of several
    GPU types hetero, fasop, uniform)."""
    if method not in PLANNERS:
        raise SpecError(str(unknown_name("search method", method, tuple(PLANNERS))))
    return PLANNERS[method](**options)
