"""Frequency plans through the real lowering: `ParallelPlan.instruction_freq_mhz` + `lower()`.

A frontier plan (one SM clock per DAG node) becomes the plan field `instruction_freq_mhz`
({"sFj"/"sBj": MHz}, keys as `simulator.actions.Action` prints them, read back by
`ParallelPlan.frequency_of`), is lowered by `workloads.lowering.lower` and run by the engine.

What `lower` emits beyond the planner's instruction DAG (search/energy/dag.py), and how the
prediction accounts for it:

* nothing, under ``LoweringOptions(communication=False, optimizer_step=False)``: the program is
  exactly the DAG's compute tasks (forward; recompute + backward at the backward's clock) with
  the DAG's edges, each folded rank standing for the stage's g GPUs, so `InstructionDag.
  evaluate` of a `profile_from_model` DAG equals the engine's time and energy to rounding;
* by default, point-to-point transfers between stages and the optimizer step: both run at
  fixed cost whatever the clocks (transfers are not compute; the step runs at the maximum
  clock), so `LoweredExtras` reads them once off the all-max program and `predict` adds each
  transfer as a delay on its DAG edge (its latency + bytes / bottleneck bandwidth) and each
  rank's step after its last instruction, with its energy and blocking power over the longer
  iteration. This is exact while no two transfers share a link at once; the engine's fluid
  model shares bandwidth when they do (an activation and a gradient arriving at one stage
  together), which is the remaining (small) difference;
* for a model whose LM head is tied to the embedding, the all-reduce of the copies'
  gradients between the first and the last stage (and T5's decoder-embedding stage;
  gradient_sync.py `tied_sync`): fixed cost too, read off the program; it starts when those
  stages' last instructions have ended, and their optimizer steps wait for it.

Tensor-parallel collectives, data-parallel gradient sync and ZeRO traffic are not in the
prediction: `LoweredExtras.from_program` refuses programs that have them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from trainsim.errors import SimulationError, SpecError
from trainsim.hwmodels.cluster import Cluster
from trainsim.search.energy.baselines import block_clocks, raise_clocks
from trainsim.search.energy.dag import InstructionDag
from trainsim.search.energy.replay import REPLAY_RTOL, ReplayCheck
from trainsim.simulator.engines import run_program
from trainsim.simulator.program import Program
from trainsim.simulator.result import SimResult
from trainsim.simulator.task import Task
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan

#: Task kinds `predict` accounts for; a lowered program with any other kind is refused.
MODELLED_KINDS: frozenset[str] = frozenset(
    {"forward", "backward", "recompute", "optimizer", "p2p"})
TIED_SYNC_NAME = "embedding.all_reduce"
"""The one collective `predict` accounts for (the tied embedding's, gradient_sync.py)."""

_P2P_NAME = re.compile(r"^s(\d+)>(\d+)\.([FB])(\d+)$")


def frequency_plan(dag: InstructionDag, freq_mhz: np.ndarray, plan: ParallelPlan
                   ) -> ParallelPlan:
    """`plan` with `instruction_freq_mhz` set to one clock per DAG node ("2F3": MHz)."""
    freq = np.asarray(freq_mhz, dtype=float)
    if len(freq) != dag.num_nodes:
        raise SpecError(f"frequency plan has {len(freq)} entries, expected one per "
                        f"instruction ({dag.num_nodes})")
    pairs = tuple((dag.label(i), float(freq[i])) for i in range(dag.num_nodes))
    return plan.replace(instruction_freq_mhz=pairs, freq_mhz=None, stage_freq_mhz=None)


def all_max_freq(dag: InstructionDag) -> np.ndarray:
    """Per node: the highest profiled clock of its instruction."""
    return dag.uniform_plan({k: dag.profile.max_freq_mhz(*k) for k in dag.block_keys})


@dataclass(frozen=True, kw_only=True, slots=True)
class LoweredExtras:
    """The fixed work `lower` adds to the instruction DAG (module docstring)."""

    edge_delay_s: dict[tuple[int, int], float]
    """(source node, destination node) -> transfer time on that cross-stage edge (s)."""
    step_time_s: np.ndarray
    """Per stage: optimizer step time (s); zeros without the step."""
    step_energy_j: np.ndarray
    """Per stage: optimizer step energy over the stage's GPUs (J)."""
    tied_sync: tuple[tuple[int, ...], float] | None = None
    """(the stages holding a copy, time s) of the tied embedding's all-reduce; None without."""

    @classmethod
    def none(cls, dag: InstructionDag) -> LoweredExtras:
        """No extra work (communication and the optimizer step switched off)."""
        z = np.zeros(dag.num_stages)
        return cls(edge_delay_s={}, step_time_s=z, step_energy_j=z.copy())

    @classmethod
    def from_program(cls, dag: InstructionDag, program: Program) -> LoweredExtras:
        """Read transfers and optimizer steps off a folded program `lower` emitted for the
        DAG's plan (any clocks: neither depends on them).

        Raises:
            SpecError: the program is unfolded or has work `predict` does not model.
        """
        if program.num_ranks != dag.num_stages:
            raise SpecError(f"program has {program.num_ranks} ranks for {dag.num_stages} "
                            "stages: predict needs the folded lowering (one rank per stage)")
        bw = program.link_bandwidth_bytes_per_s
        index = {(int(dag.stage[i]), "FB"[int(dag.kind[i])], int(dag.micro_batch[i])): i
                 for i in range(dag.num_nodes)}
        delay: dict[tuple[int, int], float] = {}
        step_t = np.zeros(dag.num_stages)
        step_e = np.zeros(dag.num_stages)
        tied: tuple[tuple[int, ...], float] | None = None
        for task in program.tasks:
            if task.name == TIED_SYNC_NAME and len(task.ranks) >= 2:
                stages: tuple[int, ...] = ()
                took = 0.0
                if tied is not None:
                    stages, took = tied
                tied = (tuple(sorted({*stages, *task.ranks})), took + _alone_s(task, bw))
                continue
            if task.kind == "wait" and task.duration_s == 0.0:
                continue  # a zero-length marker (an allocation, a stream hold): no time
            if task.kind not in MODELLED_KINDS:
                raise SpecError(f"lowered program has {task.kind!r} task {task.name!r}: the "
                                f"energy prediction models only {sorted(MODELLED_KINDS)} "
                                "(use tp=1, dp=1 or LoweringOptions(communication=False))")
            if task.kind == "optimizer":
                rank = task.ranks[0]
                step_t[rank] += task.duration_s
                step_e[rank] += task.power_w * task.duration_s * len(program.represents[rank])
            elif task.kind == "p2p":
                match = _P2P_NAME.match(task.name)
                if match is None:
                    raise SpecError(f"unexpected transfer name {task.name!r}")
                k, dst, direction, j = (int(match[1]), int(match[2]), match[3], int(match[4]))
                edge = (index[(k, direction, j)], index[(dst, direction, j)])
                delay[edge] = delay.get(edge, 0.0) + _alone_s(task, bw)
        return cls(edge_delay_s=delay, step_time_s=step_t, step_energy_j=step_e,
                   tied_sync=tied)


def _alone_s(task: Task, bandwidth: Mapping[str, float]) -> float:
    """A transfer's time with its links to itself: latency + bytes / bottleneck bandwidth."""
    if not task.links or task.comm_bytes <= 0:
        return float(task.duration_s)
    return float(task.duration_s + task.comm_bytes / min(bandwidth[lid] for lid in task.links))


def _finish(dag: InstructionDag, t: np.ndarray, extras: LoweredExtras) -> np.ndarray:
    """Earliest finish per node with transfer delays on cross-stage edges."""
    finish = np.zeros(dag.num_nodes)
    for i in range(dag.num_nodes):
        start = 0.0
        for q in dag.pred_idx[dag.pred_ptr[i]:dag.pred_ptr[i + 1]]:
            start = max(start, finish[q] + extras.edge_delay_s.get((int(q), i), 0.0))
        finish[i] = start + t[i]
    return finish


def _stage_ends(dag: InstructionDag, finish: np.ndarray, extras: LoweredExtras
                ) -> list[float]:
    """Per stage: when its optimizer step ends (after the tied all-reduce where it has one)."""
    last = [float(finish[order[-1]]) for order in dag.stage_order]
    if extras.tied_sync is not None:
        stages, took = extras.tied_sync
        end = max(last[s] for s in stages) + took
        for s in stages:
            last[s] = end
    return [end + float(extras.step_time_s[s]) for s, end in enumerate(last)]


def _latest_last(extras: LoweredExtras, horizon: float, s: int) -> float:
    """The latest a stage's last instruction may end for its step to end by `horizon`."""
    if extras.tied_sync is not None and s in extras.tied_sync[0]:
        stages, took = extras.tied_sync
        return horizon - max(extras.step_time_s[t] for t in stages) - took
    return horizon - extras.step_time_s[s]


def predict(dag: InstructionDag, freq_mhz: np.ndarray, extras: LoweredExtras
            ) -> tuple[float, float]:
    """(iteration time s, energy J) of a plan with the lowering's fixed work added.

    Longest path with transfer delays on cross-stage edges; each rank ends with its
    optimizer step after its last instruction; energy = Σ instruction + step energy +
    P_block · (N·T − Σ busy time), the engine's rule (simulator/program.py, Energy).
    """
    t, e = dag.node_time_energy(np.asarray(freq_mhz, dtype=float))
    finish = _finish(dag, t, extras)
    ends = _stage_ends(dag, finish, extras)
    time_s = float(max(ends))
    busy = float(t.sum() + extras.step_time_s.sum())
    energy = float(e.sum() + extras.step_energy_j.sum()
                   + dag.profile.blocking_power_w * (dag.num_stages * time_s - busy))
    return time_s, energy


def tighten(dag: InstructionDag, freq_mhz: np.ndarray, deadline_s: float,
            extras: LoweredExtras) -> np.ndarray:
    """Raise clocks on the critical path *with the lowering's fixed work* until the plan's
    `predict` time is at most `deadline_s` (or every critical instruction is at its top clock).

    The instruction DAG's frontier ignores transfer delays, so a plan tying the all-max time
    there can be a little slower once lowered; this is `baselines.tighten` with the
    slack computed on the DAG plus transfers and optimizer steps.
    """
    freq = np.array(freq_mhz, dtype=float)
    clocks = block_clocks(dag)
    succ: list[list[int]] = [[] for _ in range(dag.num_nodes)]
    for i in range(dag.num_nodes):
        for q in dag.pred_idx[dag.pred_ptr[i]:dag.pred_ptr[i + 1]]:
            succ[int(q)].append(i)
    last = {order[-1]: s for s, order in enumerate(dag.stage_order)}
    tol = 1e-12 * max(1.0, deadline_s)
    for _ in range(sum(len(c) for c in clocks) + 1):
        t, _ = dag.node_time_energy(freq)
        finish = _finish(dag, t, extras)
        horizon = max(_stage_ends(dag, finish, extras))
        if horizon <= deadline_s + tol:
            break
        latest = np.full(dag.num_nodes, np.inf)
        for i in range(dag.num_nodes - 1, -1, -1):
            if i in last:
                latest[i] = _latest_last(extras, horizon, last[i])
            for j in succ[i]:
                latest[i] = min(latest[i], latest[j] - t[j]
                                - extras.edge_delay_s.get((i, j), 0.0))
        if not raise_clocks(dag, freq, np.flatnonzero(latest - finish <= tol), clocks):
            break
    return freq


def no_slowdown(dag: InstructionDag, candidates: list[np.ndarray], extras: LoweredExtras
                ) -> np.ndarray:
    """The lowest-`predict`-energy plan no slower than all-max once lowered: each candidate
    (frontier plans, fastest first) as is and tightened to the all-max time; all-max itself
    when none is cheaper."""
    top = all_max_freq(dag)
    t_top, e_best = predict(dag, top, extras)
    best = top
    for freq in candidates:
        for f in (np.asarray(freq, dtype=float), tighten(dag, freq, t_top, extras)):
            t, e = predict(dag, f, extras)
            if t <= t_top * (1 + 1e-12) and e < e_best:
                best, e_best = f, e
    return best


def replay_lowered(dag: InstructionDag, freq_mhz: np.ndarray, model: ModelSpec,
                   cluster: Cluster, plan: ParallelPlan, *,
                   options: LoweringOptions | None = None, extras: LoweredExtras | None = None,
                   engine: str = "numba", rtol: float = REPLAY_RTOL,
                   check: bool = True) -> tuple[ReplayCheck, SimResult]:
    """Lower `plan` with the frequency plan as `instruction_freq_mhz`, run it, compare.

    `extras` default: none when `options` switch communication and the optimizer step off,
    else read off the all-max lowering of `plan` (`LoweredExtras.from_program`).

    Raises:
        SimulationError: with `check`, when simulated and predicted differ by more than rtol.
    """
    opts = options or LoweringOptions()
    if extras is None:
        if not opts.communication and not opts.optimizer_step:
            extras = LoweredExtras.none(dag)
        else:
            top = lower(model, cluster, frequency_plan(dag, all_max_freq(dag), plan), opts)
            extras = LoweredExtras.from_program(dag, top)
    time_s, energy_j = predict(dag, freq_mhz, extras)
    program = lower(model, cluster, frequency_plan(dag, freq_mhz, plan), opts)
    result = run_program(program, engine=engine)
    out = ReplayCheck(predicted_time_s=time_s, predicted_energy_j=energy_j,
                      replayed_time_s=float(result.iteration_time_s),
                      replayed_energy_j=float(result.energy_j))
    if check and not (abs(out.replayed_time_s - time_s) <= rtol * time_s
                      and abs(out.replayed_energy_j - energy_j) <= rtol * energy_j):
        raise SimulationError(
            f"lowered plan simulates to ({out.replayed_time_s:.9g} s, "
            f"{out.replayed_energy_j:.9g} J), the planner predicted ({time_s:.9g} s, "
            f"{energy_j:.9g} J): beyond rtol={rtol:g}")
    return out, result
