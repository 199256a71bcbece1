"""The hot loop of the micro-batching DP (dynapipe.py), compiled with numba.

`dp_all` is the split DP for many bottleneck bounds at once: O(bounds x n^2) additions for n
samples, about 10^7 per 64K-token batch of short samples -- too slow as numpy row operations
for the per-iteration planning budget (issue 16: 50 ms), a few milliseconds compiled.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["dp_all"]


@njit(cache=True)
def dp_all(time: np.ndarray, bounds: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """best[k, j]: least summed cost of splitting the first j samples into segments, segment
    [i, j) costing time[i, j], each at most bounds[k]; inf where no split exists. `bounds`
    ascending (the callers' candidate lists are)."""
    n = time.shape[0] - 1
    kk = bounds.shape[0]
    best = np.full((kk, n + 1), np.inf)
    best[:, 0] = 0.0
    for j in range(1, n + 1):
        for i in range(j):
            t = time[i, j]
            if not np.isfinite(t):
                continue
            for k in range(np.searchsorted(bounds, t), kk):  # the bounds t fits under
                c = best[k, i] + t
                best[k, j] = min(best[k, j], c)
    return best
