"""Where a lowered plan puts things: stage placement, schedule, layer partition, per-stage
costs and the tensor/data/expert-parallel groups (the half of lowering that creates no tasks).

`LoweringLayout` is what the task-emitting half (lower.py, gradient_sync.py) holds and asks;
`stage_layout()` exposes the same partition and cost path to planners that must predict exactly
what `lower` emits (the energy planner).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

from trainsim.errors import PlanError, TrainsimError
from trainsim.hwmodels.cluster import Cluster, NodeGroup
from trainsim.hwmodels.gpus import GpuSpec
from trainsim.hwmodels.opcost import OpCostModel, RooflineCostModel
from trainsim.simulator.actions import Action, infer_stage_to_rank
from trainsim.simulator.schedules import explicit, get_schedule
from trainsim.workloads.lowering.cache import LoweringCache
from trainsim.workloads.lowering.options import DEFAULT_OPTIONS, LoweringOptions
from trainsim.workloads.model import Layer, ModelGraph, ModelSpec, build_graph, trained_in
from trainsim.workloads.op_parallel import stage_op_degrees
from trainsim.workloads.op_work import InstructionCosts, Work
from trainsim.workloads.plan import MicroBatch, ParallelPlan
from trainsim.workloads.plan_fields import action_stage
from trainsim.workloads.stage_costs import instruction_costs, optimizer_bytes_per_param

MbKey = tuple[int, int, int]
"""(batch size, sequence length, target length) of a micro-batch: what its graph and costs
depend on (target length 0: the model's decoder length)."""
_ROOT_UNIT = ("embedding", "head")
"""Layers FSDP2 keeps in the root unit, which it does not reshard after the forward
(`fully_shard`'s docstring): gathered, and copied, by the forward alone."""


def key_of(mb: MicroBatch) -> MbKey:
    """The MbKey of a micro-batch."""
    return (mb.batch_size, mb.seq_len, mb.target_len)

Unit = tuple[tuple[int, ...], tuple[int, ...]]
"""(program ranks, physical tp group) of one replica unit of a stage."""


@dataclass(frozen=True, slots=True)
class ScheduleGroup:
    """Replica classes that run the same number of micro-batches, so one schedule: lowering
    walks each group's schedule over the units of its classes only."""

    count: int
    """Micro-batches each replica of the group runs."""
    order: dict[int, list[Action]]
    """The schedule: physical stage -> its actions in order."""
    classes: tuple[int, ...]
    """Indices into `LoweringLayout.classes`."""
    micro_batches: tuple[MicroBatch, ...] = ()
    """The micro-batches the group's replicas run (action micro-batch j is entry j)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageLayout:
    """How `lower` lays a plan out, and what each virtual stage's instructions cost: the
    public view of the lowering's partition and cost path, for planners that must predict
    exactly what `lower` emits (the energy planner, search/energy/profile.py)."""

    stage_layers: tuple[tuple[int, ...], ...]
    """Model-graph layer indices of each virtual stage."""
    stage_to_rank: tuple[int, ...]
    """Physical pipeline stage of each virtual stage."""
    stage_gpu_ranks: tuple[tuple[int, ...], ...]
    """Physical GPU ranks of each physical stage ([dp replica][tp index])."""
    micro_batch_shapes: tuple[tuple[int, int], ...]
    """(batch size, sequence length) of every micro-batch."""
    folded: bool
    """True when each physical stage is one program rank standing for all its GPUs."""
    costs: dict[tuple[int, float | None], InstructionCosts]
    """(virtual stage, SM clock MHz or None = the GPU's maximum) -> the costs `lower` uses
    for that stage's instructions on the first micro-batch's shape."""


def stage_layout(model: ModelSpec, cluster: Cluster, plan: ParallelPlan,
                 freqs_mhz: tuple[float | None, ...] = (None,),
                 options: LoweringOptions | None = None,
                 cache: LoweringCache | None = None) -> StageLayout:
    """The stage partition, placement and per-clock instruction costs `lower` would use.

    Args:
        model, cluster, plan: As for `lower` (the plan is checked).
        freqs_mhz: SM clocks to cost every virtual stage at (None = the GPU's maximum).
        options: Lowering options (the cost model, embedding/head placement, folding).
        cache: Shared with the lowerings of the same model, cluster and options (cache.py).
    """
    plan.check(model, cluster)
    model = trained_in(model, plan.dtype)
    opt = options or DEFAULT_OPTIONS
    if plan.cp > 1:  # what `lower` runs: dp·cp replicas of seq/cp tokens, no shared cache
        model, plan = context_parallel_inner(model, cluster, plan)
        cache = None
    elif cache is not None:
        cache.bind(model, cluster, opt)
    low = LoweringLayout(model, cluster, plan, opt, cache)
    key = low.mb_key(0)
    costs = {(k, f): low.costs(k, key, f) for k in range(plan.num_stages) for f in freqs_mhz}
    return StageLayout(
        stage_layers=tuple(tuple(s) for s in low.stage_layers),
        stage_to_rank=tuple(low.stage_to_rank[k] for k in range(plan.num_stages)),
        stage_gpu_ranks=tuple(tuple(r) for r in low.stage_gpu_ranks),
        micro_batch_shapes=tuple((mb.batch_size, mb.seq_len) for mb in low.micro_batches),
        folded=low.fold, costs=costs)


def context_parallel_inner(model: ModelSpec, cluster: Cluster, plan: ParallelPlan
                           ) -> tuple[ModelSpec, ParallelPlan]:
    """The model and plan a context-parallel plan (cp > 1) runs as: dp·cp replicas that each
    run seq/cp tokens of every sample, through a graph whose self attention reads the whole
    sequence's keys (`ModelSpec.context_parallel`). Placement (cp between dp and tp, as
    torchtitan's device mesh), the gradient reduction over dp·cp and ZeRO sharding over dp·cp
    follow from the replicas. `lower` and `stage_layout` both use it, so planners' costs and
    bounds (search/bound.py) are those of the lowered program."""
    seq = plan.seq_len or model.seq_len
    inner = plan.replace(dp=plan.dp * plan.cp, cp=1, seq_len=seq // plan.cp,
                         global_batch=cast(int, plan.global_batch) * plan.cp)
    ring = dataclasses.replace(model, context_parallel=plan.cp)
    inner.check(ring, cluster)
    return ring, inner


def partition_layers(graph: ModelGraph, counts: tuple[int, ...], embedding_and_head: bool = True
                     ) -> list[list[int]]:
    """Layer indices of each virtual stage: blocks split `counts` per stage, layers before the
    first block join stage 0, other non-block layers join the stage of the block before
    (without `embedding_and_head`, the non-block layers are left out)."""
    out: list[list[int]] = [[] for _ in counts]
    stage, seen = 0, 0
    for i, layer in enumerate(graph.layers):
        if layer.recomputable:
            while seen >= counts[stage]:
                stage, seen = stage + 1, 0
            out[stage].append(i)
            seen += 1
        elif embedding_and_head:
            out[stage].append(i)
    return out


class LoweringLayout:
    """Placement, schedule, partition, costs and groups of one lowering.

    Lowering asks for the same costs and groups once per instruction, so each answer is
    worked out once and the same (read-only) object returned after; the caches live on this
    object (not `functools.cache`, whose class-wide cache would keep every lowering alive).
    """

    def __init__(self, model: ModelSpec, cluster: Cluster, plan: ParallelPlan,
                 options: LoweringOptions, cache: LoweringCache | None = None) -> None:
        self.model, self.cluster, self.plan, self.opt = model, cluster, plan, options
        self.shared = cache
        """Answers shared with other lowerings of this model and cluster (None: none)."""
        self.cost_model: OpCostModel = (RooflineCostModel() if options.cost_model is None
                                        else options.cost_model)
        self.micro_batches = self._micro_batch_list()
        self.uniform = plan.micro_batches is None and plan.replica_micro_batches is None
        """Whether every micro-batch has one shape (one key, one graph, one cost)."""
        self.stage_gpu_ranks = self._place_stages()
        self.order = self._schedule()
        self.stage_to_rank = self._stage_map() if plan.num_stages > 1 else {0: 0}
        self._check_stage_map()
        self._check_stage_clocks()
        self.graphs: dict[MbKey, ModelGraph] = {} if cache is None else cache.graphs
        self._costs: dict[tuple[int, MbKey, float | None, str], InstructionCosts] = {}
        self._tp_groups: dict[int, list[tuple[int, ...]]] = {}
        self._dp_groups: dict[int, list[tuple[int, ...]]] = {}
        self._ep_groups: dict[int, list[tuple[int, ...]]] = {}
        self._edp_groups: dict[int, list[tuple[int, ...]]] = {}
        self._units: dict[int, list[Unit]] = {}
        self._unit_of: dict[int, dict[int, int]] = {}
        self._boundary: dict[tuple[int, MbKey], float] = {}
        self._largest_layer: dict[int, float] = {}
        self._holds_embedding: dict[int, bool] = {}
        self.stage_layers = self._partition()
        self.separable = (plan.stage_gpus is None and plan.stage_tp is None
                          and not any(self.has_op_tp(s) for s in range(plan.pp)))
        """Whether every stage has the same dp replicas, so replica d (the d-th tp group of each
        stage) is one pipeline that can run at its own speed and batch share."""
        self.replica_lists = (
            plan.replica_micro_batch_lists(model.seq_len or 1)
            if plan.replica_micro_batches is not None or plan.micro_batches is not None
            else tuple(self.micro_batches[:m] for m in plan.replica_micro_batch_counts()))
        self.fold, self.classes, self.class_counts = self._replica_classes()
        C = len(self.classes)
        self.class_of_replica = {d: c for c, reps in enumerate(self.classes) for d in reps}
        # program ranks: folded → one per (physical stage, replica class), stage-major;
        # unfolded → one per GPU
        if self.fold:
            self.num_ranks = plan.pp * C
            self.represents = [tuple(self.stage_gpu_ranks[s]) if C == 1 else
                               tuple(r for d in self.classes[c] for r in self.replica_ranks(s, d))
                               for s in range(plan.pp) for c in range(C)]
        else:
            self.num_ranks = cluster.num_gpus
            self.represents = [(r,) for r in range(cluster.num_gpus)]
        self.rank_stage = {r: s for s, ranks in enumerate(self.stage_gpu_ranks) for r in ranks}
        self.schedule_groups = self._schedule_groups()
        self._check_instruction_clocks()

    def _check_stage_clocks(self) -> None:
        """Each per-stage and per-instruction clock within the SM clock range of every GPU type
        its stage runs on (on a mixed cluster, the plan's own check only asks that some GPU
        type runs it: which stage lands on which GPUs is known only here)."""
        plan = self.plan
        if len({g.gpu.name for g in self.cluster.node_groups}) == 1:
            return  # one GPU type: the plan's check was this one
        checks = [(f"plan.stage_freq_mhz[{s}]", s, f)
                  for s, f in enumerate(plan.stage_freq_mhz or ())]
        for key, f in plan.instruction_freq_mhz:
            vstage = action_stage(key)
            if vstage < plan.num_stages:  # other keys: refused by _check_instruction_clocks
                checks.append((f"plan.instruction_freq_mhz[{key!r}]", self.phys_stage(vstage), f))
        types: dict[int, list[GpuSpec]] = {}
        for field, phys, f in checks:
            if phys not in types:
                gpus = map(self.cluster.gpu, self.stage_gpu_ranks[phys])
                types[phys] = list({g.name: g for g in gpus}.values())
            for gpu in types[phys]:
                lo, hi = gpu.sm_clock_min_mhz, gpu.sm_clock_max_mhz
                if not lo <= f <= hi:
                    raise PlanError(f"{field}={f:g} MHz is outside {gpu.name}'s SM clock range "
                                    f"{lo:g}–{hi:g} MHz (stage {phys} runs on {gpu.name})")

    def _check_instruction_clocks(self) -> None:
        """Every per-instruction clock names an instruction this plan runs: a frequency plan
        made for another schedule or shape (a 1F1B frontier plan's "1B2" under ZB-H1, whose
        backward is "1I2" and "1W2"; a stage or micro-batch the plan lacks) would otherwise
        apply in part or not at all, silently (the bug hunt: a zb-h1 run of a frontier plan
        clocked its forwards only, 49.96 J against the 1F1B plan's 46.93 J)."""
        plan = self.plan
        if not plan.instruction_freq_mhz:
            return
        names = {str(a) for g in self.schedule_groups for acts in g.order.values()
                 for a in acts}
        for key, _ in plan.instruction_freq_mhz:
            if key not in names:
                raise PlanError(
                    f"plan.instruction_freq_mhz[{key!r}] names no instruction of this plan's "
                    f"{plan.schedule} schedule ({len(names)} instructions, e.g. "
                    f"{', '.join(sorted(names)[:4])}): a frequency plan made for another "
                    f"schedule, stage count or micro-batch count does not apply")

    def _micro_batch_list(self) -> tuple[MicroBatch, ...]:
        """`plan.micro_batch_list`, shared between lowerings when uniform (the same frozen
        micro-batches for the same size, length and count)."""
        plan, default_seq = self.plan, self.model.seq_len or 1
        if self.shared is None or plan.micro_batches is not None \
                or plan.replica_micro_batches is not None:
            return plan.micro_batch_list(default_seq)
        key = (plan.micro_batch_size, plan.seq_len or default_seq, plan.num_micro_batches or 0)
        found = self.shared.micro_batches.get(key)
        if found is None:
            found = self.shared.micro_batches[key] = plan.micro_batch_list(default_seq)
        return found

    def model_flops(self, mb: MicroBatch) -> float:
        """Model FLOPs of one training pass of micro-batch `mb` (matmuls, no recompute: the
        numerator of MFU), shared between lowerings."""
        key = key_of(mb)
        flops = None if self.shared is None else self.shared.flops.get(key)
        if flops is None:
            flops = self.graph(mb).training_flops("none", matmul_only=True)
            if self.shared is not None:
                self.shared.flops[key] = flops
        return flops

    # ------------------------------------------------------------------ replicas
    def replica_ranks(self, s: int, d: int) -> tuple[int, ...]:
        """Physical GPUs of data-parallel replica `d` on stage `s` (its tp group; `separable`
        plans only)."""
        return self.tp_groups(s)[d]

    def _replica_classes(self) -> tuple[bool, list[tuple[int, ...]], list[int]]:
        """(fold, replica classes, micro-batches of each class's replicas).

        Folded, a class is the replicas that are truly identical — the same GPU types and node
        groups (links) on every stage and the same batch share — and each (stage, class) is one
        program rank; the classes are sorted by that key, so the program does not depend on the
        order the cluster was written in. Unfolded, a class is the replicas of one micro-batch
        count (each GPU is its own rank anyway). Plans whose stages have different replicas
        (stage_gpus, stage_tp, per-op degrees) have one class, folded only when each stage's
        GPUs are of one type."""
        plan, opt = self.plan, self.opt
        m = len(self.micro_batches)
        if not self.separable:
            fold = opt.fold and all(self._uniform_gpu(s) for s in range(plan.pp))
            return fold, [tuple(range(plan.dp_of_stage(0)))], [m]
        counts = plan.replica_micro_batch_counts()
        # what a replica runs: its micro-batch count, or its own list's shapes when it has one
        runs: list[Any] = (list(counts) if plan.replica_micro_batches is None else
                           [(len(ms), tuple(key_of(m) for m in ms)) for ms in self.replica_lists])
        fold = opt.fold and all(len({self.cluster.gpu(r).name for r in self.replica_ranks(s, d)})
                                == 1 for s in range(plan.pp) for d in range(plan.dp))
        keys: dict[Any, list[int]] = {}
        for d in range(plan.dp):
            key: Any = ((runs[d], tuple(tuple(self._group_key(r) for r in
                                              self.replica_ranks(s, d))
                                        for s in range(plan.pp)))
                        if fold else runs[d])
            keys.setdefault(key, []).append(d)
        ordered = sorted(keys) if fold and len(keys) > 1 else list(keys)
        return fold, [tuple(keys[k]) for k in ordered], [counts[keys[k][0]] for k in ordered]

    def _group_key(self, rank: int) -> tuple[Any, ...]:
        """What the links and speed of a GPU depend on: its node group's GPU type, node type,
        GPUs per node and NICs (not where the group is written in the cluster)."""
        g = self._group_of(rank)
        return (g.gpu.name, g.node_type.name, g.gpus_per_node, g.nic.name, g.nics_per_node)

    def _group_of(self, rank: int) -> NodeGroup:
        first = 0
        for g in self.cluster.node_groups:
            if rank < first + g.num_gpus:
                return g
            first += g.num_gpus
        raise IndexError(rank)

    def _schedule_groups(self) -> list[ScheduleGroup]:
        """Classes grouped by the micro-batches they run (one schedule each), the most first;
        without per-replica lists, replicas run a prefix of one list, so this groups by count."""
        by_list: dict[tuple[MbKey, ...], list[int]] = {}
        lists: dict[tuple[MbKey, ...], tuple[MicroBatch, ...]] = {}
        for c, reps in enumerate(self.classes):
            ms = self.replica_lists[reps[0]] if self.separable else self.micro_batches
            key = ((key_of(ms[0]),) * len(ms) if self.uniform and ms
                   else tuple(key_of(m) for m in ms))
            by_list.setdefault(key, []).append(c)
            lists[key] = ms
        return [ScheduleGroup(count=len(key), order=self.order if len(key) == len(
                    self.micro_batches) else self._schedule(len(key)),
                              classes=tuple(by_list[key]), micro_batches=lists[key])
                for key in sorted(by_list, key=lambda k: (-len(k), k))]

    def group_units(self, s: int, group: ScheduleGroup) -> list[int]:
        """Indices (into `units(s)`) of the units of stage `s` that `group`'s classes run."""
        if len(self.classes) == 1:
            return list(range(len(self.units(s))))
        if self.fold:
            return list(group.classes)
        return sorted(d for c in group.classes for d in self.classes[c])

    def prog_rank(self, s: int, c: int) -> int:
        """Folded program rank of replica class `c` on physical stage `s`."""
        return s * len(self.classes) + c

    def stage_prog_ranks(self, s: int) -> tuple[int, ...]:
        """Folded program ranks of physical stage `s` (one per replica class)."""
        return tuple(self.prog_rank(s, c) for c in range(len(self.classes)))

    def unit_copies(self, s: int, u: int) -> list[tuple[int, ...]]:
        """Folded: the tensor-parallel groups unit `u` of stage `s` stands for."""
        if len(self.classes) == 1:
            return self.tp_groups(s)
        return [self.replica_ranks(s, d) for d in self.classes[u]]

    # ------------------------------------------------------------------ placement & schedule
    def _canonical_ranks(self) -> list[int]:
        """Every GPU rank, node groups taken fastest first (then by their contents, not by
        where they are written), so an unplaced plan does not depend on the cluster's order."""
        plan, starts, first = self.plan, [], 0
        groups = list(self.cluster.node_groups)
        for g in groups:
            starts.append(first)
            first += g.num_gpus

        def key(i: int) -> tuple[Any, ...]:
            g = groups[i]
            try:
                peak = float(g.gpu.peak_flops(plan.dtype))
            except TrainsimError:
                peak = 0.0
            return (-peak, g.gpu.name, g.node_type.name, g.gpus_per_node, g.nic.name,
                    g.nics_per_node, g.nodes, g.price_per_gpu_hour_usd)

        order = sorted(range(len(groups)), key=key)
        return [r for i in order for r in range(starts[i], starts[i] + groups[i].num_gpus)]

    def _node_ranks(self) -> list[int]:
        """Every GPU rank, nodes taken in the plan's `node_order` (nodes numbered as the
        cluster is written)."""
        starts = []
        first = 0
        for g in self.cluster.node_groups:
            for _ in range(g.nodes):
                starts.append((first, g.gpus_per_node))
                first += g.gpus_per_node
        return [r for n in self.plan.node_order or () for r in
                range(starts[n][0], starts[n][0] + starts[n][1])]

    def _place_stages(self) -> list[list[int]]:
        """Physical ranks of each pipeline stage, laid out [dp replica][tp index] (Megatron:
        tp innermost, then dp, then pp), filling node groups fastest first (`_canonical_ranks`),
        nodes in `node_order`, or node groups as `placement` says."""
        plan, cluster = self.plan, self.cluster
        if plan.placement is None:
            ranks = self._canonical_ranks() if plan.node_order is None else self._node_ranks()
            out, first = [], 0
            for s in range(plan.pp):
                n = plan.gpus_of_stage(s)
                out.append(ranks[first:first + n])
                first += n
            return out
        starts, offset = [], 0
        for group in cluster.node_groups:
            starts.append(offset)
            offset += group.num_gpus
        used = [0] * len(starts)
        out = []
        for s, g in enumerate(plan.placement):
            n = plan.gpus_of_stage(s)
            first = starts[g] + used[g]
            out.append(list(range(first, first + n)))
            used[g] += n
        return out

    def _schedule(self, m: int | None = None) -> dict[int, list[Action]]:
        """Physical stage -> its actions in order (shared between lowerings: a pure function
        of the schedule, depth, micro-batches and chunks, and read-only here)."""
        plan = self.plan
        m = len(self.micro_batches) if m is None else m
        if self.shared is None or plan.schedule == "explicit":
            return self._new_schedule(m)
        key = (plan.schedule, plan.pp, m, plan.virtual_stages)
        found = self.shared.schedules.get(key)
        if found is None:
            found = self.shared.schedules[key] = self._new_schedule(m)
        return found

    def _stage_map(self) -> dict[int, int]:
        """Virtual stage -> physical stage of the schedule (shared with `_schedule`'s)."""
        plan = self.plan
        if self.shared is None or plan.schedule == "explicit":
            return infer_stage_to_rank(self.order)
        key = (plan.schedule, plan.pp, len(self.micro_batches), plan.virtual_stages)
        found = self.shared.stage_maps.get(key)
        if found is None:
            found = self.shared.stage_maps[key] = infer_stage_to_rank(self.order)
        return found

    def _new_schedule(self, m: int) -> dict[int, list[Action]]:
        plan = self.plan
        if plan.schedule == "explicit":
            order = explicit({r: list(a) for r, a in enumerate(plan.order or ())},
                             num_micro_batches=m)
        else:
            order = get_schedule(plan.schedule)(plan.pp, m, plan.virtual_stages)
        return {r: [a for a in acts if a is not None] for r, acts in order.items()}

    def _check_stage_map(self) -> None:
        plan = self.plan
        stages = sorted(self.stage_to_rank)
        if stages != list(range(plan.num_stages)):
            raise PlanError(f"plan schedule {plan.schedule!r} runs stages {stages} but the plan "
                            f"has pp×virtual_stages={plan.num_stages} stages")

    def _uniform_gpu(self, stage: int) -> bool:
        ranks = self.stage_gpu_ranks[stage]
        return len({self.cluster.gpu(r).name for r in ranks}) == 1

    def _partition(self) -> list[list[int]]:
        """Layer indices of each virtual stage (`partition_layers`)."""
        graph = self.graph(self.micro_batches[0])
        counts = self.plan.layers_per_stage(len(graph.transformer_layers()))
        return partition_layers(graph, counts, self.opt.embedding_and_head)

    def graph(self, mb: MicroBatch) -> ModelGraph:
        key = key_of(mb)
        if key not in self.graphs:
            seq = None if self.model.family == "wresnet" else mb.seq_len
            model = self.model
            if mb.target_len and model.family == "t5":
                model = dataclasses.replace(model, decoder_seq_len=mb.target_len)
            self.graphs[key] = build_graph(model, mb.batch_size, seq)
        return self.graphs[key]

    # ------------------------------------------------------------------ costs
    def phys_stage(self, vstage: int) -> int:
        return self.stage_to_rank[vstage]

    def freq(self, vstage: int, action: Action | None) -> float | None:
        if not self.plan.instruction_freq_mhz:  # skip formatting the action: a hot path
            return self.plan.frequency_of(self.phys_stage(vstage), None)
        return self.plan.frequency_of(self.phys_stage(vstage), str(action) if action else None)

    def stage_graph(self, phys: int, mb_key: MbKey) -> ModelGraph:
        """The graph one replica of physical stage `phys` runs for micro-batch shape `mb_key`
        (with `stage_gpus` or `stage_tp`, its share over the stage's data-parallel replicas:
        `ParallelPlan.replica_batch`)."""
        b = self.plan.replica_batch(phys, mb_key[0])
        if b == mb_key[0]:
            return self.graphs[mb_key]
        return self.graph(MicroBatch(batch_size=b, seq_len=mb_key[1], target_len=mb_key[2]))

    def costs(self, vstage: int, mb_key: MbKey, freq: float | None,
              gpu: GpuSpec | None = None) -> InstructionCosts:
        """What virtual stage `vstage`'s instructions cost for micro-batch shape `mb_key` at
        SM clock `freq` (None: the GPU's maximum) on `gpu` (None: the stage's first GPU; the
        sizes, parameters and collectives do not depend on it, only times and power); cached."""
        if gpu is None:
            gpu = self.cluster.gpu(self.stage_gpu_ranks[self.phys_stage(vstage)][0])
        key = (vstage, mb_key, freq, gpu.name)
        found = self._costs.get(key)
        if found is None:
            shared = self.shared
            if shared is None:
                found = self._stage_costs(vstage, mb_key, freq, gpu)
            else:
                content = self._cost_key(vstage, mb_key, freq, gpu)
                found = shared.costs.get(content)
                if found is None:
                    shared.misses += 1
                    found = shared.costs[content] = self._stage_costs(vstage, mb_key, freq, gpu)
                else:
                    shared.hits += 1
            self._costs[key] = found
        return found

    def _cost_key(self, vstage: int, mb_key: MbKey, freq: float | None,
                  gpu: GpuSpec) -> tuple[Any, ...]:
        """Everything `_stage_costs` reads from the plan, as a key shared between plans."""
        plan, s = self.plan, self.phys_stage(vstage)
        degrees = tuple(sorted(plan.op_tp_of_stage(s).items())) if self.has_op_tp(s) else None
        return (tuple(self.stage_layers[vstage]), plan.replica_batch(s, mb_key[0]), mb_key[1],
                mb_key[2], plan.tp_of_stage(s), plan.sp, plan.ep, plan.recompute_of_stage(s),
                gpu.name, freq, plan.dtype, degrees, self._copies_out(), self.holds_embedding(s))

    def _stage_costs(self, vstage: int, mb_key: MbKey, freq: float | None,
                     gpu: GpuSpec) -> InstructionCosts:
        s = self.phys_stage(vstage)
        graph = self.stage_graph(s, mb_key)
        layers = [graph.layers[i] for i in self.stage_layers[vstage]]
        degrees = None
        if self.has_op_tp(s):  # per-op degrees (Aceso): costed by workloads/op_parallel.py
            idx = self.stage_layers[vstage]
            degrees = stage_op_degrees(
                self.plan, s, self.plan.replica_batch(s, mb_key[0]),
                lambda b: [self.graph(MicroBatch(batch_size=b, seq_len=mb_key[1],
                                                 target_len=mb_key[2])).layers[i]
                           for i in idx])
        costs = instruction_costs(layers, tp=self.plan.tp_of_stage(s), sp=self.plan.sp,
                                  ep=self.plan.ep, recompute=self.plan.recompute_of_stage(s),
                                  cost_model=self.cost_model, gpu=gpu, freq_mhz=freq,
                                  dtype=self.plan.dtype, op_degrees=degrees,
                                  layer_cache=None if self.shared is None
                                  else self.shared.layer_costs,
                                  tied_owned=self.holds_embedding(s))
        if not self._copies_out():
            return costs
        idx = self.stage_layers[vstage]
        last_block = max((i for i, la in enumerate(graph.layers)
                          if la.kind not in _ROOT_UNIT), default=-1)
        regathered = [la for i, la in zip(idx, layers, strict=True)
                      if la.kind not in _ROOT_UNIT and i != last_block]
        tp = self.plan.tp_of_stage(s)
        forward = self._copy_out_work(layers, tp, gpu, freq)
        backward = self._copy_out_work(regathered, tp, gpu, freq)
        return dataclasses.replace(costs, forward=costs.forward + forward,
                                   backward=costs.backward + backward,
                                   backward_input=costs.backward_input + backward)

    def holds_embedding(self, phys: int) -> bool:
        """Whether physical stage `phys` runs the word embedding (in any of its chunks): a tied
        LM head there reads it, and no copy is kept (a V-shaped schedule's last chunk sits on
        the first stage); gradient_sync.py `tied_sync` decides the same way. An embedding
        layer that reuses another's table (T5's decoder embedding) does not hold it: it is
        the owner when its parameters cover the tied weight, as `op_work.shared_params`
        counts it."""
        found = self._holds_embedding.get(phys)
        if found is None:
            graph = self.graph(self.micro_batches[0])
            tied = max((la.shared_params for la in graph.layers), default=0)
            found = self._holds_embedding[phys] = any(
                graph.layers[i].kind == "embedding" and graph.layers[i].params >= tied
                for k in self.stage_layers_idx(phys) for i in self.stage_layers[k])
        return found

    def _copies_out(self) -> bool:
        """Whether passes pay FSDP's copy-out of the gathered parameters: ZeRO-3 regathering
        every pass, under a stack that copies (`fsdp_copy_out_traffic`). Plans that keep the
        parameters gathered copy once a step (not modelled)."""
        return (self.plan.zero >= 3 and self.plan.reshard_after_forward
                and self.model.fsdp_copy_out_traffic > 0)

    def _copy_out_work(self, layers: list[Layer], tp: int, gpu: GpuSpec,
                       freq: float | None) -> Work:
        """FSDP2's copy-out, one memory-bound kernel per layer (each block is its own FSDP
        unit): `fsdp_copy_out_traffic` times the gathered bytes of the layer's per-GPU
        parameters (its ops sharded as the stage runs them)."""
        weight_bytes = optimizer_bytes_per_param(self.plan.dtype)[0]
        total = Work()
        for layer in layers:
            params = sum(op.params for op in layer.sharded_ops(tp, self.plan.sp, self.plan.ep))
            moved = self.model.fsdp_copy_out_traffic * weight_bytes * params
            if moved > 0:
                est = self.cost_model.estimate("elementwise", 0.0, moved, gpu, freq,
                                               self.plan.dtype, None)
                total = total + Work(time_s=est.time_s, energy_j=est.time_s * est.power_w)
        return total

    def has_op_tp(self, s: int) -> bool:
        """Whether some op of physical stage `s` has its own tensor-parallel degree (then the
        stage is one replica unit, so every per-op group lies inside it)."""
        return self.plan.has_op_tp(s)

    # ------------------------------------------------------------------ groups
    def tp_groups(self, s: int) -> list[tuple[int, ...]]:
        """Physical tensor-parallel groups of stage `s` (consecutive ranks, tp innermost)."""
        found = self._tp_groups.get(s)
        if found is None:
            t = self.plan.tp_of_stage(s)
            ranks = self.stage_gpu_ranks[s]
            found = self._tp_groups[s] = [tuple(ranks[i:i + t])
                                          for i in range(0, len(ranks), t)]
        return found

    def dp_groups(self, s: int) -> list[tuple[int, ...]]:
        """Physical data-parallel groups of stage `s` (one per tp index)."""
        found = self._dp_groups.get(s)
        if found is None:
            t = self.plan.tp_of_stage(s)
            ranks = self.stage_gpu_ranks[s]
            found = self._dp_groups[s] = [tuple(ranks[i::t]) for i in range(t)]
        return found

    def ep_groups(self, s: int) -> list[tuple[int, ...]]:
        """Physical expert-parallel groups of stage `s`: `ep` consecutive data-parallel ranks
        of one tp index (DeepSpeed-MoE's layout) when ep divides the stage's dp degree, else
        `ep` consecutive ranks of the stage (experts then span tensor-parallel ranks too)."""
        found = self._ep_groups.get(s)
        if found is None:
            ep, ranks = self.plan.ep, self.stage_gpu_ranks[s]
            if self.plan.dp_of_stage(s) % ep == 0:
                found = [g[i:i + ep] for g in self.dp_groups(s) for i in range(0, len(g), ep)]
            else:
                found = [tuple(ranks[i:i + ep]) for i in range(0, len(ranks), ep)]
            self._ep_groups[s] = found
        return found

    def expert_dp_groups(self, s: int) -> list[tuple[int, ...]]:
        """Physical expert-data-parallel groups of stage `s`: the ranks holding the same
        experts, over which expert gradients are reduced and ZeRO shards expert states (and
        gathers expert parameters). Under ep = 1 every rank of a tp index holds every expert,
        so these are the dp groups. When ep divides the stage's dp degree (`ep_groups`:
        DeepSpeed-MoE's layout, ep groups inside one tp index) rank i of each ep group of one
        tp index holds the same experts: dp/ep ranks `g[i::ep]` of each dp group g (DeepSpeed's
        `_create_expert_and_data_parallel`, expert data-parallel groups per model-parallel
        rank). Otherwise (ep groups spanning tp ranks) position i of every ep group of the
        stage: dp·tp/ep ranks, the size of Megatron-Core's expert data-parallel group with
        expert-tp 1 (trainsim does not split experts over tp; megatron/core/parallel_state.py,
        `initialize_model_parallel`: expert_data_parallel_size = world_size //
        (expert_tensor_parallel_size · expert_model_parallel_size · pp); its
        DistributedDataParallel reduces the expert parameters' buffers over that group and the
        distributed optimizer shards them over it: `GradientSync.param_groups`)."""
        found = self._edp_groups.get(s)
        if found is None:
            ep = self.plan.ep
            if ep == 1:
                found = self.dp_groups(s)
            elif self.plan.dp_of_stage(s) % ep == 0:
                found = [g[i::ep] for g in self.dp_groups(s) for i in range(ep)]
            else:
                groups = self.ep_groups(s)
                found = [tuple(g[i] for g in groups) for i in range(ep)]
            self._edp_groups[s] = found
        return found

    def expert_dp(self, s: int) -> int:
        """Size of stage `s`'s expert-data-parallel groups (`expert_dp_groups`)."""
        return len(self.expert_dp_groups(s)[0])

    def units(self, s: int) -> list[Unit]:
        """(program ranks, physical tp group) per replica unit of stage `s`: the whole folded
        stage, or each tensor-parallel group when unfolded (the whole stage when its ops have
        their own degrees: their groups of different sizes must lie inside one unit)."""
        found = self._units.get(s)
        if found is None:
            if self.fold:
                found = [((self.prog_rank(s, c),), self.tp_groups(s)[reps[0]]
                          if self.separable else self.tp_groups(s)[0])
                         for c, reps in enumerate(self.classes)]
            elif self.has_op_tp(s):
                ranks = tuple(self.stage_gpu_ranks[s])
                found = [(ranks, ranks)]
            else:
                found = [(g, g) for g in self.tp_groups(s)]
            self._units[s] = found
        return found

    def unit_of(self, s: int) -> dict[int, int]:
        """Program rank -> replica unit index of physical stage `s` (cached)."""
        found = self._unit_of.get(s)
        if found is None:
            found = self._unit_of[s] = {r: u for u, (prog, _) in enumerate(self.units(s))
                                        for r in prog}
        return found

    def mb_key(self, j: int, group: ScheduleGroup | None = None) -> MbKey:
        """The shape of micro-batch `j` (of `group`'s list when given: replicas with their
        own micro-batches)."""
        mb = group.micro_batches[j] if group is not None and group.micro_batches \
            else self.micro_batches[j]
        return key_of(mb)

    def phys_stage_of_prog(self, p: int) -> int:
        """Physical stage program rank `p` belongs to."""
        if self.fold:
            return p // len(self.classes)
        return self.rank_stage[p]

    def local_params(self, phys_stage: int) -> float:
        """Parameters one GPU of physical stage `phys_stage` holds (all its virtual stages)."""
        key = self.mb_key(0)
        return float(sum(self.costs(k, key, None).params
                         for k in self.stage_layers_idx(phys_stage)))

    def local_expert_params(self, phys_stage: int) -> float:
        """Of `local_params`, the expert parameters (`InstructionCosts.expert_params`)."""
        key = self.mb_key(0)
        return float(sum(self.costs(k, key, None).expert_params
                         for k in self.stage_layers_idx(phys_stage)))

    def stage_layers_idx(self, phys_stage: int) -> list[int]:
        """Virtual stages of physical stage `phys_stage`."""
        return [k for k, r in self.stage_to_rank.items() if r == phys_stage]

    def largest_layer_params(self, phys: int) -> float:
        """Parameters per GPU of the largest layer on physical stage `phys` (cached)."""
        found = self._largest_layer.get(phys)
        if found is None:
            graph = self.graph(self.micro_batches[0])
            tp = self.plan.tp_of_stage(phys)
            found = self._largest_layer[phys] = max(
                (sum(op.params for op in graph.layers[i].sharded_ops(tp, self.plan.sp,
                                                                      self.plan.ep))
                 for k in self.stage_layers_idx(phys) for i in self.stage_layers[k]),
                default=0)
        return found

    # ------------------------------------------------------------------ stage boundaries
    def boundary_bytes(self, k: int, j: int, group: ScheduleGroup | None = None) -> float:
        """Bytes crossing the boundary after virtual stage `k` for micro-batch `j` (of
        `group`'s list when given) per GPU; cached per micro-batch shape."""
        key = (k, self.mb_key(j, group))
        found = self._boundary.get(key)
        if found is None:
            found = self._boundary[key] = self._boundary_bytes(k, key[1])
        return found

    def _boundary_bytes(self, k: int, key: MbKey) -> float:
        """Bytes crossing the boundary after virtual stage `k` for micro-batch `j` (per GPU):
        the last layer's output, plus the encoder output when layers after the boundary
        still read it (T5 cross attention; Megatron-LM sends both through its pipeline)."""
        size = self.costs(k, key, None).output_bytes
        layers = self.stage_graph(self.phys_stage(k), key).layers  # one replica's share
        cut = self.stage_layers[k][-1] + 1
        side = max((la.side_input_bytes for la in layers[cut:]), default=0.0)
        if side > 0:
            first_reader = next(i for i, la in enumerate(layers) if la.side_input_bytes > 0)
            if cut >= first_reader - 1:  # the encoder has finished before the boundary
                div = self.plan.tp_of_stage(self.phys_stage(k)) if self.plan.sp else 1
                size += side / div
        return size

    def replica_batch_ratio(self, src_s: int, dst_s: int, j: int) -> float:
        """Samples one GPU of physical stage `src_s` holds per sample one GPU of `dst_s`
        holds, for micro-batch `j` (1 unless `stage_gpus` or `stage_tp` give the stages
        different dp): `boundary_bytes` sizes a boundary by the stage before it, so a backward
        send's gradient, held by the stage after it, is that size times this."""
        if not self.plan.has_stage_degrees:
            return 1.0
        b = self.micro_batches[j].batch_size
        return self.plan.replica_batch(src_s, b) / self.plan.replica_batch(dst_s, b)

    def p2p_pairs(self, src_s: int, dst_s: int, size: float, j: int
                  ) -> tuple[list[tuple[int, int]], float]:
        """(src, dst) GPU pairs of a stage-boundary transfer and the bytes of each.

        Equal stages of one degree pair GPU i with GPU i (Megatron). Stages of different
        sizes or degrees (`stage_gpus`, `stage_tp`) pair the n = max(|src|, |dst|) slots
        round-robin; each pair carries the smaller of
        what a source GPU holds and what a destination GPU needs, per slot: `size` (one source
        GPU's boundary tensor) × |src| / n, and the same tensor at the destination's replica
        batch × |dst| / n. This reshards data-parallel splits exactly (1 GPU → 4 GPUs sends four
        quarters) and counts a tensor-parallel group's replicated activations once per GPU.
        """
        src, dst = self.stage_gpu_ranks[src_s], self.stage_gpu_ranks[dst_s]
        if len(src) == len(dst) and not self.plan.has_stage_degrees:
            return list(zip(src, dst)), size
        n = max(len(src), len(dst))
        pairs = [(src[i * len(src) // n], dst[i * len(dst) // n]) for i in range(n)]
        b = self.micro_batches[j].batch_size
        src_b = self.plan.replica_batch(src_s, b)
        dst_b = self.plan.replica_batch(dst_s, b)
        per_pair = min(size * len(src) / n, size * dst_b / src_b * len(dst) / n)
        return pairs, per_pair
