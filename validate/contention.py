"""Worker processes sharing a CPU: op times between "alone" and "all at once".

When the worker processes of a run share CPU time — fewer free cores than workers, other jobs
on the machine, or hyperthreads of one core — an op runs slower while another process computes
than while the others wait (gloo's waits sleep, they do not spin). On the CI machine kind with
other jobs running, two processes timing the same GEMM at once each took about twice as long
as one alone (traces/README.md has the figures). The simulator gives every rank its own
device, so an op's time must already say how busy the other processes are:

* data and tensor parallelism keep every process computing all the time, which is how the
  profile's ``time_s`` was measured (all processes timing at once);
* a pipeline's stages compute at the same time only part of the iteration (warm-up, cool-down
  and the bubbles of 1F1B), and while one stage waits the other runs at its ``solo_s`` speed.

`blend` therefore treats each compute task's duration as

    d_i = solo_i + φ_i · (pair_i − solo_i),

where φ_i is the fraction of the task's interval during which another process computes — a
linear processor-sharing model (the rate a task gets is that of "alone" or "all at once" in
proportion to the time spent in each state). φ depends on the timeline, which depends on the
durations, so the simulation is repeated to a fixed point (damped: d ← ½d + ½d_new, at most
`MAX_ROUNDS` rounds, until no duration moves by more than `TOLERANCE` relative). A program rank
that stands for several processes (folded data/tensor-parallel twins) always has φ = 1: its
twins compute the same task at the same instant.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainsim.simulator.engines import run_program
from trainsim.workloads.lowering.gradient_sync import GRAD_COPY_STREAMS

MAX_ROUNDS = 40
"""Upper bound on fixed-point rounds (pp2 converges in about 10)."""
TOLERANCE = 1e-4
"""Largest relative change of any duration at which the fixed point is taken as reached."""
DAMPING = 0.5
"""Weight of the previous round's durations (damps the oscillation of a two-stage pipeline)."""
COMPUTE_STREAMS = ("compute", *GRAD_COPY_STREAMS)
"""Streams whose tasks occupy a CPU: the compute stream and the gradient copies (communication
streams wait in gloo, asleep); `sim validate` counts the rest of a rank's time as comm."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Blend:
    """What `blend` did: the blended program's result and each rank's mean overlap."""

    result: Any
    """SimResult of the program with blended durations."""
    overlap: tuple[float, ...]
    """Per program rank: φ averaged over its compute tasks, weighted by their all-at-once
    durations (1 = always alongside another process, 0 = always alone)."""
    rounds: int
    """Simulations run."""


def _durations(program: Any) -> np.ndarray:
    return np.array([t.duration_s for t in program.tasks], dtype=float)


def _with_durations(program: Any, durations: np.ndarray) -> Any:
    tasks = [dataclasses.replace(t, duration_s=float(d))
             for t, d in zip(program.tasks, durations, strict=True)]
    return dataclasses.replace(program, tasks=tasks)


def overlap_fractions(tasks: Any, num_tasks: int, shared: set[int]) -> np.ndarray:
    """φ per task id: share of a compute task's interval covered by other ranks' compute
    (1 for ranks in `shared`, which stand for several processes; 0 for other streams).

    Args:
        tasks: The SimResult's task table (task_id, rank, stream, start_s, end_s).
        num_tasks: Tasks in the program.
        shared: Program ranks that stand for more than one process.
    """
    phi = np.zeros(num_tasks)
    rows = tasks[tasks["stream"].isin(COMPUTE_STREAMS)]
    by_rank = {int(r): g.sort_values("start_s")[["start_s", "end_s"]].to_numpy()
               for r, g in rows.groupby("rank")}
    for tid, rank, start, end in rows[["task_id", "rank", "start_s", "end_s"]].itertuples(
            index=False):
        if int(rank) in shared:
            phi[int(tid)] = 1.0
            continue
        length = end - start
        if length <= 0:
            continue
        others = [iv for r, ivs in by_rank.items() if r != int(rank) for iv in ivs]
        covered, last = 0.0, start
        for a, b in sorted((max(a, start), min(b, end)) for a, b in others if a < end and b > start):
            if b > last:
                covered += b - max(a, last)
                last = b
        phi[int(tid)] = covered / length
    return phi


def blend(pair: Any, solo: Any, *, engine: str = "numba") -> Blend:
    """Simulate `pair` (durations timed all at once) with each compute task moved toward its
    `solo` duration by the time it spends alone (module docstring).

    `pair` and `solo` must be the same lowering under the two cost models (same tasks in the
    same order); where they are not, `pair` is simulated unchanged.
    """

    d_pair, d_solo = _durations(pair), _durations(solo)
    same = len(d_pair) == len(d_solo) and all(
        a.name == b.name and a.ranks == b.ranks for a, b in zip(pair.tasks, solo.tasks,
                                                                strict=True))
    represents = list(getattr(pair, "represents", ()) or ())
    shared = {r for r, group in enumerate(represents) if len(group) > 1}
    if not same or pair.num_ranks < 2:
        result = run_program(pair, engine=engine)
        phi = overlap_fractions(result.tasks, len(d_pair), shared | set(range(pair.num_ranks)))
        return Blend(result=result, overlap=_mean_overlap(result.tasks, phi, d_pair,
                                                          pair.num_ranks), rounds=1)
    d = d_pair.copy()
    rounds = 0
    while True:
        rounds += 1
        result = run_program(_with_durations(pair, d), engine=engine)
        phi = overlap_fractions(result.tasks, len(d), shared)
        compute = np.zeros(len(d), dtype=bool)
        rows = result.tasks[result.tasks["stream"].isin(COMPUTE_STREAMS)]
        compute[rows["task_id"].to_numpy(dtype=int)] = True
        target = np.where(compute, d_solo + phi * (d_pair - d_solo), d_pair)
        change = np.max(np.abs(target - d) / np.maximum(d, 1e-12)) if len(d) else 0.0
        if change <= TOLERANCE or rounds >= MAX_ROUNDS:
            break
        d = DAMPING * d + (1.0 - DAMPING) * target
    return Blend(result=result, overlap=_mean_overlap(result.tasks, phi, d_pair, pair.num_ranks),
                 rounds=rounds)


def _mean_overlap(tasks: Any, phi: np.ndarray, weights: np.ndarray, ranks: int
                  ) -> tuple[float, ...]:
    rows = tasks[tasks["stream"].isin(COMPUTE_STREAMS)]
    out = []
    for r in range(ranks):
        ids = rows[rows["rank"] == r]["task_id"].to_numpy(dtype=int)
        w = weights[ids]
        out.append(float(np.sum(phi[ids] * w) / np.sum(w)) if len(ids) and np.sum(w) > 0
                   else 1.0)
    return tuple(out)
