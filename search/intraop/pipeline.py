"""Intra-op sharding inside pipeline stages (beyond CFP, which has none): method "intraop-pp".

The model's layers are cut into `pp` contiguous stages (pp divides the GPUs); stage s runs on
GPUs [s·n, (s+1)·n) (n = GPUs / pp) as a sub-mesh (`submesh_shape`: pp cuts the outer mesh
axis first, so on a 2 × 4 mesh over two 4-GPU nodes pp = 2 gives each stage one node, 1-D).
The global batch is split into M micro-batches run under 1F1B (PipeDream-Flush / Megatron-LM),
weight gradients accumulated and reduced once, after the last micro-batch.

Per candidate (pp, M):

1. the op graph of one micro-batch (global batch / M samples) is cut into stages that balance
   the layers' forward + backward FLOPs (a linear-partition DP), and once more to balance
   the layers' times under the plans step 2 found (the engine keeps the better); a stage
   after the first reads its input from a pseudo node ``stage_input`` (no work, no memory)
   whose layout is fixed to the previous stage's exit layout, so the segment DP prices the
   resharding into the stage's first block; the boundary tensor itself moves by p2p, GPU i
   of one stage to GPU i of the next (equal sub-meshes, equal layouts), as Megatron-LM
   sends it;
2. CFP runs per stage, stage after stage (each stage's entry is the previous one's exit), on
   the sub-mesh: blocks are priced on the engine once per distinct block (`problem.py`'s
   hashing, shared by all stages and by every pp with that sub-mesh and micro-batch size);
   a block's time counts its gradient reduction once per M micro-batches (the run's exposed
   reduction, `hidden_sync_time_s`, divided by M) and its memory holds the activations of
   the min(pp − s, M) micro-batches stage s keeps in flight under 1F1B;
3. the whole iteration is lowered into one Program (`lower_pipeline`) and scored by the numba
   engine; the grid keeps the fastest plan that fits.

pp = 1, M = 1 is today's intraop plan (`planner.run_intraop`, taken as is); pp = 1, M > 1 is
gradient accumulation alone. Stage pricing during the search uses the first stage's GPUs for
every stage (the stages' sub-meshes are alike on a homogeneous cluster); the final Program
puts each stage's collectives and transfers on its own GPUs' links. No recompute here.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.errors import SpecError
from trainsim.hwmodels.cluster import Cluster
from trainsim.search.intraop.blocks import Block, build_blocks
from trainsim.search.intraop.cfp import CfpSolver
from trainsim.search.intraop.costs import OraclePricing
from trainsim.search.intraop.planner import (
    GB,
    IntraopMemoryError,
    IntraopResult,
    plan_from_choice,
    resolve_inputs,
    run_intraop,
)
from trainsim.search.intraop.problem import Problem, build_problem
from trainsim.search.intraop.program import program_time_s
from trainsim.simulator.program import Program, ProgramInfo
from trainsim.simulator.task_table import TaskTableBuilder
from trainsim.workloads.lowering.comm import CommLowering
from trainsim.workloads.model import ModelSpec, build_graph
from trainsim.workloads.ops import Op
from trainsim.workloads.sharding.graph import Node, SpmdGraph, build_spmd_graph
from trainsim.workloads.sharding.mesh import DeviceMesh
from trainsim.workloads.sharding.plan import (
    ShardingPlan,
    edge_collectives,
    grad_bytes,
    grad_sync_axes,
    holds_tied_copy,
    local_params,
    saved_bytes,
    static_bytes,
)
from trainsim.workloads.sharding.spec import Collective, Spec, local_bytes
from trainsim.workloads.sharding.strategies import Strategy, sync_collectives
from trainsim.workloads.stage_costs import (
    ADAM_STEP_BYTES_PER_PARAM,
    ADAM_STEP_FLOPS_PER_PARAM,
    optimizer_bytes_per_param,
)

METHOD = "intraop-pp"
PP_CHOICES = (1, 2, 4, 8)
"""Pipeline depths tried (those dividing the mesh's GPUs and at most the layer count)."""
MB_FACTORS = (1, 2, 4)
"""Micro-batch counts tried per pp: M = factor × pp where it divides the global batch (a small
grid: more micro-batches shrink the bubble, (pp − 1) / (M + pp − 1), but run smaller GEMMs)."""
INPUT = "stage_input"

Ready = dict[int, list[int]]
"""Per physical GPU, the task ids its next step waits for."""


def submesh_shape(mesh: DeviceMesh, pp: int) -> tuple[int, ...] | None:
    """The mesh of one stage: `pp` cuts the outer axes first (consecutive GPUs per stage);
    None when it cannot cut the mesh into pp equal blocks that way."""
    rest, out = pp, []
    for n in mesh.shape:
        if rest >= n:
            if rest % n:
                return None
            rest //= n
        else:
            if n % rest:
                return None
            out.append(n // rest)
            rest = 1
    if rest != 1:
        return None
    out = [n for n in out if n > 1]
    return tuple(out) if out else (1,)


def split_layers(costs: Sequence[float], pp: int) -> list[range]:
    """Contiguous split of the layers into `pp` non-empty stages minimising the largest
    stage's cost (the linear-partition DP)."""
    n = len(costs)
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    best = np.full((pp + 1, n + 1), np.inf)
    cut = np.zeros((pp + 1, n + 1), dtype=int)
    best[0][0] = 0.0
    for k in range(1, pp + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    out, i = [], n
    for k in range(pp, 0, -1):
        out.append(range(int(cut[k][i]), i))
        i = int(cut[k][i])
    return out[::-1]


def layer_costs(graph: SpmdGraph) -> list[float]:
    """Forward + backward FLOPs per layer."""
    out = [0.0] * len(graph.layer_names)
    for n in graph.nodes:
        out[n.layer] += n.op.fwd_flops + n.op.bwd_flops
    return out


def stage_graph(full: SpmdGraph, layers: range) -> tuple[SpmdGraph, tuple[int, ...]]:
    """The stage's own graph and, per stage node, its node in `full` (-1: the input node).

    A stage that does not start the model gets node 0, ``stage_input`` (a pseudo-layer of its
    own): what its first layer read from the previous stage it reads from there."""
    members = [n for n in full.nodes if n.layer in layers]
    first = members[0].index
    outside = sorted({s for n in members for s in n.srcs if s < first})
    if len(outside) > 1:
        raise SpecError(f"a stage boundary before layer {full.layer_names[layers[0]]} cuts "
                        f"{len(outside)} tensors; a pipeline stage must read one")
    shift = 1 if outside else 0
    nodes: list[Node] = []
    keys = [full.segment_keys[la] for la in layers]
    names = [full.layer_names[la] for la in layers]
    recomp = [full.recomputable[la] if full.recomputable else False for la in layers]
    if outside:
        src = full.nodes[outside[0]]
        op = Op(name=INPUT, kind="elementwise", fwd_flops=0.0, bwd_flops=0.0, fwd_bytes=0.0,
                bwd_bytes=0.0, params=0, activation_bytes=0.0, output_bytes=src.op.output_bytes,
                shape=(0,))
        nodes.append(Node(index=0, op=op, layer=0, srcs=(), in_bytes=(), role_class="residual"))
        keys = [max(full.segment_keys) + 1, *keys]
        names = [INPUT, *names]
        recomp = [False, *recomp]
    for k, n in enumerate(members):
        nodes.append(Node(index=k + shift, op=n.op, layer=n.layer - layers[0] + shift,
                          srcs=tuple(s - first + shift if s >= first else 0 for s in n.srcs),
                          in_bytes=n.in_bytes, role_class=n.role_class,
                          tied_params=n.tied_params))
    # a head whose embedding is on another stage keeps a copy of the tied weight
    # (`holds_tied_copy`); the two copies' gradients are all-reduced (`_Lowering.tied_sync`)
    local = {n.index: k + shift for k, n in enumerate(members)}
    tied = (None if full.tied is None or not all(i in local for i in full.tied)
            else (local[full.tied[0]], local[full.tied[1]]))
    graph = SpmdGraph(nodes=tuple(nodes), graph=full.graph, segment_keys=tuple(keys),
                      layer_names=tuple(names), recomputable=tuple(recomp), tied=tied)
    return graph, ((-1,) if outside else ()) + tuple(n.index for n in members)


@dataclass(slots=True)
class StagePlan:
    """One pipeline stage: its layers, GPUs, graph and sharding plan."""

    index: int
    layers: range
    """Layer indices of the model's graph."""
    ranks: tuple[int, ...]
    """Physical GPUs, in sub-mesh order."""
    graph: SpmdGraph
    full_nodes: tuple[int, ...]
    """Per stage node, its node in the whole model's graph (-1: ``stage_input``)."""
    plan: ShardingPlan
    blocks: list[Block]
    choice: list[int]
    in_flight: int
    """Micro-batches whose activations the stage holds at once under 1F1B."""
    exit_node: int | None
    """The stage node whose output the next stage reads (None: the last stage)."""

    @property
    def has_input(self) -> bool:
        """Whether node 0 is ``stage_input``."""
        return bool(self.full_nodes) and self.full_nodes[0] < 0

    def activation_bytes(self) -> float:
        """What one micro-batch leaves saved for its backward, per GPU."""
        return sum(saved_bytes(self.graph, s, i) for i, s in enumerate(self.plan.strategies))

    def memory_bytes(self) -> float:
        """Peak per GPU: weights, gradients, optimizer states and `in_flight` micro-batches'
        activations (the forwards of 1F1B's warm-up all end before the first backward)."""
        return self.plan.static_memory_bytes() + self.in_flight * self.activation_bytes()


def _stage_problem(problem: Problem, blocks: list[Block], graph: SpmdGraph, dtype: str,
                   in_flight: int, micro_batches: int) -> Problem:
    """Block costs for a stage under 1F1B: the exposed gradient reduction of a block run
    counts once per `micro_batches`, the activations `in_flight` times."""
    assert problem.hidden_sync_time_s is not None
    times, mems = [], []
    for b, full, hidden in zip(blocks, problem.time_s, problem.hidden_sync_time_s,
                               strict=True):
        times.append(hidden + (full - hidden) / micro_batches)
        mems.append(np.array([sum(static_bytes(graph, st, n, dtype)
                                  + in_flight * saved_bytes(graph, st, n)
                                  for n, st in zip(b.nodes, opt, strict=True))
                              for opt in b.options]))
    return dataclasses.replace(problem, time_s=times, memory_bytes=mems,
                               hidden_sync_time_s=times)


def one_f_one_b(stage: int, pp: int, micro_batches: int) -> list[tuple[str, int]]:
    """Stage `stage`'s actions under 1F1B: pp − 1 − stage warm-up forwards, then one forward
    and one backward in turn, then the remaining backwards."""
    warm = min(pp - 1 - stage, micro_batches)
    out = [("F", m) for m in range(warm)]
    for m in range(micro_batches - warm):
        out += [("F", warm + m), ("B", m)]
    out += [("B", m) for m in range(micro_batches - warm, micro_batches)]
    return out


class _Lowering:
    """Builds the pipelined Program (`lower_pipeline`)."""

    def __init__(self, stages: list[StagePlan], cluster: Cluster, pricing: OraclePricing,
                 micro_batches: int) -> None:
        self.stages, self.cluster, self.pricing = stages, cluster, pricing
        self.m = micro_batches
        self.b = TaskTableBuilder()
        self.comm = CommLowering(cluster, "auto", self.b)
        self.compute, self.tp, self.dp = (self.b.stream(s) for s in ("compute", "tp", "dp"))
        mesh = stages[0].plan.mesh
        self.groups = [[[tuple(st.ranks[r] for r in g) for g in mesh.groups(a)]
                        for a in range(mesh.ndim)] for st in stages]
        self.consumers = [st.graph.consumers() for st in stages]
        self.fwd_out: dict[tuple[int, int], dict[int, Ready]] = {}
        self.sent_fwd: dict[tuple[int, int], Ready] = {}
        self.sent_bwd: dict[tuple[int, int], Ready] = {}
        self.last_compute: list[Ready] = [{r: [] for r in st.ranks} for st in stages]
        self.sync_tail: list[Ready] = [{r: [] for r in st.ranks} for st in stages]
        self.freq = cluster.gpu(0).sm_clock_max_mhz

    def chain(self, s: int, cs: Sequence[Collective], ready: Ready, name: str, m: int,
              stream: int) -> Ready:
        """Collectives of stage `s` one after another, each by every group of its axis."""
        out = {r: list(v) for r, v in ready.items()}
        code = self.b.name_template(name)
        for c in cs:
            kind = self.b.kind(c.kind)
            for g in self.groups[s][c.axis]:
                deps = sorted({d for r in g for d in out[r]})
                ids = self.comm.tasks([(c.kind, c.size_bytes)], name=code, arg=-1, kind=kind,
                                      stream=stream, prog_ranks=g, copies=[g], deps=deps,
                                      meta=(m, s, -1, -1))
                if ids:
                    for r in g:
                        out[r] = [ids[-1]]
        return out

    def task(self, name: str, kind: str, rank: int, dur: float, power: float,
             deps: Sequence[int], alloc: float, free: float, m: int, s: int,
             layer: int) -> int:
        return self.b.add(self.b.name_template(name), -1, self.b.kind(kind), self.compute,
                          (rank,), dur, 0.0, (), sorted(set(deps)), alloc, free, power,
                          self.freq, m, s, layer, layer)

    def p2p(self, s: int, dst: int, size: float, ready: Ready, m: int, direction: str
            ) -> Ready:
        """Stage `s`'s GPU i sends `size` bytes to stage `dst`'s GPU i."""
        stream = self.b.stream(f"pp{s}>{dst}")
        kind = self.b.kind("p2p")
        name = self.b.name_template(f"s{s}>{dst}.{direction}%d")
        out: Ready = {}
        for a, b in zip(self.stages[s].ranks, self.stages[dst].ranks, strict=True):
            ids = self.comm.tasks([("p2p", size)], name=name, arg=m, kind=kind, stream=stream,
                                  prog_ranks=(a, b), copies=[(a, b)], deps=sorted(ready[a]),
                                  meta=(m, s, -1, -1))
            out[b] = ids[-1:] or list(ready[a])
        return out

    def boundary_bytes(self, s: int) -> float:
        """Bytes of the tensor stage `s` hands to stage s + 1, on one GPU."""
        st = self.stages[s]
        assert st.exit_node is not None
        spec: Spec = st.plan.strategies[st.exit_node].out_spec
        return local_bytes(spec, st.plan.mesh, st.graph.nodes[st.exit_node].op.output_bytes)

    def forward(self, s: int, m: int) -> None:
        st = self.stages[s]
        graph, strat, mesh = st.graph, st.plan.strategies, st.plan.mesh
        out: dict[int, Ready] = {}
        start = 0
        if st.has_input:
            out[0] = self.sent_fwd[(s - 1, m)]
            start = 1
        for i in range(start, len(graph.nodes)):
            node = graph.nodes[i]
            waits: Ready = {r: [] for r in st.ranks}
            for slot, src in enumerate(node.srcs):
                fwd, _bwd = edge_collectives(graph, mesh, strat[src], strat[i], i, slot)
                got = self.chain(s, fwd, out[src], f"{node.op.name}.in{slot}.L{node.layer}",
                                 m, self.tp)
                for r in st.ranks:
                    waits[r] += got[r]
            t = self.pricing.op_passes(graph, i, strat[i])
            act = saved_bytes(graph, strat[i], i)
            done = {r: [self.task(f"F.s{s}.L{node.layer}.{node.op.name}", "forward", r,
                                  t.fwd_s, t.fwd_w, waits[r], act, 0.0, m, s, node.layer)]
                    for r in st.ranks}
            self.last_compute[s] = done
            out[i] = self.chain(s, strat[i].fwd_comm, done,
                                f"{node.op.name}.comm.L{node.layer}", m, self.tp)
        self.fwd_out[(s, m)] = out
        if st.exit_node is not None:
            self.sent_fwd[(s, m)] = self.p2p(s, s + 1, self.boundary_bytes(s),
                                             out[st.exit_node], m, "F")

    def backward(self, s: int, m: int) -> None:
        st = self.stages[s]
        graph, strat, mesh = st.graph, st.plan.strategies, st.plan.mesh
        dtype = st.plan.dtype
        fwd_out = self.fwd_out.pop((s, m))
        consumers = self.consumers[s]
        done: dict[int, Ready] = {}
        last = m == self.m - 1
        by_node = dict(enumerate(strat)) if last else {}
        bucket: dict[tuple[int, ...], float] = {}
        bucket_layer = -1

        def flush(layer: int) -> None:
            for axes, size in sorted(bucket.items()):
                proto = Strategy(roles=(), in_specs=(), out_spec=(), work_split=(), work_div=1,
                                 param_div=1, act_div=1, sync_axes=axes)
                got = self.chain(s, sync_collectives(proto, mesh, size), self.last_compute[s],
                                 f"grad_sync.s{s}.L{layer}", m, self.dp)
                for r in st.ranks:
                    self.sync_tail[s][r] += got[r]
            bucket.clear()

        def grad_waits(i: int) -> Ready:
            waits: Ready = {r: [] for r in st.ranks}
            for dst, slot in consumers[i]:
                _fwd, bwd = edge_collectives(graph, mesh, strat[i], strat[dst], dst, slot)
                node = graph.nodes[i]
                got = self.chain(s, bwd, done[dst], f"{node.op.name}.grad{slot}.L{node.layer}",
                                 m, self.tp)
                for r in st.ranks:
                    waits[r] += got[r]
            return waits

        start = 1 if st.has_input else 0
        for i in range(len(graph.nodes) - 1, start - 1, -1):
            node = graph.nodes[i]
            if node.layer != bucket_layer:
                if last:
                    flush(bucket_layer)
                bucket_layer = node.layer
            waits = grad_waits(i)
            if i == st.exit_node:
                for r in st.ranks:
                    waits[r] += self.sent_bwd[(s + 1, m)][r]
            elif not consumers[i]:
                waits = {r: list(fwd_out[i][r]) for r in st.ranks}
            t = self.pricing.op_passes(graph, i, strat[i])
            act = saved_bytes(graph, strat[i], i)
            done[i] = {r: [self.task(f"B.s{s}.L{node.layer}.{node.op.name}", "backward", r,
                                     t.bwd_s, t.bwd_w, waits[r], 0.0, act, m, s, node.layer)]
                       for r in st.ranks}
            self.last_compute[s] = done[i]
            axes = grad_sync_axes(graph, by_node, i) if last else ()
            if axes:
                bucket[axes] = bucket.get(axes, 0.0) + grad_bytes(graph, strat[i], i, dtype)
        if last:
            flush(bucket_layer)
        if st.has_input:
            self.sent_bwd[(s, m)] = self.p2p(s, s - 1, self.boundary_bytes(s - 1),
                                             grad_waits(0), m, "B")

    def tied_sync(self) -> None:
        """Where the LM head is on another stage than the embedding it is tied to (the first
        stage), the two copies' weight gradients are all-reduced after each stage's own
        reduction, GPU i of the first stage with GPU i of the head's (Megatron-LM's embedding
        group); both optimizer steps wait for it. The bytes are the head's local shard of the
        copy (the embedding's layout may differ: not modelled)."""
        per_param = optimizer_bytes_per_param(self.stages[0].plan.dtype)[1]
        for s, st in enumerate(self.stages[1:], start=1):
            for i, node in enumerate(st.graph.nodes):
                if holds_tied_copy(st.graph, i):
                    div = st.plan.strategies[i].param_div
                    self._pair_all_reduce(0, s, -(-node.tied_params // div) * per_param)

    def _pair_all_reduce(self, a: int, b: int, size: float) -> None:
        """All-reduce `size` bytes between GPU i of stage `a` and GPU i of stage `b`, after
        both GPUs' last compute and gradient reduction."""
        name, kind = self.b.name_template("embedding.all_reduce"), self.b.kind("all_reduce")
        for ra, rb in zip(self.stages[a].ranks, self.stages[b].ranks, strict=True):
            deps = sorted({*self.last_compute[a][ra], *self.sync_tail[a][ra],
                           *self.last_compute[b][rb], *self.sync_tail[b][rb]})
            ids = self.comm.tasks([("all_reduce", size)], name=name, arg=-1, kind=kind,
                                  stream=self.dp, prog_ranks=(ra, rb), copies=[(ra, rb)],
                                  deps=deps, meta=(-1, b, -1, -1))
            self.sync_tail[a][ra] += ids[-1:]
            self.sync_tail[b][rb] += ids[-1:]

    def optimizer(self, s: int) -> None:
        st = self.stages[s]
        strat = st.plan.strategies
        params = sum(local_params(st.graph, strat[n.index], n.index) for n in st.graph.nodes)
        gpu = self.cluster.gpu(st.ranks[0])
        est = self.pricing.cost_model.estimate(  # type: ignore[attr-defined]
            "elementwise", ADAM_STEP_FLOPS_PER_PARAM * params,
            ADAM_STEP_BYTES_PER_PARAM * params, gpu, None, "fp32", None)
        for r in st.ranks:
            self.task("optimizer", "optimizer", r, est.time_s, est.power_w,
                      self.last_compute[s][r] + self.sync_tail[s][r], 0.0, 0.0, -1, s, -1)

    def build(self) -> None:
        """Every stage's 1F1B actions, emitted as soon as what they receive exists."""
        pp = len(self.stages)
        todo = [one_f_one_b(s, pp, self.m) for s in range(pp)]
        pos = [0] * pp
        while any(p < len(t) for p, t in zip(pos, todo, strict=True)):
            moved = False
            for s in range(pp):
                while pos[s] < len(todo[s]):
                    kind, m = todo[s][pos[s]]
                    if kind == "F" and s > 0 and (s - 1, m) not in self.sent_fwd:
                        break
                    if kind == "B" and s < pp - 1 and (s + 1, m) not in self.sent_bwd:
                        break
                    (self.forward if kind == "F" else self.backward)(s, m)
                    pos[s] += 1
                    moved = True
            if not moved:
                raise RuntimeError("1F1B emission stuck (a lowering bug)")
        self.tied_sync()
        for s in range(pp):
            self.optimizer(s)


def lower_pipeline(stages: list[StagePlan], cluster: Cluster, pricing: OraclePricing,
                   micro_batches: int, *, memory_limit_bytes: float | None = None) -> Program:
    """The whole iteration — `micro_batches` micro-batches through every stage under 1F1B,
    p2p at the stage boundaries, one gradient reduction per stage after the last micro-batch
    (bucketed per layer as in `program.lower_nodes`), the Adam step — as one Program whose
    ranks are the physical GPUs."""
    low = _Lowering(stages, cluster, pricing, micro_batches)
    low.build()
    ranks = [r for st in stages for r in st.ranks]
    num = max(ranks) + 1
    static = [0.0] * num
    for st in stages:
        for r in st.ranks:
            static[r] = st.plan.static_memory_bytes()
    g = stages[0].graph.graph
    gpu = cluster.gpu(0)
    info = ProgramInfo(
        model=g.spec.name, global_batch=g.micro_batch_size * micro_batches, seq_len=g.seq_len,
        tokens_per_iteration=float(g.tokens) * micro_batches,
        model_flops_per_iteration=g.training_flops("none", matmul_only=True) * micro_batches,
        peak_flops_per_rank=float(gpu.peak_flops(stages[0].plan.dtype, gpu.sm_clock_max_mhz)),
        gpu_name=gpu.name, folded=False, planner=METHOD,
        price_per_hour_usd=float(cluster.price_per_hour_usd) * num / cluster.num_gpus)
    capacity = [memory_limit_bytes if memory_limit_bytes is not None
                else float(cluster.gpu(r).memory_bytes) for r in range(num)]
    return Program(num_ranks=num, tasks=low.b.build(),
                   link_bandwidth_bytes_per_s=dict(sorted(low.comm.links.items())),
                   static_memory_bytes=static, memory_capacity_bytes=capacity,
                   idle_power_w=[cluster.idle_power_w(r) for r in range(num)], info=info)


@dataclass(slots=True)
class Candidate:
    """One (pp, M) point of the grid as the engine scored it."""

    pp: int
    micro_batches: int
    iteration_time_s: float | None
    """None: no plan fits."""
    memory_bytes: float
    """The plan's peak per GPU, or (no fit) the least any stage split of it needs."""


@dataclass(slots=True)
class PipelineResult:
    """The best (pp, M) plan with the engine's verdict and the search's own figures."""

    method: str
    model: str
    cluster: Cluster
    mesh: DeviceMesh
    global_batch: int
    pp: int
    micro_batches: int
    stages: list[StagePlan]
    iteration_time_s: float
    memory_bytes: float
    search_s: float
    oracle_evaluations: int
    candidates: list[Candidate]
    program: Program | None = field(default=None, repr=False)
    single: IntraopResult | None = field(default=None, repr=False)
    """The pp = 1, M = 1 plan (today's intraop) when it was on the grid and fit."""

    @property
    def samples_per_s(self) -> float:
        """Samples per second on the engine."""
        return self.global_batch / self.iteration_time_s if self.iteration_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON (per stage: layers, GPUs, spec per op) with the figures; no
        wall-clock times (stable bytes)."""
        return {
            "method": self.method, "model": self.model, "global_batch": self.global_batch,
            "mesh": list(self.mesh.shape), "pp": self.pp, "micro_batches": self.micro_batches,
            "iteration_time_s": self.iteration_time_s, "samples_per_s": self.samples_per_s,
            "memory_bytes_per_gpu": self.memory_bytes,
            "oracle_evaluations": self.oracle_evaluations,
            "grid": [dataclasses.asdict(c) for c in self.candidates],
            "stages": [{"stage": st.index, "layers": [st.layers.start, st.layers.stop],
                        "gpus": list(st.ranks), "in_flight": st.in_flight,
                        "memory_bytes_per_gpu": st.memory_bytes(), "plan": st.plan.to_dict()}
                       for st in self.stages],
        }


def _single_stage(r: IntraopResult) -> StagePlan:
    graph = r.plan.graph
    return StagePlan(index=0, layers=range(len(graph.layer_names)), ranks=tuple(
        range(r.plan.mesh.size)), graph=graph, full_nodes=tuple(range(len(graph.nodes))),
        plan=r.plan, blocks=r.blocks, choice=r.choice, in_flight=1, exit_node=None)


class _Search:
    """Caches shared by the grid's candidates: graphs per micro-batch size, pricing per
    sub-mesh, engine runs per (sub-mesh, micro-batch size)."""

    def __init__(self, spec: ModelSpec, cluster: Cluster, mesh: DeviceMesh, global_batch: int,
                 seq_len: int | None, dtype: str, limit: float) -> None:
        self.spec, self.cluster, self.mesh = spec, cluster, mesh
        self.batch, self.seq_len, self.dtype, self.limit = global_batch, seq_len, dtype, limit
        self.graphs: dict[int, SpmdGraph] = {}
        self.pricing: dict[tuple[int, ...], OraclePricing] = {}
        self.runs: dict[tuple[tuple[int, ...], int], dict[tuple[object, ...],
                                                          tuple[float, float]]] = {}
        self.evaluations = 0

    def graph(self, micro: int) -> SpmdGraph:
        if micro not in self.graphs:
            self.graphs[micro] = build_spmd_graph(build_graph(self.spec, micro, self.seq_len))
        return self.graphs[micro]

    def candidate(self, pp: int, m: int, costs: Sequence[float] | None = None
                  ) -> tuple[list[StagePlan], bool, float, list[float]]:
        """(stages, whether every stage fits, peak or least memory per GPU, each layer's
        time per micro-batch under its stage's plan as the blocks' engine runs price it),
        the layers split to balance `costs` (default their FLOPs)."""
        shape = submesh_shape(self.mesh, pp)
        assert shape is not None
        sub = DeviceMesh(shape)
        micro = self.batch // m
        full = self.graph(micro)
        pricing = self.pricing.setdefault(shape, OraclePricing(self.cluster, sub, self.dtype))
        runs = self.runs.setdefault((shape, micro), {})
        n = sub.size
        stages: list[StagePlan] = []
        fits, worst = True, 0.0
        exit_spec: Spec | None = None
        consumers = full.consumers()
        times = [0.0] * len(full.layer_names)
        split = split_layers(costs if costs is not None else layer_costs(full), pp)
        for s, layers in enumerate(split):
            graph, full_nodes = stage_graph(full, layers)
            blocks = build_blocks(graph, sub)
            if exit_spec is not None:
                keep = tuple(o for o in blocks[0].options if o[0].out_spec == exit_spec)
                assert keep, f"no stage input laid out as {exit_spec}"
                blocks[0] = dataclasses.replace(blocks[0], options=keep)
            problem = build_problem(graph, blocks, self.cluster, pricing, engine=True,
                                    runs=runs)
            self.evaluations += problem.oracle_evaluations
            in_flight = min(pp - s, m)
            problem = _stage_problem(problem, blocks, graph, self.dtype, in_flight, m)
            found, least = CfpSolver(problem, pricing).solve_with_limit(self.limit)
            if found is None:
                fits = False
            got = found if found is not None else least
            worst = max(worst, got.memory_bytes)
            shift = 1 if full_nodes[0] < 0 else 0
            for b, k in zip(blocks, got.choice, strict=True):
                layer = graph.nodes[b.nodes[0]].layer - shift
                if layer >= 0:
                    times[layers.start + layer] += float(problem.time_s[b.index][k])
            plan = plan_from_choice(graph, sub, blocks, got.choice, self.dtype)
            exit_node = None
            if s < pp - 1:
                nxt = next(i for i, f in enumerate(full_nodes) if f >= 0 and any(
                    full.nodes[c].layer >= layers.stop for c, _slot in consumers[f]))
                exit_node = nxt
                exit_spec = plan.strategies[nxt].out_spec
            stages.append(StagePlan(index=s, layers=layers,
                                    ranks=tuple(range(s * n, (s + 1) * n)), graph=graph,
                                    full_nodes=full_nodes, plan=plan, blocks=blocks,
                                    choice=got.choice, in_flight=in_flight,
                                    exit_node=exit_node))
        if fits:
            worst = max(st.memory_bytes() for st in stages)
        return stages, fits, worst, times


def run_intraop_pp(model: str | ModelSpec, cluster: str | Cluster, *, global_batch: int = 8,
                   mesh: str | tuple[int, ...] | None = None,
                   memory_limit_gb: float | None = None, seq_len: int | None = None,
                   dtype: str | None = None, pp_choices: Sequence[int] = PP_CHOICES,
                   mb_factors: Sequence[int] = MB_FACTORS) -> PipelineResult:
    """Search pp, micro-batches and each stage's sharding (module docstring); the plan with
    the least engine iteration time that fits wins.

    Raises:
        SpecError: bad mesh, batch or model. IntraopMemoryError: no grid point fits (naming
            the smallest memory any of them needs).
    """
    spec, cl, the_mesh, dtype, limit = resolve_inputs(model, cluster, global_batch, mesh,
                                                      memory_limit_gb, dtype)
    start = time.perf_counter()
    search = _Search(spec, cl, the_mesh, global_batch, seq_len, dtype, limit)
    layers = len(search.graph(global_batch).layer_names)
    grid: list[tuple[int, int]] = []
    for pp in pp_choices:
        if pp > layers or submesh_shape(the_mesh, pp) is None:
            continue
        ms = sorted({f * pp for f in mb_factors if global_batch % (f * pp) == 0}
                    | ({global_batch} if global_batch < pp else set()))
        grid += [(pp, m) for m in ms]
    if not grid:
        raise SpecError(f"no pipeline depth in {tuple(pp_choices)} splits mesh "
                        f"{the_mesh.describe()} and batch {global_batch}")
    candidates: list[Candidate] = []
    best: tuple[float, int, int, list[StagePlan], Program | None, IntraopResult | None] \
        | None = None
    single: IntraopResult | None = None
    for pp, m in grid:
        if pp == 1 and m == 1:
            try:
                single = run_intraop(spec, cl, method="intraop", global_batch=global_batch,
                                     mesh=the_mesh.shape, memory_limit_gb=limit / GB,
                                     seq_len=seq_len, dtype=dtype)
            except IntraopMemoryError as exc:
                candidates.append(Candidate(1, 1, None, exc.least_bytes or math.inf))
                continue
            search.evaluations += single.oracle_evaluations
            candidates.append(Candidate(1, 1, single.iteration_time_s, single.memory_bytes))
            if best is None or single.iteration_time_s < best[0]:
                best = (single.iteration_time_s, 1, 1, [_single_stage(single)],
                        single.program, single)
            continue
        shape = submesh_shape(the_mesh, pp)
        assert shape is not None
        scored: tuple[float, list[StagePlan], Program, float] | None = None
        stages, fits, mem, times = search.candidate(pp, m)
        least = mem
        for again in (False, True):
            if again:  # re-split on the layers' times under the first plans
                if pp == 1 or [st.layers for st in stages] == split_layers(times, pp):
                    break
                stages, fits, mem, times = search.candidate(pp, m, times)
                least = min(least, mem)
            if not fits:
                continue
            program = lower_pipeline(stages, cl, search.pricing[shape], m,
                                     memory_limit_bytes=limit)
            t = program_time_s(program)
            search.evaluations += 1
            if scored is None or t < scored[0]:
                scored = (t, stages, program, mem)
        if scored is None:
            candidates.append(Candidate(pp, m, None, least))
            continue
        t, stages, program, mem = scored
        candidates.append(Candidate(pp, m, t, mem))
        if best is None or t < best[0]:
            best = (t, pp, m, stages, program, None)
    if best is None:
        least = min(c.memory_bytes for c in candidates)
        raise IntraopMemoryError(
            f"no pipelined sharding plan fits in {limit / GB:.2f} GB per GPU; the smallest "
            f"limit any plan meets is {least / GB:.2f} GB", least_bytes=least)
    t, pp, m, stages, best_program, picked = best
    memory = picked.memory_bytes if picked is not None else max(
        st.memory_bytes() for st in stages)
    return PipelineResult(method=METHOD, model=spec.name, cluster=cl, mesh=the_mesh,
                          global_batch=global_batch, pp=pp, micro_batches=m, stages=stages,
                          iteration_time_s=t, memory_bytes=memory,
                          search_s=time.perf_counter() - start,
                          oracle_evaluations=search.evaluations, candidates=candidates,
                          program=best_program, single=single)


__all__ = ["METHOD", "Candidate", "PipelineResult", "StagePlan", "lower_pipeline",
           "one_f_one_b", "run_intraop_pp", "split_layers", "stage_graph", "submesh_shape"]
