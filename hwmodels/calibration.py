"""Calibration files: fitted cost-model coefficients that replace the catalog's for one run.

``sim calibrate`` writes one; every command that prices ops with the roofline accepts it as
``--calibration FILE``. Schema (JSON)::

    {"trainsim_calibration": 1,
     "clock_scaling": {"<GPU name>": {<clock_scaling.json record>}, ...},
     "power": {"<GPU name>": {"v_min_ratio": r, "memory_bound_activity": a,
                              "dynamic_power_max_w": W, "voltage_knee_mhz": f_v (optional),
                              "source": "..."}, ...},
     "gemm_efficiency": {"<GPU name>": {"scale": k, "source": "..."}, ...},
     "op_efficiency": {"<GPU name>": {"compute_scale": {"<class>": k, ...},
                                      "memory_scale": k, "launch_overhead_s": s,
                                      "source": "..."}, ...}}

(`gemm_efficiency`: a factor on the achieved fraction of tensor peak of GEMM-class ops, fitted
to a stack's measured end-to-end runs; `op_efficiency`: per-class factors and the launch
overhead fitted to measured op times by ``sim calibrate ops``; see `RooflineCostModel`.)

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
from trainsim.hwmodels.opcost import OpEfficiency, RooflineCostModel, efficiency_classes
from trainsim.hwmodels.power import PowerModel, power_model

FORMAT_KEY = "trainsim_calibration"
FORMAT_VERSION = 1
SECTIONS = ("clock_scaling", "power", "gemm_efficiency", "op_efficiency")
SCALE_RANGE = (0.02, 50.0)
"""Fitted efficiency factors outside this range mean the measurements are not of this GPU."""
MAX_OVERHEAD_S = 0.01
"""Largest per-op launch overhead a calibration file may set."""
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
    op_efficiency: dict[str, OpEfficiency] = field(default_factory=dict)
    """GPU name -> per-class corrections fitted to measured op times."""

    def cost_model(self) -> RooflineCostModel:
        """The roofline cost model with these coefficients."""
        return RooflineCostModel(self.clock_scaling, self.power, self.gemm_efficiency,
                                 self.op_efficiency)

    def to_json(self) -> dict[str, Any]:
        """The file's content (see module docstring)."""
        return {
            FORMAT_KEY: FORMAT_VERSION,
            "clock_scaling": {g: s.as_dict(self.sources.get(f"clock_scaling.{g}", ""))
                              for g, s in sorted(self.clock_scaling.items())},
            "power": {g: {"v_min_ratio": p.v_min_ratio,
                          "memory_bound_activity": p.memory_bound_activity,
                          "dynamic_power_max_w": p.dynamic_power_max_w,
                          "voltage_knee_mhz": p.voltage_knee_mhz,
                          "source": self.sources.get(f"power.{g}", "")}
                      for g, p in sorted(self.power.items())},
            "gemm_efficiency": {g: {"scale": k,
                                    "source": self.sources.get(f"gemm_efficiency.{g}", "")}
                                for g, k in sorted(self.gemm_efficiency.items())},
            "op_efficiency": {g: {"compute_scale": dict(sorted(e.compute_scale.items())),
                                  "memory_scale": e.memory_scale,
                                  "launch_overhead_s": e.launch_overhead_s,
                                  "source": self.sources.get(f"op_efficiency.{g}", "")}
                              for g, e in sorted(self.op_efficiency.items())},
        }


def _power_record(where: str, gpu_name: str, entry: Any) -> PowerModel:
    if not isinstance(entry, dict):
        raise DataFileError(f"{where}: must be an object")
    check_keys(where, entry, _POWER_FIELDS, ("voltage_knee_mhz",))
    base = power_model(get_gpu(gpu_name))
    knee = entry.get("voltage_knee_mhz")
    try:
        return replace(base,
                       voltage_knee_mhz=None if knee is None else number(
                           where, "voltage_knee_mhz", knee),
                       v_min_ratio=number(where, "v_min_ratio", entry["v_min_ratio"]),
                       memory_bound_activity=number(where, "memory_bound_activity",
                                                    entry["memory_bound_activity"],
                                                    positive=False),
                       dynamic_power_max_w=number(where, "dynamic_power_max_w",
                                                  entry["dynamic_power_max_w"]))
    except DataFileError as exc:
        raise DataFileError(f"{where}: {str(exc).rsplit(': ', 1)[-1]}") from None


def _op_efficiency_record(where: str, entry: Any) -> OpEfficiency:
    if not isinstance(entry, dict):
        raise DataFileError(f"{where}: must be an object")
    check_keys(where, entry, ("compute_scale", "memory_scale", "launch_overhead_s", "source"))
    scales = entry["compute_scale"]
    if not isinstance(scales, dict):
        raise DataFileError(f"{where}: compute_scale must map efficiency classes to factors")
    known = efficiency_classes()
    for cls in scales:
        if cls not in known:
            raise DataFileError(f"{where}: compute_scale.{cls}: unknown efficiency class "
                                f"(valid: {', '.join(known)})")
    out = {str(cls): number(f"{where}.compute_scale", str(cls), k) for cls, k in scales.items()}
    memory = number(where, "memory_scale", entry["memory_scale"])
    for name, k in [*out.items(), ("memory_scale", memory)]:
        if not SCALE_RANGE[0] <= k <= SCALE_RANGE[1]:
            raise DataFileError(f"{where}: {name}={k} must be in [{SCALE_RANGE[0]:g}, "
                                f"{SCALE_RANGE[1]:g}]")
    overhead = entry["launch_overhead_s"]
    if overhead is not None:
        overhead = number(where, "launch_overhead_s", overhead, positive=False)
        if not 0 <= overhead <= MAX_OVERHEAD_S:
            raise DataFileError(f"{where}: launch_overhead_s={overhead} must be in "
                                f"[0, {MAX_OVERHEAD_S}]")
    return OpEfficiency(compute_scale=out, memory_scale=memory, launch_overhead_s=overhead)


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
    check_keys(str(p), data, (FORMAT_KEY,), SECTIONS)
    scalings: dict[str, ClockScaling] = {}
    powers: dict[str, PowerModel] = {}
    gemm: dict[str, float] = {}
    op_eff: dict[str, OpEfficiency] = {}
    sources: dict[str, str] = {}
    for section in SECTIONS:
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
            elif section == "op_efficiency":
                op_eff[gpu_name] = _op_efficiency_record(where, entry)
            else:
                if not isinstance(entry, dict):
                    raise DataFileError(f"{where}: must be an object")
                check_keys(where, entry, ("scale", "source"))
                scale = number(where, "scale", entry["scale"])
                if not 0.2 <= scale <= 5.0:
                    raise DataFileError(f"{where}: scale={scale} must be in [0.2, 5]")
                gemm[gpu_name] = scale
            sources[f"{section}.{gpu_name}"] = str(entry.get("source", ""))
    return Calibration(scalings, powers, sources, gemm, op_eff)
