"""One frequency plan evaluated on the instruction DAG: what the frontier and the baselines make.

A `FrontierPoint` holds a per-node clock plan with its real (unquantised) iteration time and
energy (`InstructionDag.evaluate`'s formula) and Lowtime's quantised figures; `make_point`
builds one from per-node times and energies (`make_points`: many at once, the same figures). Both search/energy/frontier.py and
search/energy/baselines.py produce points, so they live here, below both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainsim.search.energy.dag import InstructionDag
from trainsim.search.energy.kernels import QEPS, finish_times_kernel, makespans_kernel

__all__ = ["DEFAULT_UNIT_S", "FrontierPoint", "default_unit_s", "make_point", "make_points"]

#: Lowtime's (and Perseus's) time quantum: 1 ms.
DEFAULT_UNIT_S: float = 1e-3
#: The automatic quantum is at most this share of the shortest instruction (`default_unit_s`).
UNIT_SHARE_OF_SHORTEST = 0.05


def default_unit_s(shortest_s: float) -> float:
    """The crashing quantum for instructions whose shortest takes `shortest_s` at its fastest
    clock: Lowtime's 1 ms, or 5 % of that instruction where it is shorter. 1 ms is about 1 %
    of the instructions Perseus plans (GPT-3 and BLOOM stages, tens to hundreds of ms), but
    30 % of a 3.4 ms forward: quantised that coarsely, the frontier's fastest plan spent 54.89 J
    where EnvPipe's plan at the same time spends 54.65 J (gpt3-125m pp 2 dp 2 on A100, the
    planner bug hunt); at 5 % they tie."""
    return min(DEFAULT_UNIT_S, UNIT_SHARE_OF_SHORTEST * shortest_s) if shortest_s > 0 \
        else DEFAULT_UNIT_S


@dataclass(frozen=True, kw_only=True, slots=True)
class FrontierPoint:
    """One frequency plan on (or produced on the way to) the frontier."""

    time_s: float
    """Iteration time of the plan, real (unquantised) durations."""
    energy_j: float
    """Iteration energy, real: Σ E_i + P_block · (N·T − Σ t_i)."""
    freq_mhz: np.ndarray
    """Per DAG node: SM clock (MHz)."""
    quant_time_s: float
    """Lowtime's convention: longest path of ⌊t_i/u⌋·u."""
    quant_energy_j: float
    """Lowtime's convention: Σ (E_i − P_block·⌊t_i/u⌋·u) + N·P_block·quant_time_s."""
    model_time_s: float = float("nan")
    """The crashing model's makespan (quantised durations before rounding to options)."""
    model_energy_j: float = float("nan")
    """The crashing model's energy: Σ hull cost at the durations + N·P_block·model_time_s —
    what Lowtime reports as its frontier (with its exponential fit in place of our hull)."""


def make_point(dag: InstructionDag, freq: np.ndarray, t: np.ndarray, e: np.ndarray,
               unit_s: float) -> FrontierPoint:
    """A FrontierPoint from per-node clocks, times and energies (module formula)."""
    p_block, n_st = dag.profile.blocking_power_w, dag.num_stages
    time_s = float(finish_times_kernel(t, dag.pred_ptr, dag.pred_idx).max())
    qt = np.floor(t / unit_s + QEPS) * unit_s
    qtime = float(finish_times_kernel(qt, dag.pred_ptr, dag.pred_idx).max())
    return FrontierPoint(
        time_s=time_s, energy_j=float(e.sum() + p_block * (n_st * time_s - t.sum())),
        freq_mhz=freq,
        quant_time_s=round(qtime / unit_s) * unit_s,
        quant_energy_j=float((e - p_block * qt).sum() + n_st * p_block * qtime))


def make_points(dag: InstructionDag, freq: np.ndarray, t: np.ndarray, e: np.ndarray,
                unit_s: float) -> list[FrontierPoint]:
    """`make_point` of each row of (plans × nodes) clocks, times and energies, vectorised.

    Row sums along the contiguous axis are numpy's pairwise sums of each row, as in
    `make_point`, so every figure is the same to the bit.
    """
    p_block, n_st = dag.profile.blocking_power_w, dag.num_stages
    t, e = np.ascontiguousarray(t), np.ascontiguousarray(e)
    time_s = makespans_kernel(t, dag.pred_ptr, dag.pred_idx)
    qt = np.floor(t / unit_s + QEPS) * unit_s
    qtime = makespans_kernel(qt, dag.pred_ptr, dag.pred_idx)
    energy = e.sum(axis=1) + p_block * (n_st * time_s - t.sum(axis=1))
    qenergy = (e - p_block * qt).sum(axis=1) + n_st * p_block * qtime
    return [FrontierPoint(time_s=float(time_s[k]), energy_j=float(energy[k]),
                          freq_mhz=freq[k].copy(),
                          quant_time_s=round(float(qtime[k]) / unit_s) * unit_s,
                          quant_energy_j=float(qenergy[k]))
            for k in range(len(t))]
