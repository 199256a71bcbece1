"""DynaPipe's "wait-free cyclic" pipeline schedule (Jiang et al., EuroSys'24, §5), as an order.

DynaPipe builds its order by running the pipeline in lock-step *cycles* and records what each
rank ran; then it executes that order wait-free -- every action as soon as its inputs arrive,
no cycle barrier -- which is what trainsim's engine does with any order. The cycle rules, read
from awslabs/optimizing-multitask-training-through-dynamic-pipelines
(`dynapipe/schedule_opt/cyclic_schedule.py`, `wait_free_cyclic_schedule.py`):

* every micro-batch is queued at the first stage at the start; each stage keeps a FIFO queue;
* in a cycle, each rank looks at the head of each of its queues and runs the backward first,
  then the forward (DynaPipe interleaves the sorted backwards and forwards, backward first);
* what a rank runs in a cycle reaches the next rank's queue for the next cycle (DynaPipe
  fast-forwards the send so that one hop costs exactly one cycle); the last stage's forward
  makes its backward available to itself in the next cycle;
* a forward that would start a new micro-batch on a rank is held back for the cycle when the
  rank's in-flight micro-batches would pass a cap (DynaPipe's `max_otf_microbatches`) or its
  activation bytes would pass a budget (its `memory_limit`).

Without a cap, rank r warms up with 2(p − r) − 1 forwards (1F1B: p − r − 1), so variable
micro-batches do not stall the pipeline as often, at up to twice 1F1B's activations; the cap
and the budget trade that back. Two deliberate differences: DynaPipe compares the largest
micro-batch ids run forward and backward (so its first micro-batch is never held back); here
the in-flight micro-batches are counted, and a rank holding none always runs its forward, so
the order always completes. One stage per rank (DynaPipe's linear placement).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from trainsim.errors import SpecError
from trainsim.simulator.actions import Action, Schedule

__all__ = ["CYCLIC_PREFIX", "capped_cyclic", "cyclic_cap", "max_window", "parse_cyclic_name",
           "wait_free_cyclic"]

CYCLIC_PREFIX = "cyclic"
"""Schedule name: ``cyclic`` (no cap) or ``cyclic-K`` (at most K micro-batches in flight per rank)."""


def wait_free_cyclic(p: int, m: int, *, max_in_flight: int | None = None,
                     activation_bytes: Sequence[Sequence[float]] | None = None,
                     budget: float | Sequence[float] | None = None) -> Schedule:
    """DynaPipe's cyclic order for `p` ranks (one stage each) and `m` micro-batches.

    `max_in_flight` caps the micro-batches a rank holds between their forward and backward;
    `activation_bytes[r][j]` (bytes rank r keeps for micro-batch j) with `budget` (bytes per
    rank, or one per rank) holds a forward back while it would pass the budget. A rank that
    holds nothing always runs its forward (a single micro-batch over budget is for the caller
    to catch: the engine reports the peak).

    Raises:
        SpecError: bad sizes, cap or byte table.
    """
    for name, value in (("num_ranks", p), ("num_micro_batches", m)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"cyclic schedule {name}={value!r} must be an integer >= 1")
    if max_in_flight is not None and (isinstance(max_in_flight, bool)
                                      or not isinstance(max_in_flight, int)
                                      or max_in_flight < 1):
        raise SpecError(f"cyclic schedule max_in_flight={max_in_flight!r} must be an integer "
                        f">= 1")
    cap = max_in_flight or m
    held_bytes, limit = _bytes(p, m, activation_bytes, budget)
    fwd: list[deque[int]] = [deque() for _ in range(p)]
    bwd: list[deque[int]] = [deque() for _ in range(p)]
    fwd[0].extend(range(m))
    in_flight = [0] * p
    used = [0.0] * p
    order: Schedule = {r: [] for r in range(p)}
    done = 0
    while done < 2 * p * m:
        arrivals: list[tuple[deque[int], int]] = []
        progress = False
        for r in range(p):
            if bwd[r]:
                j = bwd[r].popleft()
                order[r].append(Action(r, "B", j))
                in_flight[r] -= 1
                used[r] -= held_bytes[r][j]
                if r > 0:
                    arrivals.append((bwd[r - 1], j))
                done += 1
                progress = True
            if fwd[r]:
                j = fwd[r][0]
                if in_flight[r] and (in_flight[r] >= cap
                                     or used[r] + held_bytes[r][j] > limit[r]):
                    continue  # held back this cycle
                fwd[r].popleft()
                order[r].append(Action(r, "F", j))
                in_flight[r] += 1
                used[r] += held_bytes[r][j]
                arrivals.append((fwd[r + 1] if r + 1 < p else bwd[r], j))
                done += 1
                progress = True
        if not progress:  # cannot happen: a rank holding nothing always runs its forward
            raise SpecError("cyclic schedule made no progress in a cycle")
        for queue, j in arrivals:  # what ran this cycle is available in the next one
            queue.append(j)
    return order


def capped_cyclic(cap: int) -> Callable[[int, int], Schedule]:
    """``builder(p, m)`` of the cyclic order with at most `cap` micro-batches in flight per rank
    (the schedule name ``cyclic-K``)."""
    def cyclic(p: int, m: int) -> Schedule:
        return wait_free_cyclic(p, m, max_in_flight=cap)

    cyclic.__doc__ = wait_free_cyclic.__doc__
    return cyclic


def _bytes(p: int, m: int, table: Sequence[Sequence[float]] | None,
           budget: float | Sequence[float] | None) -> tuple[np.ndarray, np.ndarray]:
    """(bytes[r][j], limit[r]) with zeros / infinity where not given."""
    if table is None:
        held = np.zeros((p, m))
    else:
        held = np.asarray(table, dtype=float)
        if held.shape != (p, m) or not np.all(np.isfinite(held)) or np.any(held < 0):
            raise SpecError(f"cyclic schedule activation_bytes must be {p} x {m} finite "
                            f"non-negative byte counts, got shape {held.shape}")
    if budget is None:
        limit = np.full(p, np.inf)
    else:
        limit = np.broadcast_to(np.asarray(budget, dtype=float), (p,)).copy()
    return held, limit


def cyclic_cap(window_bytes: Sequence[ArrayLike], budget: float, p: int) -> int | None:
    """The largest in-flight cap K under which the first stage of every replica stays within
    `budget` (`window_bytes[d]`: bytes stage 0 keeps for each micro-batch of replica d, in
    order); None when no cap is needed (uncapped, rank 0 holds at most 2p − 1).

    The cyclic order runs each rank's forwards and backwards in micro-batch order (FIFO), so
    the micro-batches in flight are always consecutive ones: K is safe when every window of K
    consecutive micro-batches fits. K is at least 1."""
    best = 2 * p - 1
    for held in window_bytes:
        x = np.asarray(held, dtype=float)
        k = 1
        while k < min(best, len(x)) and max_window(x, k + 1) <= budget:
            k += 1
        if k < len(x):
            best = min(best, k)
    return None if best >= 2 * p - 1 else best


def max_window(x: np.ndarray, k: int) -> float:
    """The largest sum of `k` consecutive values of `x` (all of them when fewer)."""
    k = min(k, len(x))
    c = np.concatenate([[0.0], np.cumsum(x)])
    return float(np.max(c[k:] - c[:-k]))


def parse_cyclic_name(name: str) -> int | None | bool:
    """For ``cyclic``: None (no cap); ``cyclic-K``: K; any other name: False.

    Raises:
        SpecError: ``cyclic-K`` with K not an integer >= 1.
    """
    key = name.strip().lower()
    if key == CYCLIC_PREFIX:
        return None
    if not key.startswith(CYCLIC_PREFIX + "-"):
        return False
    tail = key[len(CYCLIC_PREFIX) + 1:]
    if not tail.isdigit() or int(tail) < 1:
        raise SpecError(f"schedule {name!r}: cyclic-K needs K, the micro-batches in flight per "
                        f"rank, as an integer >= 1 (e.g. cyclic-4)")
    return int(tail)
