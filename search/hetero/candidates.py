"""Candidate plans on a heterogeneous cluster, each with an estimate and a proven lower bound.

A candidate is a full plan: degrees, micro-batch size, recompute, node order (which GPU types
each stage and replica get), layer partition and batch split. Building one costs no lowering:
the stage and replica GPU types follow from the node order (Megatron's layout, tp innermost,
then dp, then pp; layout.py), and stage times are sums of block costs (block_costs.py).

Each candidate carries two figures:
* `estimate_s` ranks candidates (1F1B: sum of stage times + (m-1) x the slowest, with the
  tensor-parallel collectives estimated) -- the planner asks the Oracle in this order;
* `bound_s` is a lower bound on the engine's iteration time: on every replica, the compute
  stream of stage b cannot start before micro-batch 0 has crossed stages 0..b-1 forward, must
  then run all its m forward/backward passes one at a time, and (1F1B, whose last pass on a
  stage is a full backward) micro-batch m-1's backward must still cross stages b-1..0. It counts compute only (no collective, transfer or
  optimizer step), so the engine can only take longer; the planner skips every candidate
  whose bound is not below the best time found (branch and bound), and a test checks the
  bound against the engine on random plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainsim.hwmodels.cluster import Cluster
from trainsim.search.bound import pipeline_bound
from trainsim.search.hetero.block_costs import BlockCosts, BlockCostTable
from trainsim.search.hetero.partition import (
    exact_partition,
    minmax_partition,
    stage_times,
    uniform_counts,
)
from trainsim.search.hetero.space import node_kinds
from trainsim.workloads.framework import FrameworkProfile
from trainsim.workloads.stage_costs import state_bytes_per_param


@dataclass(frozen=True, kw_only=True, slots=True)
class Degrees:
    """One point of the degree grid."""

    dp: int
    tp: int
    pp: int
    micro_batch_size: int
    recompute: str
    schedule: str = "1f1b"


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A complete plan proposal with its ranking estimate and lower bound."""

    fields: dict[str, Any]
    """ParallelPlan fields."""
    note: str
    """What it is, for the search log."""
    estimate_s: float
    """Ranking estimate of the iteration time."""
    bound_s: float
    """Proven lower bound on the engine's iteration time."""


class Layout:
    """GPU types of each stage and replica for one node order and degrees."""

    def __init__(self, cluster: Cluster, order: tuple[int, ...], deg: Degrees) -> None:
        starts, first = [], 0
        for g in cluster.node_groups:
            for _ in range(g.nodes):
                starts.append((first, g.gpus_per_node))
                first += g.gpus_per_node
        kinds = node_kinds(cluster)
        ranks = [(r, n) for n in order for r in range(starts[n][0], starts[n][0] + starts[n][1])]
        per = deg.dp * deg.tp
        firsts = [[ranks[s * per + d * deg.tp] for d in range(deg.dp)] for s in range(deg.pp)]
        self.types = [[cluster.gpu(r).name for r, _ in row] for row in firsts]
        """types[s][d]: GPU type of replica d on stage s (a tp group lies in one node)."""
        self.kinds = tuple(tuple(kinds[n] for _, n in row) for row in firsts)
        """kinds[s][d]: the node kind (GPU, node type, NICs) of replica d on stage s: two
        orders with the same kinds build the same program."""

    def replica_types(self) -> list[tuple[str, ...]]:
        """Each replica's GPU type per stage."""
        return [tuple(self.types[s][d] for s in range(len(self.types)))
                for d in range(len(self.types[0]))]


SCHEDULES = ("1f1b", "zb-h1")
"""The pipeline schedules the candidates are sized and bounded for (canonical names)."""


def zero_bubble(schedule: str) -> bool:
    """Whether `schedule` (one of SCHEDULES) splits the backward into I and W passes."""
    return schedule == "zb-h1"


def held_micro_batches(schedule: str, pp: int, m: int) -> tuple[list[int], list[int]]:
    """Per stage at its memory peak: micro-batches holding their activations, and how many of
    them also hold the backward's working set (recomputed activations, allocated at I or B
    and freed with the activations). 1F1B: p - s and 1. ZB-H1 holds p on every rank until
    their W (simulator/schedules.py `zb_h1`), and rank s starts its W passes after s + 1 I
    passes, so s + 1 working sets."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: candidates are sized for {SCHEDULES}")
    if zero_bubble(schedule):
        return [min(m, pp)] * pp, [min(m, s + 1) for s in range(pp)]
    return [min(m, pp - s) for s in range(pp)], [1] * pp


def _fits(costs: list[BlockCosts], caps: list[float], inflight: list[int],
          static_scale: float = 1.0, working_sets: list[int] | None = None,
          split_backward: bool = False) -> list[np.ndarray]:
    """Per stage: fits[k][i, j] when blocks i..j-1 fit stage k's memory (estimate);
    `inflight`: micro-batches whose activations a stage holds at its peak; `working_sets`:
    how many of them also hold the backward's working set, 1 when None: the largest block's
    (one layer recomputed at a time), or with `split_backward` (I, then W later) every
    block's recomputed activations together, at least the largest block's; `static_scale`:
    the share of the blocks' weight, gradient and optimizer bytes a GPU keeps (below 1
    under a distributed optimizer)."""
    out = []
    sets = working_sets or [1] * len(costs)
    for c, cap, q, w in zip(costs, caps, inflight, sets):
        ps, pk = c.sums["static"] * static_scale, c.sums["kept"]
        working = c.extra_max
        if split_backward:
            pr = c.sums["recomputed"]
            working = np.maximum(working, pr[None, :] - pr[:, None])
        need = (ps[None, :] - ps[:, None]) + q * (pk[None, :] - pk[:, None]) + w * working
        out.append(need <= cap)
    return out


class CandidateBuilder:
    """Turns (degrees, node order) into candidates for one planner mode."""

    def __init__(self, table: BlockCostTable, cluster: Cluster, global_batch: int, *,
                 memory_limit_bytes: float | None,
                 framework: FrameworkProfile | None = None) -> None:
        self.table, self.cluster, self.batch = table, cluster, global_batch
        self.framework = framework
        """The stack the Oracle plans for (its plan defaults: `_framework_terms`)."""
        self._terms: dict[tuple[int, int], tuple[bool, float]] = {}
        self._partitions: dict[tuple[object, ...], tuple[int, ...] | None] = {}
        self.memory = {g.gpu.name: float(g.gpu.memory_bytes) for g in cluster.node_groups}
        if memory_limit_bytes is not None:
            self.memory = {k: min(v, memory_limit_bytes) for k, v in self.memory.items()}

    def _framework_terms(self, deg: Degrees) -> tuple[bool, float]:
        """(sp, static scale) of these degrees as the Oracle runs them under the framework's
        plan defaults: sequence parallelism (on with tp > 1 for NeMo and torchtitan), and the
        share of a stage's static bytes one GPU keeps -- all of them, or under its distributed
        optimizer (ZeRO-1) the weights and gradients and 1/dp of the optimizer states."""
        key = (deg.dp, deg.tp)
        found = self._terms.get(key)
        if found is None:
            sp, scale = False, 1.0
            if self.framework is not None:
                model = self.table.model
                defaults = self.framework.plan_defaults({"dp": deg.dp, "tp": deg.tp},
                                                        model.family)
                sp = bool(defaults.get("sp", False))
                if defaults.get("zero") == 1:
                    w, g, o = state_bytes_per_param(self.table.dtype, model.grad_buffer,
                                                    model.grad_reduce_dtype)
                    scale = (w + g + o / deg.dp) / (w + g + o)
            found = self._terms[key] = (sp, scale)
        return found

    def _slowest(self, types: list[str], deg: Degrees) -> str:
        return max(set(types), key=lambda t: (self.table.costs(
            t, deg.tp, deg.micro_batch_size, deg.recompute,
            self._framework_terms(deg)[0]).compute_s.sum(), t))

    def build(self, deg: Degrees, order: tuple[int, ...], mode: str,
              order_note: str) -> list[Candidate]:
        """Candidates of `mode` ("uniform", "fasop" or "exact") for these degrees and order:
        uniform and fasop give one; exact gives its DP partition plus the FASOP and uniform
        ones (so it never searches less than they do), each with an even and, when replicas
        differ, a speed-proportional batch split."""
        lay = Layout(self.cluster, order, deg)
        L, pp, mbs = self.table.num_blocks, deg.pp, deg.micro_batch_size
        m = self.batch // (deg.dp * mbs)
        stage_type = [self._slowest(lay.types[s], deg) for s in range(pp)]
        sp, scale = self._framework_terms(deg)
        costs = [self.table.costs(t, deg.tp, mbs, deg.recompute, sp) for t in stage_type]
        prefix = [c.sums["estimate"] for c in costs]
        partitions: list[tuple[tuple[int, ...], str]] = []
        if mode == "uniform":
            partitions.append((uniform_counts(L, pp), "uniform"))
        elif mode == "fasop":
            partitions.append((minmax_partition(prefix, L), "min-max"))
        else:
            zb = zero_bubble(deg.schedule)
            inflight, working = held_micro_batches(deg.schedule, pp, m)
            caps = [min(self.memory[t] for t in set(lay.types[s])) for s in range(pp)]
            key = (tuple(stage_type), tuple(caps), deg.tp, mbs, deg.recompute, m, zb, scale)
            if key not in self._partitions:  # other orders giving the stages the same types
                self._partitions[key] = exact_partition(
                    prefix, L, m, _fits(costs, caps, inflight, scale, working, zb))
            exact = self._partitions[key]
            if exact is not None:
                partitions.append((exact, "exact"))
            partitions += [(minmax_partition(prefix, L), "min-max"),
                           (uniform_counts(L, pp), "uniform")]
        out, seen = [], set()
        for counts, how in partitions:
            if counts in seen:
                continue
            seen.add(counts)
            splits: list[tuple[int, ...] | None] = [None]
            if mode == "exact":
                split = self._split(lay, deg, counts)
                if split is not None:
                    splits.append(split)
            for split in splits:
                out.append(self._candidate(deg, order, lay, counts, split,
                                           f"{how} partition, {order_note}"))
        return out

    def _replica_times(self, lay: Layout, deg: Degrees, counts: tuple[int, ...],
                       what: str) -> list[list[float]]:
        """Per replica, per stage: "estimate" (compute + tp collectives), "compute" or
        "weight" (the W passes) time of one micro-batch."""
        done: dict[tuple[str, ...], list[float]] = {}
        out = []
        for types in lay.replica_types():
            if types not in done:
                cs = [self.table.costs(t, deg.tp, deg.micro_batch_size, deg.recompute,
                                       self._framework_terms(deg)[0])
                      for t in types]
                done[types] = stage_times([c.sums[what] for c in cs], counts)
            out.append(done[types])
        return out

    def _split(self, lay: Layout, deg: Degrees, counts: tuple[int, ...]
               ) -> tuple[int, ...] | None:
        """Samples per replica in proportion to its speed (whole micro-batches, at least
        one each), or None when the replicas are alike or the split is the even one."""
        if deg.dp == 1 or len(set(lay.replica_types())) == 1:
            return None
        mbs = deg.micro_batch_size
        units = self.batch // mbs
        speed = [1.0 / max(t) for t in self._replica_times(lay, deg, counts, "estimate")]
        share = [max(1, int(units * s / sum(speed))) for s in speed]
        while sum(share) < units:  # give the rest to the replica that would finish first
            d = min(range(len(share)), key=lambda i: ((share[i] + 1) / speed[i], i))
            share[d] += 1
        while sum(share) > units:
            d = max(range(len(share)), key=lambda i: (share[i] / speed[i], i))
            share[d] -= 1
        if len(set(share)) == 1 or min(share) < 1:
            return None
        return tuple(s * mbs for s in share)

    def _candidate(self, deg: Degrees, order: tuple[int, ...], lay: Layout,
                   counts: tuple[int, ...], split: tuple[int, ...] | None,
                   note: str) -> Candidate:
        mbs = deg.micro_batch_size
        per_replica = ([n // mbs for n in split] if split is not None
                       else [self.batch // (deg.dp * mbs)] * deg.dp)
        est, bound = 0.0, 0.0
        zb = zero_bubble(deg.schedule)
        for m, t_est, t_cmp, t_w, t_f in zip(per_replica,
                                             self._replica_times(lay, deg, counts, "estimate"),
                                             self._replica_times(lay, deg, counts, "compute"),
                                             self._replica_times(lay, deg, counts, "weight"),
                                             self._replica_times(lay, deg, counts, "forward")):
            # 1F1B: micro-batch 0 crosses every stage, the slowest stage runs the other m-1;
            # a zero-bubble schedule takes the first crossing's W passes off that path
            first = sum(t_est) - (sum(t_w) if zb else 0.0)
            est = max(est, first + (m - 1) * max(t_est))
            bound = max(bound, pipeline_bound(t_cmp, t_f, m,
                                              full_backward_last=not zb))
        fields: dict[str, Any] = {
            "dp": deg.dp, "tp": deg.tp, "pp": deg.pp, "micro_batch_size": mbs,
            "global_batch": self.batch, "recompute": deg.recompute, "schedule": deg.schedule,
            "stage_layers": list(counts) if deg.pp > 1 else None,
            "node_order": list(order)}
        if split is not None:
            fields["dp_batch_split"] = list(split)
        label = (f"dp={deg.dp} tp={deg.tp} pp={deg.pp} mbs={mbs} rc={deg.recompute} "
                 f"{deg.schedule} "
                 f"layers={'/'.join(map(str, counts))}"
                 + (f" split={'/'.join(map(str, split))}" if split else "") + f" ({note})")
        return Candidate(fields=fields, note=label, estimate_s=est, bound_s=bound)


__all__ = ["Candidate", "CandidateBuilder", "Degrees", "Layout"]
