"""Lower an SPMD sharding plan to the Program the engines run: the intra-op planners' Oracle.

It lives beside the planners rather than in workloads/lowering/ because it needs the simulator's
task builder and the collectives lowering (`CommLowering`), both below search in the layering;
it emits the same kind of Program `workloads.lowering.lower` does, on the same links.

One iteration of one batch (no pipeline, no gradient accumulation), one program rank per GPU
of the mesh (no folding: the engine shares the links that concurrent groups cross):

* forward, op by op: the resharding collectives of each input edge on stream ``tp`` (every
  group of the axis its own task, after its members' producers), then the op's compute task on
  ``compute`` (allocating its saved activations), then the op's own collectives;
* backward in reverse: each consumer's gradient resharded back to the producer's layout (the
  transposed collectives, `workloads.sharding.plan.edge_collectives`), then the backward
  compute (freeing the activations);
* weight gradients summed over the axes where the weights are replicated and the batch split,
  bucketed per layer on stream ``dp`` when the layer's backward ends, overlapping the rest
  of the backward (as DDP/XLA bucket them);
* the Adam step per device after its reductions (as workloads/lowering/gradient_sync.py);
* a recompute group (plan.py) keeps only its outside inputs and runs its forward again
  (tasks of kind ``recompute``) right before its backward.

`lower_nodes` lowers any subset of nodes — edges from outside are ready at time 0 — which is
how CFP evaluates a ParallelBlock on the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from trainsim.hwmodels.cluster import Cluster
from trainsim.search.intraop.costs import OraclePricing
from trainsim.simulator.engine_numba import event_times
from trainsim.simulator.program import Program, ProgramInfo
from trainsim.simulator.task_table import TaskTableBuilder
from trainsim.workloads.lowering.comm import NO_META, CommLowering
from trainsim.workloads.sharding.graph import SpmdGraph
from trainsim.workloads.sharding.plan import (
    ShardingPlan,
    edge_collectives,
    grad_bytes,
    grad_sync_axes,
    kept_bytes,
    saved_bytes,
)
from trainsim.workloads.sharding.spec import Collective
from trainsim.workloads.sharding.strategies import Strategy, sync_collectives
from trainsim.workloads.stage_costs import ADAM_STEP_BYTES_PER_PARAM, ADAM_STEP_FLOPS_PER_PARAM

Ready = dict[int, list[int]]
"""Per device, the task ids its next step waits for."""


class _Emitter:
    def __init__(self, graph: SpmdGraph, cluster: Cluster, pricing: OraclePricing) -> None:
        self.graph, self.cluster, self.pricing = graph, cluster, pricing
        self.mesh = pricing.mesh
        self.b = TaskTableBuilder()
        self.comm = CommLowering(cluster, "auto", self.b)
        self.groups = [self.mesh.groups(a) for a in range(self.mesh.ndim)]
        self.compute, self.tp, self.dp = (self.b.stream(s) for s in ("compute", "tp", "dp"))
        self.gpu = cluster.gpu(0)
        self.freq = self.gpu.sm_clock_max_mhz

    def chain(self, cs: Sequence[Collective], ready: Ready, name: str, arg: int,
              stream: int) -> Ready:
        """Collectives one after another, each by every group of its axis."""
        out = {r: list(v) for r, v in ready.items()}
        code = self.b.name_template(name)
        for c in cs:
            kind = self.b.kind(c.kind)
            for g in self.groups[c.axis]:
                deps = sorted({d for r in g for d in out[r]})
                ids = self.comm.tasks([(c.kind, c.size_bytes)], name=code, arg=-1, kind=kind,
                                      stream=stream, prog_ranks=g, copies=[g], deps=deps,
                                      meta=NO_META)
                if ids:
                    for r in g:
                        out[r] = [ids[-1]]
        return out

    def compute_task(self, name: str, arg: int, kind: str, rank: int, duration_s: float,
                     power_w: float, deps: Sequence[int], alloc: float, free: float,
                     layer: int) -> int:
        return self.b.add(self.b.name_template(name), -1, self.b.kind(kind), self.compute,
                          (rank,), duration_s, 0.0, (), sorted(set(deps)), alloc, free, power_w,
                          self.freq, 0, 0, layer, layer)


def lower_nodes(graph: SpmdGraph, strategies: Mapping[int, Strategy], cluster: Cluster,
                pricing: OraclePricing, *, optimizer: bool = True,
                info: ProgramInfo | None = None, memory_capacity_bytes: float | None = None,
                static_bytes_per_rank: float = 0.0,
                recompute_group: Sequence[int] | None = None) -> Program:
    """The Program of the nodes in `strategies` (keys: node indices, any subset);
    `recompute_group`: per node of the graph its recompute group or -1 (plan.py)."""
    em = _Emitter(graph, cluster, pricing)
    mesh, dtype = pricing.mesh, pricing.dtype
    ranks = range(mesh.size)
    order = sorted(strategies)
    members = set(order)
    groups = list(recompute_group) if recompute_group else [-1] * len(graph.nodes)

    def held(i: int) -> float:
        st = strategies[i]
        if groups[i] < 0:
            return saved_bytes(graph, st, i)
        return kept_bytes(graph, st, i, groups, mesh)

    def recompute(g: int) -> None:
        """The group's forward again, in order, before its backward (its activations back)."""
        again: dict[int, Ready] = {}
        for j in order:
            if groups[j] != g:
                continue
            node = graph.nodes[j]
            st = strategies[j]
            waits: Ready = {r: [] for r in ranks}
            for slot, src in enumerate(node.srcs):
                if src in again:
                    fwd, _bwd = edge_collectives(graph, mesh, strategies[src], st, j, slot)
                    got = em.chain(fwd, again[src], f"{node.op.name}.rin{slot}.L{node.layer}",
                                   j, em.tp)
                    for r in ranks:
                        waits[r] += got[r]
            t = pricing.op_passes(graph, j, st)
            done = {r: [em.compute_task(f"R.L{node.layer}.{node.op.name}", j, "recompute", r,
                                        t.fwd_s, t.fwd_w, waits[r], saved_bytes(graph, st, j),
                                        0.0, node.layer)] for r in ranks}
            again[j] = em.chain(st.fwd_comm, done, f"{node.op.name}.rcomm.L{node.layer}", j,
                                em.tp)
    fwd_out: dict[int, Ready] = {}
    consumers: dict[int, list[tuple[int, int]]] = {i: [] for i in order}
    for i in order:
        node = graph.nodes[i]
        st = strategies[i]
        waits: Ready = {r: [] for r in ranks}
        for slot, src in enumerate(node.srcs):
            if src not in members:
                continue
            consumers[src].append((i, slot))
            fwd, _bwd = edge_collectives(graph, mesh, strategies[src], st, i, slot)
            got = em.chain(fwd, fwd_out[src], f"{node.op.name}.in{slot}.L{node.layer}", i,
                           em.tp)
            for r in ranks:
                waits[r] += got[r]
        t = pricing.op_passes(graph, i, st)
        act = held(i)
        done: Ready = {r: [em.compute_task(f"F.L{node.layer}.{node.op.name}", i, "forward", r,
                                           t.fwd_s, t.fwd_w, waits[r], act, 0.0, node.layer)]
                       for r in ranks}
        fwd_out[i] = em.chain(st.fwd_comm, done, f"{node.op.name}.comm.L{node.layer}", i, em.tp)
    bwd_done: dict[int, Ready] = {}
    recomputed: set[int] = set()
    bucket: dict[tuple[int, tuple[int, ...]], float] = {}
    bucket_layer = -1
    last_compute: Ready = {r: [] for r in ranks}
    sync_tail: Ready = {r: [] for r in ranks}

    def flush(layer: int) -> None:
        for (_layer, axes), size in sorted(bucket.items()):
            proto = Strategy(roles=(), in_specs=(), out_spec=(), work_split=(), work_div=1,
                             param_div=1, act_div=1, sync_axes=axes)
            got = em.chain(sync_collectives(proto, mesh, size), last_compute,
                           f"grad_sync.L{layer}", layer, em.dp)
            for r in ranks:
                sync_tail[r] += got[r]
        bucket.clear()

    for i in reversed(order):
        node = graph.nodes[i]
        st = strategies[i]
        if node.layer != bucket_layer:
            flush(bucket_layer)
            bucket_layer = node.layer
        waits = {r: list(fwd_out[i][r]) for r in ranks} if not consumers[i] else \
            {r: [] for r in ranks}
        for dst, slot in consumers[i]:
            _fwd, bwd = edge_collectives(graph, mesh, st, strategies[dst], dst, slot)
            got = em.chain(bwd, bwd_done[dst], f"{node.op.name}.grad{slot}.L{node.layer}", i,
                           em.tp)
            for r in ranks:
                waits[r] += got[r]
        if groups[i] >= 0 and groups[i] not in recomputed:
            recomputed.add(groups[i])
            recompute(groups[i])
        t = pricing.op_passes(graph, i, st)
        act = held(i) + (saved_bytes(graph, st, i) if groups[i] >= 0 else 0.0)
        bwd_done[i] = {r: [em.compute_task(f"B.L{node.layer}.{node.op.name}", i, "backward",
                                           r, t.bwd_s, t.bwd_w, waits[r], 0.0, act,
                                           node.layer)] for r in ranks}
        last_compute = bwd_done[i]
        axes = grad_sync_axes(graph, strategies, i)
        if axes:
            key = (node.layer, axes)
            bucket[key] = bucket.get(key, 0.0) + grad_bytes(graph, st, i, dtype)
    flush(bucket_layer)
    if optimizer:
        params = sum(-(-graph.nodes[i].op.params // strategies[i].param_div) for i in order)
        est = pricing.cost_model.estimate(  # type: ignore[attr-defined]
            "elementwise", ADAM_STEP_FLOPS_PER_PARAM * params,
            ADAM_STEP_BYTES_PER_PARAM * params, em.gpu, None, "fp32", None)
        for r in ranks:
            em.compute_task("optimizer", -1, "optimizer", r, est.time_s, est.power_w,
                            last_compute[r] + sync_tail[r], 0.0, 0.0, -1)
    capacity = [memory_capacity_bytes if memory_capacity_bytes is not None
                else float(cluster.gpu(r).memory_bytes) for r in ranks]
    return Program(num_ranks=mesh.size, tasks=em.b.build(),
                   link_bandwidth_bytes_per_s=dict(sorted(em.comm.links.items())),
                   static_memory_bytes=[static_bytes_per_rank] * mesh.size,
                   memory_capacity_bytes=capacity,
                   idle_power_w=[cluster.idle_power_w(r) for r in ranks],
                   info=info or ProgramInfo(planner="intraop"))


def lower_plan(plan: ShardingPlan, cluster: Cluster, pricing: OraclePricing, *,
               memory_limit_bytes: float | None = None) -> Program:
    """The whole iteration of `plan` as a Program (module docstring)."""
    graph = plan.graph
    g = graph.graph
    gpu = cluster.gpu(0)
    info = ProgramInfo(
        model=g.spec.name, global_batch=g.micro_batch_size, seq_len=g.seq_len,
        tokens_per_iteration=float(g.tokens),
        model_flops_per_iteration=g.training_flops("none", matmul_only=True),
        peak_flops_per_rank=float(gpu.peak_flops(plan.dtype, gpu.sm_clock_max_mhz)),
        gpu_name=gpu.name, folded=False, planner="intraop",
        price_per_hour_usd=float(cluster.price_per_hour_usd) * plan.mesh.size
        / cluster.num_gpus)
    static = plan.static_memory_bytes()
    return lower_nodes(graph, dict(enumerate(plan.strategies)), cluster, pricing, info=info,
                       memory_capacity_bytes=memory_limit_bytes,
                       static_bytes_per_rank=static,
                       recompute_group=plan.recompute_group or None)


def program_time_s(program: Program) -> float:
    """Iteration time of `program` on the numba engine (no SimResult: the planners' fast
    path)."""
    return program_times_s(program)[0]


def program_times_s(program: Program) -> tuple[float, float]:
    """(iteration time, time until the last task off the ``dp`` stream ends) on the numba
    engine: the second is the block's time when its gradient reduction hides behind later
    work."""
    if program.num_tasks == 0:
        return 0.0, 0.0
    frozen = program.freeze()
    _start, end = event_times(frozen)
    if np.isnan(end).any():
        raise RuntimeError("intra-op program deadlocked (a lowering bug)")
    names = frozen.stream_names
    off_dp = np.asarray([names[c] != "dp" for c in frozen.stream_code])
    return float(np.max(end)), float(np.max(end[off_dp], initial=0.0))


__all__ = ["lower_nodes", "lower_plan", "program_time_s", "program_times_s"]
