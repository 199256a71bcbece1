"""Microbenchmark: gloo collectives over loopback TCP on this machine, and their α-β fit.

Two worker processes (one intra-op thread each, gloo on 127.0.0.1 — the setting of the CPU
traces in traces/) time, per message size S from 4 B to 16 MiB:

* ``p2p`` — a send/recv ping-pong, halved: one message one way;
* ``all_reduce`` — back to back (both processes spin through the loop);
* ``all_reduce_after_compute`` — what an all-reduce adds to a loop of `FILLER_CALLS` GEMMs +
  all-reduce (loop with it minus loop without, per call): a training step issues every
  all-reduce after an op,
  and the process that arrives first sleeps in gloo and must be woken.

Each point is the fastest of `--repeats` timed calls after `--warmup` untimed ones (a barrier
before each call; for the after-compute rows, the fastest loop with the all-reduce minus the
fastest without): on a host shared with other jobs, interference only adds time — a sleeping
process waits for a free core before it even starts waking — and the traces the fit serves
were recorded on a quiet machine. (Medians taken at a load average of 4 gave 5–6 ms for every
after-compute all-reduce up to 256 KiB, against ~1.3 ms in the quiet profile of traces/.) The fit, per kind, by least squares on relative error, is the α-β model the
simulator uses (Thakur et al. 2005; simulator/collectives.py): p2p t = α + S/β; ring all-reduce
over n ranks t = 2(n−1)·α + 2(n−1)/n · S/β (α per step).

Usage: ``python bench/gloo_collectives.py [--repeats 20] [--warmup 3] [--json]
[--write validate/data/gloo_loopback.json]``. ``--write`` stores the fit with the command, date,
machine and the measured points (validate/cpu_hardware.py reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

from trainsim.validate.cpu_hardware import collective_steps_volume
from trainsim.validate.devices import prepare_workers
from trainsim.validate.microbench_runs import provenance, reference_gemm_s, run_two_ranks
from trainsim.validate.profiler import FILLER_CALLS, FILLER_GEMM, ping_pong

SIZES_BYTES = [4, 64, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216]


def _time(fn: Any, barrier: Any, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _worker(rank: int, port: int, warmup: int, repeats: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    m, n, k = FILLER_GEMM
    a, b = torch.randn(m, k), torch.randn(n, k)

    reference = [reference_gemm_s(dist)]
    rows: list[dict[str, Any]] = []
    for size in SIZES_BYTES:
        x = torch.ones(max(1, size // 4))

        def gemm() -> None:
            for _ in range(FILLER_CALLS):
                a @ b.t()

        def both(x: Any = x) -> None:
            gemm()
            dist.all_reduce(x)

        ping = partial(ping_pong, dist, rank, x)
        p2p = [t / 2 for t in _time(ping, dist.barrier, warmup, repeats)]
        ar = _time(lambda x=x: dist.all_reduce(x), dist.barrier, warmup, repeats)
        alone = min(_time(gemm, dist.barrier, warmup, repeats))
        added = max(min(_time(both, dist.barrier, warmup, repeats)) - alone, 0.0)
        for kind, t in (("p2p", min(p2p)), ("all_reduce", min(ar)),
                        ("all_reduce_after_compute", added)):
            rows.append({"kind": kind, "size_bytes": float(x.numel() * 4), "time_s": t})
    reference.append(reference_gemm_s(dist))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"rows": rows,
                                                             "reference": reference}))
    dist.barrier()
    dist.destroy_process_group()


def fit(points: list[dict[str, float]], kind: str, n: int = 2) -> tuple[float, float]:
    """(α s, β bytes/s) minimising Σ((steps·α + volume/β − t)/t)² over `points` of `kind`."""
    import numpy as np

    rows = [p for p in points if p["kind"] == kind and p["time_s"] > 0]
    a = np.asarray([[collective_steps_volume(kind, n, p["size_bytes"])[0] / p["time_s"],
                     collective_steps_volume(kind, n, p["size_bytes"])[1] / p["time_s"]] for p in rows])
    sol, *_ = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)
    return max(float(sol[0]), 0.0), 1.0 / max(float(sol[1]), 1e-15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    prepare_workers("cpu")  # the workers' glibc malloc settings of sim trace / sim profile
    load_before = os.getloadavg()[0]
    per_rank = run_two_ranks(_worker, args.warmup, args.repeats)
    points = [{"kind": a["kind"], "size_bytes": a["size_bytes"],
               "time_s": (a["time_s"] + b["time_s"]) / 2}
              for a, b in zip(per_rank[0]["rows"], per_rank[1]["rows"])]
    reference_s = statistics.mean(per_rank[0]["reference"] + per_rank[1]["reference"])
    fits = {kind: dict(zip(("alpha_s", "beta_bytes_per_s"), fit(points, kind)))
            for kind in ("p2p", "all_reduce", "all_reduce_after_compute")}
    out = {"_about": "gloo over loopback TCP, 2 processes x 1 thread: alpha-beta fit per "
                     "collective kind (bench/gloo_collectives.py docstring)",
           **provenance("bench/gloo_collectives.py", load_before),
           "reference_gemm_s": reference_s, "fit": fits, "points": points}
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True))
    else:
        print(f"{'kind':26}{'size (B)':>12}{'time (us)':>12}{'alpha-beta (us)':>17}")
        for p in points:
            f = fits[p["kind"]]
            steps, vol = collective_steps_volume(p["kind"], 2, p["size_bytes"])
            model = steps * f["alpha_s"] + vol / f["beta_bytes_per_s"]
            print(f"{p['kind']:26}{p['size_bytes']:12.0f}{1e6 * p['time_s']:12.1f}"
                  f"{1e6 * model:17.1f}")
        for kind, f in fits.items():
            print(f"fit {kind}: alpha {1e6 * f['alpha_s']:.1f} us per step, "
                  f"beta {f['beta_bytes_per_s'] / 1e9:.3f} GB/s")
        print(f"reference GEMM {1e3 * reference_s:.3f} ms")
        print(f"load average {out['machine']['load_average_before']:.2f} -> "
              f"{out['machine']['load_average_after']:.2f}")
    if args.write is not None:
        args.write.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
