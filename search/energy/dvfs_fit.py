"""Fit and check the DVFS time coefficients against Perseus' measured stage profiles.

Perseus (SOSP'24) measured every pipeline stage's forward and backward at every SM clock on
A100-SXM and A40 (``shared/data/perseus/stage_profile/{model}+{gpu}_bf16.csv``). Those curves
are relative: what matters for a frequency planner is t(f)/t(f_max) and P(f)/P(f_max). Here the
same stages are rebuilt by trainsim's own lowering (``profile_from_model``: GPT-3 175B or
BLOOM 176B, 8 pipeline stages × tensor parallelism 8, micro-batch 1, bf16, as the artifact's
workload lists) and their predicted ratios compared with the measured ones.

`fit_clock_scaling` finds the three coefficients of `hwmodels.clock_scaling.ClockScaling`
(clock-bound GEMM fraction, sustained clock, knee sharpness) per GPU by least squares on the
time ratios of every (model, stage, instruction) curve of that GPU at once: one set of physics
coefficients per GPU, not one per curve. `fit_power_model` then fits the voltage curve of
`hwmodels.power.PowerModel` (voltage floor and the knee above which voltage rises) on the power
ratios, which changes power below the top clock only. The committed values in
``hwmodels/data/clock_scaling.json`` and ``power.json`` come from them (``sim calibrate dvfs
--write-catalog``). ``python -m trainsim.search.energy.dvfs_fit DIR`` prints, per GPU, the
per-curve RMS errors of the catalog's coefficients and how far the measured time curves lie
from their own mean (`common_curve_spread`: what one shared curve per GPU cannot get below).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from trainsim.errors import DataFileError
from trainsim.hwmodels.calibration import Calibration
from trainsim.hwmodels.clock_scaling import ClockScaling
from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.hwmodels.datafiles import DATA_DIR
from trainsim.hwmodels.gpus import get_gpu
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.hwmodels.power import PowerModel, power_model
from trainsim.search.energy.profile import profile_from_model
from trainsim.workloads.lowering.options import LoweringOptions
from trainsim.workloads.zoo import get_model

PERSEUS_GPUS = {"a100_sxm": "A100-SXM4-40GB", "a40": "A40"}
"""Perseus' device keys and the catalog GPU each stands for (the artifact's A100 SXM)."""
PERSEUS_MODELS = {"gpt3-175b": "gpt3-175b", "bloom": "bloom-176b"}
"""Perseus' model keys and the zoo model of the same shape."""
PERSEUS_PLAN = {"tp": 8, "pp": 8, "dp": 1, "micro_batch_size": 1, "global_batch": 8,
                "dtype": "bf16"}
"""The artifact's emulated layout: 8 stages of tensor parallelism 8 (SOURCES.md)."""


@dataclass(frozen=True, slots=True)
class Curve:
    """One measured (model, GPU, stage, instruction) sweep, relative to its top clock."""

    model: str
    gpu_key: str
    stage: int
    instruction: str
    freq_mhz: np.ndarray
    time_ratio: np.ndarray
    power_ratio: np.ndarray


@dataclass(frozen=True, slots=True)
class CurveError:
    """RMS errors of one curve's predicted ratios."""

    curve: Curve
    time_rms: float
    power_rms: float


def load_curves(folder: str | Path) -> list[Curve]:
    """Every curve of every ``{model}+{gpu}_bf16.csv`` under `folder` that trainsim can rebuild."""
    curves: list[Curve] = []
    for path in sorted(Path(folder).glob("*+*_bf16.csv")):
        model, gpu_key = path.name.removesuffix("_bf16.csv").split("+", 1)
        if model not in PERSEUS_MODELS or gpu_key not in PERSEUS_GPUS:
            continue
        sweeps: dict[tuple[int, str], dict[int, tuple[float, float]]] = defaultdict(dict)
        with path.open(encoding="utf-8") as fh:
            for line, row in enumerate(csv.DictReader(fh), start=2):
                try:
                    t, e = float(row["time"]), float(row["energy"])
                    key = (int(row["stage"]), row["instruction"])
                    sweeps[key][int(row["frequency"])] = (t, e)
                except (KeyError, TypeError, ValueError) as exc:
                    raise DataFileError(f"{path}:{line}: bad row ({exc})") from None
        for (stage, instruction), by_f in sorted(sweeps.items()):
            freqs = np.array(sorted(by_f), dtype=float)
            times = np.array([by_f[int(f)][0] for f in freqs])
            powers = np.array([by_f[int(f)][1] / by_f[int(f)][0] for f in freqs])
            curves.append(Curve(model, gpu_key, stage, instruction, freqs,
                                times / times[-1], powers / powers[-1]))
    return curves


def predicted_ratios(model_key: str, gpu_key: str, freqs: np.ndarray,
                     scaling: ClockScaling | None = None, power: PowerModel | None = None
                     ) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """trainsim's (time, power) ratios to the top clock per (stage, instruction), at `freqs`
    (ascending, last = top clock), with `scaling` and `power` replacing the catalog's."""
    gpu_name = PERSEUS_GPUS[gpu_key]
    model = get_model(PERSEUS_MODELS[model_key])
    cluster = parse_cluster_spec(f"8x8x{gpu_name}")
    options = LoweringOptions(cost_model=RooflineCostModel(
        {gpu_name: scaling} if scaling is not None else None,
        {gpu_name: power} if power is not None else None))
    profile = profile_from_model(model, cluster, dict(PERSEUS_PLAN),
                                 frequencies_mhz=[float(f) for f in freqs], options=options)
    out = {}
    for (stage, inst), opt in profile.options.items():
        order = np.argsort(opt.freq_mhz)
        t, e = opt.time_s[order], opt.energy_j[order]
        p = e / t
        out[(stage, inst)] = (t / t[-1], p / p[-1])
    return out


def curve_errors(curves: list[Curve], scaling: dict[str, ClockScaling] | None = None,
                 power: dict[str, PowerModel] | None = None) -> list[CurveError]:
    """Per-curve RMS error of predicted vs measured time and power ratios, with the catalog's
    coefficients or the given ones per GPU name."""
    errors: list[CurveError] = []
    groups: dict[tuple[str, str], list[Curve]] = defaultdict(list)
    for c in curves:
        groups[(c.model, c.gpu_key)].append(c)
    for (model, gpu_key), group in sorted(groups.items()):
        name = PERSEUS_GPUS[gpu_key]
        pred = predicted_ratios(model, gpu_key, group[0].freq_mhz, (scaling or {}).get(name),
                                (power or {}).get(name))
        for c in group:
            t, p = pred[(c.stage, c.instruction)]
            errors.append(CurveError(c, float(np.sqrt(np.mean((t - c.time_ratio) ** 2))),
                                     float(np.sqrt(np.mean((p - c.power_ratio) ** 2)))))
    return errors


def fit_clock_scaling(curves: list[Curve], gpu_key: str) -> tuple[ClockScaling, float]:
    """Least-squares ClockScaling for one GPU over all its curves; returns it and the RMS
    time-ratio error over every point."""
    mine = [c for c in curves if c.gpu_key == gpu_key]
    if not mine:
        raise DataFileError(f"no Perseus stage profiles for {gpu_key!r}")
    f_max = float(max(c.freq_mhz[-1] for c in mine))

    def residuals(x: np.ndarray) -> np.ndarray:
        scaling = ClockScaling(gemm_clock_bound_fraction=float(x[0]),
                               sustained_clock_mhz=float(x[1]) * f_max,
                               cap_sharpness=float(x[2]))
        parts = []
        for model, group in _by_model(mine).items():
            pred = predicted_ratios(model, gpu_key, group[0].freq_mhz, scaling)
            parts += [pred[(c.stage, c.instruction)][0] - c.time_ratio for c in group]
        return np.concatenate(parts)

    result = least_squares(residuals, x0=[0.8, 1.0, 8.0], bounds=([0.0, 0.7, 1.0],
                                                                   [1.0, 2.0, 40.0]),
                           diff_step=1e-3, max_nfev=200)
    c, s, p = (float(v) for v in result.x)
    rms = math.sqrt(float(np.mean(result.fun ** 2)))
    scaling = ClockScaling(gemm_clock_bound_fraction=round(c, 4),
                           sustained_clock_mhz=round(s * f_max, 1), cap_sharpness=round(p, 2))
    return scaling, rms


def _by_model(curves: list[Curve]) -> dict[str, list[Curve]]:
    out: dict[str, list[Curve]] = defaultdict(list)
    for c in curves:
        out[c.model].append(c)
    return out


def fit_power_model(curves: list[Curve], gpu_key: str, scaling: ClockScaling
                    ) -> tuple[PowerModel, float]:
    """Least-squares voltage curve (floor r, knee f_v) of one GPU's power model on the measured
    power ratios, with the time split `scaling` fixed (it sets each op's SM-bound share).

    Only the voltage curve is fitted: it acts below the top clock alone (V(f_max)/V(f_max) = 1
    for any r, f_v), so the fit leaves every prediction at f_max as it was. P_dyn and a_mem,
    which set power at f_max, are the catalog's. The knee starts mid-sweep (below the lowest
    measured clock the residuals do not depend on it). Returns the model and its RMS
    power-ratio error."""
    mine = [c for c in curves if c.gpu_key == gpu_key]
    base = power_model(get_gpu(PERSEUS_GPUS[gpu_key]))
    lowest = float(min(c.freq_mhz[0] for c in mine))

    def model_of(x: np.ndarray) -> PowerModel:
        return replace(base, v_min_ratio=float(x[0]), voltage_knee_mhz=float(x[1]))

    def residuals(x: np.ndarray) -> np.ndarray:
        pm = model_of(x)
        parts = []
        for model, group in _by_model(mine).items():
            pred = predicted_ratios(model, gpu_key, group[0].freq_mhz, scaling, pm)
            parts += [pred[(c.stage, c.instruction)][1] - c.power_ratio for c in group]
        return np.concatenate(parts)

    x0 = [0.6, (lowest + base.f_max_mhz) / 2]
    result = least_squares(residuals, x0=x0,
                           bounds=([0.2, base.f_min_mhz], [1.0, base.f_max_mhz - 1.0]),
                           diff_step=1e-3, max_nfev=200)
    x = np.array([round(float(result.x[0]), 4), round(float(result.x[1]), 1)])
    return model_of(x), math.sqrt(float(np.mean(residuals(x) ** 2)))


SAME_DIE = {"A100-SXM4-40GB": ("A100-SXM4-80GB",)}
"""Catalog GPUs that take a fitted GPU's coefficients (same die and clocks; assumed)."""


def calibrate(folder: str | Path, on_gpu: Callable[[str], None] | None = None) -> Calibration:
    """Fit clock scaling, then power, for every GPU with Perseus stage profiles in `folder`."""
    curves = load_curves(folder)
    if not curves:
        raise DataFileError(f"{folder}: no Perseus stage profiles "
                            "({gpt3-175b,bloom}+{a100_sxm,a40}_bf16.csv)")
    scalings: dict[str, ClockScaling] = {}
    powers: dict[str, PowerModel] = {}
    sources: dict[str, str] = {}
    for gpu_key in sorted({c.gpu_key for c in curves}):
        name = PERSEUS_GPUS[gpu_key]
        if on_gpu is not None:
            on_gpu(name)
        scaling, t_rms = fit_clock_scaling(curves, gpu_key)
        power, p_rms = fit_power_model(curves, gpu_key, scaling)
        where = f"{Path(folder).parent.name}/{Path(folder).name}/*+{gpu_key}_bf16.csv"
        for target in (name, *SAME_DIE.get(name, ())):
            scalings[target] = scaling
            powers[target] = replace(power, gpu_name=target)
            note = "" if target == name else f" (fit of {name}, same die: assumed)"
            sources[f"clock_scaling.{target}"] = (
                f"sim calibrate dvfs: least squares on t(f)/t(f_max) of {where} (Perseus "
                f"SOSP'24 measured stage profiles) through trainsim's lowering; RMS "
                f"{t_rms:.3f}{note}")
            sources[f"power.{target}"] = (
                f"sim calibrate dvfs: v_min_ratio and voltage_knee_mhz by least squares on "
                f"P(f)/P(f_max) of {where} with the time split fixed; RMS {p_rms:.3f} "
                f"(dynamic_power_max_w and memory_bound_activity, which set power at f_max, "
                f"kept from the catalog){note}")
    return Calibration(scalings, powers, sources)


def write_catalog(calibration: Calibration) -> list[Path]:
    """Replace the catalog's records (hwmodels/data/clock_scaling.json, power.json) of the
    calibrated GPUs with `calibration`'s; other GPUs' records are kept. Returns the files."""
    written = []
    for name, key in (("clock_scaling.json", "clock_scaling"), ("power.json", "power")):
        path = DATA_DIR / name
        data = json.loads(path.read_text(encoding="utf-8"))
        for gpu, record in calibration.to_json()[key].items():
            data["gpus"][gpu] = record
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written


def common_curve_spread(curves: list[Curve], gpu_key: str) -> list[float]:
    """Per-curve RMS distance of one GPU's measured time ratios from their mean curve.

    Its maximum bounds what any model reaches that predicts one t(f)/t(f_max) for every stage
    of that GPU (as per-GPU physics does when the stages have the same op mix): the mean is
    the least-squares common curve."""
    mine = [c.time_ratio for c in curves if c.gpu_key == gpu_key]
    mean = np.mean(mine, axis=0)
    return [float(np.sqrt(np.mean((t - mean) ** 2))) for t in mine]


def summary_lines(folder: str | Path) -> list[str]:
    """Per GPU: min–max per-curve RMS of the catalog's time and power ratios, and the spread
    of the measured time curves around their mean (`common_curve_spread`)."""
    curves = load_curves(folder)
    errors = curve_errors(curves)
    lines = []
    for gpu_key in sorted({c.gpu_key for c in curves}):
        mine = [e for e in errors if e.curve.gpu_key == gpu_key]
        t = [e.time_rms for e in mine]
        p = [e.power_rms for e in mine]
        spread = common_curve_spread(curves, gpu_key)
        lines.append(f"{PERSEUS_GPUS[gpu_key]}: {len(mine)} curves, time RMS "
                     f"{min(t):.3f}-{max(t):.3f}, power RMS {min(p):.3f}-{max(p):.3f}, "
                     f"measured time curves vs their mean {min(spread):.3f}-{max(spread):.3f}")
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m trainsim.search.energy.dvfs_fit PERSEUS_STAGE_PROFILE_DIR")
    print("\n".join(summary_lines(sys.argv[1])))
