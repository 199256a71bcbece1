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


__all__ = ["SLACK", "pipeline_bound"]
