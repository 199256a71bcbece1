"""The instruction DAG of a 1F1B pipeline iteration, with per-frequency options per node.

Nodes are pipeline instructions (stage, kind, micro-batch) in trainsim's 1F1B order
(`simulator.schedules.one_f_one_b`, Narayanan et al. SC'21 §2.2.1, which is also the order of
Perseus's `Synchronous1F1B`). Edges (Perseus §4.2, Fig. 5): each stage runs its instructions in
order (one GPU, one compute stream), F(s, j) → F(s+1, j), and B(s+1, j) → B(s, j); the last
stage's F(p−1, j) → B(p−1, j) is its stream order. Communication is not modelled (as in
Perseus's emulation): the iteration time is the longest path.

Iteration energy of a plan (choice of option k_i per node i), Perseus §3 with blocking power:

    E = Σ_i E_i(k_i) + P_block · (N · T − Σ_i t_i(k_i))

for N stages (one GPU each, the profile's per-GPU energy) and T the longest path: every rank
draws blocking power whenever it is not computing, up to the iteration's end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainsim.errors import SpecError
from trainsim.search.energy.kernels import finish_times_kernel
from trainsim.search.energy.profile import INSTRUCTIONS, EnergyProfile
from trainsim.simulator.schedules import one_f_one_b

_KIND_NAME = {"F": "forward", "B": "backward"}


@dataclass(frozen=True, kw_only=True, slots=True)
class InstructionDag:
    """A 1F1B instruction DAG in topological order, with options per node.

    Options of node i are `opt_time_s[opt_ptr[i]:opt_ptr[i+1]]` (likewise energy and frequency),
    fastest first; nodes of the same (stage, kind) share one option block.
    """

    profile: EnergyProfile
    num_stages: int
    num_micro_batches: int
    stage: np.ndarray
    """Per node: pipeline stage (= rank)."""
    kind: np.ndarray
    """Per node: 0 forward, 1 backward."""
    micro_batch: np.ndarray
    """Per node: micro-batch index."""
    pred_ptr: np.ndarray
    pred_idx: np.ndarray
    """Predecessors of node i: pred_idx[pred_ptr[i]:pred_ptr[i+1]] (CSR; all < i)."""
    block: np.ndarray
    """Per node: index of its (stage, kind) option block."""
    block_keys: tuple[tuple[int, str], ...]
    """(stage, instruction) of each block."""
    stage_order: tuple[tuple[int, ...], ...]
    """Per stage: its nodes in execution order."""

    @property
    def num_nodes(self) -> int:
        """Number of instructions."""
        return len(self.stage)

    def label(self, i: int) -> str:
        """Action string of node i, e.g. "2F3"."""
        return f"{int(self.stage[i])}{'FB'[int(self.kind[i])]}{int(self.micro_batch[i])}"

    def shortest_s(self) -> float:
        """The shortest instruction's time at its fastest clock (what a quantum must resolve)."""
        return min((float(self.options(b)[1].min()) for b in range(len(self.block_keys))),
                   default=0.0)

    def options(self, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(freq_mhz, time_s, energy_j) of one block, fastest clock first."""
        o = self.profile.options[self.block_keys[block]]
        return o.freq_mhz, o.time_s, o.energy_j

    def longest_path(self, durations: np.ndarray) -> float:
        """Makespan for per-node durations (any numeric dtype)."""
        return float(_longest_path(durations, self.pred_ptr, self.pred_idx).max(initial=0))

    def finish_times(self, durations: np.ndarray) -> np.ndarray:
        """Earliest finish time of every node."""
        return _longest_path(durations, self.pred_ptr, self.pred_idx)

    def evaluate(self, freq_mhz: np.ndarray) -> tuple[float, float]:
        """(iteration time s, iteration energy J) of a per-node frequency plan (module formula)."""
        t, e = self.node_time_energy(freq_mhz)
        time_s = self.longest_path(t)
        p_block = self.profile.blocking_power_w
        return time_s, float(e.sum() + p_block * (self.num_stages * time_s - t.sum()))

    def node_time_energy(self, freq_mhz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-node time and energy at the given per-node clocks."""
        if len(freq_mhz) != self.num_nodes:
            raise SpecError(f"frequency plan has {len(freq_mhz)} entries, expected one per "
                            f"instruction ({self.num_nodes})")
        t = np.empty(self.num_nodes)
        e = np.empty(self.num_nodes)
        cache: dict[tuple[int, float], tuple[float, float]] = {}
        for i in range(self.num_nodes):
            key = (int(self.block[i]), float(freq_mhz[i]))
            if key not in cache:
                cache[key] = self.profile.options[self.block_keys[key[0]]].at(key[1])
            t[i], e[i] = cache[key]
        return t, e

    def uniform_plan(self, pick: dict[tuple[int, str], float]) -> np.ndarray:
        """Per-node clocks from one clock per (stage, instruction)."""
        return np.array([pick[self.block_keys[int(b)]] for b in self.block], dtype=float)


def _longest_path(durations: np.ndarray, pred_ptr: np.ndarray, pred_idx: np.ndarray
                  ) -> np.ndarray:
    """Earliest finish per node (nodes are in topological order); compiled kernel."""
    return finish_times_kernel(np.asarray(durations, dtype=np.float64), pred_ptr, pred_idx)


def build_dag(profile: EnergyProfile, num_micro_batches: int) -> InstructionDag:
    """The 1F1B instruction DAG of `profile.num_stages` stages and `num_micro_batches`.

    Raises:
        SpecError: num_micro_batches < 1.
    """
    if isinstance(num_micro_batches, bool) or not isinstance(num_micro_batches, int) \
            or num_micro_batches < 1:
        raise SpecError(f"num_micro_batches={num_micro_batches!r} must be an integer >= 1")
    p, m = profile.num_stages, num_micro_batches
    order = one_f_one_b(p, m)
    # Topological numbering: repeatedly take, round-robin over stages, the next action whose
    # cross-stage predecessor is numbered (1F1B is deadlock-free, so this terminates).
    index: dict[tuple[int, str, int], int] = {}
    heads = [0] * p
    seq = {s: [a for a in order[s] if a is not None] for s in range(p)}
    nodes: list[tuple[int, str, int]] = []
    while len(nodes) < 2 * p * m:
        progressed = False
        for s in range(p):
            while heads[s] < len(seq[s]):
                a = seq[s][heads[s]]
                dep = (s - 1, "F", a.micro_batch) if a.kind == "F" else (s + 1, "B", a.micro_batch)
                if 0 <= dep[0] < p and dep not in index:
                    break
                key = (s, a.kind, a.micro_batch)
                index[key] = len(nodes)
                nodes.append(key)
                heads[s] += 1
                progressed = True
        if not progressed:  # pragma: no cover - 1F1B never deadlocks
            raise SpecError("1F1B order deadlocked while building the instruction DAG")
    preds: list[list[int]] = [[] for _ in nodes]
    for s in range(p):
        for a, b in zip(seq[s], seq[s][1:]):
            preds[index[(s, b.kind, b.micro_batch)]].append(index[(s, a.kind, a.micro_batch)])
    for (s, kind, j), i in index.items():
        dep = (s - 1, "F", j) if kind == "F" else (s + 1, "B", j)
        if 0 <= dep[0] < p:
            preds[i].append(index[dep])
    pred_ptr = np.zeros(len(nodes) + 1, dtype=np.int64)
    pred_ptr[1:] = np.cumsum([len(x) for x in preds])
    pred_idx = np.array([q for x in preds for q in sorted(x)], dtype=np.int64)
    block_keys = tuple((s, inst) for s in range(p) for inst in INSTRUCTIONS)
    block_of = {k: b for b, k in enumerate(block_keys)}
    return InstructionDag(
        profile=profile, num_stages=p, num_micro_batches=m,
        stage=np.array([n[0] for n in nodes], dtype=np.int64),
        kind=np.array([0 if n[1] == "F" else 1 for n in nodes], dtype=np.int64),
        micro_batch=np.array([n[2] for n in nodes], dtype=np.int64),
        pred_ptr=pred_ptr, pred_idx=pred_idx,
        block=np.array([block_of[(n[0], _KIND_NAME[n[1]])] for n in nodes], dtype=np.int64),
        block_keys=block_keys,
        stage_order=tuple(tuple(index[(s, a.kind, a.micro_batch)] for a in seq[s])
                          for s in range(p)),
    )
