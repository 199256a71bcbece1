"""What `sim trace` and `sim profile` may spawn on this machine: processes and memory.

Both commands start one torch worker process per rank (torch.multiprocessing, gloo). Without a
bound, `--plan dp=1000` or `--processes 100000` forks workers until the machine stalls, and a
zoo model such as gpt3-175b is killed by the kernel's OOM killer (a SIGKILL traceback) after
minutes. So before spawning we refuse, with one line naming the option and the limit:

* more worker processes than `os.cpu_count()` (each worker runs one intra-op thread; more
  workers than cores only time-share and make every measurement wrong anyway);
* a run whose training state does not fit the memory available now (``MemAvailable``).

**Memory estimate.** fp32 training with Adam keeps, per parameter, the weight, its gradient and
Adam's two moments: 4 × 4 bytes = 16 bytes (Kingma & Ba, ICLR'15, Alg. 1: m and v per
parameter; Rajbhandari et al., ZeRO, SC'20 §3.1 count the same states). Every data-parallel
replica holds the whole model split over its tp × pp workers, so the run holds
16 × parameters × dp bytes, plus `WORKER_OVERHEAD_BYTES` per process. Activations are left out:
the estimate is a lower bound, enough to refuse what can never fit.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainsim.errors import TraceError

#: fp32 weight + gradient + Adam m + Adam v (module docstring).
TRAINING_STATE_BYTES_PER_PARAM: int = 4 * 4

#: Resident memory of one idle worker: a Python process that imported torch (torch 2.13 CPU,
#: measured with ``resource.getrusage(...).ru_maxrss`` after ``import torch,
#: torch.distributed``: 218 MiB), rounded up.
WORKER_OVERHEAD_BYTES: int = 256 * 2**20


def cpu_limit() -> int | None:
    """Logical CPUs of this machine (`os.cpu_count()`), None when unknown."""
    return os.cpu_count()


def available_memory_bytes() -> int | None:
    """Memory available to new processes now: /proc/meminfo MemAvailable, else the free
    physical pages; None when neither can be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_processes(option: str, processes: int, *, cpus: int | None = None) -> None:
    """Refuse more worker processes than CPUs.

    Args:
        option: The option that set the count, for the message (``--processes``).
        processes: Worker processes about to be spawned.
        cpus: The limit; `cpu_limit()` when None.

    Raises:
        TraceError: fewer than 1 process, or more than `cpus`.
    """
    if processes < 1:
        raise TraceError(f"{option}: {processes} worker processes; need at least 1")
    limit = cpu_limit() if cpus is None else cpus
    if limit is not None and processes > limit:
        raise TraceError(f"{option}: {processes} worker processes exceed this machine's "
                         f"{limit} CPUs (os.cpu_count()); use at most {limit}")


def training_memory_bytes(parameters: float, dp: int, processes: int) -> float:
    """Lower bound of a run's memory: Adam training state of `dp` model copies plus the
    per-process overhead (module docstring)."""
    return TRAINING_STATE_BYTES_PER_PARAM * parameters * dp + WORKER_OVERHEAD_BYTES * processes


def check_memory(option: str, model: str, need_bytes: float, *,
                 available_bytes: int | None = None) -> None:
    """Refuse a run whose estimated memory exceeds what is available.

    Args:
        option: What sets the size, for the message (``--model``).
        model: The model's name.
        need_bytes: `training_memory_bytes` of the run.
        available_bytes: The limit; `available_memory_bytes()` when None.

    Raises:
        TraceError: the estimate exceeds the available memory.
    """
    avail = available_memory_bytes() if available_bytes is None else available_bytes
    if avail is not None and need_bytes > avail:
        raise TraceError(f"{option} {model}: needs at least {need_bytes / 1e9:.1f} GB (fp32 "
                         f"weights, gradients and Adam states, 16 B/parameter, plus the "
                         f"workers) but {avail / 1e9:.1f} GB of memory is available; use a "
                         f"smaller model")


__all__ = ["TRAINING_STATE_BYTES_PER_PARAM", "WORKER_OVERHEAD_BYTES", "available_memory_bytes",
           "check_memory", "check_processes", "cpu_limit", "training_memory_bytes"]
