"""`LoweringCache`: what lowerings of one model on one cluster share, kept between them.

A planner lowers hundreds of plans of one model on one cluster, and most of what a lowering
works out before it emits tasks does not depend on the plan but on a few of its numbers: the op
graph of a micro-batch shape, a stage's instruction costs (its layer range, op-parallel degrees,
micro-batch shape, recompute policy, GPU type and clock) and each layer's, the model FLOPs of a micro-batch, the
list of uniform micro-batches, the pipeline schedule of a (schedule, depth, micro-batches), and
the planned phases of a collective on given GPUs (comm.py's own caches, shared: with them a
collective is planned once per group shape, whatever the plan) and the chains of collectives
built from them (each lowering only gives their links its own codes). The cache
keeps those answers keyed by exactly that content, so a move that touches one stage costs only
that stage again. Every entry is a pure function of its key (and of the model, cluster and
options the cache is bound to), so a lowering with the cache emits the same Program as one
without it (tests/workloads/test_lowering_cache.py).
"""

from __future__ import annotations

from typing import Any

from trainsim.hwmodels.cluster import Cluster
from trainsim.simulator.actions import Action
from trainsim.workloads.lowering.options import LoweringOptions
from trainsim.workloads.model import ModelGraph, ModelSpec
from trainsim.workloads.op_work import InstructionCosts
from trainsim.workloads.plan import MicroBatch

CostKey = tuple[Any, ...]
"""(layer indices, replica batch, seq len, target len, tp, sp, ep, recompute, GPU name, clock,
dtype, per-op degrees or None, FSDP copy-out, whether the stage runs the embedding) of one
stage's instruction costs (`LoweringLayout._cost_key`)."""


class LoweringCache:
    """Plan-independent answers shared by the lowerings of one (model, cluster, options).

    `bind` checks the cache is used with the objects it was made for (by identity: specs are
    immutable) and empties it when they change, so one cache may serve an Oracle whose options
    are replaced between searches.
    """

    __slots__ = (
        "_owner",
        "comm_loads",
        "comm_phases",
        "comm_templates",
        "costs",
        "flops",
        "graphs",
        "hits",
        "layer_costs",
        "micro_batches",
        "misses",
        "schedules",
        "stage_maps",
    )

    def __init__(self) -> None:
        self._owner: tuple[ModelSpec, Cluster, LoweringOptions] | None = None
        self.graphs: dict[tuple[int, int, int], ModelGraph] = {}
        """(batch, seq len, target len) -> op graph."""
        self.costs: dict[CostKey, InstructionCosts] = {}
        """Stage content (`CostKey`) -> its instruction costs."""
        self.flops: dict[tuple[int, int, int], float] = {}
        """Micro-batch shape -> model FLOPs of one training pass (matmuls, no recompute)."""
        self.micro_batches: dict[tuple[int, int, int], tuple[MicroBatch, ...]] = {}
        """(micro-batch size, seq len, count) -> the uniform micro-batch list."""
        self.schedules: dict[tuple[str, int, int, int], dict[int, list[Action]]] = {}
        """(schedule, pp, micro-batches, chunks) -> physical stage -> its actions in order."""
        self.stage_maps: dict[tuple[str, int, int, int], dict[int, int]] = {}
        """The same key -> virtual stage -> physical stage."""
        self.comm_phases: dict[Any, Any] = {}
        """`CommLowering`'s planned phases per (collective, ranks, bytes) and per (collective,
        group shape, bytes) -- a collective is planned once per shape and renamed onto the
        other groups of that shape (comm.py) -- and its memoised topology: the cluster's."""
        self.comm_loads: dict[Any, Any] = {}
        """`CommLowering`'s link loads per (collectives, concurrent groups), and the links one
        copy of a shape uses: the cluster's."""
        self.comm_templates: dict[Any, Any] = {}
        """`CommLowering`'s chains of collectives per (collectives, concurrent groups), with
        links named (comm.py `NamedTemplate`): each lowering turns the names into its own
        builder's link codes."""
        self.layer_costs: dict[Any, Any] = {}
        """One layer's costs per (layer, tp, recompute, GPU, clock, ...) (stage_costs.py)."""
        self.hits = 0
        """Stage costs answered from the cache."""
        self.misses = 0
        """Stage costs worked out."""

    def bind(self, model: ModelSpec, cluster: Cluster, options: LoweringOptions) -> None:
        """Use the cache for `model` on `cluster` under `options` (cleared if it served others)."""
        owner = self._owner
        if owner is None or owner[0] is not model or owner[1] is not cluster \
                or owner[2] is not options:
            self.clear()
            self._owner = (model, cluster, options)

    def clear(self) -> None:
        """Forget every entry."""
        self.graphs.clear()
        self.costs.clear()
        self.flops.clear()
        self.micro_batches.clear()
        self.schedules.clear()
        self.stage_maps.clear()
        self.comm_phases.clear()
        self.comm_loads.clear()
        self.comm_templates.clear()
        self.layer_costs.clear()
        self.hits = self.misses = 0


__all__ = ["CostKey", "LoweringCache"]
