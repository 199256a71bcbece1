"""Saved plans that describe their run: `sim simulate --plan plan.json` alone reproduces it.

A plan file is the plan's fields (ParallelPlan.to_dict: degrees, global batch, sequence length,
dtype, schedule, ...) plus RUN_KEYS: the model and the cluster as the user named them (a zoo
name, a file path, a cluster spec), the framework profile where the run named one, and the
trainsim version that wrote it. Files from
`sim simulate --save-plan`, `sim search --out` and `sim energy --out` share this schema; a file
of plan fields alone (older files) still loads, with the model and cluster then given by flags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.errors import PlanError, read_user_text
from trainsim.workloads.plan import RUN_KEYS, ParallelPlan

TRAINSIM_VERSION = "0.1.0"
"""Written into every plan file (kept equal to trainsim.__version__ by a test)."""


@dataclass(frozen=True, slots=True)
class PlanFile:
    """A plan file's parts: the plan fields, and the run it came from where the file says."""

    fields: dict[str, Any]
    model: str | None = None
    cluster: str | None = None
    trainsim_version: str | None = None
    framework: str | None = None
    """The framework profile the run was planned and simulated for (`--framework`)."""


def plan_file_text(plan: ParallelPlan, *, model: str, cluster: str,
                   framework: str | None = None) -> str:
    """Stable JSON of `plan` with its run keys (same plan and run, same bytes); `framework`
    written only when given (files without one read as before)."""
    doc = {**plan.to_dict(), "model": model, "cluster": cluster,
           "trainsim_version": TRAINSIM_VERSION}
    if framework is not None:
        doc["framework"] = framework
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def read_plan_file(path: str | Path) -> PlanFile:
    """The parts of a saved plan file.

    Raises:
        PlanError: a missing file, text that is not a JSON object, or a run key that is not a
            string.
    """
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"plan file {str(p)!r} does not exist")
    try:
        data = json.loads(read_user_text(p))
    except json.JSONDecodeError as exc:
        raise PlanError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise PlanError(f"{p}: expected a JSON object of plan fields")
    run: dict[str, str | None] = {}
    for key in RUN_KEYS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise PlanError(f"{p}: {key}={value!r} must be a string")
        run[key] = value
    fields = {k: v for k, v in data.items() if k not in RUN_KEYS}
    return PlanFile(fields=fields, model=run["model"], cluster=run["cluster"],
                    trainsim_version=run["trainsim_version"], framework=run["framework"])
