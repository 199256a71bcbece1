"""An op cost model from a profile database: measured times, interpolated between shapes.

`ProfiledCostModel` implements the `OpCostModel` protocol (hwmodels/opcost.py), so lowering
takes it as `LoweringOptions(cost_model=...)`. For an op (kind, FLOPs, bytes, shape):

1. **Which pass.** The lowering asks for a forward, a full backward, or (GEMMs) each half of a
   backward; the query's FLOPs say which: a measured row of the same kind and shape whose
   FLOPs and bytes match is used as is (FLOPs alone can match another tensor-parallel
   degree's other pass). Without one, the pass is the one whose measured FLOPs per
   element (FLOPs / ∏shape) is nearest (the zoo counts a backward as 2× the forward FLOPs).
2. **GEMMs.** A GEMM's forward and each backward half have the same FLOPs and bytes, so the
   lowering's three calls per GEMM cannot be told apart; each returns one third of the
   measured forward + backward, which keeps every instruction's total exact.
3. **Interpolation.** Between measured shapes of one kind and pass, time is interpolated
   linearly in log(FLOPs)–log(time) (a power law between neighbours); outside the measured
   range the nearest point's throughput is kept (time ∝ FLOPs).
4. **Optimizer.** The lowering costs the Adam step as an ``elementwise`` op without a shape
   and with 12 FLOPs per parameter (workloads/stage_costs.py). With an ``optimizer`` function
   (parameters → seconds; `sim validate` passes the cold-cache CPU Adam model of
   validate/cpu_microbench.py) that answers; else it is looked up in the ``optimizer`` rows by
   parameter count (timed back to back, state in cache).
5. **Fallback.** A kind the profile lacks gets a roofline on the figures the profile implies
   (validate/cpu_hardware.py): max(FLOPs/peak, bytes/bandwidth) + the per-op overhead.

6. **Solo timings.** ``ProfiledCostModel(db, solo=True)`` answers with each row's ``solo_s``
   (the op timed while the other processes were idle) where the profile has it, else
   ``time_s``: validate/contention.py blends the two by how much of a task overlaps other
   processes' compute.

7. **Machine speed.** ``scale`` multiplies every op time: `sim validate` passes the trace's
   reference-GEMM time over the profile's (validate/profiler.py), so a profile recorded while
   the machine ran at another speed is brought to the trace's.

8. **In-model factor.** ``op_scale`` multiplies the ops' times but not the Adam step's:
   `sim validate` passes a model's whole forward and backward over the sum of its ops
   (validate/compare.py `in_model_factor`).

9. **Gradient copies.** The lowering costs the copies around a data-parallel reduction as a
   ``copy`` op of the bytes they move (`ModelSpec.grad_copy_traffic`). With a ``copy``
   function (bytes → seconds; `sim validate` passes the CPU copy bandwidth of
   validate/cpu_microbench.py) that answers; else the fallback (5) does.

10. **Inside the model.** ``fwd_scale`` and ``bwd_scale`` multiply each kind's measured
   forwards and backwards: `sim validate` passes each kind's time inside the whole model over
   the same ops timed back to back (validate/compare.py `in_model_scales`).

`sources` counts how each estimate was made (``exact``, ``interpolated``, ``roofline``,
``cpu_adam``: the `optimizer` function, ``cpu_copy``: the `copy` function).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.hwmodels.opcost import OpEstimate
from trainsim.validate.cpu_hardware import derive_figures
from trainsim.validate.profile_db import ProfileDB, ProfileRow
from trainsim.validate.trace_import import KIND_ALIASES
from trainsim.workloads.stage_costs import ADAM_STEP_FLOPS_PER_PARAM

_REL = 1e-6
"""Relative tolerance for FLOP counts to count as the same measurement."""


def _same(row: ProfileRow, flops: float, bytes_moved: float | None) -> bool:
    """`row` measured this op: its FLOPs match, and its bytes too where both are known (a
    vocab-parallel embedding's backward at tp 2 has the FLOPs of its forward at tp 1, on the
    same [tokens, hidden] shape; only the bytes tell them apart)."""
    if abs(row.flops - flops) > _REL * max(flops, 1.0):
        return False
    return bytes_moved is None or not row.bytes_moved \
        or abs(row.bytes_moved - bytes_moved) <= _REL * max(bytes_moved, 1.0)


class _Curve:
    """log(time) against log(work), linear between points, constant throughput outside."""

    def __init__(self, points: list[tuple[float, float]]) -> None:
        merged: dict[float, list[float]] = {}
        for work, t in points:
            if work > 0:
                merged.setdefault(work, []).append(t)
        pts = sorted((w, float(np.median(ts))) for w, ts in merged.items())
        self.x = np.log([w for w, _ in pts])
        self.y = np.log([t for _, t in pts])

    def __bool__(self) -> bool:
        return len(self.x) > 0

    def __call__(self, work: float) -> float:
        lx = math.log(work)
        if lx <= self.x[0]:
            return math.exp(self.y[0] + lx - self.x[0])
        if lx >= self.x[-1]:
            return math.exp(self.y[-1] + lx - self.x[-1])
        return math.exp(float(np.interp(lx, self.x, self.y)))


class ProfiledCostModel:
    """Measured op times from a `ProfileDB` (module docstring)."""

    def __init__(self, db: ProfileDB, *, solo: bool = False, scale: float = 1.0,
                 op_scale: float = 1.0, fwd_scale: Mapping[str, float] | None = None,
                 bwd_scale: Mapping[str, float] | None = None,
                 optimizer: Callable[[float], float] | None = None,
                 copy: Callable[[float], float] | None = None) -> None:
        """Index the database by (kind, shape, pass) and build per-kind curves; `solo` reads
        the rows' solo timings where measured (module docstring, 6); `scale` multiplies every
        answer (7) but `optimizer`'s (4) and `copy`'s (9), which bring their own machine speed;
        `op_scale` multiplies the ops' answers only, not the Adam step's (8); `fwd_scale` and
        `bwd_scale` (per op kind; backwards by the attention core's folded kind) multiply the
        measured forwards and backwards (10)."""
        self.db = db
        self.optimizer = optimizer
        self.copy = copy
        self.solo = solo
        self.scale = float(scale)
        self.op_scale = float(op_scale)
        self.fwd_scale = dict(fwd_scale or {})
        self.bwd_scale = dict(bwd_scale or {})
        self.figures = derive_figures(db)
        self._exact: dict[tuple[str, tuple[int, ...], str], list[ProfileRow]] = {}
        self._curves: dict[tuple[str, str], _Curve] = {}
        self._fpe: dict[tuple[str, str], float] = {}
        groups: dict[tuple[str, str], list[ProfileRow]] = {}
        for r in db.op_rows():
            self._exact.setdefault((r.kind, r.shape, r.pass_), []).append(r)
            groups.setdefault((r.kind, r.pass_), []).append(r)
        for key, rows in groups.items():
            work = [(self._work(r), self._t(r)) for r in rows]
            self._curves[key] = _Curve(work)
            per = [r.flops / math.prod(r.shape) for r in rows if r.shape and r.flops > 0]
            if per:
                self._fpe[key] = float(np.median(per))
        self.sources: Counter[str] = Counter()
        """How many estimates were exact, interpolated or roofline."""

    def _t(self, r: ProfileRow) -> float:
        """The row's time: solo where asked for and measured, else all processes at once."""
        return r.solo_s if self.solo and r.solo_s > 0 else r.time_s

    @staticmethod
    def _work(r: ProfileRow) -> float:
        if r.kind == "optimizer":
            return float(r.shape[0]) if r.shape else r.flops / ADAM_STEP_FLOPS_PER_PARAM
        return r.flops if r.flops > 0 else float(math.prod(r.shape) or 1)

    def _lookup(self, kind: str, pass_: str, flops: float,
                shape: tuple[int, ...] | None, bytes_moved: float | None = None
                ) -> float | None:
        rows = self._exact.get((kind, tuple(shape or ()), pass_), [])
        hits = [self._t(r) for r in rows if _same(r, flops, bytes_moved)]
        if hits:
            self.sources["exact"] += 1
            return float(np.median(hits))
        curve = self._curves.get((kind, pass_))
        if not curve or flops <= 0:
            return None
        self.sources["interpolated"] += 1
        return curve(flops)

    def _bwd_factor(self, kind: str) -> float:
        return self.bwd_scale.get(KIND_ALIASES.get(kind, kind), 1.0)

    def forward_s(self, kind: str, flops: float, bytes_moved: float,
                  shape: tuple[int, ...] | None = None) -> float:
        """The measured forward of an op, from its forward rows only (no scale): what
        `in_model_scales` divides an op's time inside the model by."""
        if kind in ("matmul", "batched_matmul"):
            t = self._lookup(kind, "fwd", flops, shape)
        else:
            t = self._lookup(kind, "fwd", flops, shape, bytes_moved)
        return t if t is not None else self._roofline(flops, bytes_moved)

    def _roofline(self, flops: float, bytes_moved: float) -> float:
        self.sources["roofline"] += 1
        fig = self.figures
        return (max(flops / fig.peak_flops, bytes_moved / fig.memory_bandwidth_bytes_per_s)
                + fig.op_overhead_s)

    def _pass_of(self, kind: str, flops: float, shape: tuple[int, ...] | None,
                 bytes_moved: float | None = None) -> str:
        shape_t = tuple(shape or ())
        for pass_ in ("fwd", "bwd"):
            for r in self._exact.get((kind, shape_t, pass_), []):
                if _same(r, flops, bytes_moved):
                    return pass_
        if not shape_t or (kind, "fwd") not in self._fpe:
            return "fwd"
        per = flops / math.prod(shape_t)
        best = min(("fwd", "bwd"), key=lambda p: abs(math.log(
            max(per, 1e-30) / self._fpe.get((kind, p), self._fpe[(kind, "fwd")] * 2))))
        return best

    def time_s(self, kind: str, flops: float, bytes_moved: float,
               shape: tuple[int, ...] | None = None) -> float:
        """Seconds of one op call as the lowering asks for it (module docstring)."""
        if kind == "elementwise" and shape is None and self.optimizer is not None:
            self.sources["cpu_adam"] += 1
            return self.optimizer(flops / ADAM_STEP_FLOPS_PER_PARAM)
        if kind == "copy" and self.copy is not None:
            self.sources["cpu_copy"] += 1
            return self.copy(bytes_moved)
        return self.scale * self._unscaled_s(kind, flops, bytes_moved, shape)

    def _unscaled_s(self, kind: str, flops: float, bytes_moved: float,
                    shape: tuple[int, ...] | None) -> float:
        t: float | None
        if kind == "elementwise" and shape is None and ("optimizer", "step") in self._curves:
            self.sources["interpolated"] += 1
            params = flops / ADAM_STEP_FLOPS_PER_PARAM
            rows = [r for r in self.db.ops("optimizer", "step")
                    if r.shape and r.shape[0] == round(params)]
            if rows:
                self.sources["exact"] += 1
                self.sources["interpolated"] -= 1
                return float(np.median([self._t(r) for r in rows]))
            return self._curves[("optimizer", "step")](max(params, 1.0))
        if kind in ("matmul", "batched_matmul"):
            fwd = self._lookup(kind, "fwd", flops, shape)
            bwd = self._lookup(kind, "bwd", 2 * flops, shape)
            if fwd is not None and bwd is not None:
                return self.op_scale * (self.fwd_scale.get(kind, 1.0) * fwd
                                        + self._bwd_factor(kind) * bwd) / 3.0
            t = None
        else:
            pass_ = self._pass_of(kind, flops, shape, bytes_moved)
            t = self._lookup(kind, pass_, flops, shape, bytes_moved)
            if t is not None:
                t *= self.fwd_scale.get(kind, 1.0) if pass_ == "fwd" else self._bwd_factor(kind)
        if t is not None:
            return self.op_scale * t
        return self.op_scale * self._roofline(flops, bytes_moved)

    def estimate(self, kind: str, flops: float, bytes_moved: float, gpu: Any,
                 freq_mhz: float | None = None, dtype: str = "fp16",
                 shape: tuple[int, ...] | None = None) -> OpEstimate:
        """`OpCostModel.estimate`: measured time; power is the hardware's `tdp_w` (the cpu
        description's placeholder; frequency and dtype are what the profile was run at)."""
        t = self.time_s(kind, flops, bytes_moved, shape)
        fig = self.figures
        compute_s = flops / fig.peak_flops
        memory_s = bytes_moved / fig.memory_bandwidth_bytes_per_s
        return OpEstimate(time_s=t, compute_s=min(compute_s, t), memory_s=min(memory_s, t),
                          overhead_s=max(0.0, t - max(compute_s, memory_s)),
                          power_w=float(getattr(gpu, "tdp_w", 0.0)))


def load_cost_model(path: str | Path) -> ProfiledCostModel:
    """A `ProfiledCostModel` from a profile database file (what `sim simulate --profile` uses).

    Raises:
        DataFileError: the file is not a profile database or lacks the rows a cost model needs.
    """
    return ProfiledCostModel(ProfileDB.load(path))
