"""A "cpu" hardware description and a local cluster, derived from a profile database.

So that the local machine can be simulated like any GPU (DESIGN.md §5), a profile yields:

* a `GpuSpec` named ``cpu`` (one "GPU" = one worker process with its threads): fp32 peak =
  the fastest measured GEMM's FLOP/s, memory bandwidth = the fastest measured elementwise op's
  bytes/s, one "SM" at the machine's clock; power figures are placeholders from
  data/cpu_hardware.json (energy is not measured on CPU);
* the loopback link's α (per-step latency) and β (bandwidth), fitted to the measured
  all-reduces as training issues them (after an op; `fit_alpha_beta`), by least squares on
  relative error, with the simulator's own step/volume
  counts (Thakur et al. 2005 via simulator/collectives.py): ring all-reduce of S over n ranks
  takes 2(n−1)·α + 2(n−1)/n·S/β, all-gather / reduce-scatter (n−1)·α + (n−1)/n·S/β, p2p α + S/β;
* `cpu_cluster(db, n)`: a real `Cluster` of n such processes on one node whose paths are
  a → b = (a's loopback out, b's loopback in), each link β with latency α/2, so every
  collective and transfer the lowering plans costs what the fit says.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

import numpy as np

from trainsim.errors import DataFileError, UnknownNameError
from trainsim.hwmodels.cluster import Cluster, NodeGroup
from trainsim.hwmodels.gpus import GpuSpec
from trainsim.hwmodels.nodes import NicSpec, NodeType
from trainsim.hwmodels.topology import Link
from trainsim.validate.cpu_microbench import gloo_alpha_beta
from trainsim.validate.profile_db import ProfileDB

CPU_GPU_NAME = "cpu"
MEMORY_BOUND_KINDS = ("elementwise", "gelu", "layernorm", "rmsnorm", "softmax", "dropout")
"""Op kinds whose forward is memory-bound: their fastest bytes/s gives the memory bandwidth."""


@functools.cache
def _placeholders() -> dict[str, Any]:
    text = resources.files("trainsim.validate").joinpath("data/cpu_hardware.json").read_text()
    return dict(json.loads(text))


@dataclass(frozen=True, kw_only=True, slots=True)
class CpuFigures:
    """What a profile says about the machine, per worker process."""

    peak_flops: float
    """Fastest measured GEMM forward, FLOP/s."""
    memory_bandwidth_bytes_per_s: float
    """Fastest measured memory-bound op forward, bytes/s."""
    op_overhead_s: float
    """Shortest measured op: the fixed cost of one torch op call."""
    alpha_s: float
    """Fitted per-step latency of a collective."""
    link_bandwidth_bytes_per_s: float
    """Fitted loopback bandwidth β."""

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bandwidth_bytes_per_s", "link_bandwidth_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise DataFileError(f"profile: derived {name}={getattr(self, name)!r} must be > 0")


def collective_steps_volume(kind: str, n: int, size_bytes: float) -> tuple[int, float]:
    """(latency steps, bytes per link) of collective `kind` of S=`size_bytes` over n ranks."""
    if kind in ("all_reduce", "all_reduce_after_compute"):
        return 2 * (n - 1), 2 * (n - 1) / n * size_bytes
    if kind in ("all_gather", "reduce_scatter"):
        return n - 1, (n - 1) / n * size_bytes
    if kind == "p2p":
        return 1, size_bytes
    raise UnknownNameError(f"unknown collective {kind!r} in profile")


def fit_alpha_beta(db: ProfileDB) -> tuple[float, float]:
    """(α seconds, β bytes/s) minimising Σ((steps·α + volume/β − t)/t)² over the all-reduces
    timed as training issues them (``all_reduce_after_compute``: an all-reduce's own time
    after GEMMs, validate/profiler.py), else over the back-to-back all-reduces,
    else over all collectives; a profile without collective rows gets the all-reduce-after-
    compute fit of bench/gloo_collectives.py (validate/data/gloo_loopback.json).

    Why after compute: in a training step every data- and tensor-parallel all-reduce follows
    an op; a process that arrives first sleeps in gloo and must be woken, which back-to-back
    all-reduces (both processes spinning through the loop) never pay. On the CI machine kind
    that doubles a 256 KiB all-reduce (traces/README.md).

    Raises:
        DataFileError: the profile has no collective rows and the packaged fit is unreadable.
    """
    rows = db.collectives()
    # gloo's all-reduce has ~4x the per-message latency of a send/recv on loopback; the
    # all-reduces (data- and tensor-parallel) carry most of the small plans' traffic, so they
    # alone set α and β when measured.
    rows = [r for r in rows if r.kind == "all_reduce_after_compute"] \
        or [r for r in rows if r.kind == "all_reduce"] or rows
    if not rows:  # e.g. a one-process profile: the packaged gloo microbenchmark's fit
        return gloo_alpha_beta("all_reduce_after_compute")
    a, y = [], []
    for r in rows:
        steps, volume = collective_steps_volume(r.kind, r.group_size, r.size_bytes)
        a.append([steps / r.time_s, volume / r.time_s])
        y.append(1.0)
    sol, *_ = np.linalg.lstsq(np.asarray(a), np.asarray(y), rcond=None)
    alpha, inv_beta = float(sol[0]), float(sol[1])
    if inv_beta <= 0:  # degenerate: latency-only data; take the largest transfer's rate
        big = max(rows, key=lambda r: r.size_bytes)
        inv_beta = big.time_s / max(collective_steps_volume(big.kind, big.group_size,
                                                            big.size_bytes)[1], 1.0)
    return max(alpha, 0.0), 1.0 / inv_beta


def derive_figures(db: ProfileDB) -> CpuFigures:
    """Peak, bandwidth, op overhead and the link's α/β from the profile's rows.

    Raises:
        DataFileError: the profile lacks GEMMs, memory-bound ops or collectives.
    """
    gemms = db.ops("matmul", "fwd")
    if not gemms:
        raise DataFileError("profile has no matmul measurements")
    mem = [r for k in MEMORY_BOUND_KINDS for r in db.ops(k, "fwd") if r.bytes_moved > 0]
    if not mem:
        raise DataFileError("profile has no memory-bound op measurements")
    ops = [r for r in db.rows if r.pass_ in ("fwd", "bwd")]
    alpha, beta = fit_alpha_beta(db)
    return CpuFigures(
        peak_flops=max(r.flops / r.time_s for r in gemms),
        memory_bandwidth_bytes_per_s=max(r.bytes_moved / r.time_s for r in mem),
        op_overhead_s=min(r.time_s for r in ops), alpha_s=alpha,
        link_bandwidth_bytes_per_s=beta)


def cpu_gpu_spec(db: ProfileDB) -> GpuSpec:
    """The ``cpu`` GpuSpec of one worker process (module docstring); not in the catalog."""
    fig = derive_figures(db)
    ph = _placeholders()
    meta = db.meta
    clock = float(meta.get("cpu_mhz") or ph["nominal_clock_mhz"])
    per_clock = fig.peak_flops / (clock * 1e6)
    memory = int(meta.get("memory_bytes_per_process") or 0) or 2**30
    src = dict(ph["sources"])
    src.update({"flops_per_clock_per_sm": "sim profile: fastest fp32 GEMM / clock",
                "memory_bandwidth_gbps": "sim profile: fastest memory-bound op",
                "memory_gib": "sim profile metadata: RAM / processes"})
    return GpuSpec(
        name=CPU_GPU_NAME, architecture=str(meta.get("cpu_model", "cpu")), chip="cpu",
        form_factor="cpu", sm_count=1,
        flops_per_clock_per_sm=MappingProxyType({"fp32": per_clock}),
        datasheet_tflops=MappingProxyType({"fp32": fig.peak_flops / 1e12}),
        datasheet_clock_mhz=MappingProxyType({"fp32": clock}),
        memory_bytes=memory, memory_bandwidth_bytes_per_s=fig.memory_bandwidth_bytes_per_s,
        tdp_w=float(ph["tdp_w"]), idle_power_w=float(ph["idle_power_w"]),
        sm_clock_min_mhz=clock, sm_clock_max_mhz=clock, sm_clock_step_mhz=1.0,
        base_clock_mhz=clock, boost_clock_mhz=clock, nvlink_bandwidth_bytes_per_s=None,
        pcie_gen=int(ph["pcie_gen"]), default_node_type="cpu-loopback",
        sources=MappingProxyType(src))


class CpuCluster(Cluster):
    """A Cluster of worker processes on one machine joined by fitted loopback links."""

    __slots__ = ("_loop",)
    _loop: dict[str, Link]

    def path(self, src_rank: int, dst_rank: int) -> tuple[Link, ...]:
        """(src's loopback out, dst's loopback in); empty for src == dst."""
        if src_rank == dst_rank:
            return ()
        self._check_rank(src_rank)
        self._check_rank(dst_rank)
        return (self._loop[f"cpu.r{src_rank}.out"], self._loop[f"cpu.r{dst_rank}.in"])

    def link(self, link_id: str) -> Link:
        """Loopback link by id."""
        try:
            return self._loop[link_id]
        except KeyError:
            raise UnknownNameError(f"unknown link id {link_id!r}") from None

    def links(self) -> list[Link]:
        """Every loopback link, rank by rank."""
        return list(self._loop.values())


def cpu_cluster(db: ProfileDB, processes: int) -> CpuCluster:
    """A one-node cluster of `processes` cpu "GPUs" with the profile's loopback α/β."""
    if processes < 1:
        raise DataFileError(f"cpu cluster: processes={processes} must be >= 1")
    fig = derive_figures(db)
    gpu = cpu_gpu_spec(db)
    source = {"all": "sim profile: alpha/beta fitted to measured gloo collectives"}
    nic = NicSpec(name="loopback", description="127.0.0.1 (gloo over TCP)",
                  bandwidth_bytes_per_s=fig.link_bandwidth_bytes_per_s,
                  latency_s=fig.alpha_s / 2, sources=MappingProxyType(source))
    node = NodeType(name="cpu-loopback", description="one machine, worker processes over "
                    "loopback TCP", max_gpus=processes, gpus=(CPU_GPU_NAME,), intra_node="pcie",
                    nvlink_pairs=(), pcie_gen=gpu.pcie_gen, nic="loopback", nics_per_node=1,
                    instance=None, sources=MappingProxyType(source))
    group = NodeGroup(gpu=gpu, nodes=1, gpus_per_node=processes, node_type=node, nic=nic,
                      nics_per_node=1, price_per_gpu_hour_usd=0.0, price_source="local machine")
    cluster = CpuCluster(node_groups=(group,))
    loop = {}
    for r in range(processes):
        for direction in ("out", "in"):
            lid = f"cpu.r{r}.{direction}"
            loop[lid] = Link(link_id=lid, bandwidth_bytes_per_s=fig.link_bandwidth_bytes_per_s,
                             latency_s=fig.alpha_s / 2, kind="nic")
    object.__setattr__(cluster, "_loop", loop)
    return cluster
