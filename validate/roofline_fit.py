"""Fitting the roofline to measured op times: per-class efficiency factors and launch overhead.

`sim profile --device cuda` (or any profile in its CSV schema) measures op kinds at several
sizes. The roofline (hwmodels/opcost.py) predicts each as

    t = overhead + max(ideal_c / min(1, e_c(x) * k_class), ideal_m / min(1, e_m(x) * k_mem))

with the catalog's efficiency curves e_c, e_m. This module fits one factor k per efficiency
class (gemm, batched_gemm, flash_attention, elementwise) on the compute side, one on memory bandwidth and the
launch overhead, by least squares on predicted / measured − 1 -- relative errors, so a 10 µs
kernel counts as much as a 10 ms one -- starting from the catalog's values. The curves keep their shape (how efficiency grows with
size, which the catalog cites); the fit moves their level to the measured machine and stack.
The result is an `OpEfficiency` record that `sim calibrate ops` writes into a calibration file.

Single-process timings (`solo_s`) are used where the profile has them: the roofline models one
GPU alone, and contention is the engine's business.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainsim.errors import DataFileError, TrainsimError
from trainsim.hwmodels.calibration import MAX_OVERHEAD_S, SCALE_RANGE
from trainsim.hwmodels.gpus import GpuSpec
from trainsim.hwmodels.opcost import OpEfficiency, RooflineCostModel
from trainsim.validate.profile_db import ProfileDB

MIN_ROWS = 4
"""Fewer measurements than this cannot pin down a factor per class plus the overhead."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredOp:
    """One measured op time with the roofline's pieces at the catalog's coefficients."""

    kind: str
    cls: str
    time_s: float
    ideal_compute_s: float
    compute_eff: float
    ideal_memory_s: float
    memory_eff: float

    def predict(self, k_compute: float, k_memory: float, overhead_s: float) -> float:
        """The roofline's time with efficiency factors and overhead (as `RooflineCostModel`
        applies an `OpEfficiency`: each efficiency capped at 1)."""
        compute = self.ideal_compute_s / min(1.0, self.compute_eff * k_compute) \
            if self.ideal_compute_s > 0 else 0.0
        memory = self.ideal_memory_s / min(1.0, self.memory_eff * k_memory) \
            if self.ideal_memory_s > 0 else 0.0
        return overhead_s + max(compute, memory)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClassError:
    """Fit quality of one efficiency class."""

    cls: str
    rows: int
    factor: float
    mape_before: float
    mape_after: float


@dataclass(frozen=True, kw_only=True, slots=True)
class OpFit:
    """The fitted record and how well it reproduces the measurements."""

    gpu: str
    efficiency: OpEfficiency
    classes: tuple[ClassError, ...]
    rows: int
    mape_before: float
    """Mean |predicted / measured − 1| with the catalog's coefficients."""
    mape_after: float
    """The same with the fitted record."""
    holdout_mape: float
    """Two-fold cross-validation: fit on every other row (by size within each kind), error
    on the rows left out, averaged over both folds."""
    skipped: tuple[str, ...] = ()
    """Op kinds in the profile the roofline has no class for."""


def measured_ops(db: ProfileDB, gpu: GpuSpec, dtype: str,
                 model: RooflineCostModel | None = None) -> tuple[list[MeasuredOp], list[str]]:
    """The profile's op rows as `MeasuredOp`s, and the kinds left out (no roofline class)."""
    model = model or RooflineCostModel()
    ops: list[MeasuredOp] = []
    skipped: set[str] = set()
    for row in db.op_rows():
        try:
            cls = model.op_class(row.kind)
        except TrainsimError:  # a kind the roofline has no class for: reported, not fatal
            skipped.add(row.kind)
            continue
        est = model.estimate(row.kind, row.flops, row.bytes_moved, gpu, dtype=dtype)
        c_eff = model.compute_efficiency(row.kind, row.flops, gpu, dtype) if row.flops else 1.0
        m_eff = model.memory_efficiency(row.bytes_moved, gpu) if row.bytes_moved else 1.0
        ops.append(MeasuredOp(kind=row.kind, cls=cls,
                              time_s=row.solo_s if row.solo_s > 0 else row.time_s,
                              ideal_compute_s=est.compute_s * c_eff, compute_eff=c_eff,
                              ideal_memory_s=est.memory_s * m_eff, memory_eff=m_eff))
    return ops, sorted(skipped)


def _solve(ops: Sequence[MeasuredOp], classes: list[str], start_overhead_s: float
           ) -> tuple[dict[str, float], float, float]:
    # deferred: scipy.optimize is only needed here (start-up time of every other command)
    from scipy.optimize import least_squares

    index = {c: i for i, c in enumerate(classes)}
    n = len(classes)
    times = np.array([o.time_s for o in ops])

    def residuals(x: np.ndarray) -> np.ndarray:
        ks, km, over = np.exp(x[:n]), math.exp(x[n]), x[n + 1] * 1e-6
        pred = np.array([o.predict(ks[index[o.cls]], km, over) for o in ops])
        return pred / times - 1.0

    lo = [math.log(SCALE_RANGE[0])] * (n + 1) + [0.0]
    hi = [math.log(SCALE_RANGE[1])] * (n + 1) + [MAX_OVERHEAD_S * 1e6]
    x0 = np.r_[np.zeros(n + 1), min(start_overhead_s * 1e6, MAX_OVERHEAD_S * 1e6)]
    res = least_squares(residuals, x0, bounds=(lo, hi), method="trf")
    x = res.x
    return ({c: float(math.exp(x[i])) for c, i in index.items()}, float(math.exp(x[n])),
            float(x[n + 1] * 1e-6))


def _mape(ops: Sequence[MeasuredOp], scales: dict[str, float], k_mem: float,
          overhead_s: float) -> float:
    if not ops:
        return math.nan
    return float(np.mean([abs(o.predict(scales.get(o.cls, 1.0), k_mem, overhead_s) / o.time_s
                              - 1.0) for o in ops]))


def fit_op_efficiency(db: ProfileDB, gpu: GpuSpec, dtype: str = "fp16",
                      model: RooflineCostModel | None = None) -> OpFit:
    """Fit per-class compute factors, a memory factor and the launch overhead of `gpu` to
    the profile's measured op times.

    Raises:
        DataFileError: fewer than `MIN_ROWS` op rows the roofline can price.
    """
    model = model or RooflineCostModel()
    ops, skipped = measured_ops(db, gpu, dtype, model)
    if len(ops) < MIN_ROWS:
        raise DataFileError(f"the profile has {len(ops)} op rows trainsim can price; the fit "
                            f"needs at least {MIN_ROWS}")
    classes = sorted({o.cls for o in ops})
    base_overhead = model.launch_overhead_s(gpu)
    scales, k_mem, overhead = _solve(ops, classes, base_overhead)
    pinned = [(c, k) for c, k in [*scales.items(), ("memory", k_mem)]
              if not SCALE_RANGE[0] * (1 + 1e-6) < k < SCALE_RANGE[1] * (1 - 1e-6)]
    if pinned:
        c, k = pinned[0]
        raise DataFileError(f"the fitted {c} factor {k:.3g} sits at the bound of "
                            f"[{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}]: these op times are not "
                            f"of this GPU ({gpu.name}): another GPU's, or a CPU's?")
    before = {c: _mape([o for o in ops if o.cls == c], {}, 1.0, base_overhead) for c in classes}
    after = {c: _mape([o for o in ops if o.cls == c], scales, k_mem, overhead) for c in classes}
    # two folds: alternate rows within each kind, ordered by size
    ordered = sorted(ops, key=lambda o: (o.kind, o.ideal_compute_s + o.ideal_memory_s))
    folds = (ordered[0::2], ordered[1::2])
    held: list[float] = []
    for train, test in (folds, folds[::-1]):
        if len({o.cls for o in train}) == len(classes) and test:
            s, m, x = _solve(train, classes, base_overhead)
            held.append(_mape(test, s, m, x))
    return OpFit(
        gpu=gpu.name,
        efficiency=OpEfficiency(compute_scale=scales, memory_scale=k_mem,
                                launch_overhead_s=overhead),
        classes=tuple(ClassError(cls=c, rows=sum(o.cls == c for o in ops), factor=scales[c],
                                 mape_before=before[c], mape_after=after[c]) for c in classes),
        rows=len(ops), mape_before=_mape(ops, {}, 1.0, base_overhead),
        mape_after=_mape(ops, scales, k_mem, overhead),
        holdout_mape=float(np.mean(held)) if held else math.nan, skipped=tuple(skipped))


__all__ = ["MIN_ROWS", "ClassError", "MeasuredOp", "OpFit", "fit_op_efficiency", "measured_ops"]
