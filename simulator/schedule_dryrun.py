"""A dependency-level dry run of a pipeline schedule with fixed per-kind times.

Not the engine: a few dozen lines that replay an order with unit (or any fixed) times so tests
and users can check a schedule's shape -- bubble fraction, deadlocks, activations in flight --
before lowering it. Rules, as in the papers' pipeline diagrams (and torch's
`_simulate_comms_compute`):

- a rank runs its actions in list order, one at a time; ``None`` slots are ignored;
- ``F`` of stage s, micro-batch j starts after ``F`` of stage s−1, j (plus `comm` when the two
  stages sit on different ranks);
- ``B``/``I`` of s, j starts after ``F`` of s, j and after ``B``/``I`` of s+1, j (plus `comm`);
- ``W`` of s, j starts after ``I`` of s, j.

Every action starts as soon as its rank is free and its dependencies are done, so the result
does not depend on the order the ranks are visited in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainsim.errors import SpecError
from trainsim.simulator.actions import Action, format_schedule, infer_stage_to_rank


@dataclass(frozen=True, kw_only=True, slots=True)
class DryRun:
    """Outcome of `dry_run`: when every action ran, in the caller's time unit."""

    makespan: Any
    """End of the last action (same number type as the times given: int, float, Fraction)."""
    start: dict[Action, Any] = field(repr=False)
    """Start time of each action."""
    end: dict[Action, Any] = field(repr=False)
    """End time of each action."""
    busy_by_rank: dict[int, Any]
    """Sum of action durations per rank."""

    @property
    def bubble_fraction(self) -> float:
        """Idle share of ``ranks × makespan``: 1 − Σ busy / (p · makespan)."""
        if not self.makespan:
            return 0.0
        total = sum(self.busy_by_rank.values())
        share: float = 1 - total / (len(self.busy_by_rank) * self.makespan)  # exact for Fractions
        return share


def _dependencies(action: Action, num_stages: int) -> list[Action]:
    s, j = action.stage, action.micro_batch
    if action.kind == "F":
        return [Action(s - 1, "F", j)] if s > 0 else []
    if action.kind == "W":
        return [Action(s, "I", j)]
    deps = [Action(s, "F", j)]
    if s + 1 < num_stages:
        deps.append(Action(s + 1, "I", j))  # resolved to B or I below
    return deps


def dry_run(
    order: Mapping[int, Iterable[Action | None]],
    *,
    f: Any = 1,
    b: Any = 2,
    i: Any = 1,
    w: Any = 1,
    comm: Any = 0,
    stage_to_rank: Mapping[int, int] | None = None,
) -> DryRun:
    """Replay `order` with fixed times per kind (F=`f`, B=`b`, I=`i`, W=`w`) and `comm` per
    cross-rank dependency. Pass `fractions.Fraction` times for exact arithmetic.

    Raises:
        SpecError: the order deadlocks; the message names each stuck rank, the action it is
            stuck on and the action it waits for.
    """
    ops = {rank: [a for a in order[rank] if a is not None] for rank in sorted(order)}
    owner = dict(stage_to_rank) if stage_to_rank is not None else infer_stage_to_rank(ops)
    every = [a for actions in ops.values() for a in actions]
    num_stages = max((a.stage for a in every), default=-1) + 1
    present = set(every)
    duration = {"F": f, "B": b, "I": i, "W": w}

    def resolve(dep: Action) -> Action:
        # a backward dependency on stage s+1 is whichever of B / I that stage runs
        if dep.kind == "I" and dep not in present:
            full = Action(dep.stage, "B", dep.micro_batch)
            if full in present:
                return full
        return dep

    start: dict[Action, Any] = {}
    end: dict[Action, Any] = {}
    free = {rank: 0 for rank in ops}
    busy = {rank: 0 for rank in ops}
    pointer = {rank: 0 for rank in ops}
    progress = True
    while progress:
        progress = False
        for rank, actions in ops.items():
            while pointer[rank] < len(actions):
                action = actions[pointer[rank]]
                deps = [resolve(d) for d in _dependencies(action, num_stages)]
                if any(d not in end for d in deps):
                    break
                ready = free[rank]
                for d in deps:
                    lag = comm if owner.get(d.stage, rank) != rank else 0
                    ready = max(ready, end[d] + lag)
                start[action] = ready
                end[action] = ready + duration[action.kind]
                free[rank] = end[action]
                busy[rank] += duration[action.kind]
                pointer[rank] += 1
                progress = True
    stuck = {rank: acts[pointer[rank]] for rank, acts in ops.items() if pointer[rank] < len(acts)}
    if stuck:
        lines = []
        for rank, action in stuck.items():
            waits = [resolve(d) for d in _dependencies(action, num_stages)]
            waits = [d for d in waits if d not in end]
            why = ", ".join(
                f"{d} (rank {owner[d.stage]}, not run yet)" if d in present
                else f"{d} (which no rank runs)" for d in waits
            )
            lines.append(f"rank {rank} stuck at {action} waiting for {why}")
        raise SpecError(
            f"pipeline schedule deadlocks: stuck ranks {sorted(stuck)}; "
            + "; ".join(lines) + "\n" + format_schedule(order)
        )
    makespan = max(end.values(), default=0)
    return DryRun(makespan=makespan, start=start, end=end, busy_by_rank=busy)


def unit_time_makespan(
    order: Mapping[int, Iterable[Action | None]],
    f: Any = 1,
    b: Any = 2,
    i: Any = 1,
    w: Any = 1,
    comm: Any = 0,
) -> Any:
    """Makespan of `order` under `dry_run` with the given unit times (default F=1, B=2, I=W=1).

    Raises:
        SpecError: the order deadlocks (stuck ranks named).
    """
    return dry_run(order, f=f, b=b, i=i, w=w, comm=comm).makespan


def peak_in_flight(order: Mapping[int, Iterable[Action | None]]) -> dict[int, int]:
    """Most (stage, micro-batch) activation sets a rank holds at once, per rank.

    A forward stores its activations; a full backward ``B`` frees them, and with the zero-bubble
    split they are freed by ``W`` (the weight gradient still reads the saved inputs -- Qi et al.
    2024 §2 -- so counting until W is the conservative choice). 1F1B gives ``min(p − r, m)`` on
    rank r, GPipe ``m``; with v virtual stages each set is 1/v of a stage's activations.
    """
    peaks: dict[int, int] = {}
    for rank in sorted(order):
        live = peak = 0
        for action in order[rank]:
            if action is None:
                continue
            if action.kind == "F":
                live += 1
                peak = max(peak, live)
            elif action.kind in ("B", "W"):
                live -= 1
        peaks[rank] = peak
    return peaks
