"""Baselines the frontier is compared with: all-max, ZeusGlobal, ZeusPerStage, EnvPipe.

* **all-max**: every GPU at its highest clock (what training does by default).
* **ZeusGlobal** (You et al., NSDI'23; Perseus §6.1): one power limit for every GPU, swept. With
  a per-frequency profile it is emulated as one SM clock for every instruction, swept over the
  clocks every instruction was profiled at.
* **ZeusPerStage** (Perseus §6.1): the heaviest stage (longest forward+backward at max clock)
  gets a clock, swept; every other stage takes the lowest clock whose forward+backward is no
  longer than the heaviest stage's, balancing stage times.
* **EnvPipe** (Choi et al., ATC'23): instructions on the pipeline's outer envelope (the
  all-max critical path) stay at the maximum clock, all others start at the minimum and are
  raised one clock step at a time while they are on the critical path, until the critical path
  is the envelope again (iteration time = all-max). The original can loop forever when raising
  cannot restore the envelope; we stop when no instruction can be raised or after
  Σ (clocks per instruction) rounds.

`tighten` is the repair step shared with the frontier: raise clocks on the real critical path,
cheapest marginal energy per second first, until a plan meets a deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from trainsim.search.energy.dag import InstructionDag
from trainsim.search.energy.kernels import finish_times_kernel
from trainsim.search.energy.point import DEFAULT_UNIT_S, FrontierPoint, make_point

_TOL_S = 1e-9


@njit(cache=True)
def _slack_kernel(t, pred_ptr, pred_idx):
    """Total float of every node for durations t (0 on the critical path)."""
    n = len(t)
    ef = finish_times_kernel(t, pred_ptr, pred_idx)
    makespan = ef.max() if n else 0.0
    lf = np.full(n, makespan)
    for i in range(n - 1, -1, -1):
        ls = lf[i] - t[i]
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            lf[pred_idx[k]] = min(lf[pred_idx[k]], ls)
    return lf - ef


@dataclass(frozen=True, kw_only=True, slots=True)
class Baseline:
    """One named baseline plan (or the chosen plan of a swept baseline and its sweep)."""

    name: str
    point: FrontierPoint
    """The plan at no slowdown where the method has one (else its fastest plan)."""
    sweep: tuple[FrontierPoint, ...] = ()
    """Every plan of a swept method, slowest first."""


def _plan_point(dag: InstructionDag, freq: np.ndarray, unit_s: float) -> FrontierPoint:
    t, e = dag.node_time_energy(freq)
    return make_point(dag, freq, t, e, unit_s)


def all_max(dag: InstructionDag, *, unit_s: float = DEFAULT_UNIT_S) -> FrontierPoint:
    """Every instruction at its highest profiled clock."""
    pick = {k: dag.profile.max_freq_mhz(*k) for k in dag.block_keys}
    return _plan_point(dag, dag.uniform_plan(pick), unit_s)


def block_clocks(dag: InstructionDag) -> list[np.ndarray]:
    """Profiled clocks of every block, ascending."""
    return [np.sort(dag.options(b)[0]) for b in range(len(dag.block_keys))]


def raise_clocks(dag: InstructionDag, freq: np.ndarray, nodes: np.ndarray,
                 clocks: list[np.ndarray]) -> bool:
    """Move each of `nodes` to its next higher profiled clock (in place); False when every one
    is already at its top clock — the termination test of the tightening loops."""
    raised = False
    for i in nodes:
        c = clocks[int(dag.block[i])]
        k = int(np.searchsorted(c, freq[i], side="right"))
        if k < len(c):
            freq[i] = c[k]
            raised = True
    return raised


def tighten(dag: InstructionDag, freq: np.ndarray, deadline_s: float, *,
            unit_s: float = DEFAULT_UNIT_S) -> FrontierPoint:
    """Raise clocks on the critical path until the plan finishes by `deadline_s`.

    Each round raises, on every critical instruction that is not at its top clock, the clock to
    the next profiled one; terminates because the all-max plan is the fastest possible.
    """
    freq = np.array(freq, dtype=float)
    clocks = block_clocks(dag)
    for _ in range(sum(len(c) for c in clocks) + 1):
        t, e = dag.node_time_energy(freq)
        slack = _slack_kernel(t, dag.pred_ptr, dag.pred_idx)
        makespan = float(finish_times_kernel(t, dag.pred_ptr, dag.pred_idx).max())
        if makespan <= deadline_s + _TOL_S:
            return make_point(dag, freq, t, e, unit_s)
        if not raise_clocks(dag, freq, np.flatnonzero(slack <= _TOL_S), clocks):
            break
    t, e = dag.node_time_energy(freq)
    return make_point(dag, freq, t, e, unit_s)


def zeus_global(dag: InstructionDag, *, unit_s: float = DEFAULT_UNIT_S) -> Baseline:
    """One clock for all GPUs, swept over the clocks common to every instruction."""
    sweep = []
    for f in dag.profile.common_frequencies_mhz():
        freq = np.full(dag.num_nodes, f)
        sweep.append(_plan_point(dag, freq, unit_s))
    sweep.sort(key=lambda p: -p.time_s)
    fastest = min(sweep, key=lambda p: (p.time_s, p.energy_j))
    return Baseline(name="ZeusGlobal", point=fastest, sweep=tuple(sweep))


def zeus_per_stage(dag: InstructionDag, *, unit_s: float = DEFAULT_UNIT_S) -> Baseline:
    """Heaviest stage's clock swept; other stages balanced to its forward+backward time."""
    prof = dag.profile
    common = prof.common_frequencies_mhz()

    def stage_time(s: int, f: float) -> float:
        return prof.options[(s, "forward")].at(f)[0] + prof.options[(s, "backward")].at(f)[0]

    heaviest = max(range(dag.num_stages), key=lambda s: stage_time(s, common[0]))
    sweep = []
    for f_h in common:
        target = stage_time(heaviest, f_h)
        pick: dict[tuple[int, str], float] = {}
        for s in range(dag.num_stages):
            ok = [f for f in common if stage_time(s, f) <= target + _TOL_S]
            f_s = f_h if s == heaviest else (min(ok) if ok else common[0])
            pick[(s, "forward")] = pick[(s, "backward")] = f_s
        sweep.append(_plan_point(dag, dag.uniform_plan(pick), unit_s))
    sweep.sort(key=lambda p: -p.time_s)
    fastest = min(sweep, key=lambda p: (p.time_s, p.energy_j))
    return Baseline(name="ZeusPerStage", point=fastest, sweep=tuple(sweep))


def envpipe(dag: InstructionDag, *, unit_s: float = DEFAULT_UNIT_S) -> Baseline:
    """EnvPipe: envelope at max clock, the rest raised from the minimum until the envelope is
    the critical path again (with a termination guard)."""
    top = all_max(dag, unit_s=unit_s)
    t_max, _ = dag.node_time_energy(top.freq_mhz)
    envelope = _slack_kernel(t_max, dag.pred_ptr, dag.pred_idx) <= _TOL_S
    clocks = block_clocks(dag)
    freq = np.array([clocks[int(b)][0] for b in dag.block], dtype=float)
    freq[envelope] = top.freq_mhz[envelope]
    point = tighten(dag, freq, top.time_s, unit_s=unit_s)
    return Baseline(name="EnvPipe", point=point)


def all_baselines(dag: InstructionDag, *, unit_s: float = DEFAULT_UNIT_S) -> list[Baseline]:
    """all-max, ZeusGlobal, ZeusPerStage and EnvPipe, in that order."""
    return [Baseline(name="all-max", point=all_max(dag, unit_s=unit_s)),
            zeus_global(dag, unit_s=unit_s), zeus_per_stage(dag, unit_s=unit_s),
            envpipe(dag, unit_s=unit_s)]
