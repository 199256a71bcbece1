"""Keep freed memory in the process heap (glibc malloc), so a large program's arrays are not
faulted in afresh on every evaluation.

Why: glibc serves each allocation above its mmap threshold (128 KiB, raised dynamically up to
32 MiB) with a fresh ``mmap`` and unmaps it on free, so every new numpy array of that size
faults its pages in again: system time, not simulation. A program of GPT-3 175B on 1024 GPUs
unfolded (1.2 M tasks) takes hundreds of such arrays per evaluation. Measured on the CI machine
kind (2 vCPUs, glibc 2.36; the second and third of three evaluations in one process,
`resource.getrusage`): 44,682 and 46,035 minor faults, 0.26 and 0.60 s of system time each with
glibc's defaults; 2,619 and 854 faults, 0.07 and 0.03 s with the thresholds below. The first
evaluation in a process faults its memory in either way (137,157 faults without, 96,260 with).

`keep_freed_memory` raises the mmap and trim thresholds to `KEEP_BYTES` (mallopt(3)): blocks
below it come from the heap, and freed heap memory is kept for reuse (the process's resident
size stays at its high-water mark until it exits, as PyTorch's caching allocator keeps GPU
memory). `sim` applies it at start-up (cli.py), as do the benchmarks that time what `sim` runs;
the Python API leaves the process's allocator alone. It is skipped where the user tuned malloc
themselves (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES``) and
where there is no glibc ``mallopt`` (macOS, Windows; musl accepts and ignores it).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD = -1
"""mallopt(3) parameter: free heap memory above this stays with the process."""
M_MMAP_THRESHOLD = -3
"""mallopt(3) parameter: allocations below this come from the heap, not a fresh mmap."""
KEEP_BYTES = 1 << 30
"""Both thresholds: 1 GiB (the validation workers' `validate.devices.CPU_WORKER_ENV` too)."""
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
"""Environment variables by which a user tunes glibc malloc; any of them set: left alone."""


@functools.cache
def keep_freed_memory() -> bool:
    """Apply the thresholds once per process (module docstring); whether they were applied."""
    if not sys.platform.startswith("linux") or any(os.environ.get(k) for k in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))


__all__ = ["KEEP_BYTES", "keep_freed_memory"]
