"""Torch's native profiler (Kineto) logs from C++ straight to file descriptor 2.

Every profiled iteration of `sim trace` printed lines such as ``USDT:... SyncActivityProfiler
Handler.cpp:52] profiler_start`` and ``STAGE:... Completed Stage: Warm Up`` from each worker,
whatever ``KINETO_LOG_LEVEL`` says (the USDT lines ignore it; tried with torch 2.13.0 at levels
-1 to 5), plus a warning that memory allocated before profiling has no deallocation event
(expected: the trace counts parameters and optimizer state apart, `state_bytes`). They are
not for the user. `filtered_native_stderr` routes fd 2 to a temporary file while the profiler
runs and writes back every other line when it stops, so real warnings still show.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

PROFILER_NOISE = (
    "SyncActivityProfilerHandler.cpp",
    "Memory block of unknown size was allocated before the profiling started",
)
"""Substrings of the native profiler's routine lines (torch 2.13.0's Kineto)."""


@contextlib.contextmanager
def filtered_native_stderr(noise: tuple[str, ...] = PROFILER_NOISE) -> Iterator[None]:
    """Hold what C++ and Python write to fd 2 inside the block; afterwards write back the
    lines that contain none of `noise`."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                held.seek(0)
                text = held.read().decode("utf-8", errors="replace")
                kept = [line for line in text.splitlines(keepends=True)
                        if not any(n in line for n in noise)]
                if kept:
                    sys.stderr.write("".join(kept))
                    sys.stderr.flush()
    finally:
        os.close(saved)


__all__ = ["PROFILER_NOISE", "filtered_native_stderr"]
