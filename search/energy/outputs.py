"""The files the energy planner writes, named apart from the planner so that commands can
check an output folder before any work without importing the planner's numba kernels."""

from __future__ import annotations

PLAN_FILES: dict[str, str] = {"all_max": "plan_all_max.json",
                              "no_slowdown": "plan_no_slowdown.json"}
"""Plan files written in model mode: summary key -> file name."""

OUTPUT_FILES: tuple[str, ...] = ("plans.json", "frontier.html", *PLAN_FILES.values())
"""Every file `write_outputs` may write into the output folder."""
