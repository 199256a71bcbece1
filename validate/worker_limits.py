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
16 × parameters × dp bytes, plus `WORKER_OVERHEAD_BYTES` per process, plus one micro-batch's
saved activations per data-parallel replica (the model graph's own count, which a micro-batch
of 10^12 samples makes astronomical): a lower bound, enough to refuse what can never fit.

**Work.** Warm-up and measured calls run one after the other; `MAX_CALLS` bounds how many a run
may ask for (at a millisecond or more each on a CPU, 10^5 calls is minutes; 10^12 is never).
"""

from __future__ import annotations

import os
from pathlib import Path

from trainsim.errors import TraceError
from trainsim.workloads.model import ModelSpec, build_graph

#: fp32 weight + gradient + Adam m + Adam v (module docstring).
TRAINING_STATE_BYTES_PER_PARAM: int = 4 * 4

#: Resident memory of one idle worker: a Python process that imported torch (torch 2.13 CPU,
#: measured with ``resource.getrusage(...).ru_maxrss`` after ``import torch,
#: torch.distributed``: 218 MiB), rounded up.
WORKER_OVERHEAD_BYTES: int = 256 * 2**20


#: Most timed + warm-up calls (`sim profile`) or micro-batch steps (`sim trace`) one run may
#: ask for (module docstring).
MAX_CALLS: int = 100_000


def micro_batch_activation_bytes(spec: ModelSpec, micro_batch_size: int) -> float:
    """Activations one micro-batch of `micro_batch_size` samples saves for its backward (the
    model graph's count for one sample, times the samples)."""
    return build_graph(spec, 1).activation_bytes() * micro_batch_size


def check_calls(option: str, calls: int, what: str) -> None:
    """Refuse a run that asks for more than MAX_CALLS sequential calls (`what` names them)."""
    if calls > MAX_CALLS:
        raise TraceError(f"{option}: {calls:,} {what} exceed the limit of {MAX_CALLS:,} (at "
                         f"~1 ms or more each it would not finish); ask for fewer")


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


def training_memory_bytes(parameters: float, dp: int, processes: int,
                          activation_bytes: float = 0.0) -> float:
    """Lower bound of a run's memory: Adam training state of `dp` model copies, the
    per-process overhead and `activation_bytes` (one micro-batch's) per replica (module
    docstring)."""
    return (TRAINING_STATE_BYTES_PER_PARAM * parameters * dp + WORKER_OVERHEAD_BYTES * processes
            + activation_bytes * dp)


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
        raise TraceError(f"{option} {model}: needs at least {need_bytes / 1e9:.3g} GB (fp32 "
                         f"weights, gradients and Adam states, 16 B/parameter, a micro-batch's "
                         f"activations and the workers) but {avail / 1e9:.1f} GB of memory is "
                         f"available; use a smaller model or micro-batch")


__all__ = [
    "MAX_CALLS",
    "TRAINING_STATE_BYTES_PER_PARAM",
    "WORKER_OVERHEAD_BYTES",
    "available_memory_bytes",
    "check_calls",
    "check_memory",
    "check_processes",
    "cpu_limit",
    "micro_batch_activation_bytes",
    "training_memory_bytes",
]
