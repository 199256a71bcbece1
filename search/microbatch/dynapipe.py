"""DynaPipe's micro-batching (Jiang et al., EuroSys'24; awslabs/optimizing-multitask-training-
through-dynamic-pipelines), on trainsim's cost model.

1. **Order** the batch's samples so that neighbours have similar shapes: decoder-only by length,
   longest first; encoder-decoder (input, target) points clustered (complete linkage, distance
   16) and the clusters visited along an open travelling-salesman path over their centroids.
2. **Split** the ordered samples into contiguous segments, one micro-batch each, by dynamic
   programming. A segment costs t(size, its longest input and target, padded to 8). For a
   candidate bottleneck t_max, the DP finds the least sum of segment costs with every segment
   at most t_max and within the per-micro-batch activation limit; the plan minimises
   (stages - 1) t_max + sum t_i / dp over the candidates. Faithful DynaPipe thins the candidate
   t_max values (`thin`); ours tries every distinct segment cost (exact), the DP running for all
   candidates at once.
3. **Assign** segments to data-parallel replicas by Karmarkar–Karp (largest differencing),
   balancing each replica's summed cost. Every replica needs a segment: when the optimum has
   fewer segments than replicas, the exact search reruns with the segment count in the DP
   state (at least dp); the thinned one halves its largest segments.
4. **Recompute fallback:** none, then selective, then full: the first under which every sample
   fits a micro-batch of its own.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainsim.search.hetero.block_costs import range_max
from trainsim.search.microbatch.costs import MicroBatchCosts, pad
from trainsim.search.microbatch.kernels import dp_all

CLUSTER_DISTANCE = 16.0
"""Complete-linkage cut for (input, target) points (DynaPipe's default)."""


@dataclass(frozen=True, slots=True)
class Split:
    """Micro-batches (as sample-index lists) per data-parallel replica."""

    replicas: tuple[tuple[tuple[int, ...], ...], ...]
    """replicas[d][k]: sample indices of replica d's k-th micro-batch."""
    t_max: float
    """The chosen bottleneck micro-batch time (s)."""


def order_samples(inputs: np.ndarray, targets: np.ndarray | None = None) -> np.ndarray:
    """Sample indices in DynaPipe's order (module docstring, step 1)."""
    n = len(inputs)
    if targets is None or not np.any(targets):
        return np.argsort(-inputs, kind="stable")
    if n == 1:
        return np.arange(1)
    from scipy.cluster.hierarchy import fcluster, linkage  # deferred: start-up time (scipy)

    points = np.stack([inputs, targets], axis=1).astype(float)
    labels = fcluster(linkage(points, method="complete"), t=CLUSTER_DISTANCE,
                      criterion="distance")
    ids = np.unique(labels)
    centroids = np.array([points[labels == c].mean(axis=0) for c in ids])
    path = _open_tsp(centroids)
    out: list[int] = []
    for c in path:
        members = np.flatnonzero(labels == ids[c])
        out += list(members[np.argsort(-inputs[members], kind="stable")])
    return np.array(out)


def _open_tsp(points: np.ndarray) -> list[int]:
    """An open path through `points`: nearest neighbour from the largest, then 2-opt."""
    n = len(points)
    if n <= 2:
        return list(range(n))
    dist = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=2)
    start = int(np.argmax(points.sum(axis=1)))
    path, left = [start], set(range(n)) - {start}
    while left:
        last = path[-1]
        nxt = min(left, key=lambda j: (dist[last, j], j))
        path.append(nxt)
        left.remove(nxt)
    improved = True
    while improved:
        improved = False
        for i in range(1, n - 1):
            for j in range(i + 1, n):
                a, b = path[i - 1], path[i]
                c = path[j]
                d_after = dist[b, path[j + 1]] if j + 1 < n else 0.0
                c_after = dist[c, path[j + 1]] if j + 1 < n else 0.0
                if dist[a, c] + d_after < dist[a, b] + c_after - 1e-12:
                    path[i:j + 1] = reversed(path[i:j + 1])
                    improved = True
    return path


def segment_tables(costs: MicroBatchCosts, inputs: np.ndarray, targets: np.ndarray | None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(time, kept bytes) of every segment [i, j) of the ordered samples (inf where j <= i)."""
    n = len(inputs)
    i, j = np.triu_indices(n + 1, k=1)
    s = pad(range_max(inputs)[i, j])  # the longest sample of each segment
    t = pad(range_max(targets)[i, j]) if targets is not None and np.any(targets) else None
    size = j - i
    time = np.full((n + 1, n + 1), np.inf)
    kept = np.full((n + 1, n + 1), np.inf)
    seg_time, seg_kept, seg_extra = costs.all(size, s, t)
    time[i, j] = seg_time
    kept[i, j] = seg_kept + seg_extra / max(costs.pp, 1)
    return time, kept


def split(costs: MicroBatchCosts, inputs: np.ndarray, targets: np.ndarray | None, *, dp: int,
          memory_bytes: float, exact: bool = True, thin: int = 32) -> Split | None:
    """DynaPipe's micro-batching of one batch (module docstring, steps 1–3); None when some
    sample cannot fit a micro-batch of its own under `memory_bytes` of activations.

    `exact=False` (faithful): `thin` candidate t_max values spread evenly over all distinct
    segment costs. `exact=True` (ours): every distinct value from the smallest feasible
    bottleneck up, in ascending chunks, stopping once (stages - 1) t_max + (the least sum with
    no bound) / dp reaches the best score -- no larger t_max can score lower."""
    mode = "exact" if exact else "thinned"
    return splits(costs, inputs, targets, dp=dp, memory_bytes=memory_bytes, modes=(mode,),
                  thin=thin)[mode]


def splits(costs: MicroBatchCosts, inputs: np.ndarray, targets: np.ndarray | None, *, dp: int,
           memory_bytes: float, modes: tuple[str, ...] = ("exact", "thinned"), thin: int = 32
           ) -> dict[str, Split | None]:
    """`split` for several t_max searches ("exact", "thinned") sharing one ordering and one
    table of segment costs."""
    none: dict[str, Split | None] = {m: None for m in modes}
    limit = memory_bytes / costs.pp  # stage 0 keeps up to pp micro-batches in flight (1F1B)
    alone = costs.kept(np.ones(len(inputs)), pad(inputs), None if targets is None
                       else pad(targets)) + costs.extra(np.ones(len(inputs)), pad(inputs),
                                                        None if targets is None
                                                        else pad(targets)) / max(costs.pp, 1)
    if np.any(alone > limit):  # some sample does not fit even alone: no split can
        return none
    order = order_samples(inputs, targets)
    x_in = inputs[order]
    x_t = targets[order] if targets is not None and np.any(targets) else None
    time, kept = segment_tables(costs, x_in, x_t)
    time = np.where(kept <= limit, time, np.inf)
    n = len(x_in)
    values = np.unique(time[np.isfinite(time)])
    if len(values) == 0 or not np.all(np.isfinite(np.diag(time, 1))):
        return none
    weight = max(costs.pp - 1, 0)
    least = float(_dp_all(time, np.array([np.inf]), n)[0, n])
    out = dict(none)
    for mode in modes:
        if mode == "thinned":
            picked = values if len(values) <= thin else \
                values[np.linspace(0, len(values) - 1, thin).round().astype(int)]
            best = _dp_all(time, picked, n)[:, n]
            scores = weight * picked + best / dp
            k = int(np.argmin(np.where(np.isfinite(best), scores, np.inf)))
            bound, score = float(picked[k]), float(scores[k])
        else:
            bound, score = np.inf, least / dp if weight == 0 else np.inf
            start = int(np.searchsorted(values, _least_max(time, n)))
            for first in range(start, len(values), CHUNK):
                chunk = values[first:first + CHUNK]
                if weight and weight * chunk[0] + least / dp >= score:
                    break
                best = _dp_all(time, chunk, n)[:, n]
                scores = weight * chunk + best / dp
                k = int(np.argmin(np.where(np.isfinite(best), scores, np.inf)))
                if np.isfinite(best[k]) and scores[k] < score:
                    bound, score = float(chunk[k]), float(scores[k])
                if weight == 0:
                    break
        if not np.isfinite(score):
            continue
        segments = _segments(time, bound, n)
        if mode == "exact" and len(segments) < dp <= n:  # every replica needs a segment
            bound, segments = _exact_with_count(time, values, n, dp, weight)
        out[mode] = _assign(costs, order, x_in, x_t, segments, dp, bound)
    return out


def _exact_with_count(time: np.ndarray, values: np.ndarray, n: int, parts: int, weight: int
                      ) -> tuple[float, list[tuple[int, int]]]:
    """The exact search restricted to splits of at least `parts` segments (so that every
    replica gets one), for when the unrestricted optimum has fewer: the same ascending scan
    over bottlenecks, with the segment count in the DP state."""
    least, _ = _dp_count(time, np.inf, n, parts)
    best_score, best = np.inf, (np.inf, [(i, i + 1) for i in range(n)])
    for bound in (values if weight else values[-1:]):
        if weight and weight * bound + least / parts >= best_score:
            break
        total, segments = _dp_count(time, float(bound), n, parts)
        score = weight * bound + total / parts
        if np.isfinite(total) and score < best_score:
            best_score, best = score, (float(bound), segments)
    return best


def _dp_count(time: np.ndarray, bound: float, n: int, parts: int
              ) -> tuple[float, list[tuple[int, int]]]:
    """(least summed cost of splitting [0, n) into at least `parts` segments each at most
    `bound`, its segments); state c = segments so far, capped at `parts`."""
    best = np.full((n + 1, parts + 1), np.inf)
    best[0, 0] = 0.0
    arg = np.zeros((n + 1, parts + 1, 2), dtype=int)
    for j in range(1, n + 1):
        col = np.where(time[:j, j] <= bound, time[:j, j], np.inf)
        for c in range(1, parts + 1):
            prev = best[:j, c - 1]
            src = np.full(j, c - 1)
            if c == parts:  # "at least parts": also extend splits that already have them
                more = best[:j, parts] < prev
                prev = np.where(more, best[:j, parts], prev)
                src = np.where(more, parts, src)
            cand = prev + col
            i = int(np.argmin(cand))
            best[j, c] = cand[i]
            arg[j, c] = (i, src[i])
    if not np.isfinite(best[n, parts]):
        return np.inf, []
    out, j, c = [], n, parts
    while j > 0:
        i, pc = arg[j, c]
        out.append((int(i), j))
        j, c = int(i), int(pc)
    return float(best[n, parts]), out[::-1]


def _assign(costs: MicroBatchCosts, order: np.ndarray, x_in: np.ndarray,
            x_t: np.ndarray | None, segments: list[tuple[int, int]], dp: int, bound: float
            ) -> Split:
    """Segments (at least one per replica) balanced over the replicas by Karmarkar–Karp."""
    segments = _at_least(segments, dp)
    size = np.array([b - a for a, b in segments], dtype=float)
    s_in = pad(np.array([x_in[a:b].max() for a, b in segments]))
    s_t = None if x_t is None else pad(np.array([x_t[a:b].max() for a, b in segments]))
    seg_cost = [float(c) for c in costs.time(size, s_in, s_t)]  # one vectorised call
    groups = karmarkar_karp(seg_cost, dp)
    for part in groups:  # every replica needs a micro-batch: take the cheapest from the fullest
        if not part:
            donor = max(groups, key=len)
            part.append(donor.pop(min(range(len(donor)), key=lambda i: seg_cost[donor[i]])))
    replicas = tuple(tuple(tuple(int(order[s]) for s in range(*segments[g]))
                           for g in sorted(members)) for members in groups)
    return Split(replicas=replicas, t_max=bound)


CHUNK = 64
"""Candidate bottlenecks the exact search runs through the DP at once."""


def _least_max(time: np.ndarray, n: int) -> float:
    """The smallest achievable bottleneck (min over splits of the largest segment cost)."""
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for j in range(1, n + 1):
        best[j] = np.min(np.maximum(best[:j], time[:j, j]))
    return float(best[n])


def _at_least(segments: list[tuple[int, int]], parts: int) -> list[tuple[int, int]]:
    """`segments` with the largest halved until there are `parts` (every replica gets one)."""
    out = list(segments)
    while len(out) < parts:
        k = max(range(len(out)), key=lambda i: (out[i][1] - out[i][0], -i))
        a, b = out[k]
        if b - a < 2:
            break
        mid = (a + b) // 2
        out[k:k + 1] = [(a, mid), (mid, b)]
    return out


def _dp_all(time: np.ndarray, bounds: np.ndarray, n: int) -> np.ndarray:
    """best[k, j]: least summed cost of splitting samples [0, j) with every segment at most
    bounds[k] (all bounds at once; compiled in kernels.py, `_dp_all_numpy` the reference)."""
    b = np.ascontiguousarray(bounds, dtype=float)
    if len(b) > 1 and np.any(np.diff(b) < 0):
        return _dp_all_numpy(time, b, n)
    return dp_all(np.ascontiguousarray(time[:n + 1, :n + 1], dtype=float), b)


def _dp_all_numpy(time: np.ndarray, bounds: np.ndarray, n: int) -> np.ndarray:
    """`_dp_all` as numpy row operations (reference for the compiled kernel)."""
    best = np.full((len(bounds), n + 1), np.inf)
    best[:, 0] = 0.0
    for j in range(1, n + 1):
        col = time[:j, j]  # segment [i, j) for i < j
        ok = col[None, :] <= bounds[:, None]
        cand = np.where(ok, best[:, :j] + col[None, :], np.inf)
        best[:, j] = cand.min(axis=1)
    return best


def _segments(time: np.ndarray, bound: float, n: int) -> list[tuple[int, int]]:
    """The segments of the least-sum split under `bound`."""
    best = np.full(n + 1, np.inf)
    arg = np.zeros(n + 1, dtype=int)
    best[0] = 0.0
    for j in range(1, n + 1):
        col = np.where(time[:j, j] <= bound, best[:j] + time[:j, j], np.inf)
        arg[j] = int(np.argmin(col))
        best[j] = col[arg[j]]
    out, j = [], n
    while j > 0:
        out.append((int(arg[j]), j))
        j = int(arg[j])
    return out[::-1]


def karmarkar_karp(costs: Sequence[float], parts: int) -> list[list[int]]:
    """Indices of `costs` split into `parts` sets of near-equal sums (largest differencing:
    repeatedly merge the two partitions whose largest sums differ most, pairing the largest
    set of one with the smallest of the other)."""
    if parts <= 1:
        return [list(range(len(costs)))]
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    for i, c in enumerate(costs):
        sets = [(float(c), [i])] + [(0.0, []) for _ in range(parts - 1)]
        heapq.heappush(heap, (-float(c), i, sets))
    tie = len(costs)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        a = sorted(a, key=lambda p: -p[0])
        b = sorted(b, key=lambda p: p[0])
        merged = sorted(((x[0] + y[0], x[1] + y[1]) for x, y in zip(a, b)),
                        key=lambda p: -p[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    final = heap[0][2] if heap else [(0.0, [])] * parts
    return [sorted(members) for _, members in final]


__all__ = ["Split", "karmarkar_karp", "order_samples", "segment_tables", "split", "splits"]
