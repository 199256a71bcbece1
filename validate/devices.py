"""Where `sim profile` and `sim trace` run: ``--device cpu`` (gloo) or ``--device cuda`` (NCCL).

The issue asks for the measurement loop on CPU here and on CUDA wherever a GPU is present. Both
commands spawn one worker process per rank on this machine (torch.multiprocessing); the device
decides the rest:

========= ======== ============================================================================
device    backend  per worker
========= ======== ============================================================================
``cpu``   gloo     one intra-op thread; tensors in host memory; timers read directly
``cuda``  NCCL     GPU ``LOCAL_RANK`` (= the spawn index on one machine) via
                   ``torch.cuda.set_device``; timers read after ``torch.cuda.synchronize()``
                   (kernels run asynchronously, so a host timer alone measures launches);
                   peak memory from ``torch.cuda.max_memory_allocated``
========= ======== ============================================================================

**CPU allocator.** On CPU torch allocates with glibc malloc, which serves large blocks with
mmap and gives freed memory back to the kernel; the next allocation of the same size then
faults its pages in again, which is slow in the CI machine's KVM guest. The simulated devices
keep freed memory (PyTorch's CUDA caching allocator does), so the CPU workers of both
`sim profile` and `sim trace` run with glibc's mmap and trim thresholds raised above any tensor
of the validation models (`CPU_WORKER_ENV`, set unless the environment already sets them).
Measured on tiny-gpt DP2: cross entropy 12.0 → 5.2 ms and embedding 3.0 → 1.5 ms per
iteration, iteration 147 → 136 ms (traces/README.md).

**One CPU per worker.** On cpu each worker (one intra-op thread) is bound to a logical CPU of
its own, rank r to the r-th CPU the command may run on (`worker_cores`, `pin_worker`), where
there are enough (on a host with SMT two of them may be hyperthreads of one physical core): a rank owns its processor, as a GPU rank owns its device, instead of the OS moving the
workers and their gloo threads between cores. Measured on tiny-gpt TP2 (three `sim trace` runs
each, alternating, 2026-11-27 16:1x UTC, this 2-vCPU machine): median iterations 110.1, 119.9
and 121.5 ms bound against 140.1, 139.3 and 136.4 ms unbound (iteration IQRs 13–17 against
21–28 ms); DP2, PP2 and T5 moved less (146.7/140.7 against 147.5/146.8 ms, 194.2/210.2 against
200.2/208.2, 26.3/27.4 against 30.8/27.6). Workers of several threads, or more workers than
CPUs, are left to the OS. Profiles and traces record which (``cpu_binding``).

`check_device` refuses, with one line, a device other than these two, ``cuda`` where
``torch.cuda.is_available()`` is false, and fewer GPUs than worker processes (NCCL needs one GPU
per rank). It runs before anything is spawned.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from trainsim.errors import TraceError

DEVICES = ("cpu", "cuda")
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
"""torch.distributed backend per device (gloo has no GPU collectives worth timing; NCCL has
no CPU ones)."""


CPU_WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**30)}
"""glibc tunables for CPU workers (module docstring): blocks under 1 GiB come from the heap
and the heap is not trimmed below 1 GiB of free space (mallopt(3), M_MMAP_THRESHOLD and
M_TRIM_THRESHOLD)."""


def prepare_workers(device: str) -> None:
    """Set the environment spawned workers inherit: gloo on loopback and `CPU_WORKER_ENV`
    on cpu (values already set by the user are kept)."""
    if device == "cpu":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        for key, value in CPU_WORKER_ENV.items():
            os.environ.setdefault(key, value)


def worker_cores(device: str, processes: int, threads: int = 1) -> list[int] | None:
    """The logical CPU of each of `processes` one-thread cpu workers (module docstring), or
    None where they are left to the OS: on cuda, with several threads a worker, with fewer CPUs
    allowed than workers, or where the OS has no CPU affinity (no ``sched_getaffinity``, as on
    macOS)."""
    if device != "cpu" or threads != 1 or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[:processes] if len(cpus) >= processes else None


def cpu_binding(cores: list[int] | None) -> str:
    """What a profile's or trace's metadata says of `worker_cores`' answer."""
    return ("one core per worker (rank r on CPU " + ", ".join(map(str, cores)) + " in order)"
            if cores else "none (the OS schedules the workers)")


def pin_worker(cores: list[int] | None, rank: int) -> None:
    """Bind this worker process to its CPU (`worker_cores`); nothing when `cores` is None."""
    if cores is not None:
        os.sched_setaffinity(0, {cores[rank]})


def backend_for(device: str) -> str:
    """The torch.distributed backend of `device` (``gloo`` or ``nccl``).

    Raises:
        TraceError: an unknown device.
    """
    try:
        return BACKENDS[device]
    except KeyError:
        raise TraceError(f"--device {device!r}: must be one of {', '.join(DEVICES)}") from None


def check_device(command: str, device: str, processes: int, *,
                 cuda_available: bool | None = None, gpu_count: int | None = None) -> str:
    """Refuse a device this machine cannot run `processes` workers on; return its backend.

    Args:
        command: ``sim profile`` or ``sim trace`` (for the message).
        device: ``cpu`` or ``cuda``.
        processes: Worker processes about to be spawned (one GPU each on cuda).
        cuda_available: Overrides ``torch.cuda.is_available()`` (tests).
        gpu_count: Overrides ``torch.cuda.device_count()`` (tests).

    Raises:
        TraceError: unknown device, no CUDA, or fewer GPUs than processes.
    """
    backend = backend_for(device)
    if device == "cuda":
        if cuda_available is None or gpu_count is None:
            import torch

            cuda_available = torch.cuda.is_available() if cuda_available is None \
                else cuda_available
            gpu_count = (torch.cuda.device_count() if cuda_available else 0) \
                if gpu_count is None else gpu_count
        if not cuda_available:
            raise TraceError(f"{command} --device cuda: no CUDA GPU is usable here "
                             f"(torch.cuda.is_available() is False); use --device cpu")
        if gpu_count < processes:
            raise TraceError(f"{command} --device cuda: {processes} worker processes need "
                             f"{processes} GPUs (one per process, NCCL), {gpu_count} visible")
    return backend


def local_rank(rank: int) -> int:
    """This worker's GPU index: ``LOCAL_RANK`` when a launcher set it, else the spawn index."""
    return int(os.environ.get("LOCAL_RANK", rank))


def worker_device(device: str, rank: int) -> Any:
    """The torch.device a worker computes on (and, on cuda, makes it the current GPU)."""
    import torch

    if device == "cuda":
        index = local_rank(rank)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def synchronize(dev: Any) -> None:
    """Wait for the device's queued work (a no-op on CPU) so a host timer covers it."""
    if getattr(dev, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(dev)


def device_metadata(device: str) -> dict[str, Any]:
    """GPU name, count and CUDA version for the metadata block (empty on CPU)."""
    if device != "cuda":
        return {}
    import torch

    return {"device": "cuda", "backend": "nccl", "gpu_name": torch.cuda.get_device_name(0),
            "gpu_count": torch.cuda.device_count(), "cuda": torch.version.cuda}


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the gloo rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
