"""What the CPU microbenchmarks (bench/cpu_ops.py, bench/gloo_collectives.py) share when they
record: two gloo worker processes whose results come back as JSON, the reference GEMM that
pins the machine's speed at that moment, and the machine block each data file keeps."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainsim.validate.devices import cpu_binding, free_port, pin_worker, worker_cores


def run_two_ranks(worker: Callable[..., None], *args: Any) -> list[dict[str, Any]]:
    """Spawn `worker(rank, port, *args, out_dir)` on two processes (torch.multiprocessing,
    gloo over loopback) and return what each wrote to `out_dir`/rank<r>.json."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_bound, args=(worker, worker_cores("cpu", 2), free_port(), *args, tmp),
                 nprocs=2)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]


def _bound(rank: int, worker: Callable[..., None], cores: list[int] | None, *args: Any) -> None:
    """`worker(rank, *args)` on its own core, as `sim profile` and `sim trace` run theirs
    (validate/devices.py `worker_cores`)."""
    pin_worker(cores, rank)
    worker(rank, *args)


def reference_gemm_s(dist: Any) -> float:
    """Seconds of the reference GEMM timed exactly as `sim profile` and `sim trace` time theirs
    (validate/profiler.py `reference_gemm_s`: warmed up, batches of back-to-back calls, every
    process at once): the machine's speed at this moment, which `sim validate` compares with
    the trace's own (the host's speed drifts). `dist` is torch.distributed, initialised."""
    import torch

    from trainsim.validate import profiler  # deferred: start-up time (torch's importers)

    cpu = torch.device("cpu")
    return profiler.reference_gemm_s(cpu, dist.barrier, profiler.max_over_ranks(dist, cpu),
                                     lambda: None)


def provenance(script: str, load_before: float) -> dict[str, Any]:
    """The command, date and machine a data file records (load average before and now)."""
    return {"command": (f"python {script} " + " ".join(sys.argv[1:])).strip(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": {"cpu": platform.processor() or platform.machine(),
                        "logical_cores": os.cpu_count(), "load_average_before": load_before,
                        "load_average_after": os.getloadavg()[0],
                        "cpu_binding": cpu_binding(worker_cores("cpu", 2))}}


__all__ = ["provenance", "reference_gemm_s", "run_two_ranks"]
