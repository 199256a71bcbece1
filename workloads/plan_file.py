"""Saved plans that describe their run: `sim simulate --plan plan.json` alone reproduces it.

A plan file is the plan's fields (ParallelPlan.to_dict: degrees, global batch, sequence length,
dtype, schedule, ...) plus RUN_KEYS: the model and the cluster as the user named them (a zoo
name, a file path, a cluster spec), the framework profile where the run named one, and the
trainsim version that wrote it, and the GPU prices the run was priced with where it overrode
the catalog's (`--price`: "prices", {GPU type: USD per GPU-hour}; `sim simulate --plan` prices
with them unless its own --price says otherwise). Files from
`sim simulate --save-plan`, `sim search --out` and `sim energy --out` share this schema; a file
of plan fields alone (older files) still loads, with the model and cluster then given by flags.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    prices: dict[str, float] | None = None
    """USD per GPU-hour by GPU type the run was priced with, overriding the catalog's
    (`--price`); None: the catalog's."""


def plan_file_text(plan: ParallelPlan, *, model: str, cluster: str,
                   framework: str | None = None,
                   prices: Mapping[str, float] | None = None) -> str:
    """Stable JSON of `plan` with its run keys (same plan and run, same bytes); `framework`
    and `prices` written only when given (files without them read as before)."""
    doc: dict[str, Any] = {**plan.to_dict(), "model": model, "cluster": cluster,
                           "trainsim_version": TRAINSIM_VERSION}
    if framework is not None:
        doc["framework"] = framework
    if prices:
        doc["prices"] = {name: float(usd) for name, usd in sorted(prices.items())}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def read_plan_file(path: str | Path) -> PlanFile:
    """The parts of a saved plan file.

    Raises:
        PlanError: a missing file, text that is not a JSON object, a run key that is not a
            string, or prices that are not {GPU type: USD per GPU-hour}.
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
        if key == "prices":
            continue
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise PlanError(f"{p}: {key}={value!r} must be a string")
        run[key] = value
    fields = {k: v for k, v in data.items() if k not in RUN_KEYS}
    return PlanFile(fields=fields, model=run["model"], cluster=run["cluster"],
                    trainsim_version=run["trainsim_version"], framework=run["framework"],
                    prices=_prices(p, data.get("prices")))


def _prices(path: Path, value: Any) -> dict[str, float] | None:
    """A plan file's "prices": {GPU type: USD per GPU-hour}, or None when absent."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            for k, v in value.items()):
        raise PlanError(f"{path}: prices={value!r} must map GPU types to USD per GPU-hour, "
                        'e.g. {"A10": 1.5}')
    return {k: float(v) for k, v in value.items()}
