"""Op cost: roofline with measured efficiency curves, DVFS and power.

    compute_s = FLOPs / (peak(f_max) × eff_compute) × f_max / f
    memory_s  = bytes / (bandwidth × eff_mem)
    time_s    = max(compute_s, memory_s) + launch overhead

the roofline of Williams, Waterman & Patterson (CACM 2009, eq. 1) with achieved-fraction
curves as Calculon uses them. The efficiency curves (data/efficiency.json) are indexed by the
op's *ideal* duration -- FLOPs / peak, or bytes / bandwidth, in microseconds -- so one shape
serves fast and slow GPUs alike: a GEMM that would take 10 µs at peak underfills the machine on
any GPU. Following Perseus (SOSP'24 §4), only the compute part scales with the SM clock; the
memory part does not. How much of a GEMM's time is clock-bound, and which clock a GPU sustains
near its top clock, come from hwmodels/clock_scaling.py (fitted to Perseus' per-frequency
stage profiles): compute time at clock f is the f_max time times `ClockScaling.gemm_factor`
(GEMM classes) or `ClockScaling.slowdown` (element-wise). Power comes from hwmodels/power.py at
that clock, with the op's SM-bound fraction as utilisation, and idle power during the launch
overhead.

`estimate` runs millions of times inside searches, so curves are pre-built per GPU into numpy
arrays of log10(x) and looked up with `numpy.interp`; nothing is parsed per call.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

import numpy as np

from trainsim.errors import DataFileError, unknown_name
from trainsim.hwmodels.clock_scaling import ClockScaling, clock_scaling
from trainsim.hwmodels.datafiles import check_keys, load_json
from trainsim.hwmodels.gpus import GpuSpec
from trainsim.hwmodels.power import PowerModel, power_model

_FILE = "efficiency.json"
_US = 1e6
"""Microseconds per second (curve x-axes are ideal durations in µs)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpEstimate:
    """Predicted duration and power of one op on one GPU."""

    time_s: float
    """Total: max(compute_s, memory_s) + overhead_s."""
    compute_s: float
    """Time the op needs from the SMs at the chosen clock."""
    memory_s: float
    """Time the op needs from device memory (clock-independent)."""
    overhead_s: float
    """Launch overhead."""
    power_w: float
    """Average board power over time_s."""

    @property
    def energy_j(self) -> float:
        """power_w × time_s."""
        return self.power_w * self.time_s

    @property
    def compute_bound(self) -> bool:
        """True if the SMs, not memory, bound the op."""
        return self.compute_s >= self.memory_s


class OpCostModel(Protocol):
    """Anything that predicts an op's cost (roofline, profile database, ...)."""

    def estimate(
        self,
        kind: str,
        flops: float,
        bytes_moved: float,
        gpu: GpuSpec,
        freq_mhz: float | None = None,
        dtype: str = "fp16",
        shape: tuple[int, ...] | None = None,
    ) -> OpEstimate:
        """Predict the cost of one op of `kind` with `flops` and `bytes_moved` on `gpu`."""
        ...


class _Curve:
    """Piecewise-linear y(log10 x), clamped at both ends."""

    __slots__ = ("_slopes", "_xs", "_ys", "log_x", "y")

    def __init__(self, where: str, points: Any) -> None:
        if not isinstance(points, list) or len(points) < 2:
            raise DataFileError(f"{where}: needs a list of at least two [x, y] points")
        xs, ys = [], []
        for p in points:
            if not (isinstance(p, list) and len(p) == 2 and p[0] > 0 and 0 < p[1] <= 1):
                raise DataFileError(f"{where}: point {p!r} must be [x > 0, 0 < y <= 1]")
            xs.append(math.log10(p[0]))
            ys.append(float(p[1]))
        if any(b <= a for a, b in itertools.pairwise(xs)):
            raise DataFileError(f"{where}: x values must increase")
        self.log_x = np.asarray(xs)
        """Breakpoints as a numpy array, for vectorised lookups (`many`)."""
        self.y = np.asarray(ys)
        self._xs, self._ys = xs, ys
        self._slopes = [
            (y1 - y0) / (x1 - x0) for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:], strict=False)
        ]

    def __call__(self, x: float) -> float:
        """Scalar lookup: plain-Python bisect, ~4x faster than numpy.interp on one float."""
        if x <= 0:
            return self._ys[0]
        lx = math.log10(x)
        i = bisect_right(self._xs, lx)
        if i == 0:
            return self._ys[0]
        if i == len(self._xs):
            return self._ys[-1]
        return self._ys[i - 1] + self._slopes[i - 1] * (lx - self._xs[i - 1])

    def many(self, x: np.ndarray) -> np.ndarray:
        """Vectorised lookup with numpy.interp (x > 0)."""
        return np.asarray(np.interp(np.log10(x), self.log_x, self.y))

    def scaled(self, factor: float) -> _Curve:
        """The curve with every efficiency times `factor`, capped at 1 (the peak)."""
        if factor == 1.0:
            return self
        return _Curve("scaled curve", [[10.0 ** x, min(1.0, y * factor)]
                                       for x, y in zip(self._xs, self._ys, strict=True)])


@cache
def _efficiency_data() -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, Any]]:
    data = load_json(_FILE)
    check_keys(_FILE, data, ("kind_classes", "class_peak", "gpu_curves", "curves"), ("_about",))
    for cls, peak in data["class_peak"].items():
        if peak not in ("tensor", "vector"):
            raise DataFileError(f"{_FILE}: class_peak.{cls}={peak!r} must be tensor or vector")
    for kind, cls in data["kind_classes"].items():
        if cls not in data["class_peak"]:
            raise DataFileError(f"{_FILE}: kind_classes.{kind}={cls!r} has no class_peak entry")
    return data["kind_classes"], data["class_peak"], data["gpu_curves"], data["curves"]


@cache
def _curves_for(gpu_name: str) -> tuple[dict[str, _Curve], _Curve, float]:
    _, class_peak, gpu_curves, curves = _efficiency_data()
    set_name = gpu_curves.get(gpu_name)
    if set_name is None:
        raise DataFileError(f"{_FILE}: gpu_curves has no entry for GPU {gpu_name}")
    if set_name not in curves:
        raise DataFileError(f"{_FILE}: gpu_curves.{gpu_name}={set_name!r} is not in curves")
    where = f"{_FILE}: curves.{set_name}"
    raw = curves[set_name]
    check_keys(where, raw, ("launch_overhead_s", "compute", "memory", "source"))
    compute = {}
    for cls in class_peak:
        if cls not in raw["compute"]:
            raise DataFileError(f"{where}: compute.{cls} missing")
        compute[cls] = _Curve(f"{where}: compute.{cls}", raw["compute"][cls])
    return compute, _Curve(f"{where}: memory", raw["memory"]), float(raw["launch_overhead_s"])


@dataclass(frozen=True, kw_only=True, slots=True)
class OpEfficiency:
    """Per-GPU corrections of the roofline fitted to measured op times (`sim calibrate ops`):
    a factor on the achieved compute fraction of each efficiency class, one on the achieved
    memory bandwidth (both capped at the peak), and the launch overhead replacing the
    catalog's."""

    compute_scale: dict[str, float]
    """Efficiency class (``gemm``, ``batched_gemm``, ``elementwise``, ...) -> factor."""
    memory_scale: float = 1.0
    launch_overhead_s: float | None = None
    """None keeps the catalog's overhead."""


def efficiency_classes() -> list[str]:
    """The efficiency classes op kinds map to (data/efficiency.json), sorted."""
    return sorted(set(_efficiency_data()[0].values()))


class RooflineCostModel:
    """Roofline × efficiency curves + launch overhead, with DVFS and power (module docstring)."""

    def __init__(self, clock_scalings: dict[str, ClockScaling] | None = None,
                 power_models: dict[str, PowerModel] | None = None,
                 gemm_efficiency_scales: dict[str, float] | None = None,
                 op_efficiency: dict[str, OpEfficiency] | None = None) -> None:
        """Load the efficiency data (shared, cached) and prepare per-GPU lookups lazily.

        Args:
            clock_scalings: DVFS time coefficients per GPU name that replace the catalog's
                (data/clock_scaling.json), e.g. from a calibration file or a fit in progress.
            power_models: power models per GPU name that replace the catalog's (power.json).
            gemm_efficiency_scales: per GPU name, a factor on the achieved fraction of tensor
                peak of GEMM-class ops (a calibration of the efficiency plateau to a stack's
                measured runs; the result is capped at 1).
            op_efficiency: per GPU name, per-class corrections fitted to measured op times
                (`OpEfficiency`).
        """
        self._kind_class, self._class_peak, _, _ = _efficiency_data()
        self._clock_overrides = dict(clock_scalings or {})
        self._power_overrides = dict(power_models or {})
        self._gemm_scales = dict(gemm_efficiency_scales or {})
        self._op_eff = dict(op_efficiency or {})
        self._per_gpu: dict[str, tuple[dict[str, _Curve], _Curve, float, PowerModel,
                                       ClockScaling]] = {}

    def _gpu(self, gpu: GpuSpec) -> tuple[dict[str, _Curve], _Curve, float, PowerModel,
                                          ClockScaling]:
        entry = self._per_gpu.get(gpu.name)
        if entry is None:
            compute, memory, overhead = _curves_for(gpu.name)
            fitted = self._op_eff.get(gpu.name)
            if fitted is not None:
                compute = {cls: curve.scaled(fitted.compute_scale.get(cls, 1.0))
                           for cls, curve in compute.items()}
                memory = memory.scaled(fitted.memory_scale)
                if fitted.launch_overhead_s is not None:
                    overhead = fitted.launch_overhead_s
            scaling = self._clock_overrides.get(gpu.name) or clock_scaling(gpu.name)
            power = self._power_overrides.get(gpu.name) or power_model(gpu)
            entry = (compute, memory, overhead, power, scaling)
            self._per_gpu[gpu.name] = entry
        return entry

    def op_class(self, kind: str) -> str:
        """Efficiency class of an op kind (``gemm``, ``batched_gemm``, ``flash_attention``,
        ``elementwise``)."""
        cls = self._kind_class.get(kind)
        if cls is None:
            raise unknown_name("op kind", kind, self._kind_class)
        return cls

    def estimate(
        self,
        kind: str,
        flops: float,
        bytes_moved: float,
        gpu: GpuSpec,
        freq_mhz: float | None = None,
        dtype: str = "fp16",
        shape: tuple[int, ...] | None = None,
    ) -> OpEstimate:
        """Predict one op (see module docstring). `shape` is accepted for interface
        compatibility; the curves are indexed by size, not shape."""
        cls = self.op_class(kind)
        compute_curves, memory_curve, overhead_s, pm, scaling = self._gpu(gpu)
        f_max = gpu.sm_clock_max_mhz
        f = f_max if freq_mhz is None else freq_mhz
        if f <= 0:
            raise ValueError(f"freq_mhz={f} must be > 0")
        tensor = self._class_peak[cls] == "tensor"
        peak = gpu.peak_flops(dtype if tensor else "fp32", f_max)
        compute_s = 0.0
        sm_bound_s = 0.0
        if flops > 0:
            ideal = flops / peak
            eff = compute_curves[cls](ideal * _US)
            if tensor and self._gemm_scales:
                eff = min(1.0, eff * self._gemm_scales.get(gpu.name, 1.0))
            at_max = ideal / eff
            if tensor:
                # the clock-bound share c of a GEMM draws SM power; the rest waits on memory
                compute_s = at_max * scaling.gemm_factor(f, f_max)
                sm_bound_s = (at_max * scaling.gemm_clock_bound_fraction
                              * scaling.slowdown(f, f_max))
            else:
                compute_s = sm_bound_s = at_max * scaling.slowdown(f, f_max)
        memory_s = 0.0
        if bytes_moved > 0:
            ideal = bytes_moved / gpu.memory_bandwidth_bytes_per_s
            memory_s = ideal / memory_curve(ideal * _US)
        busy_s = max(compute_s, memory_s)
        time_s = busy_s + overhead_s
        utilisation = min(1.0, sm_bound_s / busy_s) if busy_s > 0 else 0.0
        busy_power = pm.power_w(f, utilisation)
        power = (busy_power * busy_s + pm.idle_power_w * overhead_s) / time_s
        return OpEstimate(
            time_s=time_s, compute_s=compute_s, memory_s=memory_s, overhead_s=overhead_s,
            power_w=power,
        )  # fmt: skip

    def compute_efficiency(
        self, kind: str, flops: float, gpu: GpuSpec, dtype: str = "fp16"
    ) -> float:
        """eff_compute of an op of `kind` with `flops` on `gpu` (for reports and tests)."""
        cls = self.op_class(kind)
        peak_kind = self._class_peak[cls]
        peak = gpu.peak_flops(dtype if peak_kind == "tensor" else "fp32", gpu.sm_clock_max_mhz)
        return self._gpu(gpu)[0][cls](flops / peak * _US)

    def memory_efficiency(self, bytes_moved: float, gpu: GpuSpec) -> float:
        """eff_mem of an op moving `bytes_moved` on `gpu`."""
        return self._gpu(gpu)[1](bytes_moved / gpu.memory_bandwidth_bytes_per_s * _US)

    def launch_overhead_s(self, gpu: GpuSpec) -> float:
        """Fixed per-op launch overhead on `gpu`."""
        return self._gpu(gpu)[2]
