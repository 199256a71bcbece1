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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from trainsim.errors import SimulationError

#: Streams drawn first, in this order, by the exporters; other names follow alphabetically.
CONVENTIONAL_STREAMS: tuple[str, ...] = ("compute", "tp", "pp", "dp")

#: Task kinds used by the built-in lowering. Any other non-empty name is allowed too.
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
)


def _check_number(owner: str, name: str, value: float, *, allow_inf: bool = False) -> None:
    """Raise SimulationError unless `value` is a finite (or +inf if allowed) number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SimulationError(f"{owner}: {name}={value!r} is not a number")
    if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_inf):
        raise SimulationError(f"{owner}: {name}={value!r} must be a finite number >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """One unit of work on one or more ranks: a kernel, a collective or a transfer."""

    name: str
    """Human-readable label, e.g. "s1.F3" (stage 1, forward of micro-batch 3)."""
    kind: str
    """What the task is: "forward", "backward", "all_reduce", "p2p", ... (see KNOWN_KINDS)."""
    ranks: tuple[int, ...]
    """Member ranks: one for local work, two or more for a rendezvous (collective, transfer)."""
    stream: str
    """Stream name on every member rank ("compute", "tp", "pp", "dp" by convention)."""
    duration_s: float
    """Fixed part: compute time, or a collective's latency α, run before any transfer."""
    comm_bytes: float = 0.0
    """Bytes moved over EACH of `links` after the fixed part, in the fluid sharing model."""
    links: tuple[str, ...] = ()
    """Ids of the links the transfer crosses (distinct); the bottleneck sets its rate."""
    deps: tuple[int, ...] = ()
    """Indices of tasks that must end before this one starts."""
    mem_alloc_bytes: float = 0.0
    """Bytes allocated at start on every member rank."""
    mem_free_bytes: float = 0.0
    """Bytes freed at end on every member rank."""
    power_w: float = 0.0
    """Rank power while the task runs (at least its idle power, physically); counted only on the
    program's powered streams."""
    freq_mhz: float | None = None
    """SM clock the task runs at, for reports; None when not set (communication, default)."""
    micro_batch: int = -1
    """Micro-batch index, -1 when not tied to one."""
    stage: int = -1
    """Pipeline stage (virtual stage index under interleaving), -1 when none."""
    first_layer: int = -1
    """First model layer the task covers, -1 when none."""
    last_layer: int = -1
    """Last model layer the task covers (inclusive), -1 when none."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SimulationError(f"task name={self.name!r} must be a non-empty string")
        owner = f"task {self.name!r}"
        for seq_field in ("ranks", "links", "deps"):  # accept lists, store tuples
            if isinstance(getattr(self, seq_field), list):
                object.__setattr__(self, seq_field, tuple(getattr(self, seq_field)))
        if not isinstance(self.kind, str) or not self.kind:
            raise SimulationError(f"{owner}: kind={self.kind!r} must be a non-empty string")
        if not isinstance(self.stream, str) or not self.stream:
            raise SimulationError(f"{owner}: stream={self.stream!r} must be a non-empty string")
        if not isinstance(self.ranks, tuple) or not self.ranks:
            raise SimulationError(f"{owner}: ranks={self.ranks!r} must be a non-empty tuple")
        if len(set(self.ranks)) != len(self.ranks):
            raise SimulationError(f"{owner}: ranks={self.ranks!r} has a repeated rank")
        for rank in self.ranks:
            if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
                raise SimulationError(f"{owner}: ranks={self.ranks!r} must be integers >= 0")
        if not isinstance(self.links, tuple) or len(set(self.links)) != len(self.links):
            raise SimulationError(f"{owner}: links={self.links!r} must be a tuple of distinct ids")
        if not isinstance(self.deps, tuple):
            raise SimulationError(f"{owner}: deps={self.deps!r} must be a tuple of task indices")
        _check_number(owner, "duration_s", self.duration_s)
        _check_number(owner, "comm_bytes", self.comm_bytes)
        _check_number(owner, "mem_alloc_bytes", self.mem_alloc_bytes)
        _check_number(owner, "mem_free_bytes", self.mem_free_bytes)
        _check_number(owner, "power_w", self.power_w)
        if self.freq_mhz is not None:
            _check_number(owner, "freq_mhz", self.freq_mhz)
        if self.comm_bytes > 0 and not self.links:
            raise SimulationError(
                f"{owner}: comm_bytes={self.comm_bytes!r} > 0 needs at least one link in links"
            )


_TASK_FIELDS = ("name", "kind", "ranks", "stream", "duration_s", "comm_bytes", "links", "deps",
                "mem_alloc_bytes", "mem_free_bytes", "power_w", "freq_mhz", "micro_batch",
                "stage", "first_layer", "last_layer")


def trusted_task(values: tuple) -> Task:
    """A Task from `values` in `_TASK_FIELDS` order, skipping the per-field checks.

    For producers that build tasks from already-checked numbers (the lowering emits tens of
    thousands per plan, and the checks were a third of its time); `Program.validate()` still
    checks such a program as a whole.
    """
    task = object.__new__(Task)
    for name, value in zip(_TASK_FIELDS, values):
        object.__setattr__(task, name, value)
    return task


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
        _check_number("program", f"{name}[{rank}]", value, allow_inf=True)
    return tuple(float(v) for v in values)


@dataclass(frozen=True, kw_only=True, slots=True)
class Program:
    """One iteration as tasks on per-rank streams; see the module docstring for semantics."""

    num_ranks: int
    """Number of program ranks (after folding)."""
    tasks: list[Task] = field(default_factory=list)
    """All tasks; a task's id is its index here."""
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
    metadata: dict = field(default_factory=dict)
    """Free-form: model, plan, global_batch, seq_len, model_flops_per_iteration,
    peak_flops_per_rank, gpu_names, ... (see result.py for the keys read there)."""

    def __post_init__(self) -> None:
        if isinstance(self.num_ranks, bool) or not isinstance(self.num_ranks, int):
            raise SimulationError(f"program: num_ranks={self.num_ranks!r} must be an integer")
        if self.num_ranks < 1:
            raise SimulationError(f"program: num_ranks={self.num_ranks} must be >= 1")
        if not isinstance(self.tasks, list):
            object.__setattr__(self, "tasks", list(self.tasks))
        for link, bandwidth in self.link_bandwidth_bytes_per_s.items():
            _check_number("program", f"link_bandwidth_bytes_per_s[{link!r}]", bandwidth)
            if bandwidth <= 0:
                raise SimulationError(
                    f"program: link_bandwidth_bytes_per_s[{link!r}]={bandwidth!r} must be > 0"
                )
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
        return f"{task_id} {self.tasks[task_id].name!r}"

    def validate(self, *, check_cycles: bool = True) -> None:
        """Check cross-task consistency, raising SimulationError naming the first bad task.

        Checks every task's own fields again (tasks made by `trusted_task` skipped that), member
        ranks in range, dep indices in range and not self, and links known. With `check_cycles`,
        also rejects a cycle in the dependency graph (engines skip that and report every
        deadlock, including dep cycles, with the stuck ranks instead).
        """
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
        if check_cycles:
            cycle = _find_dep_cycle(self)
            if cycle:
                path = " -> ".join(self.describe(t) for t in cycle[:12])
                more = " -> ..." if len(cycle) > 12 else ""
                raise SimulationError(f"program: dependency cycle {path}{more}")

    def freeze(self) -> FrozenProgram:
        """Return the program as numpy struct-of-arrays (no Python object per task)."""
        return FrozenProgram.from_program(self)


def _find_dep_cycle(program: Program) -> list[int]:
    """Return one dependency cycle as task ids (first repeated at the end), or [] if acyclic."""
    n = len(program.tasks)
    state = bytearray(n)  # 0 new, 1 on stack, 2 done
    for root in range(n):
        if state[root]:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            tid, i = stack[-1]
            deps = program.tasks[tid].deps
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


class ProgramBuilder:
    """Accumulates tasks for lowering: `add(task) -> id`, then `build(...) -> Program`."""

    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self.tasks: list[Task] = []
        self.link_bandwidth_bytes_per_s: dict[str, float] = {}

    def add(self, task: Task) -> int:
        """Append `task` and return its id (its index)."""
        self.tasks.append(task)
        return len(self.tasks) - 1

    def add_link(self, link_id: str, bandwidth_bytes_per_s: float) -> str:
        """Declare a link (idempotent for the same bandwidth) and return its id."""
        known = self.link_bandwidth_bytes_per_s.get(link_id)
        if known is not None and known != bandwidth_bytes_per_s:
            raise SimulationError(
                f"link {link_id!r} declared with bandwidth {bandwidth_bytes_per_s!r} "
                f"and {known!r} bytes/s"
            )
        self.link_bandwidth_bytes_per_s[link_id] = float(bandwidth_bytes_per_s)
        return link_id

    def build(self, **program_fields: object) -> Program:
        """Return the Program with the added tasks and links plus the given fields."""
        links = dict(self.link_bandwidth_bytes_per_s)
        links.update(program_fields.pop("link_bandwidth_bytes_per_s", {}) or {})  # type: ignore[arg-type]
        return Program(
            num_ranks=self.num_ranks,
            tasks=list(self.tasks),
            link_bandwidth_bytes_per_s=links,
            **program_fields,  # type: ignore[arg-type]
        )


def _csr(rows: Iterable[Iterable[int]], dtype: type = np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Pack rows of integers into (ptr, values) compressed sparse rows."""
    ptr = [0]
    values: list[int] = []
    for row in rows:
        values.extend(row)
        ptr.append(len(values))
    return np.asarray(ptr, dtype=np.int64), np.asarray(values, dtype=dtype)


def stream_display_order(names: Iterable[str]) -> list[str]:
    """Conventional streams first (compute, tp, pp, dp), then the rest alphabetically."""
    names = set(names)
    first = [s for s in CONVENTIONAL_STREAMS if s in names]
    return first + sorted(names - set(first))


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
    queue_ptr: np.ndarray
    queue_task: np.ndarray
    queue_rank: np.ndarray
    queue_stream: np.ndarray
    static_memory_bytes: np.ndarray
    memory_capacity_bytes: np.ndarray
    idle_power_w: np.ndarray

    @classmethod
    def from_program(cls, program: Program) -> FrozenProgram:
        """Flatten `program` (validated structurally first)."""
        program.validate(check_cycles=False)
        tasks = program.tasks
        n = len(tasks)
        kinds: dict[str, int] = {}
        streams: dict[str, int] = {}
        link_names = tuple(sorted(program.link_bandwidth_bytes_per_s))
        link_code = {name: i for i, name in enumerate(link_names)}
        kind_code = np.empty(n, dtype=np.int32)
        stream_code = np.empty(n, dtype=np.int32)
        for t, task in enumerate(tasks):
            kind_code[t] = kinds.setdefault(task.kind, len(kinds))
            stream_code[t] = streams.setdefault(task.stream, len(streams))
        member_ptr, member_rank = _csr((task.ranks for task in tasks), np.int32)
        dep_ptr, dep_idx = _csr((task.deps for task in tasks), np.int64)
        link_ptr, link_idx = _csr(
            ((link_code[link] for link in task.links) for task in tasks), np.int32
        )
        # Queues: one per (rank, stream) pair, sorted by (rank, stream code).
        member_stream = np.repeat(stream_code, np.diff(member_ptr))
        member_task = np.repeat(np.arange(n, dtype=np.int64), np.diff(member_ptr))
        num_streams = max(len(streams), 1)
        key = member_rank.astype(np.int64) * num_streams + member_stream
        order = np.lexsort((member_task, key))
        sorted_key = key[order]
        starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]]) if n else []
        queue_ptr = np.r_[np.asarray(starts, dtype=np.int64), len(sorted_key)].astype(np.int64)
        queue_task = member_task[order]
        queue_keys = sorted_key[np.asarray(starts, dtype=np.int64)] if n else np.empty(0, np.int64)
        queue_of_sorted = np.repeat(np.arange(len(queue_keys)), np.diff(queue_ptr))
        member_queue = np.empty(len(member_rank), dtype=np.int32)
        member_pos = np.empty(len(member_rank), dtype=np.int64)
        member_queue[order] = queue_of_sorted
        member_pos[order] = np.arange(len(order), dtype=np.int64) - queue_ptr[queue_of_sorted]
        stream_list = list(streams)
        return cls(
            num_ranks=program.num_ranks,
            num_tasks=n,
            kind_names=tuple(kinds),
            stream_names=tuple(stream_list),
            link_names=link_names,
            kind_code=kind_code,
            stream_code=stream_code,
            stream_powered=np.array([s in program.powered_streams for s in stream_list], bool),
            duration_s=np.array([t.duration_s for t in tasks], dtype=np.float64),
            comm_bytes=np.array([t.comm_bytes for t in tasks], dtype=np.float64),
            mem_alloc_bytes=np.array([t.mem_alloc_bytes for t in tasks], dtype=np.float64),
            mem_free_bytes=np.array([t.mem_free_bytes for t in tasks], dtype=np.float64),
            power_w=np.array([t.power_w for t in tasks], dtype=np.float64),
            freq_mhz=np.array(
                [math.nan if t.freq_mhz is None else t.freq_mhz for t in tasks], dtype=np.float64
            ),
            micro_batch=np.array([t.micro_batch for t in tasks], dtype=np.int64),
            stage=np.array([t.stage for t in tasks], dtype=np.int64),
            first_layer=np.array([t.first_layer for t in tasks], dtype=np.int64),
            last_layer=np.array([t.last_layer for t in tasks], dtype=np.int64),
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
            queue_ptr=queue_ptr,
            queue_task=queue_task,
            queue_rank=(queue_keys // num_streams).astype(np.int32),
            queue_stream=(queue_keys % num_streams).astype(np.int32),
            static_memory_bytes=np.array(program.static_memory_bytes, dtype=np.float64),
            memory_capacity_bytes=np.array(program.memory_capacity_bytes, dtype=np.float64),
            idle_power_w=np.array(program.idle_power_w, dtype=np.float64),
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
