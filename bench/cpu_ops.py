"""Microbenchmark: eager PyTorch op dispatch, memory bandwidth and the Adam step on this CPU.

Two worker processes (one intra-op thread each, as the CPU traces in traces/ run) measure at
the same moment, a barrier before each call:

* **dispatch** — one eager op on a 1-element tensor (``torch.add(x, y, out=z)``): the fixed
  cost of an op call, and an autograd chain of `CHAIN` multiplications on a 1-element tensor,
  forward + backward, per op;
* **profiler** — the same autograd chain under ``torch.profiler`` (CPU activity, memory
  profiling on: how `sim trace` records its profiled iteration): the per-op cost the profiler
  adds to the per-kind times of a trace;
* **bandwidth** — ``y.copy_(x)`` and ``x.mul_(c)`` on 64 MiB tensors (read + write counted):
  what a memory-bound op streams from DRAM;
* **Adam** — ``torch.optim.Adam(params, lr=1e-4)`` with the library's CPU default (neither
  foreach nor fused on CPU in torch 2.x: one loop over the parameter tensors, the setting of
  validate/torch_parallel.py) on T tensors of P parameters each, timed *cold* (a 128 MiB buffer
  is written before each step, as an iteration's forward and backward evict the optimizer state
  from cache) and *warm* (back to back). The cold times are fitted as t = T·c_tensor + N·c_param
  (N = T·P parameters) by least squares on relative error.

Each figure is the median of `--repeats` timed calls, as the traces it is compared with keep
medians (their iteration and optimizer times). Until 2026-11-27 it was the fastest call, which
on the traces of that day priced the Adam step 20-32 % below their median steps (DP2 5.43
against 6.78 ms, PP2 7.37 against 9.98, T5 2.18 against 3.19). The reference GEMM is timed at
the start and end exactly as `sim profile` and `sim trace` time theirs (validate/profiler.py
`reference_gemm_s`: warmed up, batches of calls), so that its ratio to a trace's brings the
figures to the trace's machine speed.

Usage: ``python bench/cpu_ops.py [--repeats 40] [--json] [--write validate/data/cpu_ops.json]``.
``--write`` stores the fitted figures with the command, date, machine and the measured points
(validate/cpu_hardware.py reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from trainsim.validate.devices import prepare_workers
from trainsim.validate.microbench_runs import provenance, reference_gemm_s, run_two_ranks

CHAIN = 50
"""Ops in the autograd chain of the dispatch measurement."""
STREAM_BYTES = 64 * 2**20
"""Tensor size of the bandwidth measurement (beyond any cache)."""
EVICT_BYTES = 128 * 2**20
"""Buffer written before a cold Adam step (4x the 32 MiB L3 of the CI machine kind)."""
ADAM_CASES = [(10, 65536), (40, 16384), (160, 4096), (20, 131072), (80, 32768)]
"""(tensors, parameters per tensor) of the Adam measurements."""


def _median_time(fn: Any, barrier: Any, repeats: int, before: Any = None,
                 calls: int = 1) -> float:
    fn()
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return statistics.median(out)


def _worker(rank: int, port: int, repeats: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    bar = dist.barrier

    res: dict[str, Any] = {"reference_gemm_s": [reference_gemm_s(dist)]}
    x1, y1, z1 = torch.ones(1), torch.ones(1), torch.empty(1)
    res["dispatch_s"] = _median_time(lambda: torch.add(x1, y1, out=z1), bar, repeats,
                                     calls=200)

    def chain() -> None:
        w = torch.ones(1, requires_grad=True)
        v = w
        for _ in range(CHAIN):
            v = v * 1.0001
        v.backward()

    res["autograd_op_s"] = _median_time(chain, bar, repeats) / CHAIN
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        res["profiled_autograd_op_s"] = _median_time(chain, bar, repeats) / CHAIN
    n = STREAM_BYTES // 4
    xs, ys = torch.ones(n), torch.empty(n)
    res["copy_bytes_per_s"] = 2 * STREAM_BYTES / _median_time(lambda: ys.copy_(xs), bar,
                                                               repeats)
    res["mul_bytes_per_s"] = 2 * STREAM_BYTES / _median_time(lambda: xs.mul_(1.0), bar,
                                                              repeats)
    evict = torch.empty(EVICT_BYTES // 4)
    adam = []
    for tensors, per in ADAM_CASES:
        params = [torch.zeros(per, requires_grad=True) for _ in range(tensors)]
        for p in params:
            p.grad = torch.randn(per)
        opt = torch.optim.Adam(params, lr=1e-4)
        opt.step()
        cold = _median_time(opt.step, bar, repeats, before=lambda: evict.fill_(1.0))
        warm = _median_time(opt.step, bar, repeats)
        adam.append({"tensors": tensors, "params_per_tensor": per, "cold_s": cold,
                     "warm_s": warm})
    res["adam"] = adam
    res["reference_gemm_s"].append(reference_gemm_s(dist))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def fit_adam(points: list[dict[str, float]], key: str = "cold_s") -> tuple[float, float]:
    """(c_tensor s, c_param s) minimising Σ((T·c_tensor + N·c_param − t)/t)²."""
    import numpy as np

    a = np.asarray([[p["tensors"] / p[key], p["tensors"] * p["params_per_tensor"] / p[key]]
                    for p in points])
    sol, *_ = np.linalg.lstsq(a, np.ones(len(points)), rcond=None)
    return max(float(sol[0]), 0.0), max(float(sol[1]), 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    prepare_workers("cpu")  # the workers' glibc malloc settings of sim trace / sim profile
    load_before = os.getloadavg()[0]
    ranks = run_two_ranks(_worker, args.repeats)

    def mean(key: str) -> float:
        return (ranks[0][key] + ranks[1][key]) / 2

    adam = [{"tensors": a["tensors"], "params_per_tensor": a["params_per_tensor"],
             "cold_s": (a["cold_s"] + b["cold_s"]) / 2, "warm_s": (a["warm_s"] + b["warm_s"]) / 2}
            for a, b in zip(ranks[0]["adam"], ranks[1]["adam"])]
    c_tensor, c_param = fit_adam(adam)
    w_tensor, w_param = fit_adam(adam, "warm_s")
    out = {"_about": "eager PyTorch op costs on this CPU, 2 processes x 1 thread at once "
                     "(bench/cpu_ops.py docstring)",
           **provenance("bench/cpu_ops.py", load_before),
           "reference_gemm_s": statistics.mean(ranks[0]["reference_gemm_s"]
                                               + ranks[1]["reference_gemm_s"]),
           "dispatch_s": mean("dispatch_s"), "autograd_op_s": mean("autograd_op_s"),
           "profiled_autograd_op_s": mean("profiled_autograd_op_s"),
           "copy_bytes_per_s": mean("copy_bytes_per_s"),
           "mul_bytes_per_s": mean("mul_bytes_per_s"),
           "adam_cold": {"per_tensor_s": c_tensor, "per_param_s": c_param},
           "adam_warm": {"per_tensor_s": w_tensor, "per_param_s": w_param},
           "adam_points": adam}
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True))
    else:
        print(f"eager op dispatch            {1e6 * out['dispatch_s']:8.2f} us")
        print(f"autograd op (fwd + bwd)      {1e6 * out['autograd_op_s']:8.2f} us")
        print(f"same under torch.profiler    {1e6 * out['profiled_autograd_op_s']:8.2f} us")
        print(f"copy bandwidth (r+w)         {out['copy_bytes_per_s'] / 1e9:8.2f} GB/s")
        print(f"mul_ bandwidth (r+w)         {out['mul_bytes_per_s'] / 1e9:8.2f} GB/s")
        print(f"{'Adam tensors':>14}{'params/tensor':>15}{'cold (ms)':>11}{'fit (ms)':>10}"
              f"{'warm (ms)':>11}")
        for a in adam:
            model = a["tensors"] * c_tensor + a["tensors"] * a["params_per_tensor"] * c_param
            print(f"{a['tensors']:14d}{a['params_per_tensor']:15d}{1e3 * a['cold_s']:11.3f}"
                  f"{1e3 * model:10.3f}{1e3 * a['warm_s']:11.3f}")
        print(f"Adam cold fit: {1e6 * c_tensor:.1f} us per tensor + {1e9 * c_param:.2f} ns per "
              f"parameter; warm: {1e6 * w_tensor:.1f} us + {1e9 * w_param:.2f} ns")
        print(f"reference GEMM               {1e3 * out['reference_gemm_s']:8.3f} ms")
        print(f"load average {load_before:.2f} -> {out['machine']['load_average_after']:.2f}")
    if args.write is not None:
        args.write.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
