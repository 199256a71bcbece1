"""Lowering: workload + parallel plan + cluster -> Program, the one bridge from workloads to
the simulator (DESIGN.md §1–2).

* `lower.py` — `lower()`: walks the schedule and emits every instruction's tasks;
* `layout.py` — placement, schedule, layer partition, per-stage costs and groups (no tasks),
  and `stage_layout()`, the same partition and costs for planners that must predict `lower`;
* `comm.py` — collectives and transfers as tasks on real links (folding included);
* `gradient_sync.py` — data-parallel gradient buckets, ZeRO traffic and the optimizer step;
* `options.py` — `LoweringOptions`;
* `cache.py` — `LoweringCache`: what lowerings of one model on one cluster share (graphs, stage
  costs keyed by content, schedules, planned collectives), for the Oracle;
* `replay.py` — instruction tapes: a block's first instruction is recorded, the others are
  stamped out from it (one by one, or a run at a time with numpy);
* `stamp.py` — runs of instructions stamped out with numpy, their bookkeeping (what later
  passes and transfers wait for) in arrays by micro-batch (`SlotMap`);
* `chunks.py` — `ChunkedBuilder`: a task-table builder that keeps stamped runs as numpy
  columns until `build()`.
"""

from trainsim.workloads.lowering.layout import StageLayout, stage_layout
from trainsim.workloads.lowering.lower import lower
from trainsim.workloads.lowering.options import LoweringOptions

__all__ = ["LoweringOptions", "StageLayout", "lower", "stage_layout"]
