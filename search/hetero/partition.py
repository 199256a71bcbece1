"""Layer partitions for pipelines whose stages run at different speeds.

Both partitioners see stage k as a prefix-sum array over blocks (its GPU type's block costs,
block_costs.py), so a stage of blocks i..j-1 costs p_k[j] - p_k[i]:

* `minmax_partition` is FASOP's (HPDC'24): start uniform, then move one layer from the slowest
  stage to the fastest while the slowest stage gets faster.
* `exact_partition` minimises the 1F1B estimate sum_k T_k + (m-1) max_k T_k exactly (the first
  micro-batch crosses every stage once, the bottleneck stage runs the other m-1), under each
  stage's memory cap: for each candidate bottleneck B (in increasing order) a dynamic program
  over (stage, blocks so far) finds the least total with every T_k <= B; B stops growing once
  (m-1) B plus the unconstrained least total cannot beat the best found.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

INF = float("inf")


def stage_times(prefix: Sequence[np.ndarray], counts: Sequence[int]) -> list[float]:
    """Cost of each stage under block counts `counts`."""
    out, first = [], 0
    for p, c in zip(prefix, counts):
        out.append(float(p[first + c] - p[first]))
        first += c
    return out


def uniform_counts(blocks: int, stages: int) -> tuple[int, ...]:
    """Megatron's even split (the first `blocks % stages` stages get one more)."""
    base, extra = divmod(blocks, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))


def minmax_partition(prefix: Sequence[np.ndarray], blocks: int) -> tuple[int, ...]:
    """FASOP's partition: from uniform, move a layer from the slowest stage to the fastest
    until the slowest stage stops improving."""
    counts = list(uniform_counts(blocks, len(prefix)))
    times = stage_times(prefix, counts)
    for _ in range(blocks * len(prefix)):  # each move lowers the max: bounded anyway
        slow, fast = int(np.argmax(times)), int(np.argmin(times))
        if slow == fast or counts[slow] <= 1:
            break
        trial = list(counts)
        trial[slow] -= 1
        trial[fast] += 1
        new = stage_times(prefix, trial)
        if max(new) >= max(times):
            break
        counts, times = trial, new
    return tuple(counts)


def _cost_matrices(prefix: Sequence[np.ndarray], fits: Sequence[np.ndarray] | None
                   ) -> np.ndarray:
    """C[k, i, j] = cost of stage k holding blocks i..j-1 (inf when j <= i or over memory)."""
    p = np.stack(prefix)
    c = p[:, None, :] - p[:, :, None]
    n = p.shape[1]
    c[:, np.tril_indices(n)[0], np.tril_indices(n)[1]] = INF
    if fits is not None:
        c[~np.stack(fits)] = INF
    return c


def exact_partition(prefix: Sequence[np.ndarray], blocks: int, micro_batches: int,
                    fits: Sequence[np.ndarray] | None = None, 
                    ) -> tuple[int, ...] | None:
    """Block counts minimising sum_k T_k + (m-1) max_k T_k; None when no partition fits.

    Args:
        prefix: Per stage, prefix sums of its block costs (length blocks + 1).
        blocks: Blocks to split (every stage gets at least one).
        micro_batches: m, the micro-batches the bottleneck stage runs.
        fits: Per stage, a boolean matrix: fits[k][i, j] when blocks i..j-1 fit stage k's
            memory (None: all fit).
    """
    stages = len(prefix)
    if blocks < stages:
        return None
    cost = _cost_matrices(prefix, fits)
    weight = max(micro_batches - 1, 0)
    unconstrained = _least_total(cost, blocks, INF)
    if unconstrained is None:
        return None
    lowest_total = unconstrained[0]
    if weight == 0:  # one micro-batch: only the total counts
        return unconstrained[1]
    values = np.unique(cost[np.isfinite(cost)])
    # min over bounds B of S(B) + (m-1) B equals the optimum: the optimal partition is
    # feasible at B = its own max, and any S(B) + (m-1) B is some partition's score or more
    start = int(np.searchsorted(values, _least_max(cost, blocks)))
    best_score, best_bound = _scan_bounds(np.ascontiguousarray(cost), blocks, values, start,
                                          float(weight), float(lowest_total))
    if not np.isfinite(best_score):
        return None
    found = _least_total(cost, blocks, best_bound)
    return None if found is None else found[1]


@njit(cache=True)
def _scan_bounds(cost: np.ndarray, blocks: int, values: np.ndarray, start: int, weight: float,
                 lowest: float) -> tuple[float, float]:  # pragma: no cover -- compiled
    """(best score, its bound) over bounds values[start:], ascending, stopping once
    weight x bound + lowest cannot beat the best: the DP of `_least_total` per bound."""
    stages, n = cost.shape[0], cost.shape[1]
    best_score, best_bound = np.inf, np.inf
    cur = np.empty(n)
    nxt = np.empty(n)
    for vi in range(start, len(values)):
        bound = values[vi]
        if weight * bound + lowest >= best_score:
            break
        for j in range(n):
            c = cost[0, 0, j]
            cur[j] = c if c <= bound else np.inf
        for k in range(1, stages):
            for j in range(n):
                low = np.inf
                for i in range(j):
                    c = cost[k, i, j]
                    if c <= bound:
                        v = cur[i] + c
                        low = min(low, v)
                nxt[j] = low
            for j in range(n):
                cur[j] = nxt[j]
        score = cur[blocks] + weight * bound
        if score < best_score:
            best_score, best_bound = score, bound
    return best_score, best_bound


def _least_max(cost: np.ndarray, blocks: int) -> float:
    """Smallest achievable bottleneck (min over partitions of max_k C_k)."""
    m = cost[0][0].copy()  # stage 0 holds blocks 0..j-1
    for c in cost[1:]:
        m = np.min(np.maximum(m[:, None], c), axis=0)
    return float(m[blocks])


def _least_total(cost: np.ndarray, blocks: int, bound: float
                 ) -> tuple[float, tuple[int, ...]] | None:
    """(least sum_k C_k with every C_k <= bound, its counts), None when infeasible."""
    capped = np.where(cost <= bound, cost, INF)
    best = capped[0][0].copy()
    choices = []
    for c in capped[1:]:
        total = best[:, None] + c
        choices.append(np.argmin(total, axis=0))
        best = np.min(total, axis=0)
    if not np.isfinite(best[blocks]):
        return None
    ends = [blocks]
    for arg in reversed(choices):
        ends.append(int(arg[ends[-1]]))
    ends.reverse()  # ends[k] = first block of stage k+1, ends[0] = end of stage 0
    bounds = [0, *ends]
    counts = tuple(bounds[k + 1] - bounds[k] for k in range(len(cost)))
    return float(best[blocks]), counts


__all__ = ["exact_partition", "minmax_partition", "stage_times", "uniform_counts"]
