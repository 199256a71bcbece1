"""The Program: one training iteration lowered to tasks on per-rank streams, engine-independent.

A Program is what every engine runs (DESIGN.md §2). Lowering builds it from a workload, a
parallel plan and a cluster; the SimPy reference engine (`engine_simpy.run_simpy`) and the
numba twin both replay it and must agree. This docstring is the contract they share.

Semantics
---------
* **Streams are FIFOs.** Every member rank of a task has a stream named `task.stream`; each
  (rank, stream) pair runs its tasks one at a time in task-index order.
* **Start rule.** A task starts at the earliest time when (a) every task in `deps` has ended and
  (b) on every member rank it is at the head of that rank's stream and the previous task on that
  stream has ended. Start time is therefore `max(end of each dep, end of the stream predecessor on
  each member rank)`, or 0 when there is none. A multi-rank task (collective, point-to-point
  transfer) is one rendezvous: it waits for its slowest member.
* **Two phases.** A task first runs its fixed part, `duration_s` (compute time, or a collective's
  latency α); its fixed part ends at exactly `start + duration_s`. Then, if `comm_bytes > 0`, it
  transfers `comm_bytes` over each of its `links` in a fluid model: while n_l tasks are in their
  transfer phase on link l, a transferring task's rate is `min over its links of
  bandwidth_l / n_l` (equal sharing, not max-min fair). Rates are recomputed whenever a transfer
  starts or ends; between such instants remaining bytes fall linearly (clamped at zero). The
  next completion time is `t_update + remaining / rate`; at that instant every transfer whose own
  `t_update + remaining / rate` is at or below it ends together. A lone transfer thus takes
  `comm_bytes / min bandwidth`; two identical ones sharing a link take twice as long.
* **Shared links of folded programs.** A folded task stands for n identical copies; where n of
  them cross one physical link l, the task crosses the link id ``l/n`` (`shared_link_id`) with
  bandwidth_l / n. Every id ``l/n`` is the same physical link l: its users are counted in
  copies, so a transferring task's share of ``l/n`` is `bandwidth_l / W_l`, with W_l the copies
  of every task transferring over l whatever its n (engines compute it as
  `bandwidth_{l/n} / (W_l / n)`, which is `bandwidth_{l/n} / users` when all share one n).
  Without it a folded tp all-reduce (on l) and a dp all-reduce (on l/2) would never contend,
  though their unfolded copies do.
* **SM sharing.** An NCCL collective kernel holds some of its GPU's SMs (one CTA per channel)
  for as long as it runs, and a GEMM running beside it has only the rest. A task *occupies SMs*
  when its kind is in `sm_comm_kinds` and it is not zero-length (duration or bytes > 0); it
  does so on every member rank from its start (fixed part included) to its end. A task is
  *slowed* when it runs on the "compute" stream and does not itself occupy SMs. While at least
  one occupying task runs on rank r, r's SM rate is `1 − comm_sm_fraction[r]` (φ_r), else 1; a
  slowed task's fixed part (its `duration_s`, the work at full speed) progresses at the lowest
  SM rate over its member ranks. The rate is re-read whenever an occupying task starts or ends
  on a member and the rate differs: work left falls linearly at the old rate since the last
  change (`work − (now − t_change) × rate`, clamped at zero; the start is the first change, with
  all of `duration_s` left) and the fixed part ends at `t_change + work / rate` of the last
  change, so at exactly `start + duration_s` when the rate stayed 1. A change at the instant
  the fixed part ends does not affect it. With φ = 0 (the default) nothing changes, so CPU
  programs and programs built without φ keep their old times exactly. Pipeline p2p transfers
  (1–2 CTAs) are not in the default kinds.
* **Ends.** A task ends when its transfer completes (or at the end of its fixed part if it has
  no bytes). Its end is seen by dependants and by the next task on its streams at that instant.
* **Ties.** Start and end times are a pure function of the program (max-plus over predecessor
  ends plus the fluid model, which is order-independent within an instant); where an engine has
  to order work at one instant it uses task index. Transfer completions at an instant are
  processed before starts at that instant. Engines agree up to floating-point rounding (1e-9 s
  relative).
* **Memory.** `mem_alloc_bytes` is added at start and `mem_free_bytes` removed at end on every
  member rank, over a per-rank base of `static_memory_bytes`. At one instant, ends of tasks that
  started earlier are applied first, then starts, then ends of zero-length tasks, each group in
  task-index order (so a buffer freed at t is reusable by a task starting at t, and a zero-length
  task's own allocation is still counted). Peak is the maximum of the running sum; the rank is
  OOM when the peak exceeds `memory_capacity_bytes`, at the first event where it does, by
  `peak - capacity`.
* **Energy.** Per rank: Σ over its tasks on powered streams of `power_w × (end − start)` plus
  `idle_power_w × (iteration time − powered busy time)`, where powered busy time is the length
  of the union of those tasks' intervals. Iteration time is the last end over all tasks (start at
  0); an empty program takes 0 s.
* **Deadlock.** A program cannot finish exactly when the graph of dependency edges plus stream-
  order edges (on every member rank) has a cycle — cyclic deps, collectives whose members' stream
  orders disagree, a dep on a task that never starts. Engines then raise `SimulationError` naming
  the stuck ranks and, per stuck stream, its head task and what it waits for.
* **Folding.** Program rank r may stand for several physical ranks (`represents[r]`) that behave
  identically; results are per program rank and `SimResult.expand()` unfolds them.

`Program.freeze()` gives the same program as numpy struct-of-arrays (`FrozenProgram`), with no
Python object per task, for compiled engines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.errors import SimulationError
from trainsim.simulator.task import Task, check_number
from trainsim.simulator.task_table import TaskTable, compiled

#: Streams drawn first, in this order, by the exporters; other names follow alphabetically.
CONVENTIONAL_STREAMS: tuple[str, ...] = ("compute", "tp", "pp", "dp")

#: Task kinds used by the built-in lowering ("wait": a zero-length task that holds its stream
#: until its deps end). Any other non-empty name is allowed too.
KNOWN_KINDS: tuple[str, ...] = (
    "forward",
    "backward",
    "backward_input",
    "backward_weight",
    "recompute",
    "optimizer",
    "p2p",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "wait",
)


#: Kinds whose tasks run NCCL collective kernels that hold SMs while they run ("tp_comm": a
#: run of mixed tensor-parallel collectives); the default of `Program.sm_comm_kinds`.
SM_COMM_KINDS: frozenset[str] = frozenset(
    {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "tp_comm"}
)

#: The stream whose tasks an SM-occupying collective slows (program.py: SM sharing).
SM_SHARED_STREAM = "compute"

#: Values of `sm_roles`: a task that neither occupies nor is slowed, one that occupies SMs, one
#: that is slowed.
SM_NONE, SM_OCCUPIES, SM_SLOWED = 0, 1, 2


def shared_link_id(link: str, copies: int) -> str:
    """The link id a folded task uses where `copies` of its copies cross physical `link`."""
    return link if copies <= 1 else f"{link}/{copies}"


def physical_link(link_id: str) -> tuple[str, int]:
    """(physical link, copies) of a link id written by `shared_link_id`."""
    head, sep, tail = link_id.rpartition("/")
    if sep and tail.isdigit() and int(tail) >= 1:
        return head, int(tail)
    return link_id, 1


def link_slots(link_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per link code: the index of its physical link (codes of one physical link share it, in
    first-appearance order) and its copies n, for the engines' user counts (shared links)."""
    slots: dict[str, int] = {}
    slot = np.empty(len(link_names), dtype=np.int64)
    copies = np.empty(len(link_names), dtype=np.int64)
    for i, name in enumerate(link_names):
        phys, n = physical_link(name)
        slot[i] = slots.setdefault(phys, len(slots))
        copies[i] = n
    return slot, copies


def _check_shared_links(bandwidth: Mapping[str, float]) -> None:
    """The ids of one physical link must agree on its bandwidth (n × that of ``l/n``)."""
    seen: dict[str, tuple[str, float]] = {}
    for link, bw in bandwidth.items():
        phys, n = physical_link(link)
        first = seen.setdefault(phys, (link, bw * n))
        if not math.isclose(first[1], bw * n, rel_tol=1e-9):
            raise SimulationError(
                f"program: link_bandwidth_bytes_per_s[{link!r}]={bw!r} disagrees with "
                f"{first[0]!r}: ids l/n of one physical link l carry bandwidth_l / n")


def _per_rank(
    name: str, values: Sequence[float], num_ranks: int, default: float
) -> tuple[float, ...]:
    """Normalise a per-rank sequence: empty means `default` everywhere."""
    if len(values) == 0:
        return (default,) * num_ranks
    if len(values) != num_ranks:
        raise SimulationError(
            f"program: {name} has {len(values)} entries, expected num_ranks={num_ranks}"
        )
    for rank, value in enumerate(values):
        check_number("program", f"{name}[{rank}]", value, allow_inf=True)
    return tuple(float(v) for v in values)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProgramInfo:
    """What a Program stands for: the facts results and exporters read beside its tasks.

    Every field is optional (None: unknown, and whatever needs it reports None). Lowering
    (workloads/lowering/) fills the model, plan, throughput, peak and price fields; a program
    built some other way says where it comes from (`source`, `planner`, `generator`, `seed`).
    """

    model: str | None = None
    """Model name (the timeline's title)."""
    plan: Mapping[str, Any] | None = None
    """The parallel plan the program was lowered from, as `ParallelPlan.to_dict()`."""
    global_batch: int | None = None
    """Samples per iteration: `SimResult.samples_per_s = global_batch / iteration_time_s`."""
    seq_len: int | None = None
    """Sequence length (of the first micro-batch): tokens = global_batch × seq_len when
    `tokens_per_iteration` is not given."""
    tokens_per_iteration: float | None = None
    """Tokens per iteration over all replicas (`SimResult.tokens_per_s`)."""
    model_flops_per_iteration: float | None = None
    """Model FLOPs of one iteration over all GPUs, not counting recompute (MFU's numerator;
    see result.py)."""
    peak_flops_per_rank: float | tuple[float, ...] | None = None
    """Peak FLOP/s: one figure for every physical GPU, or one per program rank (applying to
    each physical rank it represents)."""
    gpu_names: tuple[str, ...] | None = None
    """GPU type of each program rank (Chrome trace process names)."""
    gpu_name: str | None = None
    """GPU type of every rank, where `gpu_names` is not given."""
    folded: bool | None = None
    """True when a program rank stands for several identical GPUs (`Program.represents`)."""
    price_per_hour_usd: float | None = None
    """What the GPUs the program runs on cost per hour (`SimResult.cost_usd`)."""
    source: str | None = None
    """Where a program not lowered from a model comes from (a profile, a file)."""
    planner: str | None = None
    """The planner that built the program, if one did."""
    generator: str | None = None
    """The generator of a synthetic program (tests: "random_program")."""
    seed: int | None = None
    """The seed of a synthetic program."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Program:
    """One iteration as tasks on per-rank streams; see the module docstring for semantics."""

    num_ranks: int
    """Number of program ranks (after folding)."""
    tasks: list[Task] | TaskTable = field(default_factory=list)
    """All tasks; a task's id is its index here. A list of `Task` (any other iterable of tasks
    is copied into one), or a columnar `TaskTable` (what lowering builds), which reads as a
    read-only sequence of `Task`."""
    link_bandwidth_bytes_per_s: dict[str, float] = field(default_factory=dict)
    """Bandwidth of every link id the tasks cross (per direction, bytes/s, > 0)."""
    static_memory_bytes: Sequence[float] = ()
    """Per rank: memory held all iteration (weights, grads, optimizer states); empty = 0."""
    memory_capacity_bytes: Sequence[float] = ()
    """Per rank: device memory capacity; empty = unlimited (inf)."""
    idle_power_w: Sequence[float] = ()
    """Per rank: power drawn while no powered-stream task runs; empty = 0."""
    powered_streams: frozenset[str] = frozenset({"compute"})
    """Streams whose tasks' power_w counts toward energy (communication usually overlaps)."""
    represents: Sequence[tuple[int, ...]] = ()
    """Per program rank, the physical ranks it stands for (folding); empty = identity."""
    comm_sm_fraction: Sequence[float] = ()
    """Per rank: φ, the share of the GPU's SMs a running collective holds (compute-stream work
    then runs at 1 − φ; see SM sharing above), in [0, 1); empty = 0 (no sharing)."""
    sm_comm_kinds: frozenset[str] = SM_COMM_KINDS
    """Task kinds that occupy SMs while they run (SM sharing)."""
    info: ProgramInfo = field(default_factory=ProgramInfo)
    """What the program stands for: model, plan, batch, FLOPs, GPUs, price (`ProgramInfo`)."""

    def __post_init__(self) -> None:
        if isinstance(self.num_ranks, bool) or not isinstance(self.num_ranks, int):
            raise SimulationError(f"program: num_ranks={self.num_ranks!r} must be an integer")
        if not isinstance(self.info, ProgramInfo):
            raise SimulationError(
                f"program: info must be a ProgramInfo, not {type(self.info).__name__}"
            )
        if self.num_ranks < 1:
            raise SimulationError(f"program: num_ranks={self.num_ranks} must be >= 1")
        if not isinstance(self.tasks, (list, TaskTable)):
            object.__setattr__(self, "tasks", list(self.tasks))
        for link, bandwidth in self.link_bandwidth_bytes_per_s.items():
            check_number("program", f"link_bandwidth_bytes_per_s[{link!r}]", bandwidth)
            if bandwidth <= 0:
                raise SimulationError(
                    f"program: link_bandwidth_bytes_per_s[{link!r}]={bandwidth!r} must be > 0"
                )
        _check_shared_links(self.link_bandwidth_bytes_per_s)
        n = self.num_ranks
        set_ = object.__setattr__
        set_(
            self,
            "static_memory_bytes",
            _per_rank("static_memory_bytes", self.static_memory_bytes, n, 0.0),
        )
        set_(
            self,
            "memory_capacity_bytes",
            _per_rank("memory_capacity_bytes", self.memory_capacity_bytes, n, math.inf),
        )
        set_(self, "idle_power_w", _per_rank("idle_power_w", self.idle_power_w, n, 0.0))
        set_(self, "powered_streams", frozenset(self.powered_streams))
        set_(self, "sm_comm_kinds", frozenset(self.sm_comm_kinds))
        phi = _per_rank("comm_sm_fraction", self.comm_sm_fraction, n, 0.0)
        for rank, value in enumerate(phi):
            if value >= 1:
                raise SimulationError(
                    f"program: comm_sm_fraction[{rank}]={value!r} must be < 1 (the share of SMs "
                    "a collective holds)"
                )
        set_(self, "comm_sm_fraction", phi)
        if len(self.represents) == 0:
            set_(self, "represents", tuple((r,) for r in range(n)))
        else:
            reps = tuple(tuple(int(p) for p in group) for group in self.represents)
            if len(reps) != n:
                raise SimulationError(
                    f"program: represents has {len(reps)} entries, expected num_ranks={n}"
                )
            flat = [p for group in reps for p in group]
            if any(not group for group in reps) or len(set(flat)) != len(flat) or min(flat) < 0:
                raise SimulationError(
                    "program: represents must give each rank a non-empty group of distinct "
                    f"physical ranks >= 0, got {reps!r}"
                )
            set_(self, "represents", reps)

    @property
    def num_tasks(self) -> int:
        """Number of tasks."""
        return len(self.tasks)

    @property
    def num_physical_ranks(self) -> int:
        """Number of physical ranks the program stands for (after unfolding)."""
        return sum(len(group) for group in self.represents)

    def describe(self, task_id: int) -> str:
        """Short label of a task for messages: `12 's0.F3'`."""
        if isinstance(self.tasks, TaskTable):
            return f"{task_id} {self.tasks.name(task_id)!r}"
        return f"{task_id} {self.tasks[task_id].name!r}"

    def table(self) -> TaskTable:
        """The tasks as columns: the program's own `TaskTable`, or one built from its list."""
        if isinstance(self.tasks, TaskTable):
            return self.tasks
        return TaskTable.from_tasks(self.tasks)

    def task_names(self) -> list[str]:
        """Every task's name, by id (formatted from the table's templates when columnar)."""
        if isinstance(self.tasks, TaskTable):
            return self.tasks.names()
        return [t.name for t in self.tasks]

    def validate(self, *, check_cycles: bool = True) -> None:
        """Check cross-task consistency, raising SimulationError naming the first bad task.

        Checks every task's own fields again (tasks made by `trusted_task` skipped that), member
        ranks in range, dep indices in range and not self, and links known. With `check_cycles`,
        also rejects a cycle in the dependency graph (engines skip that and report every
        deadlock, including dep cycles, with the stuck ranks instead). A columnar program is
        checked with array operations; only when they find a fault are its tasks walked one by
        one, so the message is the same either way.
        """
        if isinstance(self.tasks, TaskTable):
            bad = self.tasks.first_bad_task(self.num_ranks, self.link_bandwidth_bytes_per_s)
            if bad is not None:
                self._validate_tasks()
                raise SimulationError(f"task {self.describe(bad[0])}: {bad[1]}")
        else:
            self._validate_tasks()
        if check_cycles:
            cycle = _find_dep_cycle(self)
            if cycle:
                path = " -> ".join(self.describe(t) for t in cycle[:12])
                more = " -> ..." if len(cycle) > 12 else ""
                raise SimulationError(f"program: dependency cycle {path}{more}")

    def _validate_tasks(self) -> None:
        """The per-task checks of `validate` (raises on the first bad task)."""
        n_tasks = len(self.tasks)
        for tid, task in enumerate(self.tasks):
            Task.__post_init__(task)
            for rank in task.ranks:
                if rank >= self.num_ranks:
                    raise SimulationError(
                        f"task {self.describe(tid)}: rank {rank} out of range "
                        f"(num_ranks={self.num_ranks})"
                    )
            for dep in task.deps:
                if isinstance(dep, bool) or not isinstance(dep, (int, np.integer)):
                    raise SimulationError(f"task {self.describe(tid)}: dep {dep!r} is not an index")
                if not 0 <= dep < n_tasks:
                    raise SimulationError(
                        f"task {self.describe(tid)}: dep {dep} out of range (0..{n_tasks - 1})"
                    )
                if dep == tid:
                    raise SimulationError(f"task {self.describe(tid)}: depends on itself")
            for link in task.links:
                if link not in self.link_bandwidth_bytes_per_s:
                    raise SimulationError(
                        f"task {self.describe(tid)}: unknown link {link!r} (known: "
                        f"{', '.join(sorted(self.link_bandwidth_bytes_per_s)[:12]) or 'none'})"
                    )

    def freeze(self) -> FrozenProgram:
        """Return the program as numpy struct-of-arrays (no Python object per task)."""
        return FrozenProgram.from_program(self)




def _queues(n: int, member_ptr: np.ndarray, member_rank: np.ndarray, stream_code: np.ndarray,
            num_streams: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                       np.ndarray]:
    """(queue_ptr, queue_task, queue keys, member_queue, member_pos): the (rank, stream)
    queues, key = rank * num_streams + stream, sorted by key, each in task order."""
    member_stream = np.repeat(stream_code, np.diff(member_ptr))
    member_task = np.repeat(np.arange(n, dtype=np.int64), np.diff(member_ptr))
    key = member_rank.astype(np.int64) * num_streams + member_stream
    # members come in task order, so a stable sort by key orders each queue by task (what
    # `np.lexsort((member_task, key))` gives, at about half its cost)
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts: np.ndarray | list[int]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]]) if n else []
    queue_ptr = np.r_[np.asarray(starts, dtype=np.int64), len(sorted_key)].astype(np.int64)
    queue_task = member_task[order]
    queue_keys = sorted_key[np.asarray(starts, dtype=np.int64)] if n else np.empty(0, np.int64)
    queue_of_sorted = np.repeat(np.arange(len(queue_keys)), np.diff(queue_ptr))
    member_queue = np.empty(len(member_rank), dtype=np.int32)
    member_pos = np.empty(len(member_rank), dtype=np.int64)
    member_queue[order] = queue_of_sorted
    member_pos[order] = np.arange(len(order), dtype=np.int64) - queue_ptr[queue_of_sorted]
    return queue_ptr, queue_task, queue_keys, member_queue, member_pos


def _find_dep_cycle(program: Program) -> list[int]:
    """Return one dependency cycle as task ids (first repeated at the end), or [] if acyclic."""
    n = len(program.tasks)
    table = program.table()
    ptr, flat = table.dep_ptr.tolist(), table.dep_idx.tolist()
    state = bytearray(n)  # 0 new, 1 on stack, 2 done
    for root in range(n):
        if state[root]:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            tid, i = stack[-1]
            deps = flat[ptr[tid] : ptr[tid + 1]]
            if i < len(deps):
                stack[-1] = (tid, i + 1)
                dep = deps[i]
                if state[dep] == 1:
                    path = [t for t, _ in stack]
                    return path[path.index(dep) :] + [dep]
                if state[dep] == 0:
                    state[dep] = 1
                    stack.append((dep, 0))
            else:
                state[tid] = 2
                stack.pop()
    return []


def _first_appearance(codes: np.ndarray, names: tuple[str, ...]
                      ) -> tuple[np.ndarray, tuple[str, ...]]:
    """Recode `codes` so code i is the i-th distinct one to appear (unused names dropped):
    engines and results see the same code tables whatever built the program."""
    if len(codes) == 0:
        return np.zeros(0, np.int32), ()
    if compiled(len(codes)):  # the same codes in one compiled pass, not a sort
        from trainsim.simulator.csr_numba import first_appearance  # deferred: start-up time

        order = first_appearance(codes, len(names))
    else:
        used, first = np.unique(codes, return_index=True)
        order = used[np.argsort(first, kind="stable")]
    mapping = np.zeros(len(names), dtype=np.int32)
    mapping[order] = np.arange(len(order), dtype=np.int32)
    return mapping[codes], tuple(names[c] for c in order.tolist())


def stream_display_order(names: Iterable[str]) -> list[str]:
    """Conventional streams first (compute, tp, pp, dp), then the rest alphabetically."""
    names = set(names)
    first = [s for s in CONVENTIONAL_STREAMS if s in names]
    return first + sorted(names - set(first))


def sm_roles(program: Program) -> np.ndarray:
    """Per task: SM_OCCUPIES, SM_SLOWED or SM_NONE (program.py: SM sharing), as int8."""
    table = program.table()
    occupying_kind = np.array([k in program.sm_comm_kinds for k in table.kind_names], bool)
    shared_stream = np.array([s == SM_SHARED_STREAM for s in table.stream_names], bool)
    n = len(table)
    if n == 0:
        return np.zeros(0, np.int8)
    occupies = occupying_kind[table.kind_code] & ((table.duration_s > 0) | (table.comm_bytes > 0))
    slowed = shared_stream[table.stream_code] & ~occupying_kind[table.kind_code]
    roles = np.full(n, SM_NONE, np.int8)
    roles[occupies] = SM_OCCUPIES
    roles[slowed] = SM_SLOWED
    return roles


@dataclass(frozen=True, kw_only=True, slots=True)
class FrozenProgram:
    """A Program as flat numpy arrays for compiled engines (see program.py's semantics).

    Per-task arrays have length `num_tasks`. Variable-length per-task lists are CSR pairs:
    task t's members are `member_rank[member_ptr[t]:member_ptr[t+1]]`, likewise deps and links.
    Queues are the (rank, stream) FIFOs, sorted by (rank, stream code); queue q holds
    `queue_task[queue_ptr[q]:queue_ptr[q+1]]` in execution order, and `member_queue` /
    `member_pos` give, aligned with `member_rank`, the queue of each member and the task's
    position in it.
    """

    num_ranks: int
    num_tasks: int
    kind_names: tuple[str, ...]
    """Code table: `kind_code[t]` indexes this (first-appearance order)."""
    stream_names: tuple[str, ...]
    """Code table: `stream_code[t]` indexes this (first-appearance order)."""
    link_names: tuple[str, ...]
    """Code table for `link_idx` (sorted link ids)."""
    kind_code: np.ndarray
    stream_code: np.ndarray
    stream_powered: np.ndarray
    """Per stream code: True when its tasks' power counts toward energy."""
    duration_s: np.ndarray
    comm_bytes: np.ndarray
    mem_alloc_bytes: np.ndarray
    mem_free_bytes: np.ndarray
    power_w: np.ndarray
    freq_mhz: np.ndarray
    """NaN where the task has no frequency."""
    micro_batch: np.ndarray
    stage: np.ndarray
    first_layer: np.ndarray
    last_layer: np.ndarray
    member_ptr: np.ndarray
    member_rank: np.ndarray
    member_queue: np.ndarray
    member_pos: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    link_ptr: np.ndarray
    link_idx: np.ndarray
    link_bandwidth_bytes_per_s: np.ndarray
    link_slot: np.ndarray
    """Per link code: its physical link's index (`link_slots`: shared links)."""
    link_copies: np.ndarray
    """Per link code: the copies n of a shared link id ``l/n`` (1 for a plain link)."""
    queue_ptr: np.ndarray
    queue_task: np.ndarray
    queue_rank: np.ndarray
    queue_stream: np.ndarray
    static_memory_bytes: np.ndarray
    memory_capacity_bytes: np.ndarray
    idle_power_w: np.ndarray
    comm_sm_fraction: np.ndarray
    """Per rank: φ (program.py: SM sharing)."""
    sm_role: np.ndarray
    """Per task: SM_OCCUPIES, SM_SLOWED or SM_NONE (`sm_roles`)."""

    @classmethod
    def from_program(cls, program: Program) -> FrozenProgram:
        """Flatten `program` (validated structurally first)."""
        program.validate(check_cycles=False)
        table = program.table()
        n = len(table)
        kind_code, kind_names = _first_appearance(table.kind_code, table.kind_names)
        stream_code, stream_names = _first_appearance(table.stream_code, table.stream_names)
        link_names = tuple(sorted(program.link_bandwidth_bytes_per_s))
        link_code = {name: i for i, name in enumerate(link_names)}
        remap = np.array([link_code[name] for name in table.link_names], dtype=np.int32)
        slot, copies = link_slots(link_names)
        # The table's columns are shared, not copied: neither a TaskTable nor a FrozenProgram
        # is written after it is built (copying them was a tenth of a second at 1.2 M tasks).
        link_ptr = table.link_ptr
        link_idx = remap[table.link_idx] if len(table.link_idx) else np.zeros(0, np.int32)
        member_ptr, member_rank = table.member_ptr, table.member_rank
        dep_ptr, dep_idx = table.dep_ptr, table.dep_idx
        # Queues: one per (rank, stream) pair, sorted by (rank, stream code).
        num_streams = max(len(stream_names), 1)
        if compiled(len(member_rank)):  # the same arrays, one compiled counting pass
            from trainsim.simulator.csr_numba import queues  # deferred: start-up time (numba)

            queue_ptr, queue_task, queue_keys, member_queue, member_pos = queues(
                member_ptr, member_rank, stream_code, num_streams, program.num_ranks)
        else:
            queue_ptr, queue_task, queue_keys, member_queue, member_pos = _queues(
                n, member_ptr, member_rank, stream_code, num_streams)
        return cls(
            num_ranks=program.num_ranks,
            num_tasks=n,
            kind_names=kind_names,
            stream_names=stream_names,
            link_names=link_names,
            kind_code=kind_code,
            stream_code=stream_code,
            stream_powered=np.array([s in program.powered_streams for s in stream_names], bool),
            duration_s=table.duration_s,
            comm_bytes=table.comm_bytes,
            mem_alloc_bytes=table.mem_alloc_bytes,
            mem_free_bytes=table.mem_free_bytes,
            power_w=table.power_w,
            freq_mhz=table.freq_mhz,
            micro_batch=table.micro_batch,
            stage=table.stage,
            first_layer=table.first_layer,
            last_layer=table.last_layer,
            member_ptr=member_ptr,
            member_rank=member_rank,
            member_queue=member_queue,
            member_pos=member_pos,
            dep_ptr=dep_ptr,
            dep_idx=dep_idx,
            link_ptr=link_ptr,
            link_idx=link_idx,
            link_bandwidth_bytes_per_s=np.array(
                [program.link_bandwidth_bytes_per_s[name] for name in link_names], np.float64
            ),
            link_slot=slot,
            link_copies=copies,
            queue_ptr=queue_ptr,
            queue_task=queue_task,
            queue_rank=(queue_keys // num_streams).astype(np.int32),
            queue_stream=(queue_keys % num_streams).astype(np.int32),
            static_memory_bytes=np.array(program.static_memory_bytes, dtype=np.float64),
            memory_capacity_bytes=np.array(program.memory_capacity_bytes, dtype=np.float64),
            idle_power_w=np.array(program.idle_power_w, dtype=np.float64),
            comm_sm_fraction=np.array(program.comm_sm_fraction, dtype=np.float64),
            sm_role=sm_roles(program),
        )

    def lone_transfer_s(self) -> np.ndarray:
        """Per task: comm_bytes over its bottleneck link's full bandwidth (0 with no bytes)."""
        out = np.zeros(self.num_tasks, dtype=np.float64)
        for t in np.flatnonzero(self.comm_bytes > 0):
            bws = self.link_bandwidth_bytes_per_s[
                self.link_idx[self.link_ptr[t] : self.link_ptr[t + 1]]
            ]
            out[t] = self.comm_bytes[t] / bws.min()
        return out
