"""Replay a frequency plan through trainsim's engine and check it against the planner.

A plan over the instruction DAG becomes a Program (simulator/program.py): one rank per stage,
one "compute" task per instruction in the stage's 1F1B order, with duration t_i and power
E_i / t_i at its clock, cross-stage dependencies F(s−1, j) → F(s, j) and B(s+1, j) → B(s, j),
and the GPU's blocking power as every rank's idle power. The engine's energy rule (Σ power ×
duration + idle power × idle time) is then exactly the planner's iteration energy
(search/energy/dag.py), so replayed and predicted time and energy must agree to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainsim.errors import SimulationError
from trainsim.search.energy.dag import InstructionDag
from trainsim.simulator.engines import run_program
from trainsim.simulator.program import Program, ProgramInfo
from trainsim.simulator.result import SimResult
from trainsim.simulator.task import Task

#: Relative agreement required between replay and prediction (engines agree to 1e-9).
REPLAY_RTOL: float = 1e-6


def plan_program(dag: InstructionDag, freq_mhz: np.ndarray) -> Program:
    """The Program of one iteration under a per-instruction frequency plan."""
    t, e = dag.node_time_energy(np.asarray(freq_mhz, dtype=float))
    tasks = []
    for i in range(dag.num_nodes):
        s = int(dag.stage[i])
        deps = tuple(int(q) for q in dag.pred_idx[dag.pred_ptr[i]:dag.pred_ptr[i + 1]]
                     if int(dag.stage[q]) != s)
        tasks.append(Task(name=dag.label(i), kind="forward" if dag.kind[i] == 0 else "backward",
                          ranks=(s,), stream="compute", duration_s=float(t[i]), deps=deps,
                          power_w=float(e[i] / t[i]), freq_mhz=float(freq_mhz[i]),
                          micro_batch=int(dag.micro_batch[i]), stage=s))
    return Program(num_ranks=dag.num_stages, tasks=tasks,
                   idle_power_w=[dag.profile.blocking_power_w] * dag.num_stages,
                   info=ProgramInfo(source=dag.profile.source, planner="energy"))


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayCheck:
    """Replayed vs predicted figures of one plan."""

    predicted_time_s: float
    predicted_energy_j: float
    replayed_time_s: float
    replayed_energy_j: float

    @property
    def ok(self) -> bool:
        """True when both agree within REPLAY_RTOL."""
        return (abs(self.replayed_time_s - self.predicted_time_s)
                <= REPLAY_RTOL * max(1.0, self.predicted_time_s)
                and abs(self.replayed_energy_j - self.predicted_energy_j)
                <= REPLAY_RTOL * max(1.0, self.predicted_energy_j))


def replay(dag: InstructionDag, freq_mhz: np.ndarray, *, engine: str = "simpy",
           check: bool = True) -> tuple[ReplayCheck, SimResult]:
    """Run a plan through the engine; returns the comparison and the SimResult.

    Raises:
        SimulationError: with `check`, when replay and prediction disagree.
    """
    freq = np.asarray(freq_mhz, dtype=float)
    time_s, energy_j = dag.evaluate(freq)
    result = run_program(plan_program(dag, freq), engine=engine)
    out = ReplayCheck(predicted_time_s=time_s, predicted_energy_j=energy_j,
                      replayed_time_s=float(result.iteration_time_s),
                      replayed_energy_j=float(result.energy_j))
    if check and not out.ok:
        raise SimulationError(
            f"replayed plan ({out.replayed_time_s:.9g} s, {out.replayed_energy_j:.9g} J) differs "
            f"from the planner's prediction ({time_s:.9g} s, {energy_j:.9g} J)")
    return out, result
