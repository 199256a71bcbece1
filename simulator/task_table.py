"""Tasks as columns: the storage behind a lowered Program (issue 4: fast lowering).

A lowered iteration has tens of thousands (folded) to about a million (unfolded) tasks. Making
one `Task` object per task was most of the lowering's time, and `Program.freeze()` then walked
those objects again to build the engines' arrays. A `TaskTable` holds the same tasks as numpy
columns — codes into small name tables for kind, stream, link and name, CSR pairs for the
variable-length ranks, links and deps — so lowering appends plain numbers
(`TaskTableBuilder`) and freezing is a handful of array operations.

The table is also a read-only `Sequence[Task]`: `table[i]` and iteration give ordinary `Task`
objects, made once on first access and cached, so the SimPy reference engine, exporters and tests
read a lowered program exactly as one built from `Task` objects.

Names are stored as (template, argument) pairs: a task's name is `template % arg` when
`arg >= 0` (lowering's "s3.F%d" with the micro-batch index), else the template itself. Names
are formatted only when asked for (`names()`, `Task.name`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from trainsim.errors import SimulationError
from trainsim.simulator.task import Task, trusted_task

_FLOAT_COLUMNS = ("duration_s", "comm_bytes", "mem_alloc_bytes", "mem_free_bytes", "power_w")
_INT_COLUMNS = ("micro_batch", "stage", "first_layer", "last_layer")


class TaskTable(Sequence[Task]):
    """Tasks as numpy columns; also a read-only sequence of `Task` (materialised lazily).

    Per-task arrays have one entry per task. Task t's member ranks are
    `member_rank[member_ptr[t]:member_ptr[t+1]]`, its links `link_names[link_idx[...]]` over
    `link_ptr`, its deps `dep_idx[...]` over `dep_ptr` (in the order they were added).
    `freq_mhz` is NaN where the task has none.
    """

    __slots__ = (
        "_tasks",
        "comm_bytes",
        "dep_idx",
        "dep_ptr",
        "duration_s",
        "first_layer",
        "freq_mhz",
        "kind_code",
        "kind_names",
        "last_layer",
        "link_idx",
        "link_names",
        "link_ptr",
        "mem_alloc_bytes",
        "mem_free_bytes",
        "member_ptr",
        "member_rank",
        "micro_batch",
        "name_arg",
        "name_code",
        "name_templates",
        "power_w",
        "stage",
        "stream_code",
        "stream_names",
    )

    def __init__(self, *, name_templates: Sequence[str], name_code: np.ndarray,
                 name_arg: np.ndarray, kind_names: Sequence[str], kind_code: np.ndarray,
                 stream_names: Sequence[str], stream_code: np.ndarray,
                 link_names: Sequence[str], member_ptr: np.ndarray, member_rank: np.ndarray,
                 link_ptr: np.ndarray, link_idx: np.ndarray, dep_ptr: np.ndarray,
                 dep_idx: np.ndarray, duration_s: np.ndarray, comm_bytes: np.ndarray,
                 mem_alloc_bytes: np.ndarray, mem_free_bytes: np.ndarray, power_w: np.ndarray,
                 freq_mhz: np.ndarray, micro_batch: np.ndarray, stage: np.ndarray,
                 first_layer: np.ndarray, last_layer: np.ndarray) -> None:
        self.name_templates = tuple(name_templates)
        self.kind_names = tuple(kind_names)
        self.stream_names = tuple(stream_names)
        self.link_names = tuple(link_names)
        i32, i64, f64 = np.int32, np.int64, np.float64
        self.name_code = np.asarray(name_code, i32)
        self.name_arg = np.asarray(name_arg, i64)
        self.kind_code = np.asarray(kind_code, i32)
        self.stream_code = np.asarray(stream_code, i32)
        self.member_ptr = np.asarray(member_ptr, i64)
        self.member_rank = np.asarray(member_rank, i32)
        self.link_ptr = np.asarray(link_ptr, i64)
        self.link_idx = np.asarray(link_idx, i32)
        self.dep_ptr = np.asarray(dep_ptr, i64)
        self.dep_idx = np.asarray(dep_idx, i64)
        self.duration_s = np.asarray(duration_s, f64)
        self.comm_bytes = np.asarray(comm_bytes, f64)
        self.mem_alloc_bytes = np.asarray(mem_alloc_bytes, f64)
        self.mem_free_bytes = np.asarray(mem_free_bytes, f64)
        self.power_w = np.asarray(power_w, f64)
        self.freq_mhz = np.asarray(freq_mhz, f64)
        self.micro_batch = np.asarray(micro_batch, i64)
        self.stage = np.asarray(stage, i64)
        self.first_layer = np.asarray(first_layer, i64)
        self.last_layer = np.asarray(last_layer, i64)
        self._tasks: list[Task] | None = None
        n = len(self.kind_code)
        for name in ("name_code", "name_arg", "stream_code", *_FLOAT_COLUMNS, "freq_mhz",
                     *_INT_COLUMNS):
            if len(getattr(self, name)) != n:
                raise SimulationError(f"task table: column {name} has {len(getattr(self, name))}"
                                      f" entries, expected {n}")
        for ptr, values, name in ((self.member_ptr, self.member_rank, "member"),
                                  (self.link_ptr, self.link_idx, "link"),
                                  (self.dep_ptr, self.dep_idx, "dep")):
            if len(ptr) != n + 1 or ptr[0] != 0 or ptr[-1] != len(values) \
                    or (n and np.any(np.diff(ptr) < 0)):
                raise SimulationError(f"task table: {name}_ptr is not a CSR pointer over "
                                      f"{len(values)} values for {n} tasks")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_tasks(cls, tasks: Sequence[Task]) -> TaskTable:
        """The columns of `tasks` (codes in first-appearance order; each name literal)."""
        names: dict[str, int] = {}
        kinds: dict[str, int] = {}
        streams: dict[str, int] = {}
        links: dict[str, int] = {}
        name_code = [names.setdefault(t.name, len(names)) for t in tasks]
        kind_code = [kinds.setdefault(t.kind, len(kinds)) for t in tasks]
        stream_code = [streams.setdefault(t.stream, len(streams)) for t in tasks]
        member_ptr, member_rank = _csr([t.ranks for t in tasks])
        link_ptr, link_idx = _csr([[links.setdefault(x, len(links)) for x in t.links]
                                   for t in tasks])
        dep_ptr, dep_idx = _csr([t.deps for t in tasks])
        return cls(
            name_templates=list(names), name_code=np.asarray(name_code, np.int32),
            name_arg=np.full(len(tasks), -1, np.int64), kind_names=list(kinds),
            kind_code=np.asarray(kind_code, np.int32), stream_names=list(streams),
            stream_code=np.asarray(stream_code, np.int32), link_names=list(links),
            member_ptr=member_ptr, member_rank=member_rank, link_ptr=link_ptr,
            link_idx=link_idx, dep_ptr=dep_ptr, dep_idx=dep_idx,
            **{c: np.array([getattr(t, c) for t in tasks], np.float64) for c in _FLOAT_COLUMNS},
            freq_mhz=np.array([math.nan if t.freq_mhz is None else t.freq_mhz for t in tasks],
                              np.float64),
            **{c: np.array([getattr(t, c) for t in tasks], np.int64) for c in _INT_COLUMNS},
        )

    # ------------------------------------------------------------------ sequence of Task
    def __len__(self) -> int:
        return len(self.kind_code)

    @overload
    def __getitem__(self, index: int) -> Task: ...

    @overload
    def __getitem__(self, index: slice) -> list[Task]: ...

    def __getitem__(self, index: int | slice) -> Task | list[Task]:
        return self.materialise()[index]

    def __iter__(self) -> Iterator[Task]:
        return iter(self.materialise())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (TaskTable, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable cache; compared by value

    def __repr__(self) -> str:
        return f"TaskTable({len(self)} tasks)"

    def materialise(self) -> list[Task]:
        """Every task as a `Task` object (built once, then cached): for readers that want
        objects (the SimPy engine, exporters, tests); compiled engines read the columns."""
        if self._tasks is None:
            self._tasks = self._build_tasks()
        return self._tasks

    def names(self) -> list[str]:
        """Every task's name, formatted from its template and argument."""
        templates = self.name_templates
        return [templates[c] if a < 0 else templates[c] % a
                for c, a in zip(self.name_code.tolist(), self.name_arg.tolist())]

    def name(self, task_id: int) -> str:
        """One task's name."""
        template: str = self.name_templates[self.name_code[task_id]]
        arg = int(self.name_arg[task_id])
        return template if arg < 0 else template % arg

    def _build_tasks(self) -> list[Task]:
        names = self.names()
        kinds = [self.kind_names[c] for c in self.kind_code.tolist()]
        streams = [self.stream_names[c] for c in self.stream_code.tolist()]
        ranks = _split(self.member_ptr, self.member_rank.tolist())
        link_names = self.link_names
        links = [tuple(link_names[i] for i in row)
                 for row in _split(self.link_ptr, self.link_idx.tolist())]
        deps = _split(self.dep_ptr, self.dep_idx.tolist())
        freq = [None if math.isnan(f) else f for f in self.freq_mhz.tolist()]
        cols = [names, kinds, ranks, streams, self.duration_s.tolist(),
                self.comm_bytes.tolist(), links, deps, self.mem_alloc_bytes.tolist(),
                self.mem_free_bytes.tolist(), self.power_w.tolist(), freq,
                self.micro_batch.tolist(), self.stage.tolist(), self.first_layer.tolist(),
                self.last_layer.tolist()]
        return [trusted_task(values) for values in zip(*cols)]

    # ------------------------------------------------------------------ checks
    def first_bad_task(self, num_ranks: int, known_links: set[str] | dict[str, float]
                       ) -> tuple[int, str] | None:
        """(task id, what is wrong) of the first task breaking a structural rule, or None.

        The vectorised twin of `Task.__post_init__` plus `Program.validate`'s range checks:
        numbers finite and >= 0, ranks distinct, in range and non-empty, deps in range and not
        self, links known, bytes only with links, non-empty names.
        """
        n = len(self)
        bad = np.zeros(n, dtype=bool)
        why = [""] * 0
        checks: list[tuple[np.ndarray, str]] = []
        for col in _FLOAT_COLUMNS:
            values = getattr(self, col)
            checks.append((~(np.isfinite(values) & (values >= 0)), (f"{col} must be a finite "
                                                                   f"number >= 0")))
        f = self.freq_mhz
        checks.append((~np.isnan(f) & ~(np.isfinite(f) & (f >= 0)),
                       "freq_mhz must be a finite number >= 0"))
        counts = np.diff(self.member_ptr)
        checks.append((counts == 0, "ranks must be a non-empty tuple"))
        owner = np.repeat(np.arange(n, dtype=np.int64), counts)
        out = (self.member_rank < 0) | (self.member_rank >= num_ranks)
        checks.append((_any_row(owner[out], n), f"rank out of range (num_ranks={num_ranks})"))
        if len(self.member_rank):
            checks.append((_repeats(self.member_ptr, self.member_rank, owner, n),
                           "ranks has a repeated rank"))
        dep_owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.dep_ptr))
        checks.append((_any_row(dep_owner[(self.dep_idx < 0) | (self.dep_idx >= n)], n),
                       f"dep out of range (0..{n - 1})"))
        checks.append((_any_row(dep_owner[self.dep_idx == dep_owner], n), "depends on itself"))
        unknown = np.array([name not in known_links for name in self.link_names], dtype=bool)
        link_owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.link_ptr))
        if unknown.any():
            checks.append((_any_row(link_owner[unknown[self.link_idx]], n), "unknown link"))
        if len(self.link_idx):
            checks.append((_repeats(self.link_ptr, self.link_idx, link_owner, n),
                           "links must be distinct ids"))
        checks.append(((self.comm_bytes > 0) & (np.diff(self.link_ptr) == 0),
                       "comm_bytes > 0 needs at least one link in links"))
        empty = np.array([not t for t in self.name_templates], dtype=bool)
        if empty.any():
            checks.append((empty[self.name_code], "name must be a non-empty string"))
        first: tuple[int, str] | None = None
        for mask, message in checks:
            bad = np.flatnonzero(mask)
            if len(bad) and (first is None or bad[0] < first[0]):
                first = (int(bad[0]), message)
        del why
        return first


def _repeats(ptr: np.ndarray, values: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """Per task, whether its CSR row (`values[ptr[t]:ptr[t+1]]`, owners `owner`) repeats a
    value: sorted within rows by numpy, or for a large table by a compiled look along each
    row (csr_numba.py)."""
    if compiled(len(values)):
        from trainsim.simulator.csr_numba import rows_with_repeats  # deferred: start-up time

        return rows_with_repeats(ptr, values)
    if len(values) and int(values.min()) >= 0:
        # one sort of (owner, value) packed in an int64 (values are small ids): equal
        # neighbours are a row's repeats, as the lexsort below finds them
        span = int(values.max()) + 1
        packed = np.sort(owner.astype(np.int64) * span + values)
        return _any_row(packed[1:][packed[1:] == packed[:-1]] // span, n)
    order = np.lexsort((values, owner))
    o, v = owner[order], values[order]
    dup = (o[1:] == o[:-1]) & (v[1:] == v[:-1])
    return _any_row(o[1:][dup], n)


COMPILED_FROM = 200_000
"""Entries (deps, members, links) from which the compiled CSR kernels of csr_numba.py replace
numpy: `_repeats` and the late-dep merge here, the code tables and queues of
`FrozenProgram.from_program`, the engine's reversed dependencies and the result's per-rank
orders (result.py). They pay off on unfolded programs of hundreds of thousands of tasks; below
this numpy is quick enough for one program, and a small run (the Quickstart's 7,172 tasks)
then does not compile them on a machine's first run (about a second of numba compilation,
bench/engine.py cold)."""
COMPILED_FOR_MANY = 1_000
"""The threshold once a caller evaluates many programs (`use_compiled_kernels`: the Oracle):
the one-off compilation is then shared by every plan. On bench/oracle.py's plan streams
(2026-11-27) the compiled passes took an evaluation of GPT-3 175B's Aceso moves from 50.6 to
43.8 ms and one of the 1.3B grid from 5.05 to 4.05 ms."""
_THRESHOLD = [COMPILED_FROM]


def compiled(entries: int) -> bool:
    """Whether a CSR pass over `entries` items runs the compiled kernels (csr_numba.py)."""
    return entries >= _THRESHOLD[0]


def use_compiled_kernels() -> None:
    """From now on, in this process, run the compiled CSR kernels from `COMPILED_FOR_MANY`
    entries on (their results are numpy's; tests/simulator/test_csr_numba.py). Process-wide
    and not undone: after an Oracle, a single `simulate` compiles them too (once per machine;
    numba caches them on disk). The kernels are loaded now (`csr_numba.load_kernels`), once
    per process, rather than by the first program past the threshold."""
    from trainsim.simulator.csr_numba import load_kernels  # deferred: start-up time (numba)

    _THRESHOLD[0] = COMPILED_FOR_MANY
    load_kernels()


def _any_row(rows: np.ndarray, n: int) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return mask


def _split(ptr: np.ndarray, values: list[Any]) -> list[tuple[Any, ...]]:
    bounds = ptr.tolist()
    return [tuple(values[a:b]) for a, b in itertools.pairwise(bounds)]


def _csr(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=ptr[1:])
    flat = [x for r in rows for x in r]
    return ptr, np.asarray(flat, dtype=np.int64)


class TaskTableBuilder:
    """Appends tasks as numbers to column lists; `build()` returns the `TaskTable`.

    Codes for names, kinds, streams and links are interned with `name_template()`, `kind()`,
    `stream()` and `link()`. `add` takes everything already coded, so a producer that emits the
    same block of tasks many times (lowering) computes the codes once and appends numbers.
    Deps may be added later with `add_dep` (a receiver's dep on a transfer created after it); a
    task's deps keep the order they were given in, late ones last.
    """

    def __init__(self) -> None:
        self._names: dict[str, int] = {}
        self._kinds: dict[str, int] = {}
        self._streams: dict[str, int] = {}
        self._links: dict[str, int] = {}
        self.name_code: list[int] = []
        self.name_arg: list[int] = []
        self.kind_code: list[int] = []
        self.stream_code: list[int] = []
        self.member_count: list[int] = []
        self.member_rank: list[int] = []
        self.link_count: list[int] = []
        self.link_idx: list[int] = []
        self.dep_count: list[int] = []
        self.dep_idx: list[int] = []
        self.late_owner: list[int] = []
        self.late_dep: list[int] = []
        self.duration_s: list[float] = []
        self.comm_bytes: list[float] = []
        self.mem_alloc_bytes: list[float] = []
        self.mem_free_bytes: list[float] = []
        self.power_w: list[float] = []
        self.freq_mhz: list[float] = []
        self.micro_batch: list[int] = []
        self.stage: list[int] = []
        self.first_layer: list[int] = []
        self.last_layer: list[int] = []

    def __len__(self) -> int:
        return len(self.kind_code)

    def name_template(self, template: str) -> int:
        """Code of a name template ("s3.F%d" formatted with the argument, or a literal)."""
        return self._names.setdefault(template, len(self._names))

    def kind(self, name: str) -> int:
        """Code of a task kind."""
        return self._kinds.setdefault(name, len(self._kinds))

    def stream(self, name: str) -> int:
        """Code of a stream name."""
        return self._streams.setdefault(name, len(self._streams))

    def link(self, name: str) -> int:
        """Code of a link id."""
        return self._links.setdefault(name, len(self._links))

    def add(self, name: int, arg: int, kind: int, stream: int, ranks: Sequence[int],
            duration_s: float, comm_bytes: float, links: Sequence[int], deps: Sequence[int],
            alloc_bytes: float, free_bytes: float, power_w: float, freq_mhz: float,
            micro_batch: int, stage: int, first_layer: int, last_layer: int) -> int:
        """Append one task (codes from this builder; freq NaN = none); return its id."""
        tid = len(self.kind_code)
        self.name_code.append(name)
        self.name_arg.append(arg)
        self.kind_code.append(kind)
        self.stream_code.append(stream)
        self.member_count.append(len(ranks))
        self.member_rank.extend(ranks)
        self.link_count.append(len(links))
        self.link_idx.extend(links)
        self.dep_count.append(len(deps))
        self.dep_idx.extend(deps)
        self.duration_s.append(duration_s)
        self.comm_bytes.append(comm_bytes)
        self.mem_alloc_bytes.append(alloc_bytes)
        self.mem_free_bytes.append(free_bytes)
        self.power_w.append(power_w)
        self.freq_mhz.append(freq_mhz)
        self.micro_batch.append(micro_batch)
        self.stage.append(stage)
        self.first_layer.append(first_layer)
        self.last_layer.append(last_layer)
        return tid

    def add_dep(self, task: int, dep: int) -> None:
        """Add a dep to an existing task, after the deps it already has."""
        self.late_owner.append(task)
        self.late_dep.append(dep)

    def build(self) -> TaskTable:
        """The table of every added task."""
        n = len(self.kind_code)

        def ptr(counts: list[int]) -> np.ndarray:
            out = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.asarray(counts, dtype=np.int64), out=out[1:])
            return out

        dep_ptr = ptr(self.dep_count)
        dep_idx = np.asarray(self.dep_idx, dtype=np.int64)
        if len(self.late_owner) and compiled(len(dep_idx) + len(self.late_owner)):
            # the stable sort below, as one compiled counting pass
            from trainsim.simulator.csr_numba import merge_late  # deferred: start-up time

            dep_ptr, dep_idx = merge_late(dep_ptr, dep_idx, np.asarray(self.late_owner),
                                          np.asarray(self.late_dep), n)
        elif len(self.late_owner):
            owner = np.r_[np.repeat(np.arange(n, dtype=np.int64), np.diff(dep_ptr)),
                          np.asarray(self.late_owner, dtype=np.int64)]
            order = np.argsort(owner, kind="stable")
            dep_idx = np.r_[dep_idx, np.asarray(self.late_dep, dtype=np.int64)][order]
            dep_ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(owner, minlength=n), out=dep_ptr[1:])
        return TaskTable(
            name_templates=list(self._names), name_code=np.asarray(self.name_code, np.int32),
            name_arg=np.asarray(self.name_arg, np.int64), kind_names=list(self._kinds),
            kind_code=np.asarray(self.kind_code, np.int32), stream_names=list(self._streams),
            stream_code=np.asarray(self.stream_code, np.int32), link_names=list(self._links),
            member_ptr=ptr(self.member_count),
            member_rank=np.asarray(self.member_rank, np.int32),
            link_ptr=ptr(self.link_count), link_idx=np.asarray(self.link_idx, np.int32),
            dep_ptr=dep_ptr, dep_idx=dep_idx,
            duration_s=np.asarray(self.duration_s, np.float64),
            comm_bytes=np.asarray(self.comm_bytes, np.float64),
            mem_alloc_bytes=np.asarray(self.mem_alloc_bytes, np.float64),
            mem_free_bytes=np.asarray(self.mem_free_bytes, np.float64),
            power_w=np.asarray(self.power_w, np.float64),
            freq_mhz=np.asarray(self.freq_mhz, np.float64),
            micro_batch=np.asarray(self.micro_batch, np.int64),
            stage=np.asarray(self.stage, np.int64),
            first_layer=np.asarray(self.first_layer, np.int64),
            last_layer=np.asarray(self.last_layer, np.int64),
        )


__all__ = ["TaskTable", "TaskTableBuilder"]
