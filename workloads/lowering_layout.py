"""Where a lowered plan puts things: stage placement, schedule, layer partition, per-stage
costs and the tensor/data/expert-parallel groups (the half of lowering that creates no tasks).

`LoweringLayout` is the base of the lowering in lowering.py; `stage_layout()` exposes the same
partition and cost path to planners that must predict exactly what `lower` emits (the energy
planner).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from trainsim.errors import PlanError
from trainsim.simulator.actions import Action, infer_stage_to_rank
from trainsim.simulator.schedules import explicit, get_schedule
from trainsim.workloads.model import ModelGraph, build_graph
from trainsim.workloads.plan import MicroBatch, ParallelPlan
from trainsim.workloads.stage_costs import InstructionCosts, instruction_costs

T = TypeVar("T")


def _cached(method: Callable[..., T]) -> Callable[..., T]:
    """Remember a method's results on its object (not `functools.cache`, whose class-wide
    cache would keep every lowering, and all its tasks, alive)."""
    attr = f"_cache_{method.__name__}"

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any) -> T:
        cache = self.__dict__.get(attr)
        if cache is None:
            cache = self.__dict__[attr] = {}
        try:
            return cache[args]
        except KeyError:
            value = cache[args] = method(self, *args)
            return value

    return wrapper


@dataclass(frozen=True, kw_only=True, slots=True)
class LoweringOptions:
    """Switches for what-if analyses and tests; the defaults model a real run."""

    fold: bool = True
    """Fold identical ranks (tp members, dp replicas) into one program rank per stage. Exact on
    one homogeneous node; across nodes, different folded collectives meeting on one NIC share
    it per task rather than per copy (lowering_comm.py), a small approximation."""
    communication: bool = True
    """Model communication (False: every collective and transfer is free)."""
    embedding_and_head: bool = True
    """Place the embedding and LM-head layers on the first/last stage (False drops them, which
    makes stages exactly uniform — used to check textbook bubble formulas)."""
    optimizer_step: bool = True
    """End the iteration with the optimizer step."""
    dp_bucket_bytes: float = 25 * 2**20
    """Gradient bucket size for the overlapped data-parallel reduction (PyTorch DDP default)."""
    collective_algorithm: str = "auto"
    """Collective algorithm (auto picks the fastest alone per collective)."""
    cost_model: Any = None
    """Op cost model; the roofline (hwmodels/opcost.py) when None."""
    tp_communication: bool = True
    """Emit the tensor-parallel collectives. False when the cost model's op times already
    include them (Aceso's profiles measure each op with its all-reduce, search/aceso_profile.py),
    so they are not counted twice."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageLayout:
    """How `lower` lays a plan out, and what each virtual stage's instructions cost: the
    public view of the lowering's partition and cost path, for planners that must predict
    exactly what `lower` emits (the energy planner, search/energy_profile.py)."""

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


def stage_layout(model: Any, cluster: Any, plan: ParallelPlan,
                 freqs_mhz: tuple[float | None, ...] = (None,),
                 options: LoweringOptions | None = None) -> StageLayout:
    """The stage partition, placement and per-clock instruction costs `lower` would use.

    Args:
        model, cluster, plan: As for `lower` (the plan is checked).
        freqs_mhz: SM clocks to cost every virtual stage at (None = the GPU's maximum).
        options: Lowering options (the cost model, embedding/head placement, folding).
    """
    plan.check(model, cluster)
    low = LoweringLayout(model, cluster, plan, options or LoweringOptions())
    key = low._mb_key(0)
    costs = {(k, f): low.costs(k, key, f) for k in range(plan.num_stages) for f in freqs_mhz}
    return StageLayout(
        stage_layers=tuple(tuple(s) for s in low.stage_layers),
        stage_to_rank=tuple(low.stage_to_rank[k] for k in range(plan.num_stages)),
        stage_gpu_ranks=tuple(tuple(r) for r in low.stage_gpu_ranks),
        micro_batch_shapes=tuple((mb.batch_size, mb.seq_len) for mb in low.micro_batches),
        folded=low.fold, costs=costs)


class LoweringLayout:
    """Placement, schedule, partition, costs and groups of one lowering."""

    def __init__(self, model: Any, cluster: Any, plan: ParallelPlan,
                 options: LoweringOptions) -> None:
        self.model, self.cluster, self.plan, self.opt = model, cluster, plan, options
        if options.cost_model is None:
            from trainsim.hwmodels.opcost import RooflineCostModel
            self.cost_model: Any = RooflineCostModel()
        else:
            self.cost_model = options.cost_model
        self.micro_batches = plan.micro_batch_list(model.seq_len or 1)
        self.stage_gpu_ranks = self._place_stages()
        self.order = self._schedule()
        self.stage_to_rank = infer_stage_to_rank(self.order) if plan.num_stages > 1 \
            else {0: 0}
        self._check_stage_map()
        self.graphs: dict[tuple[int, int], ModelGraph] = {}
        self.stage_layers = self._partition()
        self.fold = options.fold and all(self._uniform_gpu(s) for s in range(plan.pp))
        # program ranks: folded → one per physical stage; unfolded → one per GPU
        if self.fold:
            self.num_ranks = plan.pp
            self.represents = [tuple(self.stage_gpu_ranks[s]) for s in range(plan.pp)]
        else:
            self.num_ranks = cluster.num_gpus
            self.represents = [(r,) for r in range(cluster.num_gpus)]
        self.rank_stage = {r: s for s, ranks in enumerate(self.stage_gpu_ranks) for r in ranks}

    # ------------------------------------------------------------------ placement & schedule
    def _place_stages(self) -> list[list[int]]:
        """Physical ranks of each pipeline stage, laid out [dp replica][tp index] (Megatron:
        tp innermost, then dp, then pp), filling node groups in order or as `placement` says."""
        plan, cluster = self.plan, self.cluster
        if plan.placement is None:
            out, first = [], 0
            for s in range(plan.pp):
                n = plan.gpus_of_stage(s)
                out.append(list(range(first, first + n)))
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

    def _schedule(self) -> dict[int, list[Action]]:
        plan = self.plan
        m = len(self.micro_batches)
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
        """Layer indices of each virtual stage: blocks split per the plan, layers before the
        first block join stage 0, other non-block layers join the stage of the block before."""
        graph = self.graph(self.micro_batches[0])
        counts = self.plan.layers_per_stage(len(graph.transformer_layers()))
        out: list[list[int]] = [[] for _ in counts]
        stage, seen = 0, 0
        for i, layer in enumerate(graph.layers):
            if layer.recomputable:
                while seen >= counts[stage]:
                    stage, seen = stage + 1, 0
                out[stage].append(i)
                seen += 1
            elif self.opt.embedding_and_head:
                out[stage].append(i)
        return out

    def graph(self, mb: MicroBatch) -> ModelGraph:
        key = (mb.batch_size, mb.seq_len)
        if key not in self.graphs:
            seq = None if self.model.family == "wresnet" else mb.seq_len
            self.graphs[key] = build_graph(self.model, mb.batch_size, seq)
        return self.graphs[key]

    # ------------------------------------------------------------------ costs
    def phys_stage(self, vstage: int) -> int:
        return self.stage_to_rank[vstage]

    def freq(self, vstage: int, action: Action | None) -> float | None:
        if not self.plan.instruction_freq_mhz:  # skip formatting the action: a hot path
            return self.plan.frequency_of(self.phys_stage(vstage), None)
        return self.plan.frequency_of(self.phys_stage(vstage), str(action) if action else None)

    def stage_graph(self, phys: int, mb_key: tuple[int, int]) -> ModelGraph:
        """The graph one replica of physical stage `phys` runs for micro-batch shape `mb_key`
        (with `stage_gpus`, the micro-batch split over the stage's data-parallel replicas)."""
        b = self.plan.replica_batch(phys, mb_key[0])
        if b == mb_key[0]:
            return self.graphs[mb_key]
        return self.graph(MicroBatch(batch_size=b, seq_len=mb_key[1]))

    @_cached
    def costs(self, vstage: int, mb_key: tuple[int, int], freq: float | None) -> InstructionCosts:
        s = self.phys_stage(vstage)
        graph = self.stage_graph(s, mb_key)
        layers = [graph.layers[i] for i in self.stage_layers[vstage]]
        gpu = self.cluster.gpu(self.stage_gpu_ranks[s][0])
        degrees = None
        if self.has_op_tp(s):  # per-op degrees (Aceso): costed by workloads/op_parallel.py
            from trainsim.workloads.op_parallel import stage_op_degrees

            idx = self.stage_layers[vstage]
            degrees = stage_op_degrees(
                self.plan, s, self.plan.replica_batch(s, mb_key[0]),
                lambda b: [self.graph(MicroBatch(batch_size=b, seq_len=mb_key[1])).layers[i]
                           for i in idx])
        return instruction_costs(layers, tp=self.plan.tp_of_stage(s), sp=self.plan.sp,
                                 ep=self.plan.ep, recompute=self.plan.recompute_of_stage(s),
                                 cost_model=self.cost_model, gpu=gpu, freq_mhz=freq,
                                 dtype=self.plan.dtype, op_degrees=degrees)

    def has_op_tp(self, s: int) -> bool:
        """Whether some op of physical stage `s` has its own tensor-parallel degree (then the
        stage is one replica unit, so every per-op group lies inside it)."""
        return self.plan.has_op_tp(s)

    # ------------------------------------------------------------------ groups
    # Lowering asks for a stage's groups once per instruction, so each is built once and the
    # same (read-only) list returned after.
    @_cached
    def tp_groups(self, s: int) -> list[tuple[int, ...]]:
        """Physical tensor-parallel groups of stage `s` (consecutive ranks, tp innermost)."""
        t = self.plan.tp_of_stage(s)
        ranks = self.stage_gpu_ranks[s]
        return [tuple(ranks[i:i + t]) for i in range(0, len(ranks), t)]

    @_cached
    def dp_groups(self, s: int) -> list[tuple[int, ...]]:
        """Physical data-parallel groups of stage `s` (one per tp index)."""
        t = self.plan.tp_of_stage(s)
        ranks = self.stage_gpu_ranks[s]
        return [tuple(ranks[i::t]) for i in range(t)]

    @_cached
    def ep_groups(self, s: int) -> list[tuple[int, ...]]:
        """Physical expert-parallel groups of stage `s`: `ep` consecutive data-parallel ranks
        of one tp index (DeepSpeed-MoE's layout) when ep divides the stage's dp degree, else
        `ep` consecutive ranks of the stage (experts then span tensor-parallel ranks too)."""
        ep, ranks = self.plan.ep, self.stage_gpu_ranks[s]
        if self.plan.dp_of_stage(s) % ep == 0:
            return [g[i:i + ep] for g in self.dp_groups(s) for i in range(0, len(g), ep)]
        return [tuple(ranks[i:i + ep]) for i in range(0, len(ranks), ep)]

    @_cached
    def units(self, s: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """(program ranks, physical tp group) per replica unit of stage `s`: the whole folded
        stage, or each tensor-parallel group when unfolded (the whole stage when its ops have
        their own degrees: their groups of different sizes must lie inside one unit)."""
        if self.fold:
            return [((s,), self.tp_groups(s)[0])]
        if self.has_op_tp(s):
            ranks = tuple(self.stage_gpu_ranks[s])
            return [(ranks, ranks)]
        return [(g, g) for g in self.tp_groups(s)]

    def _mb_key(self, j: int) -> tuple[int, int]:
        mb = self.micro_batches[j]
        return (mb.batch_size, mb.seq_len)

    def _phys_stage_of_prog(self, p: int) -> int:
        if self.fold:
            return p
        return self.rank_stage[p]

    def _local_params(self, phys_stage: int) -> float:
        key = self._mb_key(0)
        return float(sum(self.costs(k, key, None).params for k in self.stage_layers_idx(phys_stage)))

    def stage_layers_idx(self, phys_stage: int) -> list[int]:
        return [k for k, r in self.stage_to_rank.items() if r == phys_stage]
