"""Calibration files: fitted cost-model coefficients that replace the catalog's for one run.

``sim calibrate`` writes one; every command that prices ops with the roofline accepts it as
``--calibration FILE``. Schema (JSON)::

    {"trainsim_calibration": 1,
     "clock_scaling": {"<GPU name>": {<clock_scaling.json record>}, ...},
     "power": {"<GPU name>": {"v_min_ratio": r, "memory_bound_activity": a,
                              "dynamic_power_max_w": W, "source": "..."}, ...},
     "gemm_efficiency": {"<GPU name>": {"scale": k, "source": "..."}, ...}}

(`gemm_efficiency`: a factor on the achieved fraction of tensor peak of GEMM-class ops, fitted
to a stack's measured end-to-end runs; see `RooflineCostModel`.)

GPU names must be in the catalog; every record carries the `source` that says what it was fitted
to. The catalog's own files (data/clock_scaling.json, data/power.json) hold the same records for
the fit to the public reference data, and ``sim calibrate --write-catalog`` regenerates them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainsim.errors import DataFileError
from trainsim.hwmodels.clock_scaling import ClockScaling, parse_clock_scaling
from trainsim.hwmodels.datafiles import check_keys, number
from trainsim.hwmodels.gpus import get_gpu
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.hwmodels.power import PowerModel, power_model

FORMAT_KEY = "trainsim_calibration"
FORMAT_VERSION = 1
_POWER_FIELDS = ("v_min_ratio", "memory_bound_activity", "dynamic_power_max_w", "source")


@dataclass(frozen=True)
class Calibration:
    """Per-GPU coefficients that replace the catalog's, with their sources."""

    clock_scaling: dict[str, ClockScaling] = field(default_factory=dict)
    power: dict[str, PowerModel] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    """'clock_scaling.<gpu>' / 'power.<gpu>' / 'gemm_efficiency.<gpu>' -> what the record was
    fitted to."""
    gemm_efficiency: dict[str, float] = field(default_factory=dict)
    """GPU name -> factor on the GEMM efficiency plateau."""

    def cost_model(self) -> RooflineCostModel:
        """The roofline cost model with these coefficients."""
        return RooflineCostModel(self.clock_scaling, self.power, self.gemm_efficiency)

    def to_json(self) -> dict[str, Any]:
        """The file's content (see module docstring)."""
        return {
            FORMAT_KEY: FORMAT_VERSION,
            "clock_scaling": {g: s.as_dict(self.sources.get(f"clock_scaling.{g}", ""))
                              for g, s in sorted(self.clock_scaling.items())},
            "power": {g: {"v_min_ratio": p.v_min_ratio,
                          "memory_bound_activity": p.memory_bound_activity,
                          "dynamic_power_max_w": p.dynamic_power_max_w,
                          "source": self.sources.get(f"power.{g}", "")}
                      for g, p in sorted(self.power.items())},
            "gemm_efficiency": {g: {"scale": k,
                                    "source": self.sources.get(f"gemm_efficiency.{g}", "")}
                                for g, k in sorted(self.gemm_efficiency.items())},
        }


def _power_record(where: str, gpu_name: str, entry: Any) -> PowerModel:
    if not isinstance(entry, dict):
        raise DataFileError(f"{where}: must be an object")
    check_keys(where, entry, _POWER_FIELDS)
    base = power_model(get_gpu(gpu_name))
    try:
        return replace(base,
                       v_min_ratio=number(where, "v_min_ratio", entry["v_min_ratio"]),
                       memory_bound_activity=number(where, "memory_bound_activity",
                                                    entry["memory_bound_activity"],
                                                    positive=False),
                       dynamic_power_max_w=number(where, "dynamic_power_max_w",
                                                  entry["dynamic_power_max_w"]))
    except DataFileError as exc:
        raise DataFileError(f"{where}: {str(exc).rsplit(': ', 1)[-1]}") from None


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration file; errors name the file and the field."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataFileError(f"calibration file {p} not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFileError(f"{p}: not a JSON calibration file ({exc})") from None
    if not isinstance(data, dict) or data.get(FORMAT_KEY) != FORMAT_VERSION:
        raise DataFileError(f"{p}: not a trainsim calibration file (needs "
                            f'"{FORMAT_KEY}": {FORMAT_VERSION})')
    check_keys(str(p), data, (FORMAT_KEY,), ("clock_scaling", "power", "gemm_efficiency"))
    scalings: dict[str, ClockScaling] = {}
    powers: dict[str, PowerModel] = {}
    gemm: dict[str, float] = {}
    sources: dict[str, str] = {}
    for section in ("clock_scaling", "power", "gemm_efficiency"):
        records = data.get(section, {})
        if not isinstance(records, dict):
            raise DataFileError(f"{p}: {section} must be an object of GPU name -> record")
        for gpu_name, entry in records.items():
            where = f"{p}: {section}.{gpu_name}"
            get_gpu(gpu_name)  # unknown GPU names fail here, with suggestions
            if section == "clock_scaling":
                scalings[gpu_name] = parse_clock_scaling(where, entry)
            elif section == "power":
                powers[gpu_name] = _power_record(where, gpu_name, entry)
            else:
                if not isinstance(entry, dict):
                    raise DataFileError(f"{where}: must be an object")
                check_keys(where, entry, ("scale", "source"))
                scale = number(where, "scale", entry["scale"])
                if not 0.2 <= scale <= 5.0:
                    raise DataFileError(f"{where}: scale={scale} must be in [0.2, 5]")
                gemm[gpu_name] = scale
            sources[f"{section}.{gpu_name}"] = str(entry.get("source", ""))
    return Calibration(scalings, powers, sources, gemm)
