"""Prices of an SPMD plan's pieces on a real cluster: op passes and collectives along mesh axes.

Two cost models, one per planner, so that the comparison the issue asks for is the one the
papers make:

* `OraclePricing` — what the engine charges. An op's passes come from the op cost model
  (roofline × measured efficiency, `workloads.op_work.op_pass_work`) at its *per-device* size,
  so a sharded GEMM loses efficiency and every kernel pays its launch overhead. A collective
  along an axis is planned on the real links by `CommLowering` (ring/tree/hierarchical, link
  classes) with all groups of the axis running at once, so groups that share a NIC share it —
  exactly the time the engine gives these tasks alone.
* `AlphaBetaPricing` — Alpa's ILP model (Zheng et al. 2022 §4.2): per mesh axis one α (the
  link latency per step) and one β (1 / the bandwidth of one group's ring on its slowest link,
  contention between groups ignored); all-gather / reduce-scatter (n−1)/n·S, all-reduce
  2(n−1)/n·S, all-to-all (n−1)/n·S·`ALL_TO_ALL_PENALTY`; a heavy op's compute is its
  unsharded time split evenly among the devices that share it, light (elementwise) ops cost
  nothing (Alpa merges them into their producers).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainsim.hwmodels.cluster import Cluster
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.simulator.task_table import TaskTableBuilder
from trainsim.workloads.lowering.comm import CommLowering
from trainsim.workloads.op_work import op_pass_work
from trainsim.workloads.sharding.graph import SpmdGraph
from trainsim.workloads.sharding.mesh import DeviceMesh
from trainsim.workloads.sharding.spec import Collective, shard_factor
from trainsim.workloads.sharding.strategies import HEAVY_KINDS, Strategy, sharded_op

ALL_TO_ALL_PENALTY = 1.5
"""Alpa's all-to-all penalty: its cost model charges an all-to-all more than its byte count
because it runs below ring bandwidth (assumed factor; Alpa's code uses a penalty of this
kind without a published figure)."""


@dataclass(frozen=True, slots=True)
class PassTimes:
    """One op's forward and backward on one device: seconds and average watts."""

    fwd_s: float
    bwd_s: float
    fwd_w: float
    bwd_w: float


class OraclePricing:
    """Op and collective times as the engine sees them (module docstring)."""

    def __init__(self, cluster: Cluster, mesh: DeviceMesh, dtype: str,
                 cost_model: object | None = None) -> None:
        self.cluster, self.mesh, self.dtype = cluster, mesh, dtype
        self.cost_model = cost_model if cost_model is not None else RooflineCostModel()
        self.gpu = cluster.gpu(0)
        self.comm = CommLowering(cluster, "auto", TaskTableBuilder())
        self.groups = [mesh.groups(a) for a in range(mesh.ndim)]
        self._coll: dict[tuple[int, str, float], float] = {}
        self._ops: dict[tuple[int, tuple[str, ...]], PassTimes] = {}

    def collective_s(self, c: Collective) -> float:
        """Time of collective `c` run by every group of its axis at once, alone."""
        key = (c.axis, c.kind, c.size_bytes)
        found = self._coll.get(key)
        if found is None:
            groups = self.groups[c.axis]
            need = [(c.kind, c.size_bytes)]
            load = self.comm.link_load(need, groups) if len(groups) > 1 else {}
            total = 0.0
            for ph in self.comm.phases(c.kind, groups[0], c.size_bytes):
                total += ph.latency_s
                if ph.bytes_per_link > 0:
                    bw = min(self.comm.topology.link(link).bandwidth_bytes_per_s
                             / load.get(link, 1) for link in ph.links)
                    total += ph.bytes_per_link / bw
            found = self._coll[key] = total
        return found

    def collectives_s(self, cs: list[Collective]) -> float:
        """Sum of `collective_s` (they run one after another)."""
        return sum(self.collective_s(c) for c in cs)

    def op_passes(self, graph: SpmdGraph, node: int, strategy: Strategy) -> PassTimes:
        """Forward and backward of node's per-device op under `strategy`."""
        op = graph.nodes[node].op
        key = (id(op), strategy.roles)
        found = self._ops.get(key)
        if found is None:
            local = sharded_op(op, strategy, shard_factor(strategy.out_spec, self.mesh))
            f, b, _i, _w = op_pass_work(self.cost_model, self.gpu, local, None, self.dtype)
            found = self._ops[key] = PassTimes(f.time_s, b.time_s, f.power_w, b.power_w)
        return found


class AlphaBetaPricing:
    """Alpa's α-β collective costs per mesh axis and even compute split (module docstring)."""

    def __init__(self, cluster: Cluster, mesh: DeviceMesh, dtype: str,
                 cost_model: object | None = None) -> None:
        self.mesh, self.dtype = mesh, dtype
        self.oracle = OraclePricing(cluster, mesh, dtype, cost_model)
        self.alpha_s: list[float] = []
        self.beta_s_per_byte: list[float] = []
        for axis in range(mesh.ndim):
            group = mesh.groups(axis)[0]
            ring = list(group[1:]) + [group[0]]
            links = [link for src, dst in zip(group, ring, strict=True) if src != dst
                     for link in cluster.path(src, dst)]
            hops = [sum(link.latency_s for link in cluster.path(s, d))
                    for s, d in zip(group, ring, strict=True) if s != d]
            self.alpha_s.append(max(hops, default=0.0))
            slowest = min((link.bandwidth_bytes_per_s for link in links), default=1.0)
            self.beta_s_per_byte.append(1.0 / slowest)
        self._full: dict[int, PassTimes] = {}

    def collective_s(self, c: Collective) -> float:
        """α-β time of `c` on its axis."""
        n = self.mesh.shape[c.axis]
        if n <= 1:
            return 0.0
        a, b = self.alpha_s[c.axis], self.beta_s_per_byte[c.axis]
        if c.kind == "all_reduce":
            return 2 * (n - 1) * a + 2 * (n - 1) / n * c.size_bytes * b
        if c.kind == "all_to_all":  # size = one device's buffer; (n-1)/n of it leaves
            return (n - 1) * a + ALL_TO_ALL_PENALTY * (n - 1) / n * c.size_bytes * b
        return (n - 1) * a + (n - 1) / n * c.size_bytes * b

    def collectives_s(self, cs: list[Collective]) -> float:
        """Sum of `collective_s`."""
        return sum(self.collective_s(c) for c in cs)

    def op_passes(self, graph: SpmdGraph, node: int, strategy: Strategy) -> PassTimes:
        """Heavy ops: the unsharded op's time / work_div; light ops: 0 (merged)."""
        op = graph.nodes[node].op
        if op.kind not in HEAVY_KINDS:
            return PassTimes(0.0, 0.0, 0.0, 0.0)
        full = self._full.get(id(op))
        if full is None:
            f, b, _i, _w = op_pass_work(self.oracle.cost_model, self.oracle.gpu, op, None,
                                        self.dtype)
            full = self._full[id(op)] = PassTimes(f.time_s, b.time_s, f.power_w, b.power_w)
        w = strategy.work_div
        return PassTimes(full.fwd_s / w, full.bwd_s / w, full.fwd_w, full.bwd_w)


Pricing = OraclePricing | AlphaBetaPricing

__all__ = ["ALL_TO_ALL_PENALTY", "AlphaBetaPricing", "OraclePricing", "PassTimes", "Pricing"]
