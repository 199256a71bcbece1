"""A proven lower bound on a pipeline plan's simulated iteration time, from compute alone.

On every data-parallel replica, the compute stream of pipeline rank r runs its passes one at a
time, so the iteration lasts at least

    (forward of micro-batch 0 over the stages before r) + m x (rank r's work per micro-batch)
    [+ (backward of micro-batch m-1 over the stages before r), 1F1B only]

for every r: rank r cannot start before micro-batch 0 reaches it, and under 1F1B its last pass
is a full backward that the stages before it must still carry back (a zero-bubble or
interleaved rank may end on other work while they do, so it gets no tail). Collectives,
transfers and the optimizer step only add time, so the engine's iteration time is never below
it; planners skip a candidate whose bound is not below the best time found (branch and bound),
and tests check the bound against the engine on random plans.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainsim.hwmodels.cluster import Cluster
from trainsim.workloads.lowering import LoweringOptions, stage_layout
from trainsim.workloads.lowering.cache import LoweringCache
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan

BOUNDED_SCHEDULES = ("1f1b", "interleaved")
"""Schedules `plan_bound` covers: 1F1B (PipeDream-flush) and Megatron's interleaved 1F1B."""

SLACK = 1e-9
"""Relative slack under the bound: the engine sums the same floats in another order."""


def pipeline_bound(work: Sequence[float], forward: Sequence[float], micro_batches: int, *,
                   full_backward_last: bool, crossing: Sequence[float] | None = None) -> float:
    """Lower bound (s) for one replica.

    Args:
        work: Per pipeline rank, the compute time of one micro-batch (forward + backward +
            recompute, summed over the rank's model chunks).
        forward: Per pipeline rank, the forward time of one micro-batch before it (for an
            interleaved schedule: of the chunks micro-batch 0 crosses before reaching the rank).
        micro_batches: Micro-batches the replica runs.
        full_backward_last: 1F1B (the last pass is a full backward): add the tail.
        crossing: With the tail, per rank the full pass (forward + backward) micro-batch 0 /
            m-1 make over it; default `work`.
    """
    w = np.asarray(work, dtype=float)
    head = np.asarray(crossing if (full_backward_last and crossing is not None) else
                      (w if full_backward_last else forward), dtype=float)
    before = np.concatenate(([0.0], np.cumsum(head)[:-1]))
    return float(np.max(before + micro_batches * w)) * (1 - SLACK)


def plan_bound(model: ModelSpec, cluster: Cluster, plan: ParallelPlan,
               options: LoweringOptions | None = None,
               cache: LoweringCache | None = None) -> float | None:
    """`pipeline_bound` of a uniform 1F1B or interleaved plan from the costs `lower` uses
    (`stage_layout`), before anything is lowered; None where it does not apply.

    Covered: one GPU type on the whole cluster, equal micro-batches on every replica (no
    per-replica split or list), one clock per plan, schedules in `BOUNDED_SCHEDULES`. Each
    pipeline rank's work per micro-batch is the forward + backward + recompute of its virtual
    stages; under 1F1B micro-batch 0 (and m-1, backward) crosses the ranks before it, under the
    interleaved schedule micro-batch 0's first-chunk forwards reach the rank (no tail).
    `cache`: an Oracle's (or any) `LoweringCache` for this model and cluster, so stage costs
    already worked out are not worked out again.
    """
    if (plan.schedule not in BOUNDED_SCHEDULES or plan.micro_batches is not None
            or plan.dp_batch_split is not None or plan.replica_micro_batches is not None
            or plan.stage_freq_mhz is not None or plan.instruction_freq_mhz
            or len({g.gpu.name for g in cluster.node_groups}) != 1):
        return None
    lay = stage_layout(model, cluster, plan, (plan.freq_mhz,), options, cache)
    pp = plan.pp
    work = [0.0] * pp
    first_forward = [0.0] * pp
    for k, rank in enumerate(lay.stage_to_rank):
        c = lay.costs[(k, plan.freq_mhz)]
        work[rank] += c.forward.time_s + c.backward.time_s + c.recompute.time_s
        if k < pp:  # chunk 0 of each rank: what micro-batch 0 crosses first
            first_forward[rank] = c.forward.time_s
    m = len(lay.micro_batch_shapes)
    return pipeline_bound(work, first_forward, m,
                          full_backward_last=plan.schedule == "1f1b")


__all__ = ["BOUNDED_SCHEDULES", "SLACK", "pipeline_bound", "plan_bound"]
