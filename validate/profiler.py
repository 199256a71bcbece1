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

**Solo timings.** With 2+ processes on CPU every op is timed a second time by process 0 alone
while the others wait in a barrier (gloo's wait sleeps, it does not spin): the ``solo_s``
column. Where the processes share CPU time (other jobs, fewer free cores than processes) an op
of a pipeline stage that computes while the other stage waits runs faster than the
all-at-once figure says; validate/contention.py uses both figures.

Several models (``--model tiny-gpt,tiny-t5``) go into one database: the union of their ops
(rows are keyed by kind, shape and pass, so a shape two models share is timed once), the Adam
step of each model's stages and the collective sizes of each.

**Whole models** (``model:<name>`` rows, pass ``fwdbwd``, shape the micro-batch size): one
micro-batch's forward and backward of each model, unsplit (tp 1, pp 1), timed like an op. Run
whole, a model takes longer than its ops timed one by one: the glue between them (head
split/merge views and copies, the autograd engine walking ~170-240 nodes a micro-batch) and
caches its other layers have evicted. On the CI machine kind on 2026-11-27, alone: tiny-t5
19.3-20.5 ms for two micro-batches against 14.3 ms of its profiled ops (×1.35-1.43), tiny-gpt
124.5-131 against 116.2 ms (×1.07-1.13). `sim validate` scales the ops by that ratio
(validate/compare.py, in-model factor).

**Ops inside the model** (``model:<name>:<kind>`` rows, passes ``fwd_in_model`` and
``bwd_in_model``): the whole model run again micro-batch by micro-batch with a clock read around
each op's forward and each autograd node of its backward (validate/op_clock.py, no profiler;
backward nodes by the kind their name maps to, the attention core's two as one). Inside a model
an op often finds its data out of cache: its input was written ops ago, another process shares
the last-level cache, and the first ops follow the optimizer step. On the CI machine kind
(2026-11-27, one process, tiny-gpt) a layer norm forward took 28 µs back to back and 67 µs
inside the model, softmax 133 / 232 µs, a residual add 11 / 30 µs, the embedding 32 / 250 µs,
GEMMs and GELU within a few per cent. `sim validate` scales each kind's forwards and backwards
by their own in-model ratios (validate/compare.py `in_model_scales`). A node's kind is its name's
(validate/trace_import.py), so a backward the zoo counts in one op can land in another kind
(the softmax's scale-and-mask add, the embedding's position add: both elementwise), the same
way in the profile and in the traces. On CPU only: on a GPU the clocks would read launches.

**All-reduces as training issues them** (``all_reduce_after_compute`` rows, 2+ processes on
CPU): each process runs `FILLER_CALLS` GEMMs (`FILLER_GEMM`) then the all-reduce, in a loop,
and the row's time is the all-reduce's own, timed call by call (it includes waiting for the
peer, as in training). What an all-reduce adds to such a loop grows with the compute before
it and levels off: on the CI machine kind on
2026-11-27 a 256 KiB all-reduce added 1.2-1.8 ms back to back, 2.4-3.0 ms after one GEMM
(1.4 ms), 3.2-3.6 ms after two, 3.2-3.8 after four and 3.2-4.4 after eight, and about as much
after sleeping that long (so it is the wake-up, not the compute); a training step's
collectives follow 2-6 ms (tensor-parallel) to 100+ ms (data-parallel) of compute. On a
machine whose processes sleep while they wait this is larger than the back-to-back figure: a
process that reaches the collective first sleeps in gloo, and waking it again costs. The
cpu link's α-β fit uses these rows (validate/cpu_hardware.py).

**Reference GEMM.** The machine's speed drifts: on the CI machine kind two processes' GEMMs
ran at ~85 GFLOP/s each at one moment and at ~50 GFLOP/s each a quarter of an hour later,
with nothing else running in the guest (its host is shared). So the profile and every trace
time the same `FILLER_GEMM`, all processes at once, at their start and end
(`reference_gemm_s`, in the metadata); `sim validate` scales the profiled op times by the
trace's figure over the profile's (validate/compare.py) and prints the factor. A process's
first GEMMs run slow: in a `sim profile` of 2026-11-27 the start's reference took 2.11 and
2.08 ms per call (two processes), the end's 1.42 and 1.43 ms, and the profile's own row of
that GEMM 1.46 ms. So the reference first runs the GEMM for `REFERENCE_WARMUP_S` (the profile
says so in ``reference_warmup_s``). Even warmed up, a profile's ends can see another speed
than its rows (2.23 ms at the ends against 1.52 ms in the row, in a recording that day), so
`sim validate` takes the profile's side from its own row of that GEMM, timed among the op rows
it stands for; a trace's ends bracket its timed iterations (validate/compare.py
`profile_reference_s`).

``--device cuda`` (validate/devices.py): NCCL, one GPU per process, timers read after
``torch.cuda.synchronize()``; no solo timings (each process has its own GPU).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from trainsim.errors import TraceError
from trainsim.validate import op_clock
from trainsim.validate.devices import (
    check_device,
    cpu_binding,
    device_metadata,
    free_port,
    pin_worker,
    prepare_workers,
    synchronize,
    worker_cores,
    worker_device,
)
from trainsim.validate.profile_db import WHOLE_MODEL, ProfileDB, ProfileRow
from trainsim.validate.small_models import get_validation_model
from trainsim.validate.worker_limits import (
    check_calls,
    check_memory,
    check_processes,
    micro_batch_activation_bytes,
    training_memory_bytes,
)
from trainsim.workloads.model import build_graph

COLLECTIVE_SIZES_BYTES = tuple(4**k for k in range(6, 13))
"""4 KiB … 16 MiB (×4), the range between a tensor-parallel activation and a gradient bucket."""


def machine_metadata(processes: int, threads: int, device: str = "cpu") -> dict[str, Any]:
    """CPU model, cores, clock, memory, OS, torch version and the run's processes/threads
    (plus GPU name, count and CUDA version on cuda)."""
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
            "date": datetime.date.today().isoformat(), **device_metadata(device)}


def _load_average() -> float | None:
    """1-minute load average (/proc/loadavg), None where unreadable: how busy the machine
    was, recorded beside the measurements."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def op_specs(model: str, micro_batch_size: int, tps: tuple[int, ...],
             seen: dict[tuple[str, tuple[int, ...], float], dict[str, Any]] | None = None
             ) -> list[dict[str, Any]]:
    """Distinct ops of `model`'s graph at each tp degree: kind, shape, FLOPs, bytes, context
    (added to `seen`, which several models share, and all of `seen` returned)."""

    spec = get_validation_model(model)
    graph = build_graph(spec, micro_batch_size)
    seen = {} if seen is None else seen
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


def _op_callable(o: dict[str, Any], dev: Any = None) -> tuple[Callable[[], Any], list[Any]]:
    """(forward thunk, tensors whose grads to clear) running op `o` as the model runs it."""
    import torch

    from trainsim.validate import torch_ops as ops  # deferred: start-up time (torch)

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev).requires_grad_(True)

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
        mask = ops.attention_mask(sq, skv, o["causal"], dev)
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
        ids = torch.randint(0, o["vocab"], (b, tokens // b), device=dev)
        word, pos = leaf(o["vocab"] // tp, h), leaf(tokens // b, h)
        return (lambda: ops.embedding(ids, word, pos, 0, None, vocab_parallel=tp > 1)), \
            [word, pos]
    if kind == "cross_entropy":
        tp = o["tp"]
        v_local = o["vocab"] // tp
        logits = leaf(elements // v_local, v_local)
        target = torch.randint(0, o["vocab"], (elements // v_local,), device=dev)
        return (lambda: ops.cross_entropy(logits, target, 0, None)), [logits]
    raise TraceError(f"sim profile: op kind {kind!r} has no torch implementation")


FILLER_GEMM = (256, 1024, 256)
"""(m, n, k) of the reference GEMM and of the GEMMs run before each all-reduce in the
``all_reduce_after_compute`` rows: tiny-gpt's FC1, ~1.4 ms on the CI machine kind."""
FILLER_CALLS = 4
"""`FILLER_GEMM`s run before each all-reduce of the ``all_reduce_after_compute`` rows: ~6 ms,
where the all-reduce's cost has levelled off (module docstring); one GEMM, as profiles before
2026-11-27 ran, measured it still rising."""
AFTER_COMPUTE_CALLS = 4
"""Calls (GEMMs, then the timed all-reduce) per repeat of an ``all_reduce_after_compute``
row."""
INTERLEAVED_SIZES_BYTES = (4096, 65536, 2**20)
"""Sizes of the ``all_reduce_after_compute`` rows besides the ones the plans need."""

REFERENCE_REPEATS = 10
"""Timed batches of the reference GEMM at each end of a profile or trace."""

REFERENCE_WARMUP_S = 0.5
"""Seconds of the reference GEMM run untimed first (module docstring: a fresh process's
first GEMMs run ~45 % slower)."""

IN_MODEL_CALLS_PER_REPEAT = 2
"""Micro-batches a whole model runs with its ops timed inside it, per repeat (each one call,
so more of them than batches)."""

MIN_BATCH_S = 0.02
"""Each timed repeat runs an op back to back for at least this long and divides: a process
sharing its core with others (time slices of milliseconds) then sees its average share of the
CPU, as during a training run, not the speed of one lucky uninterrupted call."""


def _time(fn: Callable[[], Any], warmup: int, repeats: int, barrier: Callable[[], None],
          agree: Callable[[int], int] = lambda n: n,
          sync: Callable[[], None] = lambda: None) -> list[float]:
    """Per-call seconds of `repeats` batches of back-to-back calls (see MIN_BATCH_S); `agree`
    makes every process use the same batch length (collectives must match call for call);
    `sync` waits for a GPU's queued work before each clock read."""
    sync()
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
        fn()
    sync()
    once = (time.perf_counter() - t0) / max(warmup, 1)
    calls = agree(max(1, min(1000, int(MIN_BATCH_S / max(once, 1e-7)))))
    out = []
    for _ in range(repeats):
        barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / calls)
    return out


def _stats(times: list[float]) -> dict[str, float]:
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return {"time_s": statistics.median(times), "p25_s": q[0], "p75_s": q[2]}


def _solo(fn: Callable[[], Any], rank: int, warmup: int, repeats: int, dist: Any,
          sync: Callable[[], None]) -> list[float]:
    """Process 0 times `fn` alone while the others wait in a barrier (module docstring)."""
    times = _time(fn, warmup, repeats, lambda: None, sync=sync) if rank == 0 else []
    dist.barrier()
    return times


def _backward(both: list[float], fwd: list[float]) -> list[float]:
    """(forward + backward) − forward, repeat by repeat (sorted pairs)."""
    return [max(b - f, 1e-9) for b, f in zip(sorted(both), sorted(fwd), strict=True)]


def _profile_worker(rank: int, cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from trainsim.validate import torch_model as tm  # deferred: start-up time (torch)

    pin_worker(cfg["cores"], rank)
    torch.set_num_threads(cfg["threads"])
    world = cfg["processes"]
    dev = worker_device(cfg["device"], rank)
    dist.init_process_group(cfg["backend"], init_method=f"tcp://127.0.0.1:{cfg['port']}",
                            rank=rank, world_size=world)
    rows: list[dict[str, Any]] = []
    warmup, repeats = cfg["warmup"], cfg["repeats"]
    solo = cfg["solo"]

    def sync() -> None:
        synchronize(dev)

    agree = max_over_ranks(dist, dev)
    cfg["agree"], cfg["sync"], cfg["dev"] = agree, sync, dev
    try:
        reference = [reference_gemm_s(dev, dist.barrier, agree, sync)]
        for o in cfg["ops"]:
            fwd, leaves = _op_callable(o, dev)

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

            fwd_times = _time(fwd, warmup, repeats, dist.barrier, agree, sync)
            bwd_times = _backward(_time(both, warmup, repeats, dist.barrier, agree, sync),
                                  fwd_times)
            solo_fwd = solo_bwd = None
            if solo:
                sf = _solo(fwd, rank, warmup, repeats, dist, sync)
                sb = _solo(both, rank, warmup, repeats, dist, sync)
                if sf:
                    solo_fwd = statistics.median(sf)
                    solo_bwd = statistics.median(_backward(sb, sf))
            shape = list(o["shape"])
            rows.append({"kind": o["kind"], "shape": shape, "pass_": "fwd",
                         "flops": o["fwd_flops"], "bytes_moved": o["fwd_bytes"],
                         "repeats": repeats, "solo_s": solo_fwd, **_stats(fwd_times)})
            rows.append({"kind": o["kind"], "shape": shape, "pass_": "bwd",
                         "flops": o["bwd_flops"], "bytes_moved": o["bwd_bytes"],
                         "repeats": repeats, "solo_s": solo_bwd, **_stats(bwd_times)})
        done: set[int] = set()
        for name, pp, tp in cfg["stage_plans"]:
            spec = get_validation_model(name)
            for stage in range(pp):
                model = tm.build_stage(spec, stage=stage, pp=pp, tp=tp,
                                       tp_rank=rank % tp).to(dev)
                params = list(model.parameters())
                n = sum(p.numel() for p in params)
                if n in done:
                    continue
                done.add(n)
                for p in params:
                    p.grad = torch.randn_like(p)
                opt = torch.optim.Adam(params, lr=1e-4)
                times = _time(opt.step, warmup + 1, repeats, dist.barrier, agree, sync)
                st = _solo(opt.step, rank, warmup + 1, repeats, dist, sync) if solo else []
                rows.append({"kind": "optimizer", "shape": [n], "pass_": "step",
                             "flops": 12.0 * n, "bytes_moved": 28.0 * n, "repeats": repeats,
                             "solo_s": statistics.median(st) if st else None,
                             **_stats(times)})
        rows += _whole_models(tm, cfg, rank, dist)
        rows += _collectives(dist, rank, world, cfg)
        if solo:
            rows += _after_compute(dist, world, cfg)
        reference.append(reference_gemm_s(dev, dist.barrier, agree, sync))
        Path(cfg["out_dir"], f"profile_rank{rank}.json").write_text(json.dumps(rows))
        Path(cfg["out_dir"], f"reference_rank{rank}.json").write_text(json.dumps(reference))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def max_over_ranks(dist: Any, dev: Any) -> Callable[[int], int]:
    """n -> its maximum over every process (an all-reduce on `dev`): how processes agree on a
    batch length, so their collectives match call for call."""
    import torch

    def agree(n: int) -> int:
        t = torch.tensor([n], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    return agree


def _whole_models(tm: Any, cfg: dict[str, Any], rank: int, dist: Any) -> list[dict[str, Any]]:
    """``model:<name>`` rows (module docstring, whole models): one micro-batch's forward and
    backward of each model, unsplit, gradients cleared before each call as the op rows clear
    theirs."""
    dev, sync, agree = cfg["dev"], cfg["sync"], cfg["agree"]
    warmup, repeats, b = cfg["warmup"], cfg["repeats"], cfg["micro_batch_size"]
    rows = []
    for name in sorted({n for n, _, _ in cfg["stage_plans"]}):
        spec = get_validation_model(name)
        model = tm.build_stage(spec, stage=0, pp=1).to(dev)
        data = tm.batch(spec, b, seed=0, device=dev)

        def step(model: Any = model, data: dict[str, Any] = data, s: int = spec.seq_len) -> None:
            model.zero_grad(set_to_none=True)
            out = model(data["ids"], b, s, None, targets=data["targets"],
                        dec_ids=data.get("dec_ids"))
            clock = op_clock.current()
            if clock is not None:  # the in-model rows below: time the backward's nodes too
                clock.hook_backward(out)
            out.backward()

        times = _time(step, warmup, repeats, dist.barrier, agree, sync)
        st = _solo(step, rank, warmup, repeats, dist, sync) if cfg["solo"] else []
        rows.append({"kind": f"{WHOLE_MODEL}{name}", "shape": [b], "pass_": "fwdbwd",
                     "flops": 0.0, "bytes_moved": 0.0, "repeats": repeats,
                     "solo_s": statistics.median(st) if st else None, **_stats(times)})
        per_kind: dict[tuple[str, str], list[float]] = {}
        # CPU only: on a GPU the clocks would read kernel launches (op_clock.py)
        for _ in range(IN_MODEL_CALLS_PER_REPEAT * repeats if dev.type == "cpu" else 0):
            dist.barrier()
            with op_clock.running() as clock:
                step()
                sync()
            for pass_, kinds in (("fwd_in_model", clock.fwd_s), ("bwd_in_model", clock.bwd_s)):
                for k, v in kinds.items():
                    per_kind.setdefault((pass_, k), []).append(v)
        for (pass_, k), ts in sorted(per_kind.items()):
            rows.append({"kind": f"{WHOLE_MODEL}{name}:{k}", "shape": [b], "pass_": pass_,
                         "flops": 0.0, "bytes_moved": 0.0, "repeats": len(ts), "solo_s": None,
                         **_stats(ts)})
    return rows


def reference_gemm_s(dev: Any, barrier: Callable[[], None], agree: Callable[[int], int],
                     sync: Callable[[], None]) -> float:
    """Median per-call seconds of the `FILLER_GEMM` forward, every process at once (module
    docstring: reference GEMM)."""
    import torch

    m, n, k = FILLER_GEMM
    a, b = torch.randn(m, k, device=dev), torch.randn(n, k, device=dev)
    sync()
    end = time.perf_counter() + REFERENCE_WARMUP_S
    while time.perf_counter() < end:
        a @ b.t()
        sync()
    return statistics.median(_time(lambda: a @ b.t(), 2, REFERENCE_REPEATS, barrier, agree,
                                   sync))


def _after_compute(dist: Any, world: int, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """``all_reduce_after_compute`` rows (module docstring): per size, the all-reduce's own
    time when it follows `FILLER_CALLS` GEMMs, timed call by call (`AFTER_COMPUTE_CALLS` calls
    a repeat, their mean; the row keeps the median repeat). It used to be the loop time with
    the all-reduce minus the loop time without, whose difference carried the GEMMs' noise:
    quartiles 0.0-3.5 ms for a 4 KiB all-reduce in a profile of 2026-11-27."""
    import torch

    m, n, k = FILLER_GEMM
    a, b = torch.randn(m, k, device=cfg["dev"]), torch.randn(n, k, device=cfg["dev"])
    sync = cfg["sync"]
    rows = []
    sizes = sorted(set(INTERLEAVED_SIZES_BYTES) | {int(s) for s in cfg["extra_sizes"]})
    for size in sizes:
        x = torch.ones(max(1, size // 4), device=cfg["dev"])

        def after_gemms(x: Any = x) -> float:
            for _ in range(FILLER_CALLS):
                a @ b.t()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync()
            return time.perf_counter() - t0

        for _ in range(cfg["warmup"] + 1):
            after_gemms()
        times = []
        for _ in range(cfg["repeats"]):
            dist.barrier()
            times.append(statistics.fmean(after_gemms() for _ in range(AFTER_COMPUTE_CALLS)))
        rows.append({"kind": "all_reduce_after_compute", "shape": [], "pass_": "comm",
                     "group_size": world, "size_bytes": float(x.numel() * 4),
                     "repeats": cfg["repeats"], **_stats(times)})
    return rows


def _all_gather(dist: Any, parts: list[Any], rank: int) -> Any:
    """All-gather of this rank's part (a fresh copy each call, as a training step sends)."""
    return dist.all_gather(parts, parts[rank].clone())


def ping_pong(dist: Any, rank: int, x: Any) -> None:
    """One round trip of `x` between ranks 0 and 1 (two p2p transfers)."""
    if rank == 0:
        dist.send(x, 1)
        dist.recv(x, 1)
    else:
        dist.recv(x, 0)
        dist.send(x, 0)


def _collectives(dist: Any, rank: int, world: int, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    rows = []
    dev = cfg["dev"]
    sizes = sorted(set(COLLECTIVE_SIZES_BYTES) | {int(s) for s in cfg["extra_sizes"]})
    for size in sizes:
        n = max(1, size // 4)
        x = torch.ones(n, device=dev)
        reps = cfg["repeats"]
        calls: dict[str, Callable[[], Any]] = {"all_reduce": partial(dist.all_reduce, x)}
        if n % world == 0:
            parts = [torch.empty(n // world, device=dev) for _ in range(world)]
            calls["all_gather"] = partial(_all_gather, dist, parts, rank)
            calls["reduce_scatter"] = partial(dist.reduce_scatter, parts[rank],
                                              list(x.chunk(world)))
        if world == 2:
            calls["p2p"] = partial(ping_pong, dist, rank, x)
        for kind, fn in calls.items():
            try:
                times = _time(fn, cfg["warmup"] + 1, reps, dist.barrier, cfg["agree"],
                              cfg["sync"])
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

    spec = get_validation_model(model)
    tokens = micro_batch_size * spec.seq_len
    return [4.0 * tokens * spec.hidden, 3 * 4.0 * tokens * tp, 4.0 * spec.parameters()]


def run_profile(model: str = "tiny-gpt", *, micro_batch_size: int = 2, processes: int = 2,
                threads: int = 1, warmup: int = 3, repeats: int = 10,
                device: str = "cpu") -> ProfileDB:
    """Profile the ops of `model` (one name or several, comma-separated) and the collectives
    (module docstring) into a ProfileDB.

    Raises:
        TraceError: an unsupported device or one this machine lacks (validate/devices.py), an
            option out of range, more processes than CPUs or a model too large for the memory
            (validate/worker_limits.py), or a worker failed.
    """
    import tempfile

    for option, value, least in (("--micro-batch", micro_batch_size, 1),
                                 ("--processes", processes, 1), ("--threads", threads, 1),
                                 ("--warmup", warmup, 0), ("--repeats", repeats, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise TraceError(f"sim profile {option} {value!r} must be an integer >= {least}")
    names = [m.strip() for m in str(model).split(",") if m.strip()]
    if not names:
        raise TraceError(f"sim profile --model {model!r}: name at least one model")
    specs = [get_validation_model(m) for m in names]
    backend = check_device("sim profile", device, processes)
    if device == "cpu":
        check_processes("sim profile --processes", processes)
    check_calls("sim profile --warmup/--repeats", warmup + repeats, "calls per measurement")
    # Each process times the Adam step of up to the whole model (the pp=1 stage plan).
    for spec in specs:
        check_memory("sim profile --model", spec.name,
                     training_memory_bytes(spec.parameters(), processes, processes,
                                           micro_batch_activation_bytes(spec, micro_batch_size)))
    import torch.multiprocessing as mp  # after the checks: bad options answer without torch

    seen: dict[tuple[str, tuple[int, ...], float], dict[str, Any]] = {}
    stage_plans: list[tuple[str, int, int]] = []
    extra: list[float] = []
    all_tps: set[int] = set()
    for name, spec in zip(names, specs, strict=True):
        tps = tuple(t for t in range(1, processes + 1) if processes % t == 0
                    and spec.num_heads % t == 0 and spec.vocab_size % t == 0)
        pps = [p for p in range(1, processes + 1) if processes % p == 0 and p <= spec.num_layers]
        if spec.family == "t5":
            tps, pps = (1,), [1]
        op_specs(name, micro_batch_size, tps, seen)
        stage_plans += sorted({(name, pp, 1) for pp in pps} | {(name, 1, tp) for tp in tps})
        extra += [s for tp in tps for s in plan_sizes(name, micro_batch_size, tp)]
        all_tps |= set(tps)
    solo = device == "cpu" and processes > 1
    load_before = _load_average()
    cores = worker_cores(device, processes, threads)
    with tempfile.TemporaryDirectory(prefix="trainsim-profile-") as tmp:
        cfg = {"ops": list(seen.values()), "stage_plans": stage_plans, "processes": processes,
               "threads": threads, "warmup": warmup, "repeats": repeats, "extra_sizes": extra,
               "out_dir": tmp, "port": free_port(), "device": device, "backend": backend,
               "micro_batch_size": micro_batch_size,
               "solo": solo, "cores": cores}
        prepare_workers(device)
        try:
            mp.spawn(_profile_worker, args=(cfg,), nprocs=processes, join=True)
        except mp.ProcessRaisedException as exc:
            raise TraceError(f"a profiling worker failed: "
                             f"{str(exc).strip().splitlines()[-1]}") from None
        per_rank = [json.loads(Path(tmp, f"profile_rank{r}.json").read_text())
                    for r in range(processes)]
        reference = [t for r in range(processes)
                     for t in json.loads(Path(tmp, f"reference_rank{r}.json").read_text())]
    rows = []
    for recs in zip(*per_rank, strict=True):
        first = recs[0]
        solos = [r["solo_s"] for r in recs if r.get("solo_s")]
        rows.append(ProfileRow(
            kind=first["kind"], shape=tuple(first["shape"]), pass_=first["pass_"],
            group_size=int(first.get("group_size", 1)),
            size_bytes=float(first.get("size_bytes", 0.0)),
            flops=float(first.get("flops", 0.0)), bytes_moved=float(first.get("bytes_moved", 0.0)),
            time_s=statistics.fmean(r["time_s"] for r in recs),
            p25_s=min(r["p25_s"] for r in recs), p75_s=max(r["p75_s"] for r in recs),
            repeats=int(first["repeats"]),
            solo_s=statistics.fmean(solos) if solos else 0.0))
    meta = machine_metadata(processes, threads, device)
    meta.update({"model": ",".join(s.name for s in specs),
                 "micro_batch_size": micro_batch_size, "warmup": warmup,
                 "repeats": repeats, "tensor_parallel_degrees": sorted(all_tps),
                 "solo_timings": solo, "load_average_before": load_before,
                 "cpu_binding": cpu_binding(cores),
                 "reference_gemm": list(FILLER_GEMM),
                 "reference_gemm_s": statistics.median(reference),
                 "reference_warmup_s": REFERENCE_WARMUP_S,
                 "load_average_after": _load_average(),
                 "command": f"sim profile --device {device} --model {model} --micro-batch "
                            f"{micro_batch_size} --processes {processes} --warmup {warmup} "
                            f"--repeats {repeats}"})
    return ProfileDB(meta=meta, rows=tuple(rows))
