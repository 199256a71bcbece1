"""Lowering: ParallelPlan + model + cluster → Program (DESIGN.md §2).

One training iteration becomes tasks on per-rank streams:

* ``compute`` — each pipeline instruction (forward, backward or its input/weight halves,
  recompute) of each micro-batch as one task, timed by summing the op cost model over the
  stage's ops (stage_costs.py), and the optimizer step at the end;
* ``tp`` — the tensor-parallel collectives of that instruction, right after it (Megatron runs
  them synchronously between GEMMs, so their sum after the compute gives the same total time);
* ``pp:<src>><dst>`` — point-to-point activation/gradient transfers between consecutive stages,
  one FIFO channel per stage boundary and direction, shared by both ends;
* ``ep`` — expert-parallel all-to-alls (MoE dispatch/combine) over each stage's ep groups;
* ``dp`` — data-parallel gradient synchronisation, bucketed (PyTorch DDP's 25 MiB default) and
  overlapped with the last micro-batch's backward, plus ZeRO traffic (ZeRO-1/2 parameter
  all-gather after the step; ZeRO-3 parameter gathers before every pass).

The lowering is a small package: `layout.py` places stages, partitions layers, costs
instructions and forms groups (no tasks); `comm.py` turns collectives into tasks on real links
(`CommLowering`); `gradient_sync.py` emits the data-parallel and ZeRO traffic and the optimizer
step (`GradientSync`); this module walks the schedule and emits each instruction's tasks,
repeated ones stamped out from tapes (`replay.py`), runs of them with numpy (`stamp.py`,
`chunks.py`).

**Folding.** Members of one tensor-parallel group and identical data-parallel replicas behave
identically, so by default each (pipeline stage, replica class) is one program rank standing for
its GPUs: a class is the replicas with the same GPU types and node groups on every stage and the
same batch share (`dp_batch_split`), so on a homogeneous cluster each stage is one rank, and on
a mixed one each replica runs at its own GPUs' speed while the gradient reduction — one task
over the stage's ranks — starts when the slowest is ready. A folded collective keeps its real
links; where N folded copies would cross one link at once (the tp groups' data-parallel
all-reduces through one NIC), it crosses that link as ``<id>/N`` with 1/N of its bandwidth, so
alone it takes exactly as long as the N concurrent copies would, and beside other tasks on that
link it gets N shares (program.py: shared links are counted in copies). On nodes whose GPUs are not
wired alike (`node_symmetric` false: the DGX-1 hybrid cube-mesh, bridged A40 pairs) groups of
one replica class can sit on links of different widths, and the folded collective takes the
slowest group's links for all (`CommLowering._representative_first`): an approximation that
never runs faster than the replicas it stands for. `python bench/folding.py` (GPT-3 1.3B,
every dp × tp × pp; 2026-11-28): on 4, 8 and 16 V100-SXM2 folded time equals unfolded on 22 of
26 plans and is 0.03 % to 1.72 % slower on the others, energy up to 0.86 % (with the first
group's links: 18 of 26, −0.80 % to +1.72 %); on 8 and 16 A100-SXM4 (NVSwitch) all 20 are
identical. There, `sim simulate --unfold` is the exact answer.
`LoweringOptions(fold=False)` lowers every GPU as its own rank (so do plans whose
tensor-parallel groups mix GPU types, or whose stages have different replicas and mix GPU
types inside a stage).

**Replicas.** Each replica runs `dp_batch_split[d] / micro_batch_size` micro-batches; replicas
of one count share a schedule (`ScheduleGroup`), and lowering walks each group's schedule over
its own units. Unplaced stages fill node groups fastest first, so the program does not depend on
the order the cluster was written in.

**SM sharing.** Each program rank carries its GPU's φ (hwmodels/comm_sm.py: the SMs a running
NCCL collective holds), so the engines slow compute-stream work while a dp, tp, ep or ZeRO
collective runs on that rank (program.py: SM sharing); `LoweringOptions(comm_sm_sharing=False)`
turns it off.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import Any, cast

import numpy as np

from trainsim.hwmodels.cluster import Cluster
from trainsim.hwmodels.comm_sm import comm_sm_fraction
from trainsim.simulator.actions import Action
from trainsim.simulator.program import Program, ProgramInfo
from trainsim.simulator.task_table import TaskTableBuilder
from trainsim.workloads.lowering.cache import LoweringCache
from trainsim.workloads.lowering.chunks import ChunkedBuilder
from trainsim.workloads.lowering.comm import (
    CommLowering,
    Meta,
    Need,
    PlannedComm,
    cross_unit,
    kind_of,
)
from trainsim.workloads.lowering.gradient_sync import GradientSync
from trainsim.workloads.lowering.layout import (
    LoweringLayout,
    MbKey,
    ScheduleGroup,
    Unit,
    context_parallel_inner,
    key_of,
)
from trainsim.workloads.lowering.options import DEFAULT_OPTIONS, LoweringOptions
from trainsim.workloads.lowering.replay import Bank, Tape, flush, record, replay
from trainsim.workloads.lowering.stamp import (
    KIND_CODES,
    LateRuns,
    SlotMap,
    late_deps,
    stamp_run,
    stamp_tuples,
)
from trainsim.workloads.lowering.stamp_units import stamp_units
from trainsim.workloads.model import ModelSpec, trained_in
from trainsim.workloads.op_work import InstructionCosts, Work
from trainsim.workloads.ops import CommNeed
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.stage_costs import state_bytes_per_param

KIND_OF_ACTION = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}


@dataclass(frozen=True, slots=True)
class _Part:
    """A compute step of an instruction (one task per program rank of a unit) and the
    tensor-parallel collectives after it on each unit (None where there are none)."""

    name: int
    names: list[int]
    """Per gradient bucket (the compute splits into buckets when the dp sync overlaps it)."""
    kind: int
    times: list[list[float]]
    """Per unit, each program rank's task duration (its own GPU type's)."""
    powers: list[list[float]]
    """Per unit, each program rank's power during the task."""
    alloc: float
    tp: list[PlannedComm | None]
    op_needs: tuple[CommNeed, ...] | None = None
    """On a stage whose ops have their own tp degrees: its collectives, each over groups of
    its own size (`CommNeed.group_size`), emitted by `_op_tp_tasks` instead of `tp`."""
    tp_name: int = -1
    """Name code of those collectives ("tp.s3.F%d")."""


@dataclass(frozen=True, slots=True)
class _Send:
    """The stage-boundary transfer after an instruction: per sending unit, its transfers and
    each one's receiving unit; `local` when nothing moves (same GPUs, or no communication)."""

    dst: int
    direction: str
    local: bool
    per_unit: list[list[tuple[PlannedComm, int]]]


@dataclass(frozen=True, slots=True)
class _Block:
    """Everything one kind of instruction emits but ids, deps and names' micro-batch."""

    units: list[Unit]
    unit_ids: list[int]
    """Index of each of `units` in the stage's `layout.units` (the keys of done/held/recv)."""
    freqs: list[list[float]]
    """Per unit, the SM clock of each program rank's compute task."""
    first_layer: int
    last_layer: int
    recompute: _Part | None
    main: _Part
    final: bool
    """True when this pass frees the micro-batch's activations (its last backward)."""
    extra_free: float
    ep_needs: tuple[CommNeed, ...]
    send: _Send | None



def lower(model: ModelSpec, cluster: Cluster, plan: ParallelPlan,
          options: LoweringOptions | None = None, *,
          cache: LoweringCache | None = None) -> Program:
    """Lower one training iteration of `model` on `cluster` under `plan` to a Program.

    `cache` (optional) keeps plan-independent answers (graphs, stage costs, schedules,
    planned collectives) for the next lowering of the same model on the same cluster under the
    same options (cache.py), and turns on instruction tapes (replay.py); the Program is the
    same with or without it (tests/workloads/test_lowering_cache.py)."""
    plan.check(model, cluster)
    model = trained_in(model, plan.dtype)
    opt = options or DEFAULT_OPTIONS
    if plan.cp > 1:
        return _context_parallel(model, cluster, plan, opt)
    if cache is not None:
        cache.bind(model, cluster, opt)
    return _Lowering(model, cluster, plan, opt, cache=cache).build()


def _context_parallel(model: ModelSpec, cluster: Cluster, plan: ParallelPlan,
                      options: LoweringOptions) -> Program:
    """A context-parallel plan lowers as dp·cp replicas that each run seq/cp tokens of every
    sample (`context_parallel_inner`); the program states the plan as given.

    The ring's key/value exchange is not emitted: ring attention (torchtitan, Transformer
    Engine) overlaps each step's transfer with the previous chunk's attention kernel, which at
    the sequence lengths context parallelism is used for takes longer (assumed hidden).
    """
    ring, inner = context_parallel_inner(model, cluster, plan)
    return _Lowering(ring, cluster, inner, options, stated=plan).build()


_BlockKey = tuple[int, str, MbKey, float | None, int, str, int]
"""(stage, action kind, micro-batch shape, clock, gradient buckets, final backward kind,
schedule group)."""

_RecvKey = tuple[int, str, int, int]
"""(stage, direction or action kind, micro-batch, unit) of a transfer or a finished pass."""


@dataclass(frozen=True, slots=True)
class _ActArrays:
    """One physical stage's actions as arrays (`schedule_arrays`)."""

    stage: np.ndarray
    kind: np.ndarray
    """`KIND_CODES` index of each action's pass."""
    micro_batch: np.ndarray
    pair: np.ndarray
    """stage * 4 + kind: the key of `_Uniform`'s arrays."""
    is_last: np.ndarray
    """True at its stage's last backward (the one that runs the gradient reduction)."""


@dataclass(frozen=True, slots=True)
class _Schedule:
    """What `build` reads of a schedule besides its actions, worked out once per schedule."""

    order: dict[int, list[Action]]
    """The schedule (kept, so the cache key, its id, stays its own)."""
    last_bwd: dict[int, tuple[str, int]]
    """vstage -> (pass, micro-batch) of its last backward."""
    final_kind: dict[int, str]
    """vstage -> "W" when its backward is split, else "B"."""
    _arrays: dict[int, _ActArrays]

    def arrays(self, phys: int) -> _ActArrays:
        """Physical stage `phys`'s actions as arrays (worked out on first use)."""
        found = self._arrays.get(phys)
        if found is None:
            acts, last_bwd = self.order[phys], self.last_bwd
            n = len(acts)
            stage = np.fromiter((a.stage for a in acts), np.int64, n)
            kind = np.fromiter((KIND_CODES.index(a.kind) for a in acts), np.int64, n)
            mb = np.fromiter((a.micro_batch for a in acts), np.int64, n)
            last = np.fromiter((last_bwd.get(a.stage) == (a.kind, a.micro_batch)
                                for a in acts), bool, n)
            found = self._arrays[phys] = _ActArrays(stage=stage, kind=kind, micro_batch=mb,
                                                    pair=stage * 4 + kind, is_last=last)
        return found


_SCHEDULES: dict[int, _Schedule] = {}
_SCHEDULES_KEPT = 32


def schedule_arrays(order: dict[int, list[Action]]) -> _Schedule:
    """`_Schedule` of `order`; the last few are kept by identity (schedules are shared
    between lowerings through the LoweringCache, and read-only)."""
    found = _SCHEDULES.get(id(order))
    if found is not None and found.order is order:
        return found
    final_kind: dict[int, str] = {}
    last_bwd: dict[int, tuple[str, int]] = {}
    for acts in order.values():
        for a in acts:
            if a.kind in ("B", "W"):
                last_bwd[a.stage] = (a.kind, a.micro_batch)
                final_kind[a.stage] = a.kind
    found = _Schedule(order=order, last_bwd=last_bwd, final_kind=final_kind, _arrays={})
    if len(_SCHEDULES) >= _SCHEDULES_KEPT:
        del _SCHEDULES[next(iter(_SCHEDULES))]
    _SCHEDULES[id(order)] = found
    return found


class _Uniform:
    """`build`'s tapes by (vstage, pass) on a plan of one micro-batch shape, as arrays indexed
    by vstage * 4 + pass code: tape index (-1: none yet), one unit?, extra free."""

    def __init__(self, stages: int) -> None:
        self.tape = np.full(4 * stages, -1, np.int64)
        self.one_unit = np.zeros(4 * stages, bool)
        self.extra = np.zeros(4 * stages, np.float64)
        self.units: dict[int, list[int]] = {}
        """Units each (vstage, pass) runs on (its block's `unit_ids`)."""

    def add(self, stage: int, kind: str, tape: Tape, blk: _Block) -> None:
        p = stage * 4 + KIND_CODES.index(kind)
        self.tape[p] = tape.index
        self.one_unit[p] = len(blk.unit_ids) == 1
        self.extra[p] = blk.extra_free
        self.units[p] = blk.unit_ids


class _Lowering:
    """The state of one lowering; `build()` returns the Program.

    It holds the layout (`LoweringLayout`: placement, partition, costs, groups), the task
    builder, the collective lowering and the gradient synchronisation, and walks the schedule.
    Tasks go straight into a `TaskTableBuilder` as numbers (no object per task); names are
    (template, micro-batch) pairs formatted only when read.
    """

    def __init__(self, model: ModelSpec, cluster: Cluster, plan: ParallelPlan,
                 options: LoweringOptions, stated: ParallelPlan | None = None,
                 cache: LoweringCache | None = None) -> None:
        self.stated = plan if stated is None else stated
        """The plan as the user gave it (differs from `plan` under context parallelism)."""
        self.layout = layout = LoweringLayout(model, cluster, plan, options, cache)
        self.plan, self.opt, self.fold = plan, options, layout.fold
        # with tapes, stamped runs join the table as numpy columns (chunks.py)
        self.b = ChunkedBuilder() if cache is not None else TaskTableBuilder()
        self.comm = CommLowering(cluster, options.collective_algorithm, self.b)
        if cache is not None:  # planned phases and link loads are the cluster's, not the plan's
            self.comm._phase_cache = cache.comm_phases
            self.comm._load_cache = cache.comm_loads
            self.comm._named_cache = cache.comm_templates
        self.compute_stream = self.b.stream("compute")
        self.sync = GradientSync(layout, self.comm, self.b, self.compute_stream)
        self.last_compute: dict[int, int] = {}  # program rank -> its last compute task
        self._blocks: dict[_BlockKey, _Block] = {}
        self.tapes = cache is not None
        """Stamp repeated instructions out from tapes (replay.py); on with a shared cache."""
        self.pending: list[tuple[list[Any], ...]] = []
        """Replayed rows' constant columns not yet in the builder (replay.flush)."""
        self._tapes: dict[_BlockKey, Tape | None] = {}
        """Block -> its tape, or None when it cannot be replayed (recorded once either way)."""
        self._tape_list: list[Tape] = []
        self._bank: Bank | None = None
        """The tapes as numpy columns, for runs of replays (replay.Bank)."""
        self.cluster = cluster
        self.max_clock_mhz = [cluster.gpu(layout.represents[p][0]).sm_clock_max_mhz
                              for p in range(layout.num_ranks)]
        # with tapes, keyed by micro-batch: a stamped run's entries live in arrays (stamp.py)
        arrays = cache is not None
        self.done: dict[_RecvKey, list[int]] = SlotMap(2, ids=True) if arrays else {}
        self.held: dict[tuple[int, int, int], float] = SlotMap(1, ids=False) if arrays else {}
        self.recv: dict[_RecvKey, list[int]] = SlotMap(2, ids=True) if arrays else {}
        self.late: LateRuns = []
        """Stamped runs' late deps on transfers (stamp.py), resolved in `_patch_deps`."""
        self.patch: list[tuple[int, _RecvKey]] = []
        self._scratch: dict[int, int] = {}
        """Where instructions that no gradient reduction waits for note their buckets."""
        self.patch_runs: list[tuple[int, tuple[int, ...], _RecvKey]] = []
        """Replayed instructions' late deps: (first id, rows, key) (replay.py)."""
        self.history: dict[tuple[int, int], list[int]] = {}  # (stage, unit) -> compute ids
        self._slowest: frozenset[int] | None = None
        """Folded: the GPUs of the slowest chain of stage-boundary pairs (`_slowest_chain`)."""

    # ------------------------------------------------------------------ build
    def build(self) -> Program:
        """Create every task: pipeline instructions rank by rank in schedule order, then the
        optimizer step. Transfers are created by their sender, so a receiver's dependency on one
        may not exist yet when the receiver's task is made; such deps are patched at the end."""
        plan, layout, sync = self.plan, self.layout, self.sync
        groups = layout.schedule_groups
        # vstage -> the gradient buckets' last compute task per program rank, over every group:
        # the reduction is emitted with the last group's final backward and waits for them all
        synced: dict[int, list[dict[int, int]]] = {}
        for gi, group in enumerate(groups):
            sched = schedule_arrays(group.order)
            final_kind = sched.final_kind
            last_bwd = sched.last_bwd
            mbs = group.micro_batches
            mb_keys = ([key_of(mbs[0])] * len(mbs) if layout.uniform and mbs
                       else [key_of(mb) for mb in mbs])
            # (vstage, shape, clock) -> costs: asked once per instruction, worked out once
            found: dict[tuple[int, MbKey, float | None], InstructionCosts] = {}
            per_action_freq = bool(plan.instruction_freq_mhz)
            # (vstage, pass, shape) -> (tape, units, extra free): instructions that are not
            # a stage's last backward replay their block's tape straight from here
            fast: dict[tuple[int, str, MbKey], tuple[Tape, list[int], float]] = {}
            use_fast = self.tapes and plan.zero < 3 and not per_action_freq
            # one micro-batch shape: `fast` by (vstage, pass) alone, as arrays, so runs are
            # found and stamped out with numpy (`_stamp_uniform`)
            uniform = _Uniform(plan.num_stages) if use_fast and len(set(mb_keys)) == 1 \
                else None
            b, pending = self.b, self.pending
            # (group, vstage) whose unsharded gradients are allocated (`holds_unsharded_grads`)
            held: set[tuple[int, int]] = set()
            hold_grads = sync.holds_unsharded_grads()
            for phys in sorted(group.order):
                acts, i, general = group.order[phys], 0, -1
                while i < len(acts):
                    a = acts[i]
                    mb_key = mb_keys[a.micro_batch]
                    entry = fast.get((a.stage, a.kind, mb_key)) if use_fast else None
                    if entry is not None and i != general \
                            and last_bwd.get(a.stage) != (a.kind, a.micro_batch):
                        if uniform is not None:
                            first = i
                            i, used = self._stamp_uniform(sched.arrays(phys), acts, i, uniform,
                                                          fast, mb_key)
                            if used < i - first:  # an input of another form: ordinary code
                                i = general = first + used
                            continue
                        # a run of instructions that all replay a tape: stamp them out at once
                        run: list[tuple[Tape, int, int, str, float]] = []
                        units: list[list[int]] = []
                        first = i
                        while entry is not None \
                                and last_bwd.get(a.stage) != (a.kind, a.micro_batch):
                            run.append((entry[0], a.micro_batch, a.stage, a.kind, entry[2]))
                            units.append(entry[1])
                            i += 1
                            if i == len(acts):
                                break
                            a = acts[i]
                            entry = fast.get((a.stage, a.kind, mb_keys[a.micro_batch]))
                        used = self._replay_run(run, units)
                        if used < len(run):  # an input of another form: the ordinary code
                            i = general = first + used
                        continue
                    i += 1
                    freq = (layout.freq(a.stage, a) if per_action_freq
                            else plan.frequency_of(layout.phys_stage(a.stage), None))
                    hit = found.get((a.stage, mb_key, freq))
                    if hit is None:
                        layout.graph(group.micro_batches[a.micro_batch])
                        hit = found[(a.stage, mb_key, freq)] = layout.costs(a.stage, mb_key,
                                                                            freq)
                    c = hit
                    sync_now = (last_bwd.get(a.stage) == (a.kind, a.micro_batch)
                                and self.opt.communication
                                and bool(sync.grad_groups(phys, c)))
                    per_bucket: list[dict[int, int]] = (
                        synced.setdefault(a.stage, [{} for _ in range(sync.buckets(c))])
                        if sync_now else [self._scratch])
                    fk = final_kind.get(a.stage, "B")
                    flush(b, pending)
                    if hold_grads and a.kind in ("B", "I") and (gi, a.stage) not in held:
                        held.add((gi, a.stage))
                        self._hold_unsharded_grads(a, phys, c, group)
                    self._instruction(a, phys, c, fk, per_bucket, gi, group, freq, mb_key)
                    if use_fast and not sync_now \
                            and last_bwd.get(a.stage) != (a.kind, a.micro_batch):
                        bkey = (a.stage, a.kind, mb_key, freq, 1, fk, gi)
                        tape = self._tapes.get(bkey)
                        if tape is not None:
                            blk = self._blocks[bkey]
                            fast[(a.stage, a.kind, mb_key)] = (tape, blk.unit_ids,
                                                               blk.extra_free)
                            if uniform is not None:
                                uniform.add(a.stage, a.kind, tape, blk)
                    if sync_now and gi == len(groups) - 1:
                        flush(b, pending)
                        sync.dp_sync(a.stage, phys, c, per_bucket)
        flush(self.b, self.pending)
        self._patch_deps()
        if self.opt.optimizer_step:
            sync.tied_sync(self.last_compute)
            sync.optimizer_step(self.last_compute)
        return self._program()

    def _patch_deps(self) -> None:
        """Add each receiver's deps on the transfers it waits for (`TaskTableBuilder.add_dep`,
        in the same order; with tapes on, appended to the builder's late-dep lists in bulk)."""
        recv = self.recv
        if not self.tapes:
            add_dep = self.b.add_dep
            for tid, key in self.patch:
                for dep in recv.get(key, ()):
                    add_dep(tid, dep)
            return
        owners: list[int] = []
        deps: list[int] = []
        for tid, key in self.patch:
            found = recv.get(key)
            if found:
                owners.extend([tid] * len(found))
                deps.extend(found)
        for base, rows, key in self.patch_runs:  # replayed: (base, rows, key), rows in order
            found = recv.get(key)
            if not found:
                continue
            if len(found) == 1:
                owners.extend([base + r for r in rows])
                deps.extend(found * len(rows))
            else:
                for r in rows:
                    owners.extend([base + r] * len(found))
                    deps.extend(found)
        # the builder sorts late deps by owner (stable): each owner's stay in the order added
        self.b.late_owner.extend(owners)
        self.b.late_dep.extend(deps)
        if self.late:
            cast(ChunkedBuilder, self.b).append_late(*late_deps(self.late, cast(SlotMap, recv)))

    def _hold_unsharded_grads(self, a: Action, phys: int, c: InstructionCosts,
                              group: ScheduleGroup) -> None:
        """Allocate virtual stage `a.stage`'s unsharded gradients on its units' ranks right
        before its first backward (`GradientSync.holds_unsharded_grads`): a zero-length task
        on the compute stream, ahead of the backward in the stream's order."""
        b, layout = self.b, self.layout
        if self.plan.dp_of_stage(phys) < 2:
            return
        name, kind = b.name_template(f"s{a.stage}.grads.alloc"), b.kind("wait")
        size = c.params * self.sync.reduce_bytes
        layers = layout.stage_layers[a.stage]
        for u in layout.group_units(phys, group):
            for p in layout.units(phys)[u][0]:
                b.add(name, -1, kind, self.compute_stream, (p,), 0.0, 0.0, (), (),
                      size, 0.0, 0.0, math.nan, a.micro_batch, a.stage, layers[0], layers[-1])

    def _instruction(self, a: Action, phys: int, c: InstructionCosts, final_kind: str,
                     per_bucket: list[dict[int, int]], gi: int, group: ScheduleGroup,
                     freq: float | None, mb_key: MbKey) -> None:
        """Tasks of one pipeline instruction on every replica unit of its stage: ZeRO-3
        parameter gather, recompute (with its collectives), the compute (split into gradient
        buckets when the data-parallel sync overlaps it), its tensor- and expert-parallel
        collectives, and the send to the neighbouring stage.

        Every instruction of one kind (stage, pass, micro-batch shape, clock, buckets) emits
        the same block of tasks but for ids, deps and names, so the block (`_Block`: codes,
        times, planned collectives) is worked out once and stamped out here. Only the units
        of schedule group `group` (index `gi`) run it, at clock `freq` on shape `mb_key`."""
        k = a.stage
        n = len(per_bucket)
        bkey = (k, a.kind, mb_key, freq, n, final_kind, gi)
        blk = self._blocks.get(bkey)
        if blk is None:
            blk = self._blocks[bkey] = self._block(a, phys, c, final_kind, n, freq, group)
        if self.tapes and self.plan.zero < 3 and not self.sync.gathers_params_at(a):
            if bkey in self._tapes:
                tape = self._tapes[bkey]
                if tape is not None:
                    inputs = self._inputs(a, blk)
                    if tape.input_shape == tuple([len(x) for x in inputs]):
                        replay(self.b, tape, inputs, a.micro_batch, k, a.kind,
                               blk.extra_free, self.pending, patch=self.patch_runs,
                               done=self.done,
                               recv=self.recv, held=self.held,
                               per_bucket=per_bucket if n > 1 or per_bucket[0] is not
                               self._scratch else None, last_compute=self.last_compute)
                        return
            elif self._tapeable(blk, c):
                flush(self.b, self.pending)
                self._record(bkey, a, phys, c, per_bucket, blk)
                return
            else:
                self._tapes[bkey] = None
        flush(self.b, self.pending)
        self._emit(a, phys, c, per_bucket, blk)

    def _stamp_uniform(self, arrays: _ActArrays, acts: list[Action], i: int, uni: _Uniform,
                       fast: dict[tuple[int, str, MbKey], tuple[Tape, list[int], float]],
                       mb_key: MbKey) -> tuple[int, int]:
        """Stamp out the run of instructions from `acts[i]` that replay a tape (up to the
        first without one, or a stage's last backward) on a plan of one micro-batch shape:
        found and stamped with numpy (stamp.py), else as `_replay_run`. Returns (end of the
        run, how many it replayed)."""
        pair, last = arrays.pair, arrays.is_last
        ok = (uni.tape[pair[i:]] >= 0) & ~last[i:]
        end = len(acts) if ok.all() else i + int(np.argmin(ok))
        pairs = pair[i:end]
        if end - i > 1:
            flush(self.b, self.pending)
            if self._bank is None:
                self._bank = Bank(self._tape_list)
            elif self._bank.size != len(self._tape_list):
                self._bank.grow(self._tape_list)
            stamp = stamp_run if uni.one_unit[pairs].all() \
                else partial(stamp_units, units=uni.units)  # unfolded: several units a stage
            if stamp(cast(ChunkedBuilder, self.b), self._bank, self._tape_list,
                     uni.tape[pairs], arrays.micro_batch[i:end], arrays.stage[i:end],
                     arrays.kind[i:end], uni.extra[pairs], late=self.late,
                     done=cast(SlotMap, self.done),
                     recv=cast(SlotMap, self.recv), held=cast(SlotMap, self.held),
                     last_compute=self.last_compute):
                return end, end - i
        entries = [fast[(a.stage, a.kind, mb_key)] for a in acts[i:end]]
        run: list[tuple[Tape, int, int, str, float]] = [
            (e[0], a.micro_batch, a.stage, a.kind, e[2]) for a, e in zip(acts[i:end], entries)]
        return end, self._replay_run(run, [e[1] for e in entries], stamp=False)

    def _replay_run(self, run: list[tuple[Tape, int, int, str, float]],
                    units: list[list[int]], stamp: bool = True) -> int:
        """Replay `run` (tape, micro-batch, stage, pass, extra free; `units` each one's
        units): with numpy in one pass where `stamp_run` takes it (unless `stamp` is off: it
        did not), else one by one up to the first whose inputs differ in form from its
        tape's. Returns how many it replayed."""
        b = self.b
        if stamp and len(run) > 1 and all(len(u) == 1 for u in units):
            flush(b, self.pending)
            if self._bank is None:
                self._bank = Bank(self._tape_list)
            elif self._bank.size != len(self._tape_list):
                self._bank.grow(self._tape_list)
            if stamp_tuples(cast(ChunkedBuilder, b), self._bank, self._tape_list, run,
                            late=self.late,
                            done=cast(SlotMap, self.done), recv=cast(SlotMap, self.recv),
                            held=cast(SlotMap, self.held), last_compute=self.last_compute):
                return len(run)
        done = self.done
        for q, ((tape, j, k, kind, extra), uids) in enumerate(zip(run, units)):
            if kind == "F":
                inputs: list[list[int]] = [[] for _ in uids]
            elif kind == "W":
                inputs = [done[(k, "F", j, u)] + done[(k, "I", j, u)] for u in uids]
            else:
                inputs = [done[(k, "F", j, u)] for u in uids]
            if tape.input_shape == tuple([len(x) for x in inputs]):
                replay(b, tape, inputs, j, k, kind, extra, self.pending, patch=self.patch_runs,
                       done=done, recv=self.recv, held=self.held, per_bucket=None,
                       last_compute=self.last_compute)
            else:
                return q
        return len(run)

    def _inputs(self, a: Action, blk: _Block) -> list[list[int]]:
        """Per unit of `blk`, the tasks instruction `a` waits for first (its earlier passes)."""
        k, j, done = a.stage, a.micro_batch, self.done
        if a.kind == "F":
            return [[] for _ in blk.unit_ids]
        if a.kind == "W":
            return [done[(k, "F", j, u)] + done[(k, "I", j, u)] for u in blk.unit_ids]
        return [list(done[(k, "F", j, u)]) for u in blk.unit_ids]

    def _tapeable(self, blk: _Block, c: InstructionCosts) -> bool:
        """Whether `blk`'s rows depend only on its inputs (replay.py: no ZeRO-3, expert- or
        per-op tensor-parallel collectives)."""
        r = blk.recompute
        return not blk.ep_needs and blk.main.op_needs is None and (
            r is None or (r.op_needs is None and not (c.recompute_ep_comm and self.plan.ep >= 2)))

    def _record(self, bkey: _BlockKey, a: Action, phys: int, c: InstructionCosts,
                per_bucket: list[dict[int, int]], blk: _Block) -> None:
        """Emit `a` with `_emit`, recording its tape for the block's later instructions."""
        k, j = a.stage, a.micro_batch
        inputs = self._inputs(a, blk)
        t0, p0 = len(self.b), len(self.patch)
        recv = self.recv
        self.recv = {}
        fresh: list[dict[int, int]] = [{} for _ in per_bucket]
        try:
            self._emit(a, phys, c, fresh, blk)
        finally:
            new_recv = self.recv
            self.recv = recv
            for key, ids in new_recv.items():
                recv.setdefault(key, []).extend(ids)
            for bucket, d in zip(per_bucket, fresh):
                bucket.update(d)
        free_rows = ([(fresh[-1][p] - t0, u) for i, u in enumerate(blk.unit_ids)
                      for p in blk.units[i][0]] if blk.final else [])
        held = [(u, self.held[(k, j, u)]) for u in blk.unit_ids] if a.kind == "F" else []
        ranks = {p for prog, _ in blk.units for p in prog}
        tape = record(self.b, t0, inputs, free_rows=free_rows, patch=self.patch[p0:],
                      done={u: self.done[(k, a.kind, j, u)] for u in blk.unit_ids},
                      recv=new_recv, held=held, per_bucket=fresh,
                      last_compute={p: t for p, t in self.last_compute.items() if p in ranks},
                      j=j, index=len(self._tape_list))
        if tape is not None:
            self._tape_list.append(tape)
        self._tapes[bkey] = tape

    def _emit(self, a: Action, phys: int, c: InstructionCosts,
              per_bucket: list[dict[int, int]], blk: _Block) -> None:
        """Append instruction `a`'s tasks the ordinary way (see `_instruction`)."""
        k, j = a.stage, a.micro_batch
        n = len(per_bucket)
        meta = (j, k, blk.first_layer, blk.last_layer)
        add, emit = self.b.add, self.comm.emit_planned
        waits: list[tuple[int, str, int]] = []
        if a.kind == "F" and k > 0:
            waits.append((k, "F", j))
        if a.kind in ("B", "I") and k < self.plan.num_stages - 1:
            waits.append((k, "B", j))
        uids = blk.unit_ids
        last: dict[int, list[int]] = {u: [] for u in uids}
        if a.kind != "F":
            done = self.done
            for u in last:
                last[u] = done[(k, "F", j, u)] + done[(k, "I", j, u)] if a.kind == "W" \
                    else list(done[(k, "F", j, u)])
        gathered = (self.sync.zero3_gather(a, phys, c, meta, self.history)
                    if self.plan.zero >= 3 else None)
        param_rest = self.sync.overlapped_param_gather(a, phys, c, meta)
        # the gathered parameters: held from the pass's first compute task to its last
        gather_alloc = 0.0
        if gathered is not None:
            last = {u: sorted(set(last[u]) | set(gathered[0][u])) for u in last}
            gather_alloc = self.sync.zero3_bytes(phys, c)
        patch = self.patch
        if blk.recompute is not None:
            r = blk.recompute
            for i, u in enumerate(uids):
                deps = tuple(last[u])
                rids = [add(r.name, j, r.kind, self.compute_stream, (p,), t, 0.0, (),
                            deps, r.alloc + gather_alloc, 0.0, pw, f, j, k, meta[2], meta[3])
                        for p, f, t, pw in zip(blk.units[i][0], blk.freqs[i], r.times[i],
                                               r.powers[i])]
                self._note_compute(blk.units[i][0], rids)
                patch.extend((rid, (*key, u)) for rid in rids for key in waits)
                if r.op_needs is not None:
                    last[u] = self._op_tp_tasks(r, phys, blk.units[i][0], rids, j, meta)
                else:
                    tp = r.tp[i]
                    last[u] = (emit(tp, rids, j, meta)[-1:] or rids) if tp is not None else rids
            waits = []
            gather_alloc = 0.0  # allocated by the recompute
            last = self._ep_tasks(c.recompute_ep_comm, phys, f"s{k}.R%d", j, last, meta)
        m = blk.main
        for i, u in enumerate(uids):
            prog = blk.units[i][0]
            if a.kind == "F":
                self.held[(k, j, u)] = m.alloc
            free = self.held.get((k, j, u), 0.0) + blk.extra_free if blk.final else 0.0
            if gathered is not None:
                free += self.sync.zero3_bytes(phys, c)
            ids: list[int] = last[u]
            for bucket in range(n):
                deps = tuple(ids)
                alloc = m.alloc + gather_alloc if bucket == 0 else 0.0
                fr = free if bucket == n - 1 else 0.0
                ids = [add(m.names[bucket], j, m.kind, self.compute_stream, (p,), t, 0.0,
                           (), deps, alloc, fr, pw, f, j, k, meta[2], meta[3])
                       for p, f, t, pw in zip(prog, blk.freqs[i], m.times[i], m.powers[i])]
                if bucket == 0 and waits:
                    patch.extend((tid, (*key, u)) for tid in ids for key in waits)
                for p, tid in zip(prog, ids):
                    per_bucket[bucket][p] = tid
            self.history.setdefault((phys, u), []).append(ids[0])
            self._note_compute(prog, ids)
            if m.op_needs is not None:
                last[u] = self._op_tp_tasks(m, phys, prog, ids, j, meta)
            else:
                tp = m.tp[i]
                last[u] = (emit(tp, ids, j, meta)[-1:] or ids) if tp is not None else ids
            if last[u] != ids:
                self._hold_compute(prog, last[u], k, a.kind, j, meta)
        if blk.ep_needs:
            last = self._ep_tasks(blk.ep_needs, phys, f"s{k}.{a.kind}%d", j, last, meta)
        if gathered is not None:  # the layers gathered behind the compute end the pass too
            last = {u: sorted(set(last[u]) | set(gathered[1][u])) for u in last}
        if param_rest is not None:  # so do the previous step's parameters (ZeRO-1/2)
            last = {u: sorted(set(last[u]) | set(param_rest[u])) for u in last}
        done = self.done
        recv = self.recv
        send = blk.send
        for i, u in enumerate(uids):
            after = last[u]
            done[(k, a.kind, j, u)] = after
            if send is None:
                continue
            if send.local:
                recv.setdefault((send.dst, send.direction, j, u), []).extend(after)
                continue
            for tp, dst_unit in send.per_unit[i]:
                ids = emit(tp, after, j, meta)
                recv.setdefault((send.dst, send.direction, j, dst_unit), []).extend(
                    ids[-1:] or after)

    def _note_compute(self, prog: tuple[int, ...], ids: list[int]) -> None:
        """Remember each rank's latest compute task (the optimizer step waits for it)."""
        for p, tid in zip(prog, ids):
            self.last_compute[p] = tid

    def _block(self, a: Action, phys: int, c: InstructionCosts, final_kind: str, n: int,
               freq: float | None, group: ScheduleGroup) -> _Block:
        """Work out what every instruction like `a` emits (see `_instruction`)."""
        k, b, layout = a.stage, self.b, self.layout
        unit_ids = layout.group_units(phys, group)
        units = [layout.units(phys)[u] for u in unit_ids]
        freqs = [[freq or self.max_clock_mhz[p] for p in prog] for prog, _ in units]
        op_tp = layout.has_op_tp(phys)
        # each program rank runs at its own GPU type's speed (a mixed cluster's replicas differ)
        mb_key = layout.mb_key(a.micro_batch, group)
        rank_costs = [[layout.costs(k, mb_key, freq, self.cluster.gpu(layout.represents[p][0]))
                       for p in prog] for prog, _ in units]
        # the backward's working set, freed with the activations at the micro-batch's last
        # backward pass (B, or W after its I: decided per pass, as a schedule may run some
        # micro-batches' backwards whole and split others'): one layer's recomputed
        # activations (or the loss's buffers) for a whole B; for I and W, the recomputed
        # inputs W reads again (`split_working_set`)
        working = c.split_working_set() if a.kind in ("I", "W") \
            else c.recompute_activation_bytes
        recompute = None
        if a.kind in ("B", "I") and c.recompute.time_s > 0:
            rname = f"s{k}.R%d"
            recompute = _Part(name=b.name_template(rname), names=[], kind=b.kind("recompute"),
                              times=[[x.recompute.time_s for x in row] for row in rank_costs],
                              powers=[[x.recompute.power_w for x in row] for row in rank_costs],
                              alloc=working,
                              tp=[self._tp_plan(c.recompute_comm, phys, prog, grp, rname, u)
                                  for u, (prog, grp) in zip(unit_ids, units)]
                              if not op_tp else [],
                              op_needs=c.recompute_comm if op_tp else None,
                              tp_name=b.name_template("tp." + rname))
        attr = {"F": "forward", "B": "backward", "I": "backward_input",
                "W": "backward_weight"}[a.kind]
        name = f"s{k}.{a.kind}%d"
        names = [name] if n == 1 else [f"{name}.b{bucket}" for bucket in range(n)]
        parts = [[Work(time_s=w.time_s / n, energy_j=w.energy_j / n)
                  for w in (getattr(x, attr) for x in row)] for row in rank_costs]
        needs = {"F": c.fwd_comm, "B": c.bwd_comm, "I": c.bwd_comm, "W": ()}[a.kind]
        main = _Part(name=b.name_template(names[0]), names=[b.name_template(x) for x in names],
                     kind=b.kind(KIND_OF_ACTION[a.kind]),
                     times=[[w.time_s for w in row] for row in parts],
                     powers=[[w.power_w for w in row] for row in parts],
                     # the backward's working set (recomputed activations, the loss's
                     # gradient buffers) comes with the recompute task where there is one,
                     # else with the backward itself; it is freed with the activations
                     alloc=c.kept_activation_bytes if a.kind == "F" else
                     working if a.kind in ("B", "I") and recompute is None else 0.0,
                     tp=[self._tp_plan(needs, phys, prog, grp, name, u)
                         for u, (prog, grp) in zip(unit_ids, units)]
                     if not op_tp else [],
                     op_needs=needs if op_tp else None, tp_name=b.name_template("tp." + name))
        ep_needs = {"F": c.fwd_ep_comm, "B": c.bwd_ep_comm, "I": c.bwd_ep_comm,
                    "W": ()}[a.kind]
        layers = layout.stage_layers[k]
        return _Block(units=units, unit_ids=unit_ids, freqs=freqs, first_layer=layers[0],
                      last_layer=layers[-1], recompute=recompute, main=main,
                      final=a.kind in ("B", "W"), extra_free=working,
                      ep_needs=ep_needs if self.plan.ep >= 2 else (),
                      send=self._send_plan(a, unit_ids, group))

    def _hold_compute(self, prog: tuple[int, ...], tail: list[int], k: int, kind: str,
                      j: int, meta: Meta) -> None:
        """Keep each rank's compute stream from running past this instruction's tensor-parallel
        collectives (`tail`): they sit between the GEMMs whose results they carry, so a
        synchronous stack computes nothing else meanwhile. A zero-length "wait" task on the
        compute stream, after the collectives, does it; the plan's `tp_comm_overlap` (AsyncTP,
        --tp-comm-overlap) lets them run behind the next compute instead."""
        if self.plan.tp_comm_overlap or not tail:
            return
        b = self.b
        name, code = b.name_template(f"s{k}.{kind}%d.tp_wait"), b.kind("wait")
        ids = [b.add(name, j, code, self.compute_stream, (p,), 0.0, 0.0, (), tuple(tail),
                     0.0, 0.0, 0.0, math.nan, j, k, meta[2], meta[3]) for p in prog]
        self._note_compute(prog, ids)

    def _tp_plan(self, needs: tuple[CommNeed, ...], s: int, prog: tuple[int, ...],
                 group: tuple[int, ...], name: str, unit: int) -> PlannedComm | None:
        """The tensor-parallel collectives of one instruction on one unit, right after its
        compute (Megatron runs them synchronously between GEMMs, so their sum after the
        compute takes the same total time); None when there are none. `name` is the
        instruction's name template ("s3.F%d"); `unit` the unit's index in the stage's units
        (folded, it stands for its replica class's tp groups)."""
        if not needs or len(group) < 2 or not self.opt.communication \
                or not self.opt.tp_communication:
            return None
        pairs = [(n.collective, n.size_bytes) for n in needs]
        b = self.b
        copies: list[tuple[int, ...]]
        key: Hashable
        if self.fold:
            copies = self.layout.unit_copies(s, unit)
            key = ("tp", s) if len(self.layout.classes) == 1 else ("tp", s, unit)
        else:
            copies, key = [group], ("tp1", group)
        return PlannedComm(template=self.comm.template(pairs, copies, key),
                     name=b.name_template("tp." + name), kind=b.kind(kind_of(pairs)),
                     stream=b.stream("tp"), prog_ranks=prog)

    def _op_tp_tasks(self, part: _Part, s: int, prog: tuple[int, ...], ids: list[int],
                     j: int, meta: Meta) -> list[int]:
        """The collectives of one instruction on a stage whose ops have their own
        tensor-parallel degrees (Aceso): each `CommNeed` runs over the stage's groups of
        `group_size` consecutive ranks (0: the stage's tp), consecutive needs of one size as
        one chain. Folded, one chain stands for every group of that size (the copies);
        unfolded, each group's chain waits for the previous step of its own ranks. `ids` are
        the compute tasks of `prog`, one per rank; returns what the next step waits for."""
        needs = part.op_needs or ()
        if not needs or not self.opt.communication or not self.opt.tp_communication:
            return ids
        ranks, tp = self.layout.stage_gpu_ranks[s], self.plan.tp_of_stage(s)
        # One chain per group size, in order of first use: the collectives all run after the
        # instruction's compute anyway (as in `_tp_plan`), so their order inside it does not
        # change its time, and a deep stage then emits a few chains, not one per layer.
        by_size: dict[int, list[Need]] = {}
        for need in needs:
            t = need.group_size or tp
            by_size.setdefault(t, []).append((need.collective, need.size_bytes))
        runs = list(by_size.items())
        b = self.b
        kind = b.kind(kind_of([(n.collective, n.size_bytes) for n in needs]))
        stream = b.stream("tp")
        if self.fold:
            prev = ids
            for t, pairs in runs:
                if t < 2:
                    continue
                groups = [tuple(ranks[i:i + t]) for i in range(0, len(ranks), t)]
                out = self.comm.tasks(pairs, name=part.tp_name, arg=j, kind=kind, stream=stream,
                                      prog_ranks=prog, copies=groups, deps=prev, meta=meta,
                                      key=("tpg", s, t))
                prev = out[-1:] or prev
            return prev
        tail = {r: [tid] for r, tid in zip(prog, ids)}
        for t, pairs in runs:
            if t < 2:
                continue
            for i in range(0, len(ranks), t):
                group = tuple(ranks[i:i + t])
                deps = sorted({d for r in group for d in tail[r]})
                out = self.comm.tasks(pairs, name=part.tp_name, arg=j, kind=kind, stream=stream,
                                      prog_ranks=group, copies=[group], deps=deps, meta=meta)
                if out:
                    for r in group:
                        tail[r] = out[-1:]
        return sorted({d for r in prog for d in tail[r]})

    def _send_plan(self, a: Action, unit_ids: list[int], group: ScheduleGroup) -> _Send | None:
        """Point-to-point transfer of activations (after F) or gradients (after B/I) to the
        neighbouring stage, per sending unit of `unit_ids` (the stage's units that run `a`): the
        transfers and the receiving unit of each."""
        k, j = a.stage, a.micro_batch
        layout = self.layout
        if a.kind == "F" and k < self.plan.num_stages - 1:
            dst, direction, size = k + 1, "F", layout.boundary_bytes(k, j, group)
        elif a.kind in ("B", "I") and k > 0:
            dst, direction, size = k - 1, "B", layout.boundary_bytes(k - 1, j, group)
        else:
            return None
        src_s, dst_s = layout.phys_stage(k), layout.phys_stage(dst)
        if direction == "B":  # the gradient as one GPU of the sending stage holds it
            size *= layout.replica_batch_ratio(src_s, dst_s, j)
        if src_s == dst_s or not self.opt.communication or size <= 0:
            return _Send(dst=dst, direction=direction, local=True, per_unit=[])
        pairs, size = layout.p2p_pairs(src_s, dst_s, size, j)
        b = self.b
        stream, kind = b.stream(f"pp{src_s}>{dst_s}"), b.kind("p2p")
        label = b.name_template(f"s{k}>{dst}.{direction}%d")
        need = [("p2p", size)]
        if self.fold and len(layout.classes) == 1:
            # the pairs all send at once (on their links shared with each other): the folded
            # transfer is the slowest pair of the slowest chain
            chain = self._slowest_chain()
            ours = [p for p in pairs if p[0] in chain] or pairs
            rep = ours[0] if not chain or self.comm.copies_alike(pairs) \
                else next(p for p in self.comm.slowest_first(need, pairs) if p in ours)
            comm = PlannedComm(template=self.comm.template(
                                   need, [rep, *(p for p in pairs if p != rep)],
                                   ("pp", src_s, dst_s)),
                               name=label, kind=kind, stream=stream, prog_ranks=(src_s, dst_s))
            return _Send(dst=dst, direction=direction, local=False, per_unit=[[(comm, 0)]])
        if self.fold:  # each replica class sends to its own program rank on the next stage
            out = []
            for c in unit_ids:
                mine = {r for d in layout.classes[c] for r in layout.replica_ranks(src_s, d)}
                cpairs = [(x, y) for x, y in pairs if x in mine]
                comm = PlannedComm(
                    template=self.comm.template(need, cpairs, ("pp", src_s, dst_s, c)),
                    name=label, kind=kind, stream=stream,
                    prog_ranks=(layout.prog_rank(src_s, c), layout.prog_rank(dst_s, c)))
                out.append([(comm, c)])
            return _Send(dst=dst, direction=direction, local=False, per_unit=out)
        dst_unit = layout.unit_of(dst_s)
        streams = self._pair_streams(src_s, dst_s, pairs)
        per_unit = []
        for prog, _group in (layout.units(src_s)[u] for u in unit_ids):
            unit = set(prog)
            per_unit.append([
                (PlannedComm(template=self.comm.template(need, [(src_r, dst_r)]), name=label,
                       kind=kind, stream=pair_stream, prog_ranks=(src_r, dst_r)),
                 dst_unit[dst_r])
                for (src_r, dst_r), pair_stream in zip(pairs, streams, strict=True)
                if src_r in unit])
        return _Send(dst=dst, direction=direction, local=False, per_unit=per_unit)

    def _slowest_chain(self) -> frozenset[int]:
        """Folded: the GPUs of the slowest chain of stage-boundary pairs, whose transfers the
        folded ones stand for (cached).

        The pairs of every stage boundary (`LoweringLayout.p2p_pairs`, both directions) join
        the GPUs into chains -- with equal stages, each pipeline replica; with stages of
        different sizes (`stage_gpus`), a GPU of the smaller stage with its run of the larger
        one's -- and unfolded each chain runs at its own pace until the gradient reduction.
        A chain's transfers at a boundary take as long as its slowest pair there (timed on
        its links shared with the boundary's other pairs, `CommLowering.copy_times`, at the
        first micro-batch's size); the slowest chain is the one whose boundaries add up to the
        most (the first of equal ones). Picking each boundary's slowest pair instead would
        add up hops that no one chain crosses: with (4, 8, 4) GPUs on two nodes, one chain
        crosses nodes into the middle stage and another out of it."""
        if self._slowest is not None:
            return self._slowest
        layout, plan = self.layout, self.plan
        if len({len(r) for r in layout.stage_gpu_ranks}) == 1:
            # every chain alike (equal stages, every boundary's pairs wired alike): the first
            # pair of each boundary stands for all, as the empty chain says; remembered by
            # placement, which is all it depends on
            key = ("chains alike", tuple(tuple(r) for r in layout.stage_gpu_ranks),
                   tuple(layout.phys_stage(k) for k in range(plan.num_stages)))
            cache = self.comm._load_cache
            alike = cache.get(key)
            if alike is None:
                alike = cache[key] = all(self.comm.copies_alike(pairs)
                                         for pairs, _ in self._boundary_pairs())
            if alike:
                self._slowest = frozenset()
                return self._slowest
        parent: dict[int, int] = {}

        def root(g: int) -> int:
            while parent.setdefault(g, g) != g:
                parent[g] = parent[parent[g]]
                g = parent[g]
            return g

        hops = []
        for pairs, per_pair in self._boundary_pairs():
            # pairs wired alike add one time to every chain: no need to time them
            hops.append((pairs, [0.0] * len(pairs) if self.comm.copies_alike(pairs)
                         else self.comm.copy_times([("p2p", per_pair)], pairs)))
            for x, y in pairs:
                parent[root(x)] = root(y)
        total: dict[int, float] = {}
        for pairs, times in hops:
            worst: dict[int, float] = {}
            for (x, _), t in zip(pairs, times, strict=True):
                c = root(x)
                worst[c] = max(worst.get(c, 0.0), t)
            for c, t in worst.items():
                total[c] = total.get(c, 0.0) + t
        slowest = max(total, key=total.__getitem__) if total else None
        self._slowest = frozenset(g for g in parent if root(g) == slowest)
        return self._slowest

    def _boundary_pairs(self) -> Iterator[tuple[list[tuple[int, int]], float]]:
        """(GPU pairs, bytes of each) of every stage boundary that moves data, forward then
        backward, for the first micro-batch (`LoweringLayout.p2p_pairs`)."""
        layout = self.layout
        for k in range(self.plan.num_stages - 1):
            a, z = layout.phys_stage(k), layout.phys_stage(k + 1)
            size = layout.boundary_bytes(k, 0)
            if a != z and size > 0:
                yield layout.p2p_pairs(a, z, size, 0)
                yield layout.p2p_pairs(z, a, size * layout.replica_batch_ratio(z, a, 0), 0)

    def _pair_streams(self, src_s: int, dst_s: int, pairs: list[tuple[int, int]]
                      ) -> list[int]:
        """Stream code of each pair of a stage-boundary transfer, unfolded: ``pp<src>><dst>``,
        and ``pp<src>><dst>.<i>`` for the i-th (from 0) of a GPU's pairs when a GPU has
        several (stages of different sizes: one GPU sends to, or receives from, several). The
        pairs of one GPU run at once (batched isend/irecv, as NCCL groups them), sharing its
        links, rather than one after another on one FIFO stream; each pair's transfers of
        successive micro-batches keep their order on its own stream."""
        base = f"pp{src_s}>{dst_s}"
        seen: Counter[tuple[str, int]] = Counter()
        out = []
        for src_r, dst_r in pairs:
            i = seen["s", src_r] + seen["d", dst_r]
            seen["s", src_r] += 1
            seen["d", dst_r] += 1
            out.append(self.b.stream(f"{base}.{i}" if i else base))
        return out

    def _ep_tasks(self, needs: tuple[CommNeed, ...], phys: int, name: str, arg: int,
                  last: dict[int, list[int]], meta: Meta) -> dict[int, list[int]]:
        """Expert-parallel all-to-alls (MoE dispatch/combine) over the stage's ep groups."""
        if not needs or self.plan.ep < 2:
            return last
        pairs = [(n.collective, n.size_bytes) for n in needs]
        b = self.b
        return cross_unit(self.comm, self.layout, phys, self.layout.ep_groups(phys), pairs,
                          name=b.name_template("ep." + name), arg=arg,
                          kind=b.kind(kind_of(pairs)), stream=b.stream("ep"), last=last,
                          meta=meta, key=("ep", phys))

    # ------------------------------------------------------------------ program
    def _program(self) -> Program:
        plan, layout = self.plan, self.layout
        cluster = layout.cluster
        model = layout.model
        w, g, o = state_bytes_per_param(plan.dtype, model.grad_buffer, model.grad_reduce_dtype)
        static, capacity, idle, gpu_names, peaks, phi = [], [], [], [], [], []
        for p in range(layout.num_ranks):
            s = layout.phys_stage_of_prog(p)
            params = layout.local_params(s)
            # ZeRO shards the dense parameters' states over dp and the experts' over their
            # expert-data-parallel group (the ranks holding the same experts, dp/ep of them
            # for tp = 1: `LoweringLayout.expert_dp_groups`), as Megatron-Core's distributed
            # optimizer shards expert buffers over the expert data-parallel group
            expert = layout.local_expert_params(s) if plan.ep > 1 else 0.0
            total = 0.0
            for n, part in ((plan.dp_of_stage(s), params - expert),
                            (layout.expert_dp(s) if expert else 1, expert)):
                per_param = (w / (n if plan.zero >= 3 else 1) + g / (n if plan.zero >= 2 else 1)
                             + o / (n if plan.zero >= 1 else 1))
                if self.sync.keeps_gathered() and n > 1:
                    # the gathered weights (the unsharded gradients they accumulate over several
                    # micro-batches are allocated at each stage's first backward:
                    # `_hold_unsharded_grads`)
                    per_param += w * (n - 1) / n
                total += part * per_param
            gpu = cluster.gpu(layout.represents[p][0])
            static.append(total)
            capacity.append(float(gpu.memory_bytes))
            idle.append(float(cluster.idle_power_w(layout.represents[p][0])))
            gpu_names.append(gpu.name)
            peaks.append(float(gpu.peak_flops(plan.dtype)))
            phi.append(comm_sm_fraction(gpu) if self.opt.comm_sm_sharing else 0.0)
        mbs = layout.micro_batches
        if plan.replica_micro_batches is not None:
            every = [mb for ms in layout.replica_lists for mb in ms]
            model_flops = sum(layout.model_flops(mb) for mb in every)
            tokens: int | None = sum(mb.batch_size * mb.seq_len for mb in every)
        elif plan.dp_batch_split is None and layout.uniform and mbs:
            # the same terms summed the same way as below, without a call per micro-batch
            model_flops = sum(repeat(layout.model_flops(mbs[0]), len(mbs))) * plan.dp
            tokens = sum(repeat(mbs[0].batch_size * mbs[0].seq_len, len(mbs))) * plan.dp
        elif plan.dp_batch_split is None:
            model_flops = sum(layout.model_flops(mb) for mb in mbs) * plan.dp
            tokens = sum(mb.batch_size * mb.seq_len for mb in mbs) * plan.dp
        else:  # replica d runs the first counts[d] micro-batches
            counts = plan.replica_micro_batch_counts()
            model_flops = sum(layout.model_flops(mb) * sum(1 for m in counts if m > j)
                              for j, mb in enumerate(mbs))
            tokens = sum(mb.batch_size * mb.seq_len * sum(1 for m in counts if m > j)
                         for j, mb in enumerate(mbs))
        if layout.model.family == "wresnet":
            tokens = plan.global_batch
        stated = self.stated
        info = ProgramInfo(
            model=layout.model.name, plan=stated.to_dict(), global_batch=stated.global_batch,
            seq_len=layout.micro_batches[0].seq_len * stated.cp, tokens_per_iteration=tokens,
            model_flops_per_iteration=model_flops, peak_flops_per_rank=tuple(peaks),
            gpu_names=tuple(gpu_names), folded=self.fold,
            price_per_hour_usd=float(cluster.price_per_hour_usd),
        )
        # The lowering computes every number itself, so tasks skip the per-task checks.
        return Program(num_ranks=layout.num_ranks, tasks=self.b.build(),
                       link_bandwidth_bytes_per_s=dict(sorted(self.comm.links.items())),
                       static_memory_bytes=static, memory_capacity_bytes=capacity,
                       idle_power_w=idle, represents=layout.represents,
                       comm_sm_fraction=phi, info=info)


__all__ = ["lower"]
