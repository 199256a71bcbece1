"""One task of a Program: a kernel, a collective or a transfer on one or more ranks.

Split from program.py so the columnar `TaskTable` (task_table.py) and the `Program` that holds
either can both use it; program.py's module docstring states what the fields mean to engines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainsim.errors import SimulationError


def check_number(owner: str, name: str, value: float, *, allow_inf: bool = False) -> None:
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
        check_number(owner, "duration_s", self.duration_s)
        check_number(owner, "comm_bytes", self.comm_bytes)
        check_number(owner, "mem_alloc_bytes", self.mem_alloc_bytes)
        check_number(owner, "mem_free_bytes", self.mem_free_bytes)
        check_number(owner, "power_w", self.power_w)
        if self.freq_mhz is not None:
            check_number(owner, "freq_mhz", self.freq_mhz)
        if self.comm_bytes > 0 and not self.links:
            raise SimulationError(
                f"{owner}: comm_bytes={self.comm_bytes!r} > 0 needs at least one link in links"
            )


_TASK_FIELDS = ("name", "kind", "ranks", "stream", "duration_s", "comm_bytes", "links", "deps",
                "mem_alloc_bytes", "mem_free_bytes", "power_w", "freq_mhz", "micro_batch",
                "stage", "first_layer", "last_layer")


def trusted_task(values: tuple[Any, ...]) -> Task:
    """A Task from `values` in `_TASK_FIELDS` order, skipping the per-field checks.

    For producers that build tasks from already-checked numbers (the lowering emits tens of
    thousands per plan, and the checks were a third of its time); `Program.validate()` still
    checks such a program as a whole.
    """
    task = object.__new__(Task)
    for name, value in zip(_TASK_FIELDS, values):
        object.__setattr__(task, name, value)
    return task


__all__ = ["Task", "check_number", "trusted_task"]
