"""Record one GPU's kernel speeds and single-GPU training steps, for calibration and checks.

Run it on a machine with a CUDA GPU (``--device cuda``, the default, refuses a machine without
one; ``--device cpu --small`` is a smoke run of the same code at toy sizes). It writes into
``--out``:

* ``kernels.csv``: median time of bf16 kernels the way eager PyTorch training issues them,
  back to back: GEMMs (``F.linear``) over transformer shapes from 256 to 16384 tokens; causal
  SDPA/FlashAttention forward and backward over sequence lengths 512-8192; memory-bound
  elementwise kernels (add, GeLU, copy) from 64 KiB to 1 GiB; the launch floor (a
  one-element add). validate/kernel_fit.py turns it into roofline-efficiency curves, and
  `sim calibrate ops` into a calibration file.
* ``runs.csv``: Llama-style training steps on this one GPU in the schema of
  ../shared/data/published/training_runs.csv (tokens/s/GPU and peak reserved memory, as
  torchtitan logs them), so `sim accuracy runs.csv` checks the Oracle against them. The step is
  what torchtitan runs in eager mode: FSDP2 (`fully_shard` per block, bf16 parameters
  and fp32 reduction), SDPA attention, RMSNorm, SwiGLU, rotary embeddings, fused AdamW, fp32
  cross entropy, optionally full activation checkpointing per block.
* ``step_kernels.csv``: each run's GPU time per kernel name and step (torch.profiler over
  two more steps), to split a step's time by op class.
* ``attention_backends.csv`` (``--attention-backends``): causal SDPA per backend (cuDNN,
  FlashAttention-2, memory-efficient): the kernel a stack's torch picks sets attention's speed.
* ``meta.json``: GPU name, torch/CUDA versions, nvidia-smi's power limit and clocks (read only).

Why a script of its own rather than `sim profile`: that command times the validation models'
ops in fp32 on gloo workers; a Hopper calibration needs bf16 tensor-core kernels and the
kernel a modern stack uses for attention.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

RUN_COLUMNS = ["source", "name", "gpu", "nodes", "gpus_per_node", "params_b", "layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab", "tp", "pp", "cp", "dp", "global_batch", "micro_batch", "virtual_stages", "sequence_parallel", "recompute", "zero", "dtype", "framework", "ref_kind", "ref_value", "notes"]


def timed(fn: Callable[[], Any], dev: torch.device, min_s: float = 0.02,
          repeats: int = 7) -> tuple[float, float, float]:
    """Median, 25th and 75th percentile per-call seconds of `fn` run back to back in batches."""
    for _ in range(3):
        fn()
    sync(dev)
    t0 = time.perf_counter()
    fn()
    sync(dev)
    one = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, min(2000, int(min_s / one)))
    per_call = []
    for _ in range(repeats):
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(dev)
        per_call.append((time.perf_counter() - t0) / calls)
    q = statistics.quantiles(per_call, n=4)
    return statistics.median(per_call), q[0], q[2]


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def kernel_rows(dev: torch.device, small: bool) -> list[dict[str, Any]]:
    """Time GEMMs, attention, elementwise kernels and the launch floor."""
    dt = torch.bfloat16
    rows: list[dict[str, Any]] = []

    def add(kind: str, shape: tuple[int, ...], flops: float, nbytes: float,
            t: tuple[float, float, float]) -> None:
        rows.append({"kind": kind, "shape": "x".join(map(str, shape)), "flops": flops,
                     "bytes": nbytes, "median_s": t[0], "p25_s": t[1], "p75_s": t[2]})
        print(f"{kind:18s} {shape!s:28s} {1e6 * t[0]:10.1f} us", flush=True)

    one = torch.ones(1, device=dev, dtype=dt)
    add("launch", (1,), 0.0, 6.0, timed(lambda: one.add_(one), dev))

    tokens = (64, 256) if small else (256, 1024, 4096, 16384)
    weights = ((64, 64), (128, 256)) if small else (
        (2048, 2048), (3072, 3072), (4096, 4096), (8192, 2048), (2048, 8192), (1024, 4096),
        (14336, 4096), (4096, 14336), (6144, 4096), (8192, 8192), (128256, 4096))
    for m in tokens:
        for n, k in weights:
            if m * n > 16384 * 32768:
                continue  # output over 1 GiB: not a shape a one-GPU step uses
            xs = [torch.randn(m, k, device=dev, dtype=dt) for _ in range(3)]
            w = torch.randn(n, k, device=dev, dtype=dt) / math.sqrt(k)
            i = [0]

            def gemm(xs: list[torch.Tensor] = xs, w: torch.Tensor = w, i: list[int] = i) -> None:
                i[0] = (i[0] + 1) % 3
                F.linear(xs[i[0]], w)
            add("gemm", (m, n, k), 2.0 * m * n * k, 2.0 * (m * k + n * k + m * n), timed(gemm, dev))
            del xs, w

    heads, d = (4, 32) if small else (32, 128)
    for s in ((64, 128) if small else (512, 1024, 2048, 4096, 8192)):
        b = max(1, (256 if small else 16384) // s)
        q, k_, v = (torch.randn(b, heads, s, d, device=dev, dtype=dt, requires_grad=True)
                    for _ in range(3))
        flops = 4.0 * b * heads * s * s * d  # as trainsim counts it (non-causal), fwd
        nbytes = 2.0 * 4 * b * heads * s * d
        add("sdpa_causal_fwd", (b * heads, s, s, d), flops, nbytes, timed(
            lambda q=q, k_=k_, v=v: F.scaled_dot_product_attention(q, k_, v, is_causal=True),
            dev))
        out = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
        grad = torch.randn_like(out)

        def both(q: torch.Tensor = q, k_: torch.Tensor = k_, v: torch.Tensor = v,
                 grad: torch.Tensor = grad) -> None:
            o = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
            torch.autograd.grad(o, (q, k_, v), grad)
        add("sdpa_causal_fwdbwd", (b * heads, s, s, d), 3.5 * flops, 2.0 * nbytes,
            timed(both, dev))
        del q, k_, v, out, grad

    for mib in ((0.0625, 1.0) if small else (0.0625, 0.25, 1, 4, 16, 64, 256, 1024)):
        n = int(mib * 2**20 / 2)
        x, y = torch.randn(n, device=dev, dtype=dt), torch.randn(n, device=dev, dtype=dt)
        add("ew_add", (n,), n, 3.0 * 2 * n, timed(lambda x=x, y=y: x + y, dev))
        add("ew_gelu", (n,), 8.0 * n, 2.0 * 2 * n, timed(lambda x=x: F.gelu(x), dev))
        add("ew_copy", (n,), 0.0, 2.0 * 2 * n, timed(lambda x=x: x.clone(), dev))
        del x, y
    return rows


def attention_backend_rows(dev: torch.device, small: bool) -> list[dict[str, Any]]:
    """Causal SDPA forward and forward+backward per backend torch offers here (cuDNN,
    FlashAttention-2, memory-efficient): which kernel a stack runs changes attention's speed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, d = (4, 32) if small else (32, 128)
    rows = []
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):
        for s in ((64, 128) if small else (1024, 4096, 8192)):
            b = max(1, (256 if small else 16384) // s)
            q, k, v = (torch.randn(b, heads, s, d, device=dev, dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            grad = torch.randn(b, heads, s, d, device=dev, dtype=torch.bfloat16)

            def fwd(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v) -> Any:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def both(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v,
                     grad: torch.Tensor = grad) -> None:
                torch.autograd.grad(fwd(q, k, v), (q, k, v), grad)
            try:
                with sdpa_kernel(backend):
                    tf, tb = timed(fwd, dev)[0], timed(both, dev)[0]
            except RuntimeError as exc:  # the backend does not run here
                print(f"{backend.name} s={s}: {str(exc)[:120]}", flush=True)
                continue
            flops = 4.0 * b * heads * s * s * d
            rows.append({"backend": backend.name, "shape": f"{b * heads}x{s}x{s}x{d}",
                         "fwd_flops": flops, "fwd_s": tf, "fwdbwd_s": tb})
            print(f"{backend.name:20s} s={s:5d} fwd {1e6 * tf:9.1f} us fwd+bwd {1e6 * tb:9.1f} us "
                  f"({3.5 * flops / tb / 1e12:6.1f} TF/s counted non-causal)", flush=True)
            del q, k, v, grad
    return rows


class Block(nn.Module):
    """One Llama block: RMSNorm, GQA attention with rotary embeddings, RMSNorm, SwiGLU."""

    def __init__(self, dim: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.attn_norm, self.ffn_norm = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim, eps=1e-5)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, s, self.heads, self.hd)
        k = self.wk(h).view(b, s, self.kv_heads, self.hd)
        v = self.wv(h).view(b, s, self.kv_heads, self.hd)
        q, k = rotate(q, rope), rotate(k, rope)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True, enable_gqa=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as torchtitan applies it (complex multiply, in fp32)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * rope[None, :, None, :]).flatten(3).type_as(x)


class Llama(nn.Module):
    def __init__(self, cfg: dict[str, Any], checkpoint: bool) -> None:
        super().__init__()
        dim, self.checkpoint = cfg["hidden"], checkpoint
        self.tok = nn.Embedding(cfg["vocab"], dim)
        self.layers = nn.ModuleList(Block(dim, cfg["heads"], cfg["kv_heads"], cfg["ffn"])
                                    for _ in range(cfg["layers"]))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.out = nn.Linear(dim, cfg["vocab"], bias=False)
        hd = dim // cfg["heads"]
        freqs = 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd))
        angles = torch.outer(torch.arange(cfg["seq"]).float(), freqs)
        self.register_buffer("rope", torch.polar(torch.ones_like(angles), angles),
                             persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        for layer in self.layers:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(layer, x, self.rope, use_reentrant=False)
            else:
                x = layer(x, self.rope)
        return self.out(self.norm(x))


RUNS = [  # name, shape, sequence, micro-batch, full activation checkpointing
    ("llama-1b", {"layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn": 8192}, 4096, 1, False),
    ("llama-1b", {"layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn": 8192}, 4096, 2, True),
    ("llama-1b", {"layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn": 8192}, 8192, 1, False),
    ("llama-3b", {"layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8, "ffn": 8192}, 4096, 1, False),
    ("llama-3b", {"layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8, "ffn": 8192}, 4096, 2, True),
    ("llama-3b", {"layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8, "ffn": 8192}, 2048, 1, False),
]


def kernel_totals(step: Callable[[], None], dev: torch.device, run: str
                  ) -> list[dict[str, Any]]:
    """GPU time per kernel name over two profiled steps (torch.profiler), per step."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CUDA] if dev.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for _ in range(2):
            step()
        sync(dev)
    rows = []
    for e in prof.key_averages():
        t = e.self_device_time_total if dev.type == "cuda" else e.self_cpu_time_total
        if t > 0 and (dev.type != "cuda" or e.device_type.name == "CUDA"):
            rows.append({"run": run, "name": e.key[:160], "calls_per_step": e.count / 2,
                         "us_per_step": t / 2})
    return sorted(rows, key=lambda r: -r["us_per_step"])


def training_rows(dev: torch.device, small: bool, gpu: str, steps: int, which: list[int]
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One-GPU FSDP2 training steps; each run's failure (an OOM, say) is reported, not fatal.
    Also each run's GPU time per kernel name (two more steps under the profiler)."""
    import gc

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rows: list[dict[str, Any]] = []
    by_kernel: list[dict[str, Any]] = []
    for name, shape, seq, mb, ckpt in (RUNS[i] for i in which):
        cfg = dict(shape, vocab=128256, seq=seq)
        if small:
            cfg.update(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=512, seq=64)
        try:
            torch.manual_seed(0)
            with torch.device(dev):
                model = Llama(cfg, ckpt)
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in model.layers:
                fully_shard(layer, mp_policy=policy)
            fully_shard(model, mp_policy=policy)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
            params = sum(p.numel() for p in model.parameters())
            ids = torch.randint(0, cfg["vocab"], (mb, cfg["seq"] + 1), device=dev)

            def step(model: nn.Module = model, opt: Any = opt, ids: torch.Tensor = ids) -> None:
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            for _ in range(3):
                step()
            sync(dev)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                sync(dev)
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            alloc = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
            reserved = torch.cuda.max_memory_reserved(dev) / 2**30 if dev.type == "cuda" else 0.0
            label = f"{name} seq{cfg['seq']} mb{mb} {'full-ac' if ckpt else 'no-ac'}"
            retries = torch.cuda.memory_stats(dev).get("num_alloc_retries", 0) \
                if dev.type == "cuda" else 0
            kernels = kernel_totals(step, dev, label)
            by_kernel += kernels
            busy = sum(k["us_per_step"] for k in kernels) / 1e6
            base = dict(source="local-gpu-record", name=label, gpu=gpu, nodes=1,
                        gpus_per_node=1, params_b=round(params / 1e9, 3), **cfg,
                        tp=1, pp=1, cp=1, dp=1, global_batch=mb, micro_batch=mb,
                        virtual_stages="", sequence_parallel="",
                        recompute="full" if ckpt else "none", zero=3, dtype="bf16",
                        framework="torchtitan")
            note = (f"recorded by bench/gpu_record.py: FSDP2 on one GPU, eager mode, "
                    f"torch {torch.__version__}; median of {steps} steps {1e3 * t:.1f} ms "
                    f"(min {1e3 * min(times):.1f}, max {1e3 * max(times):.1f}), GPU kernels "
                    f"{1e3 * busy:.1f} ms a step; "
                    f"max allocated {alloc:.2f} GiB, max reserved {reserved:.2f} GiB; "
                    f"allocator retries {retries}")
            rows.append(dict(base, ref_kind="tokens_per_s_per_gpu",
                             ref_value=round(mb * cfg["seq"] / t, 1), notes=note))
            rows.append(dict(base, ref_kind="peak_memory_gib", ref_value=round(reserved, 2),
                             notes=note))
            print(f"{label:36s} {1e3 * t:9.1f} ms {mb * cfg['seq'] / t:10.0f} tok/s "
                  f"alloc {alloc:6.2f} GiB reserved {reserved:6.2f} GiB retries {retries}", flush=True)
        except (RuntimeError, ValueError) as exc:  # an OOM (a RuntimeError), a bad op: go on
            print(f"{name} seq{seq} mb{mb}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        finally:
            model = opt = step = ids = None  # type: ignore[assignment]
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return rows, by_kernel


def smi() -> dict[str, str]:
    """nvidia-smi's read-only view of the card (name, power limit, clocks)."""
    fields = "name,power.limit,power.max_limit,clocks.sm,clocks.max.sm,clocks.mem,memory.total"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             check=False, capture_output=True, text=True, timeout=20).stdout.strip()
        return dict(zip(fields.split(","), (v.strip() for v in out.split(","))))
    except (OSError, subprocess.SubprocessError):
        return {}


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Write `rows`, or append them where the file exists (one process per run)."""
    new = not path.exists()
    with path.open("w" if new else "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        if new:
            w.writeheader()
        w.writerows(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="toy sizes (a smoke run)")
    ap.add_argument("--gpu", default="H100-SXM5-80GB", help="trainsim catalog name of the GPU")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--runs", default="all", help="'all', 'none' or indices into RUNS "
                    "(0,2); one process per run keeps one run's memory out of the next")
    ap.add_argument("--no-kernels", action="store_true", help="skip the kernel sweep")
    ap.add_argument("--attention-backends", action="store_true",
                    help="also time causal SDPA per backend (attention_backends.csv)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                         rank=0, world_size=1)
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "smi": smi(),
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "command": " ".join(sys.argv)}
    if not args.no_kernels:
        kernels = kernel_rows(dev, args.small)
        meta["smi_after_kernels"] = smi()
        write_csv(args.out / "kernels.csv", kernels, list(kernels[0]))
        (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
    if args.attention_backends:
        backends = attention_backend_rows(dev, args.small)
        if backends:  # none, where no backend runs here (each said why)
            write_csv(args.out / "attention_backends.csv", backends, list(backends[0]))
    which = list(range(len(RUNS))) if args.runs == "all" else [] if args.runs == "none" \
        else [int(i) for i in args.runs.split(",") if i]
    runs, by_kernel = training_rows(dev, args.small, args.gpu, args.steps, which)
    if runs:
        write_csv(args.out / "runs.csv", runs, RUN_COLUMNS)
        write_csv(args.out / "step_kernels.csv", by_kernel, list(by_kernel[0]))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
