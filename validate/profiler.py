"""`sim profile`: time the zoo's op kinds and the collectives with torch on this machine.

Which ops: every distinct (kind, shape) of a model's graph at a micro-batch size and each
tensor-parallel degree that fits the processes (the sharded ops, workloads/ops.py), run through
the same torch code the validation model runs (validate/torch_ops.py); forward and full backward
are timed separately. The Adam step is timed on each pipeline stage's real parameters. The
collectives (all-reduce, all-gather, reduce-scatter where the backend has it, and send/recv
ping-pong halved) run over torch.distributed at sizes from 4 KiB to 16 MiB plus the sizes the
plans need.

How: `processes` worker processes (2 by default: the CI machine has 2 cores) are spawned with
gloo on 127.0.0.1, each with one intra-op thread — the setting of the training runs — and time
every op at the same moment (a barrier before each), so the measurements see the same contention
for memory bandwidth, caches and CPU time as a real run. Each measurement is `warmup` untimed
calls then `repeats` timed batches of back-to-back calls (`MIN_BATCH_S`); a backward is a batch
of forward+backward minus a batch of forwards; a row keeps the median per-call time (quartiles
beside it), averaged over processes.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainsim.errors import TraceError
from trainsim.validate.profile_db import ProfileDB, ProfileRow

COLLECTIVE_SIZES_BYTES = tuple(4**k for k in range(6, 13))
"""4 KiB … 16 MiB (×4), the range between a tensor-parallel activation and a gradient bucket."""


def machine_metadata(processes: int, threads: int) -> dict[str, Any]:
    """CPU model, cores, clock, memory, OS, torch version and the run's processes/threads."""
    import torch

    model, mhz = platform.processor() or platform.machine(), 0.0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("", platform.machine()):
                model = line.split(":", 1)[1].strip()
            if line.startswith("cpu MHz") and not mhz:
                mhz = float(line.split(":", 1)[1])
    except OSError:
        pass
    memory = 0
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {"device": "cpu", "cpu_model": model, "cpu_mhz": round(mhz, 1),
            "logical_cores": os.cpu_count(), "memory_bytes": memory,
            "memory_bytes_per_process": memory // max(processes, 1),
            "os": platform.platform(terse=True), "python": platform.python_version(),
            "torch": torch.__version__, "backend": "gloo", "processes": processes,
            "threads_per_process": threads,
            "date": datetime.date.today().isoformat()}


def op_specs(model: str, micro_batch_size: int, tps: tuple[int, ...]
             ) -> list[dict[str, Any]]:
    """Distinct ops of `model`'s graph at each tp degree: kind, shape, FLOPs, bytes, context."""
    from trainsim.validate.small_models import get_validation_model
    from trainsim.workloads.model import build_graph

    spec = get_validation_model(model)
    graph = build_graph(spec, micro_batch_size)
    seen: dict[tuple[str, tuple[int, ...], float], dict[str, Any]] = {}
    for tp in tps:
        for layer in dict.fromkeys(graph.layers):
            causal = layer.kind != "transformer" or spec.family != "t5"
            score_shape: tuple[int, ...] = ()
            for op in layer.sharded_ops(tp):
                if op.kind == "attention_score":
                    score_shape = tuple(op.shape or ())
                key = (op.kind, tuple(op.shape or ()), op.fwd_flops)
                if key in seen:
                    continue
                seen[key] = {"kind": op.kind, "name": op.name, "shape": tuple(op.shape or ()),
                             "fwd_flops": op.fwd_flops, "bwd_flops": op.bwd_flops,
                             "fwd_bytes": op.fwd_bytes, "bwd_bytes": op.bwd_bytes, "tp": tp,
                             "score_shape": score_shape, "causal": causal and
                             not op.name.startswith("cross"), "bias": spec.bias and
                             op.name != "lm_head", "hidden": spec.hidden,
                             "vocab": spec.vocab_size, "b": micro_batch_size}
    return list(seen.values())


def _op_callable(o: dict[str, Any]) -> tuple[Callable[[], Any], list[Any]]:
    """(forward thunk, tensors whose grads to clear) running op `o` as the model runs it."""
    import torch

    from trainsim.validate import torch_ops as ops

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape).requires_grad_(True)

    kind, shape = o["kind"], o["shape"]
    if kind == "matmul":
        m, n, k = shape
        x, w = leaf(m, k), leaf(n, k)
        bias = leaf(n) if o["bias"] else None
        return (lambda: ops.matmul(x, w, bias)), [x, w, bias]
    if kind == "attention_score":
        bh, sq, skv, d = shape
        q, kk = leaf(bh, sq, d), leaf(bh, skv, d)
        return (lambda: ops.attention_score(q, kk)), [q, kk]
    if kind == "attention_context":
        bh, sq, d, skv = shape
        p, v = leaf(bh, sq, skv), leaf(bh, skv, d)
        return (lambda: ops.attention_context(p, v)), [p, v]
    if kind == "softmax":
        bh, sq, skv, d = o["score_shape"]
        x = leaf(bh, sq, skv)
        mask = ops.attention_mask(sq, skv, o["causal"])
        scale = 1.0 / d**0.5
        return (lambda: ops.scale_mask_softmax(x, mask, scale)), [x]
    (elements,) = shape
    h = o["hidden"]
    if kind in ("layernorm", "rmsnorm"):
        x, w, b = leaf(elements // h, h), leaf(h), leaf(h)
        return (lambda: ops.layernorm(x, w, b)), [x, w, b]
    if kind == "gelu":
        x = leaf(elements)
        return (lambda: ops.gelu(x)), [x]
    if kind == "elementwise":
        x, y = leaf(elements), leaf(elements)
        return (lambda: ops.residual_add(x, y)), [x, y]
    if kind == "embedding":
        tokens, tp, b = elements // h, o["tp"], o["b"]
        ids = torch.randint(0, o["vocab"], (b, tokens // b))
        word, pos = leaf(o["vocab"] // tp, h), leaf(tokens // b, h)
        return (lambda: ops.embedding(ids, word, pos, 0, None, vocab_parallel=tp > 1)), \
            [word, pos]
    if kind == "cross_entropy":
        tp = o["tp"]
        v_local = o["vocab"] // tp
        logits = leaf(elements // v_local, v_local)
        target = torch.randint(0, o["vocab"], (elements // v_local,))
        return (lambda: ops.cross_entropy(logits, target, 0, None)), [logits]
    raise TraceError(f"sim profile: op kind {kind!r} has no torch implementation")


MIN_BATCH_S = 0.02
"""Each timed repeat runs an op back to back for at least this long and divides: a process
sharing its core with others (time slices of milliseconds) then sees its average share of the
CPU, as during a training run, not the speed of one lucky uninterrupted call."""


def _time(fn: Callable[[], Any], warmup: int, repeats: int, barrier: Callable[[], None],
          agree: Callable[[int], int] = lambda n: n) -> list[float]:
    """Per-call seconds of `repeats` batches of back-to-back calls (see MIN_BATCH_S); `agree`
    makes every process use the same batch length (collectives must match call for call)."""
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
        fn()
    once = (time.perf_counter() - t0) / max(warmup, 1)
    calls = agree(max(1, min(1000, int(MIN_BATCH_S / max(once, 1e-7)))))
    out = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return out


def _stats(times: list[float]) -> dict[str, float]:
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return {"time_s": statistics.median(times), "p25_s": q[0], "p75_s": q[2]}


def _profile_worker(rank: int, cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from trainsim.validate import torch_model as tm
    from trainsim.validate.small_models import get_validation_model

    torch.set_num_threads(cfg["threads"])
    world = cfg["processes"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=world)
    rows: list[dict[str, Any]] = []
    warmup, repeats = cfg["warmup"], cfg["repeats"]

    def agree(n: int) -> int:
        t = torch.tensor([n])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    cfg["agree"] = agree
    try:
        for o in cfg["ops"]:
            fwd, leaves = _op_callable(o)

            def clear(leaves: list[Any] = leaves) -> None:
                for t in leaves:
                    if t is not None:
                        t.grad = None

            out = fwd()
            grad = torch.randn_like(out) if out.dim() > 0 else None

            def both(fwd: Callable[[], Any] = fwd, grad: Any = grad,
                     clear: Callable[[], None] = clear) -> None:
                clear()
                fwd().backward(grad)

            fwd_times = _time(fwd, warmup, repeats, dist.barrier, agree)
            both_times = _time(both, warmup, repeats, dist.barrier, agree)
            # backward = (forward + backward) - forward, repeat by repeat (sorted pairs)
            bwd_times = [max(b - f, 1e-9) for b, f in zip(sorted(both_times), sorted(fwd_times),
                                                          strict=True)]
            shape = list(o["shape"])
            rows.append({"kind": o["kind"], "shape": shape, "pass_": "fwd",
                         "flops": o["fwd_flops"], "bytes_moved": o["fwd_bytes"],
                         "repeats": repeats, **_stats(fwd_times)})
            rows.append({"kind": o["kind"], "shape": shape, "pass_": "bwd",
                         "flops": o["bwd_flops"], "bytes_moved": o["bwd_bytes"],
                         "repeats": repeats, **_stats(bwd_times)})
        spec = get_validation_model(cfg["model"])
        done: set[int] = set()
        for pp, tp in cfg["stage_plans"]:
            for stage in range(pp):
                model = tm.build_stage(spec, stage=stage, pp=pp, tp=tp, tp_rank=rank % tp)
                params = list(model.parameters())
                n = sum(p.numel() for p in params)
                if n in done:
                    continue
                done.add(n)
                for p in params:
                    p.grad = torch.randn_like(p)
                opt = torch.optim.Adam(params, lr=1e-4)
                times = _time(opt.step, warmup + 1, repeats, dist.barrier, agree)
                rows.append({"kind": "optimizer", "shape": [n], "pass_": "step",
                             "flops": 12.0 * n, "bytes_moved": 28.0 * n, "repeats": repeats,
                             **_stats(times)})
        rows += _collectives(dist, rank, world, cfg)
        Path(cfg["out_dir"], f"profile_rank{rank}.json").write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _collectives(dist: Any, rank: int, world: int, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    rows = []
    sizes = sorted(set(COLLECTIVE_SIZES_BYTES) | {int(s) for s in cfg["extra_sizes"]})
    for size in sizes:
        n = max(1, size // 4)
        x = torch.ones(n)
        reps = cfg["repeats"]
        calls: dict[str, Callable[[], Any]] = {"all_reduce": lambda x=x: dist.all_reduce(x)}
        if n % world == 0:
            parts = [torch.empty(n // world) for _ in range(world)]
            calls["all_gather"] = lambda p=parts, x=x: dist.all_gather(p, p[rank].clone())
            calls["reduce_scatter"] = lambda p=parts, x=x: dist.reduce_scatter(
                p[rank], list(x.chunk(world)))
        if world == 2:
            def ping(x: Any = x) -> None:
                if rank == 0:
                    dist.send(x, 1)
                    dist.recv(x, 1)
                else:
                    dist.recv(x, 0)
                    dist.send(x, 0)
            calls["p2p"] = ping
        for kind, fn in calls.items():
            try:
                times = _time(fn, cfg["warmup"] + 1, reps, dist.barrier, cfg["agree"])
            except (RuntimeError, ValueError):  # e.g. reduce_scatter on an old gloo
                continue
            if kind == "p2p":
                times = [t / 2 for t in times]
            if kind in ("all_gather", "reduce_scatter"):
                payload = float(n // world * world * 4)
            else:
                payload = float(n * 4)
            rows.append({"kind": kind, "shape": [], "pass_": "comm", "group_size": world,
                         "size_bytes": payload, "repeats": reps, **_stats(times)})
    return rows


def plan_sizes(model: str, micro_batch_size: int, tp: int) -> list[float]:
    """Collective sizes the small plans need: activations, the CE statistics, all gradients."""
    from trainsim.validate.small_models import get_validation_model

    spec = get_validation_model(model)
    tokens = micro_batch_size * spec.seq_len
    return [4.0 * tokens * spec.hidden, 3 * 4.0 * tokens * tp, 4.0 * spec.parameters()]


def run_profile(model: str = "tiny-gpt", *, micro_batch_size: int = 2, processes: int = 2,
                threads: int = 1, warmup: int = 3, repeats: int = 10,
                device: str = "cpu") -> ProfileDB:
    """Profile `model`'s ops and the collectives (module docstring) into a ProfileDB.

    Raises:
        TraceError: an unsupported device, an option out of range, more processes than CPUs
            or a model too large for the memory (validate/worker_limits.py), or a worker
            failed.
    """
    import tempfile

    import torch.multiprocessing as mp

    from trainsim.validate.small_models import get_validation_model
    from trainsim.validate.torch_parallel import free_port
    from trainsim.validate.worker_limits import (
        check_memory,
        check_processes,
        training_memory_bytes,
    )

    if device != "cpu":
        raise TraceError(f"sim profile --device {device!r}: only 'cpu' is implemented here "
                         f"(CUDA profiling needs a GPU machine)")
    for option, value, least in (("--micro-batch", micro_batch_size, 1),
                                 ("--processes", processes, 1), ("--threads", threads, 1),
                                 ("--warmup", warmup, 0), ("--repeats", repeats, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise TraceError(f"sim profile {option} {value!r} must be an integer >= {least}")
    check_processes("sim profile --processes", processes)
    spec = get_validation_model(model)
    # Each process times the Adam step of up to the whole model (the pp=1 stage plan).
    check_memory("sim profile --model", spec.name,
                 training_memory_bytes(spec.parameters(), processes, processes))
    tps = tuple(t for t in range(1, processes + 1)
                if processes % t == 0 and spec.num_heads % t == 0 and spec.vocab_size % t == 0)
    pps = [p for p in range(1, processes + 1) if processes % p == 0 and p <= spec.num_layers]
    if spec.family == "t5":
        tps, pps = (1,), [1]
    stage_plans = sorted({(pp, 1) for pp in pps} | {(1, tp) for tp in tps})
    extra = [s for tp in tps for s in plan_sizes(model, micro_batch_size, tp)]
    with tempfile.TemporaryDirectory(prefix="trainsim-profile-") as tmp:
        cfg = {"model": model, "ops": op_specs(model, micro_batch_size, tps),
               "stage_plans": stage_plans, "processes": processes, "threads": threads,
               "warmup": warmup, "repeats": repeats, "extra_sizes": extra, "out_dir": tmp,
               "port": free_port()}
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        try:
            mp.spawn(_profile_worker, args=(cfg,), nprocs=processes, join=True)
        except mp.ProcessRaisedException as exc:
            raise TraceError(f"a profiling worker failed: "
                             f"{str(exc).strip().splitlines()[-1]}") from None
        per_rank = [json.loads(Path(tmp, f"profile_rank{r}.json").read_text())
                    for r in range(processes)]
    rows = []
    for recs in zip(*per_rank, strict=True):
        first = recs[0]
        rows.append(ProfileRow(
            kind=first["kind"], shape=tuple(first["shape"]), pass_=first["pass_"],
            group_size=int(first.get("group_size", 1)),
            size_bytes=float(first.get("size_bytes", 0.0)),
            flops=float(first.get("flops", 0.0)), bytes_moved=float(first.get("bytes_moved", 0.0)),
            time_s=statistics.fmean(r["time_s"] for r in recs),
            p25_s=min(r["p25_s"] for r in recs), p75_s=max(r["p75_s"] for r in recs),
            repeats=int(first["repeats"])))
    meta = machine_metadata(processes, threads)
    meta.update({"model": spec.name, "micro_batch_size": micro_batch_size, "warmup": warmup,
                 "repeats": repeats, "tensor_parallel_degrees": list(tps),
                 "command": f"sim profile --device cpu --model {model} --micro-batch "
                            f"{micro_batch_size} --processes {processes} --warmup {warmup} "
                            f"--repeats {repeats}"})
    return ProfileDB(meta=meta, rows=tuple(rows))
