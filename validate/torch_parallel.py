"""Real training iterations of a small model under a parallel plan, in separate processes.

`run_parallel(spec, plan, ...)` spawns dp·tp·pp worker processes (torch.multiprocessing, gloo on
127.0.0.1 only) that train the model for warm-up + measured iterations and write what they saw
to one JSON file per rank. Ranks are laid out as the lowering lays out GPUs (Megatron-LM: tensor
parallel innermost, then data parallel, then pipeline): rank = stage·dp·tp + replica·tp + t.

* data parallel: after the last backward every replica all-reduces its gradients as one
  flattened buffer and divides by dp (one bucket, as the lowering's DDP model has for a model
  under 25 MiB of gradients);
* pipeline parallel: each stage runs its action list of the simulator's own 1F1B schedule
  (simulator/schedules.py), with blocking receives and non-blocking sends of [tokens, hidden]
  activations and their gradients between stages;
* tensor parallel: column/row-parallel linears with all-reduces inside forward and backward
  (validate/torch_ops.py).

Each worker uses one intra-op thread (two processes share two cores). Timed iterations run
without the profiler. `BREAKDOWN_ITERATIONS` more run with clocks around every op, autograd node
and collective (validate/op_clock.py): the per-kind breakdown. One last iteration runs under
torch.profiler (per-op ranges, CPU memory events) and is folded into per-op events and a peak
of live tensor bytes by trace_import.

``device="cuda"`` (validate/devices.py) runs the same code with NCCL, one GPU per worker
(``LOCAL_RANK``), host timers read after ``torch.cuda.synchronize()``, op ranges synchronized
in the profiled iteration, and the peak memory of that iteration from
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainsim.errors import TraceError
from trainsim.simulator.schedules import get_schedule
from trainsim.validate import op_clock
from trainsim.validate.devices import (
    check_device,
    free_port,
    pin_worker,
    prepare_workers,
    synchronize,
    worker_cores,
    worker_device,
)
from trainsim.validate.native_stderr import filtered_native_stderr
from trainsim.validate.profiler import max_over_ranks, reference_gemm_s
from trainsim.validate.small_models import get_validation_model
from trainsim.validate.worker_limits import (
    check_calls,
    check_memory,
    check_processes,
    micro_batch_activation_bytes,
    training_memory_bytes,
)

BREAKDOWN_ITERATIONS = 5
"""Iterations run with an `OpClock` after the timed ones on CPU; the trace keeps each kind's
median over them (validate/op_clock.py). On a GPU the clocks would read kernel launches, so
the breakdown comes from the profiled iteration's synchronized op ranges."""
GRAD_COPY_TRAFFIC = 6.0
"""Bytes read and written per gradient byte around a data-parallel all-reduce here (the
iteration below): ``torch.cat`` of the gradients into one buffer (read, write: 2) before it,
``div_`` of the buffer (2) and its ``copy_`` back into the gradients (2) after it; what
`sim validate` sets as `ModelSpec.grad_copy_traffic` for a trace of this harness."""
WORKER_THREADS = 1
"""Intra-op threads per worker (one core per process on the 2-core CI machine)."""


def rank_layout(rank: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(stage, replica, tp index) of a global rank (tp innermost, then dp, then pp)."""
    per_stage = dp * tp
    return rank // per_stage, (rank % per_stage) // tp, rank % tp


def _groups(dist: Any, world: int, dp: int, tp: int, pp: int, rank: int
            ) -> tuple[Any, Any, Any]:
    """This rank's tensor-parallel, data-parallel and embedding process groups (every rank
    creates every group). The embedding group pairs a pipeline's first and last rank, which
    hold the two copies of the tied word embedding (None without a pipeline)."""
    tp_group = dp_group = emb_group = None
    for s in range(pp):
        for d in range(dp):
            ranks = [s * dp * tp + d * tp + t for t in range(tp)]
            g = dist.new_group(ranks) if tp > 1 else None
            if rank in ranks:
                tp_group = g
        for t in range(tp):
            ranks = [s * dp * tp + d * tp + t for d in range(dp)]
            g = dist.new_group(ranks) if dp > 1 else None
            if rank in ranks:
                dp_group = g
    for d in range(dp if pp > 1 else 0):
        for t in range(tp):
            ranks = [d * tp + t, (pp - 1) * dp * tp + d * tp + t]
            g = dist.new_group(ranks)
            if rank in ranks:
                emb_group = g
    return tp_group, dp_group, emb_group


def _worker(rank: int, cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from trainsim.validate import torch_model as tm  # deferred: start-up time (torch)

    pin_worker(cfg["cores"], rank)
    torch.set_num_threads(WORKER_THREADS)
    dp, tp, pp = cfg["dp"], cfg["tp"], cfg["pp"]
    world = dp * tp * pp
    dev = worker_device(cfg["device"], rank)
    dist.init_process_group(cfg["backend"], init_method=f"tcp://127.0.0.1:{cfg['port']}",
                            rank=rank, world_size=world)

    def clock() -> float:
        synchronize(dev)
        return time.perf_counter()

    try:
        tp_group, dp_group, emb_group = _groups(dist, world, dp, tp, pp, rank)
        spec = get_validation_model(cfg["model"])
        stage, replica, t = rank_layout(rank, dp, tp)
        model = tm.build_stage(spec, stage=stage, pp=pp, tp=tp, tp_rank=t,
                               seed=cfg["seed"]).to(dev)
        params = [p for p in model.parameters()]
        optimizer = torch.optim.Adam(params, lr=1e-4)
        b, m = cfg["micro_batch_size"], cfg["num_micro_batches"]
        s = spec.seq_len
        batches = [tm.batch(spec, b, seed=1000 * replica + j, device=dev) for j in range(m)]
        actions = get_schedule("1f1b")(pp, m, 1)[stage]
        prev_rank = rank - dp * tp if stage > 0 else None
        next_rank = rank + dp * tp if stage < pp - 1 else None
        shape = (b * s, spec.hidden)

        def iteration(record: dict[str, Any] | None) -> None:
            optimizer.zero_grad(set_to_none=True)
            inputs: dict[int, Any] = {}
            outputs: dict[int, Any] = {}
            sends: list[Any] = []
            for a in actions:
                if a is None:  # an idle slot (1F1B has none)
                    continue
                j = a.micro_batch
                if a.kind == "F":
                    if prev_rank is None:
                        x = batches[j]["ids"]
                    else:
                        x = torch.empty(shape, device=dev)
                        with op_clock.comm():
                            dist.recv(x, src=prev_rank)
                        x.requires_grad_(True)
                    t0 = clock()
                    with tm.op_range("action", f"{stage}F{j}"):
                        out = model(x, b, s, tp_group, targets=batches[j]["targets"],
                                    dec_ids=batches[j].get("dec_ids"))
                        if next_rank is None:
                            out = out / m
                    t1 = clock()
                    timing = op_clock.current()
                    if timing is not None:
                        timing.hook_backward(out)
                    inputs[j], outputs[j] = x, out
                    if next_rank is not None:
                        sends.append(dist.isend(out.detach(), dst=next_rank))
                else:
                    grad = None
                    if next_rank is not None:
                        grad = torch.empty(shape, device=dev)
                        with op_clock.comm():
                            dist.recv(grad, src=next_rank)
                    t0 = clock()
                    with tm.op_range("action", f"{stage}B{j}"):
                        torch.autograd.backward(outputs.pop(j), grad)
                    t1 = clock()
                    x = inputs.pop(j)
                    if prev_rank is not None:
                        sends.append(dist.isend(x.grad, dst=prev_rank))
                if record is not None:
                    record["compute_s"] += t1 - t0
            t0 = clock()
            if dp_group is not None:
                grads = [p.grad for p in params if p.grad is not None]
                flat = torch.cat([g.reshape(-1) for g in grads])
                with op_clock.comm():
                    dist.all_reduce(flat, group=dp_group)
                flat.div_(dp)
                offset = 0
                for g in grads:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
            if emb_group is not None and spec.tied_embeddings:
                # the two copies of the tied word embedding get the same gradient, as
                # Megatron-LM's embedding group does after the data-parallel reduction (its
                # time counts in the trace's dp_sync_s, a pipeline's only "sync" with dp 1)
                with op_clock.comm():
                    dist.all_reduce(model.wte.grad, group=emb_group)
            t1 = clock()
            optimizer.step()
            t2 = clock()
            timing = op_clock.current()
            if timing is not None:
                timing.add("optimizer", t2 - t1)
            with op_clock.comm():
                for w in sends:
                    w.wait()
            if record is not None:
                record["dp_sync_s"] += t1 - t0
                record["optimizer_s"] += t2 - t1
                record["compute_s"] += t2 - t1


        agree = max_over_ranks(dist, dev)
        reference = [reference_gemm_s(dev, dist.barrier, agree, lambda: synchronize(dev))]
        for _ in range(cfg["warmup"]):
            iteration(None)
        times, parts = [], []
        for _ in range(cfg["iterations"]):
            record = {"compute_s": 0.0, "dp_sync_s": 0.0, "optimizer_s": 0.0}
            dist.barrier()
            t0 = clock()
            iteration(record)
            times.append(clock() - t0)
            parts.append(record)
        reference.append(reference_gemm_s(dev, dist.barrier, agree,
                                          lambda: synchronize(dev)))
        breakdown: list[dict[str, float]] = []  # per-kind seconds by clocks (op_clock.py)
        for _ in range(BREAKDOWN_ITERATIONS if dev.type == "cpu" else 0):
            dist.barrier()
            with op_clock.running() as clocked:
                iteration(None)
            breakdown.append(clocked.kind_s)
        # one profiled iteration, after the others (straight after the reference GEMM it ran
        # 40 % slower: the caches held the GEMM's data): per-op events and CPU memory
        from torch.profiler import ProfilerActivity, profile

        dist.barrier()
        tm.profiling(True, dev)
        trace_path = Path(cfg["out_dir"]) / f"kineto_rank{rank}.json"
        activities = [ProfilerActivity.CPU]
        if dev.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.reset_peak_memory_stats(dev)
        with filtered_native_stderr(), profile(activities=activities,
                                               profile_memory=True) as prof:
            iteration(None)
        tm.profiling(False)
        cuda_peak = int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
        prof.export_chrome_trace(str(trace_path))
        state_bytes = tm.tensor_bytes(iter(params)) + tm.tensor_bytes(
            v for st in optimizer.state.values() for v in st.values()
            if torch.is_tensor(v) and v.dim() > 0)
        result = {"rank": rank, "stage": stage, "replica": replica, "tp_index": t,
                  "iteration_times_s": times, "parts": parts,
                  "param_bytes": tm.tensor_bytes(iter(params)),
                  "state_bytes": state_bytes, "kineto": trace_path.name,
                  "device_peak_bytes": cuda_peak, "reference_gemm_s": reference,
                  "cpu_core": cfg["cores"][rank] if cfg["cores"] else None,
                  "breakdown": breakdown}
        Path(cfg["out_dir"], f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_parallel(model: str, *, dp: int, tp: int, pp: int, micro_batch_size: int,
                 num_micro_batches: int, iterations: int, warmup: int, out_dir: str | Path,
                 seed: int = 0, device: str = "cpu") -> list[dict[str, Any]]:
    """Spawn the workers, wait for them, and return each rank's record (rank order).

    Raises:
        TraceError: a degree does not fit the model (heads, vocabulary, layers), more workers
            than CPUs (cpu) or GPUs (cuda, validate/devices.py) or a model too large for the
            memory (validate/worker_limits.py), or a worker died.
    """

    spec = get_validation_model(model)
    if spec.family not in ("gpt", "t5"):
        raise TraceError(f"model {spec.name!r}: family {spec.family!r} has no torch model")
    if spec.family == "t5" and (tp > 1 or pp > 1):
        raise TraceError(f"model {spec.name!r}: T5 runs with data parallelism only (tp=pp=1)")
    if spec.num_heads % tp or spec.vocab_size % tp or int(spec.ffn_hidden or 0) % tp:
        raise TraceError(f"plan tp={tp} must divide num_heads={spec.num_heads}, "
                         f"vocab_size={spec.vocab_size} and ffn_hidden={spec.ffn_hidden}")
    if pp > spec.num_layers:
        raise TraceError(f"plan pp={pp} exceeds model num_layers={spec.num_layers}")
    world = dp * tp * pp
    backend = check_device("sim trace", device, world)
    if device == "cpu":
        check_processes(f"--plan dp={dp},tp={tp},pp={pp}", world)
    # the timed and warm-up iterations, the clocked ones and the profiled one
    steps = (iterations + warmup + BREAKDOWN_ITERATIONS + 1) * (num_micro_batches or 1)
    check_calls("sim trace --iterations/--warmup/--micro-batches", steps, "micro-batch steps")
    check_memory("--model", spec.name, training_memory_bytes(
        spec.parameters(), dp, world, micro_batch_activation_bytes(spec, micro_batch_size)))
    cfg = {"model": model, "dp": dp, "tp": tp, "pp": pp, "micro_batch_size": micro_batch_size,
           "num_micro_batches": num_micro_batches, "iterations": iterations, "warmup": warmup,
           "out_dir": str(out_dir), "seed": seed, "port": free_port(), "device": device,
           "backend": backend, "cores": worker_cores(device, world, WORKER_THREADS)}
    import torch.multiprocessing as mp

    prepare_workers(device)
    try:
        mp.spawn(_worker, args=(cfg,), nprocs=world, join=True)
    except mp.ProcessRaisedException as exc:
        raise TraceError(f"a training worker failed: {str(exc).strip().splitlines()[-1]}") \
            from None
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
