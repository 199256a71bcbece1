"""Roofline-efficiency curves from a GPU's recorded kernel times (bench/gpu_record.py).

The catalog's curves (hwmodels/data/efficiency.json) give, per op class, the achieved fraction of
peak as a function of the op's *ideal* duration x (FLOPs / peak or bytes / bandwidth, in µs);
an op takes ideal / eff(x) + the launch overhead. This module inverts that for measured kernels:

* ``gemm``: eff = ideal / (t − overhead) of each bf16 ``F.linear`` shape, the median over the
  shapes that fall in one bin of x (bins a factor √2 wide), so the curve is the typical
  transformer GEMM's, not the best shape's. Kernels shorter than 3× the host's launch floor
  (the ``launch`` row: a one-element add, back to back) are left out: their time is eager
  PyTorch's dispatch rate, not the GPU's; below the smallest x kept the catalog keeps its
  earlier (assumed) points.
* ``flash_attention``: causal SDPA (FlashAttention/cuDNN), with FLOPs counted as trainsim counts
  them (non-causal 4·b·a·s²·d forward, 2.5× that backward: workloads/transformer_block.py). One
  curve serves both passes (the op model indexes both by their own ideal duration), so each
  sequence length gives one point: the forward+backward efficiency 3.5·ideal_fwd / t, placed at
  √2.5 · x_fwd, between the two passes' x. The backward is the less efficient pass (measured
  bwd/fwd time 3.0–3.5 against a FLOP ratio of 2.5), so a forward is predicted a little slow
  and a backward a little fast; their sum is what the curve fits.
* ``memory``: eff = ideal / (t − overhead) of streaming kernels (add, GeLU, copy), bytes read
  plus written over the catalog bandwidth, with the same launch-floor rule (bins a factor 4
  wide).

``python -m trainsim.validate.kernel_fit validate/data/h100_kernels.csv --gpu H100-SXM5-80GB``
prints the fitted points beside the catalog's curve at the same x (measured / catalog). The
catalog's Hopper curves are not replaced by these yet: hwmodels/data/SOURCES.md says why.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from trainsim.errors import SpecError, TrainsimError
from trainsim.hwmodels.gpus import get_gpu
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.validate.profile_db import ProfileDB, ProfileRow

FLASH_BACKWARD = 2.5
"""Backward FLOPs of the attention kernel over its forward (workloads/transformer_block.py)."""
_US = 1e6


def _binned(points: list[tuple[float, float]], width: float = math.sqrt(2.0)
            ) -> list[list[float]]:
    """Median x and median efficiency per log bin of x (bins `width` wide), ascending in x."""
    bins: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for x, e in points:
        bins[round(math.log(x, width))].append((x, e))
    return [[round(statistics.median(x for x, _ in b), 1), round(statistics.median(e for _, e in b), 3)]
            for _, b in sorted(bins.items())]


def _launch_floor(rows: list[dict[str, str]]) -> float:
    """The host's launch floor: the ``launch`` row's time (0 without one)."""
    return min((float(r["median_s"]) for r in rows if r["kind"] == "launch"), default=0.0)


def _dispatch_bound(row: dict[str, str], floor: float) -> bool:
    """Whether eager PyTorch's dispatch rate, not the kernel, sets the row's time: within 3x
    of the launch floor (attention rows, long kernels, are always kept)."""
    return not row["kind"].startswith("sdpa") and float(row["median_s"]) < 3.0 * floor


def fit_kernel_curves(path: str | Path, gpu_name: str, overhead_s: float
                      ) -> dict[str, list[list[float]]]:
    """Curve points [x µs, efficiency] per class (gemm, flash_attention, memory) from a
    kernels.csv written by bench/gpu_record.py, against `gpu_name`'s catalog peak (bf16 at its
    top clock) and memory bandwidth, with `overhead_s` taken off each kernel's time."""
    gpu = get_gpu(gpu_name)
    peak = gpu.peak_flops("bf16", gpu.sm_clock_max_mhz)
    bandwidth = gpu.memory_bandwidth_bytes_per_s
    rows = read_kernels(path)
    floor = _launch_floor(rows)
    gemm, flash, memory = [], [], []
    forward = {r["shape"]: float(r["median_s"]) for r in rows if r["kind"] == "sdpa_causal_fwd"}
    for r in rows:
        kind, t = r["kind"], float(r["median_s"])
        if _dispatch_bound(r, floor):
            continue
        if kind == "gemm":
            ideal = float(r["flops"]) / peak
            gemm.append((ideal * _US, ideal / max(t - overhead_s, 1e-9)))
        elif kind == "sdpa_causal_fwdbwd" and r["shape"] in forward:
            ideal_fwd = float(r["flops"]) / (1.0 + FLASH_BACKWARD) / peak
            flash.append((ideal_fwd * math.sqrt(FLASH_BACKWARD) * _US,
                           (1.0 + FLASH_BACKWARD) * ideal_fwd / max(t - 2 * overhead_s, 1e-9)))
        elif kind.startswith("ew_"):
            ideal = float(r["bytes"]) / bandwidth
            memory.append((ideal * _US, ideal / max(t - overhead_s, 1e-9)))
    return {"gemm": _binned(gemm, 2.0), "flash_attention": _binned(flash, 2.0),
            "memory": _binned(memory, 4.0)}


KERNEL_COLUMNS = ("kind", "shape", "flops", "bytes", "median_s")
"""The leading columns of a kernels.csv (how `sim calibrate ops` tells one apart)."""
_AS_OP = {"gemm": "matmul", "sdpa_causal_fwd": "flash_attention", "ew_add": "elementwise",
          "ew_gelu": "elementwise", "ew_copy": "elementwise"}
"""Recorded kernel kinds as the zoo's op kinds (their roofline classes)."""


def read_kernels(path: str | Path) -> list[dict[str, str]]:
    """The rows of a kernels.csv, checked: its header, and on every row a shape of integers
    ("AxB..."), a time > 0 and FLOPs and bytes >= 0 (SpecError naming the line and field)."""
    with Path(path).open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or tuple(rows[0])[:len(KERNEL_COLUMNS)] != KERNEL_COLUMNS:
        raise SpecError(f"{path}: not a kernels.csv of bench/gpu_record.py")
    for line, r in enumerate(rows, start=2):
        try:
            ok = (all(int(v) > 0 for v in r["shape"].split("x")) and float(r["median_s"]) > 0
                  and float(r["flops"]) >= 0 and float(r["bytes"]) >= 0)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise SpecError(f"{path}:{line}: needs shape 'AxB...' of positive integers, "
                            f"median_s > 0, flops and bytes >= 0 (got {dict(r)})")
    return rows


def is_kernels_csv(path: str | Path) -> bool:
    """Whether `path` starts with a kernels.csv header (bench/gpu_record.py)."""
    with Path(path).open(newline="") as f:
        header = next(csv.reader(f), [])
    return tuple(header[:len(KERNEL_COLUMNS)]) == KERNEL_COLUMNS


def kernels_profile(path: str | Path) -> ProfileDB:
    """A kernels.csv as a profile database `sim calibrate ops` fits the roofline to: GEMMs as
    `matmul`, causal SDPA as `flash_attention` (forward, and the backward as forward+backward
    minus forward, 2.5x the forward's FLOPs), streaming kernels as `elementwise`. Kernels
    within 3x of the host's launch floor are left out, as in `fit_kernel_curves`."""
    rows = read_kernels(path)
    floor = _launch_floor(rows)
    forward = {r["shape"]: r for r in rows if r["kind"] == "sdpa_causal_fwd"}
    out = []
    for r in rows:
        t, shape = float(r["median_s"]), tuple(int(v) for v in r["shape"].split("x"))
        if r["kind"] in _AS_OP and not _dispatch_bound(r, floor):
            out.append(ProfileRow(kind=_AS_OP[r["kind"]], shape=shape, flops=float(r["flops"]),
                                  bytes_moved=float(r["bytes"]), time_s=t))
        elif r["kind"] == "sdpa_causal_fwdbwd" and r["shape"] in forward:
            fwd = forward[r["shape"]]
            out.append(ProfileRow(kind="flash_attention", shape=shape, pass_="bwd",
                                  flops=FLASH_BACKWARD * float(fwd["flops"]),
                                  bytes_moved=float(r["bytes"]) - float(fwd["bytes"]),
                                  time_s=t - float(fwd["median_s"])))
    return ProfileDB(meta={"device": "cuda", "command": f"bench/gpu_record.py ({path})"},
                     rows=tuple(out))


_MEMORY_NOTE = re.compile(r"max allocated ([0-9.]+) GiB, max reserved ([0-9.]+) GiB")


def reserved_over_allocated(path: str | Path) -> list[float]:
    """Max reserved / max allocated memory of each recorded training run (its notes, as
    bench/gpu_record.py writes them): what PyTorch's caching allocator holds beyond the tensors
    at their peak (blocks rounded up, freed blocks cached for reuse, fragmentation)."""
    ratios = []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            found = _MEMORY_NOTE.search(row.get("notes", ""))
            if row.get("ref_kind") == "peak_memory_gib" and found:
                ratios.append(float(found[2]) / float(found[1]))
    if not ratios:
        raise SpecError(f"{path}: no run notes with max allocated / max reserved memory")
    return ratios


def main(argv: list[str] | None = None) -> int:
    """The command line; a missing or wrong file or an unknown GPU: one line, exit code 2."""
    try:
        report(argv)
    except (TrainsimError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        line = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) else str(exc)
        print(f"error: {line}", file=sys.stderr)
        return 2
    return 0


def report(argv: list[str] | None) -> None:
    """Print the fitted points beside the catalog's (and the runs' memory ratios)."""
    ap = argparse.ArgumentParser(description="Fit roofline-efficiency curves to recorded kernels.")
    ap.add_argument("kernels", type=Path)
    ap.add_argument("--gpu", default="H100-SXM5-80GB")
    ap.add_argument("--overhead-us", type=float, default=4.0,
                    help="per-kernel launch overhead of the catalog's curve (µs)")
    ap.add_argument("--runs", type=Path, help="runs.csv of the same recording: also print "
                    "each run's reserved / allocated memory")
    args = ap.parse_args(argv)
    curves = fit_kernel_curves(args.kernels, args.gpu, args.overhead_us / _US)
    print(f"{'class':16s} {'x (us)':>9s} {'measured':>9s} {'catalog':>8s} {'ratio':>6s}")
    for cls, points in curves.items():
        for x, e in points:
            c = catalog_efficiency(cls, x, args.gpu)
            print(f"{cls:16s} {x:9.1f} {e:9.3f} {c:8.3f} {e / c:6.2f}")
    print(json.dumps(curves))
    if args.runs is not None:
        ratios = reserved_over_allocated(args.runs)
        print(f"reserved / allocated: {', '.join(f'{r:.3f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.3f}")


def catalog_efficiency(cls: str, x_us: float, gpu_name: str) -> float:
    """The catalog's efficiency for `cls` at ideal duration `x_us` (flash attention: the
    class its kind maps to; memory: the memory curve)."""
    model, gpu = RooflineCostModel(), get_gpu(gpu_name)
    if cls == "memory":
        return model.memory_efficiency(x_us / _US * gpu.memory_bandwidth_bytes_per_s, gpu)
    kind = "matmul" if cls == "gemm" else cls
    peak = gpu.peak_flops("bf16", gpu.sm_clock_max_mhz)
    return model.compute_efficiency(kind, x_us / _US * peak, gpu, "bf16")


if __name__ == "__main__":
    sys.exit(main())
