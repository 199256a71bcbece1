"""The reference engine: a Program replayed with SimPy, written for clarity over speed.

One SimPy process per (rank, stream) walks that stream's FIFO (program.py gives the semantics).
A task is run by its *leader*, the process of its first member rank: the leader waits until every
dependency has ended and every other member has reached the task with its previous task done
(each such member signals an `arrived` event), then holds for the fixed part and finally asks
`FluidLinks` to move the bytes. The other members just signal arrival and wait for the task's end
event, so a collective is a rendezvous that holds all its members' streams for its whole length.

SM sharing (program.py) is a second thin resource, `SmSharing`: the leader tells it when an
SM-occupying collective starts and ends, and a slowed compute-stream task waits on its
`compute()` event instead of a plain timeout whenever one of its ranks has φ > 0; a change of the
task's rate invalidates its pending timeout (generation counter) and plans a new one.

When no event is left and some task has not ended, the program deadlocked: `deadlock_error`
builds the report from the ended flags alone (heads of stuck streams, what each waits for, and
one wait cycle), so it is shared with any other engine.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy
from simpy.core import URGENT

from trainsim.errors import SimulationError
from trainsim.simulator.program import SM_OCCUPIES, SM_SLOWED, Program, physical_link, sm_roles
from trainsim.simulator.result import SimResult, build_result


@dataclass(slots=True)
class _Transfer:
    """A task in its transfer phase: bytes left as of FluidLinks.updated_s, and current rate."""

    remaining_bytes: float
    links: tuple[str, ...]
    done: simpy.Event
    rate_bytes_per_s: float = 0.0


class _Wakeup(simpy.Event):
    """A timeout processed before ordinary events of the same instant (transfers end first)."""

    def __init__(self, env: simpy.Environment, delay_s: float, generation: int) -> None:
        super().__init__(env)
        self.generation = generation
        self._ok = True
        self._value = None
        env.schedule(self, URGENT, delay_s)


class FluidLinks:
    """Shares links among concurrent transfers: rate = min over links of bandwidth / users,
    the users of a shared link id ``l/n`` counted in copies on physical link l (program.py).

    A thin resource: `transfer()` returns an event that succeeds when the bytes have moved.
    Rates change only when a transfer starts or ends, so between such instants every transfer
    drains linearly; the manager keeps one wake-up pending at the earliest completion and
    invalidates it (generation counter) whenever the set of transfers changes.
    """

    def __init__(self, env: simpy.Environment, bandwidth_bytes_per_s: dict[str, float]) -> None:
        self.env = env
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.active: dict[int, _Transfer] = {}
        self.users: dict[str, int] = defaultdict(int)  # per physical link, in copies
        self.physical = {link: physical_link(link) for link in bandwidth_bytes_per_s}
        self.updated_s = 0.0
        self.next_end_s = float("inf")
        self.generation = 0

    def transfer(self, task_id: int, nbytes: float, links: tuple[str, ...]) -> simpy.Event:
        """Start moving `nbytes` over each of `links` now; the event succeeds when done."""
        self._drain_until_now()
        done = self.env.event()
        self.active[task_id] = _Transfer(remaining_bytes=nbytes, links=links, done=done)
        for link in links:
            phys, copies = self.physical[link]
            self.users[phys] += copies
        self._replan()
        return done

    def _drain_until_now(self) -> None:
        elapsed_s = self.env.now - self.updated_s
        if elapsed_s > 0:
            for tr in self.active.values():
                tr.remaining_bytes = max(tr.remaining_bytes - tr.rate_bytes_per_s * elapsed_s, 0.0)
        self.updated_s = self.env.now

    def _end_s(self, tr: _Transfer) -> float:
        return self.updated_s + tr.remaining_bytes / tr.rate_bytes_per_s

    def _replan(self) -> None:
        """Recompute every rate and schedule one wake-up at the earliest completion."""
        self.generation += 1
        if not self.active:
            self.next_end_s = float("inf")
            return
        for tr in self.active.values():
            tr.rate_bytes_per_s = min(
                self.bandwidth_bytes_per_s[link]
                / (self.users[self.physical[link][0]] / self.physical[link][1])
                for link in tr.links
            )
        self.next_end_s = min(self._end_s(tr) for tr in self.active.values())
        wake = _Wakeup(self.env, max(self.next_end_s - self.env.now, 0.0), self.generation)
        wake.callbacks.append(self._on_wakeup)

    def _on_wakeup(self, wake: simpy.Event) -> None:
        if wake.generation != self.generation:  # type: ignore[attr-defined]
            return  # the set of transfers changed since this wake-up was planned
        finished = sorted(t for t, tr in self.active.items() if self._end_s(tr) <= self.next_end_s)
        self._drain_until_now()
        done = [self.active.pop(task_id) for task_id in finished]
        for tr in done:
            for link in tr.links:
                phys, copies = self.physical[link]
                self.users[phys] -= copies
        self._replan()
        for tr in done:  # in task-index order; dependants see the end at this instant
            tr.done.succeed()


@dataclass(slots=True)
class _Slowed:
    """A slowed task in its fixed part: full-speed work left as of `since_s`, at `rate`."""

    ranks: tuple[int, ...]
    work_s: float
    since_s: float
    rate: float
    end_s: float
    done: simpy.Event
    generation: int = 0


class SmSharing:
    """Slows compute-stream fixed parts to 1 − φ_r while a collective holds SMs on rank r.

    `comm_started` / `comm_ended` count the SM-occupying tasks per rank; `compute()` runs a
    slowed task's fixed part and returns an event that succeeds when its work is done. When a
    count change alters a running task's rate, its work left is drained at the old rate and a new
    timeout planned (program.py: SM sharing; the numba twin does the same arithmetic).
    """

    def __init__(self, env: simpy.Environment, phi: tuple[float, ...]) -> None:
        self.env = env
        self.phi = phi
        self.busy = [0] * len(phi)
        self.running: dict[int, _Slowed] = {}

    def rate(self, ranks: tuple[int, ...]) -> float:
        """The lowest SM rate over `ranks` now."""
        rate = 1.0
        for r in ranks:
            if self.busy[r] > 0:
                rate = min(rate, 1.0 - self.phi[r])
        return rate

    def compute(self, ranks: tuple[int, ...], duration_s: float) -> simpy.Event:
        """Run a slowed fixed part of `duration_s` at full speed on `ranks`, from now."""
        rate = self.rate(ranks)
        task = _Slowed(ranks=ranks, work_s=duration_s, since_s=self.env.now, rate=rate,
                       end_s=self.env.now + duration_s / rate, done=self.env.event())
        for r in ranks:
            self.running[r] = task
        self._plan(task, duration_s / rate)
        return task.done

    def comm_started(self, ranks: tuple[int, ...]) -> None:
        """An SM-occupying task starts on `ranks`."""
        for r in ranks:
            self.busy[r] += 1
            if self.busy[r] == 1 and self.phi[r] > 0:
                self._retime(self.running.get(r))

    def comm_ended(self, ranks: tuple[int, ...]) -> None:
        """An SM-occupying task ends on `ranks`."""
        for r in ranks:
            self.busy[r] -= 1
            if self.busy[r] == 0 and self.phi[r] > 0:
                self._retime(self.running.get(r))

    def _retime(self, task: _Slowed | None) -> None:
        now = self.env.now
        if task is None or task.end_s <= now:
            return  # nothing runs there, or its fixed part ends at this very instant
        rate = self.rate(task.ranks)
        if rate == task.rate:
            return
        task.work_s = max(0.0, task.work_s - (now - task.since_s) * task.rate)
        task.since_s = now
        task.rate = rate
        task.end_s = now + task.work_s / rate
        self._plan(task, task.work_s / rate)

    def _plan(self, task: _Slowed, delay_s: float) -> None:
        task.generation += 1
        timer = self.env.timeout(delay_s)
        generation = task.generation
        timer.callbacks.append(lambda _ev: self._finish(task, generation))

    def _finish(self, task: _Slowed, generation: int) -> None:
        if generation != task.generation:
            return  # re-timed since this timeout was planned
        task.end_s = -1.0
        for r in task.ranks:
            if self.running.get(r) is task:
                del self.running[r]
        task.done.succeed()


def run_simpy(
    program: Program, *, on_progress: Callable[[int, int], None] | None = None
) -> SimResult:
    """Replay `program` with SimPy and return its SimResult.

    Args:
        program: the program to run.
        on_progress: called with (tasks ended, total tasks) about every 1% of tasks, for a
            progress bar on long runs.

    Raises:
        SimulationError: the program is inconsistent (bad rank, dep, link) or deadlocks; a
            deadlock names the stuck ranks, the head task of each stuck stream and what it waits
            for.
    """
    program.validate(check_cycles=False)
    tasks = program.tasks
    n = len(tasks)
    env = simpy.Environment()
    links = FluidLinks(env, program.link_bandwidth_bytes_per_s)
    sm = SmSharing(env, tuple(program.comm_sm_fraction))
    roles = sm_roles(program).tolist()
    phi_ranks = {r for r, phi in enumerate(program.comm_sm_fraction) if phi > 0}
    ended = [env.event() for _ in range(n)]
    # arrived[t][i]: member ranks[i + 1] of task t is at the task with its stream free.
    arrived: list[list[simpy.Event]] = [[env.event() for _ in task.ranks[1:]] for task in tasks]
    start_s = np.full(n, np.nan)
    end_s = np.full(n, np.nan)
    done_count = [0]
    report_every = max(n // 100, 1)

    # the leader's part: wait, hold, transfer, end
    def run_task(tid: int) -> Generator[Any, Any, None]:
        task = tasks[tid]
        waits = [ended[d] for d in task.deps if not ended[d].triggered]
        waits += [ev for ev in arrived[tid] if not ev.triggered]
        if waits:
            yield simpy.AllOf(env, waits)
        start_s[tid] = env.now
        role = roles[tid]
        if role == SM_OCCUPIES:
            sm.comm_started(task.ranks)
        if task.duration_s > 0:
            if role == SM_SLOWED and not phi_ranks.isdisjoint(task.ranks):
                yield sm.compute(task.ranks, task.duration_s)
            else:
                yield env.timeout(task.duration_s)
        if task.comm_bytes > 0:
            yield links.transfer(tid, task.comm_bytes, task.links)
        end_s[tid] = env.now
        if role == SM_OCCUPIES:
            sm.comm_ended(task.ranks)
        ended[tid].succeed()
        done_count[0] += 1
        if on_progress is not None and done_count[0] % report_every == 0:
            on_progress(done_count[0], n)

    def stream(rank: int, queue: list[int]) -> Generator[Any, Any, None]:  # a (rank, stream) FIFO
        for tid in queue:
            member = tasks[tid].ranks.index(rank)
            if member == 0:
                yield from run_task(tid)
            else:
                arrived[tid][member - 1].succeed()
                yield ended[tid]

    for (rank, _name), queue in sorted(stream_queues(program).items()):
        env.process(stream(rank, queue))
    env.run()
    if n and np.isnan(end_s).any():
        raise deadlock_error(program, ~np.isnan(end_s))
    return build_result(program, start_s, end_s, engine="simpy")


def stream_queues(program: Program) -> dict[tuple[int, str], list[int]]:
    """Map each (rank, stream) to its task ids in FIFO (task-index) order."""
    queues: dict[tuple[int, str], list[int]] = defaultdict(list)
    for tid, task in enumerate(program.tasks):
        for rank in task.ranks:
            queues[(rank, task.stream)].append(tid)
    return dict(queues)


def deadlock_error(program: Program, ended: np.ndarray, *, max_lines: int = 24) -> SimulationError:
    """Describe why the tasks not `ended` can never run: stuck ranks, heads, what they wait for.

    A stuck stream's head waits for unfinished deps or for peers whose same-named stream is at a
    different task. Following "waits for" from a head must revisit a task (the program's
    dep + stream-order graph has a cycle), and that cycle is reported too.
    """
    tasks = program.tasks
    queues = stream_queues(program)
    head: dict[tuple[int, str], int] = {}
    for key, queue in sorted(queues.items()):
        for tid in queue:
            if not ended[tid]:
                head[key] = tid
                break
    stuck_ranks = sorted({rank for rank, _ in head})
    n_stuck = int((~ended).sum())

    def blocker(tid: int) -> tuple[str, int]:
        """What `tid` waits for first: an unfinished dep, else the task ahead of it on a member."""
        task = tasks[tid]
        for dep in task.deps:
            if not ended[dep]:
                return "dep", dep
        for rank in task.ranks:
            ahead = head[(rank, task.stream)]
            if ahead != tid:
                return "stream", ahead
        return "none", -1

    lines = []
    for (rank, stream_name), tid in sorted(head.items()):
        task = tasks[tid]
        deps = [d for d in task.deps if not ended[d]]
        peers = [r for r in task.ranks if head[(r, task.stream)] != tid]
        why = []
        if deps:
            shown = ", ".join(program.describe(d) for d in deps[:5])
            why.append(f"deps [{shown}{', ...' if len(deps) > 5 else ''}]")
        if peers:
            shown = ", ".join(
                f"rank {r} (its {task.stream!r} stream is at task "
                f"{program.describe(head[(r, task.stream)])})"
                for r in peers[:5]
            )
            why.append(f"peers not arrived: {shown}{', ...' if len(peers) > 5 else ''}")
        lines.append(
            f"  rank {rank} stream {stream_name!r}: head task {program.describe(tid)} "
            f"({task.kind}) waits for {'; '.join(why) or 'nothing (engine bug)'}"
        )
    shown_lines = lines[:max_lines]
    if len(lines) > max_lines:
        shown_lines.append(f"  ... and {len(lines) - max_lines} more stuck streams")
    # Walk "waits for" from the first head until a task repeats: that is a wait cycle.
    cycle_text = ""
    if head:
        seen: dict[int, int] = {}
        path: list[int] = []
        tid = head[min(head)]
        while tid >= 0 and tid not in seen:
            seen[tid] = len(path)
            path.append(tid)
            tid = blocker(tid)[1]
        if tid >= 0:
            cycle = path[seen[tid] :] + [tid]
            text = " -> ".join(program.describe(t) for t in cycle[:10])
            cycle_text = f"\n  wait cycle: {text}{' -> ...' if len(cycle) > 10 else ''}"
    rank_list = ", ".join(map(str, stuck_ranks[:32])) + (", ..." if len(stuck_ranks) > 32 else "")
    return SimulationError(
        f"deadlock: {n_stuck} of {len(tasks)} tasks can never run; stuck ranks: {rank_list}\n"
        + "\n".join(shown_lines)
        + cycle_text
    )
