"""SimResult: what one simulated iteration tells a capacity planner.

Engines only decide when each task starts and ends; everything else (per-task table, memory
timeline and peak, OOM, energy, bubbles, throughput, MFU) is derived here by `build_result` from
those two arrays and the Program, so every engine reports identically given identical times.
The accounting rules (order of memory events at one instant, the energy formula) are stated in
program.py's module docstring.

Throughput, MFU and cost read these `Program.info` (`ProgramInfo`) fields when set (else they
are None):

* ``global_batch`` — samples per iteration: ``samples_per_s = global_batch / iteration_time_s``.
* ``tokens_per_iteration`` — tokens per iteration; defaults to ``global_batch × seq_len`` (so
  ``seq_len`` is needed unless micro-batches have their own lengths).
* ``model_flops_per_iteration`` — model FLOPs of one iteration over all GPUs, not counting
  recompute (the "model FLOPs" of MFU, Chowdhery et al. 2022, PaLM, App. B; for GPT this is
  72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)), the per-iteration count of Narayanan et al. 2021,
  Megatron-LM SC21, App. A, without its extra recompute forward), and
* ``peak_flops_per_rank`` — a number (every physical GPU) or a list per program rank (applying
  to each physical rank it represents):
  ``mfu = model_flops_per_iteration / (iteration_time_s × Σ peak over physical ranks)``.
* ``price_per_hour_usd`` — the cluster's price: ``cost_usd = price_per_hour_usd ×
  iteration_time_s / 3600``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from trainsim.errors import SimulationError
from trainsim.simulator.program import FrozenProgram, Program
from trainsim.simulator.task_table import compiled

if TYPE_CHECKING:
    import pandas as pd

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRecord:
    """Per-rank figures of one iteration (a program rank, or a physical one after expand())."""

    rank: int
    """Program rank (or physical rank in an expanded result)."""
    represents: tuple[int, ...]
    """Physical ranks this record stands for (itself only, after expand())."""
    busy_s: float
    """Length of the union of the rank's powered-stream task intervals."""
    idle_s: float
    """iteration_time_s − busy_s."""
    bubble_fraction: float
    """Share of the iteration the "compute" stream is idle (0 for an empty program)."""
    peak_memory_bytes: float
    """Maximum of static memory plus running allocations."""
    memory_capacity_bytes: float
    """Device capacity (inf when unlimited)."""
    oom: bool
    """True when peak_memory_bytes > memory_capacity_bytes."""
    oom_time_s: float | None
    """First moment memory exceeds capacity; None when it never does."""
    oom_excess_bytes: float
    """peak_memory_bytes − capacity when OOM, else 0."""
    energy_j: float
    """Σ power_w × duration over powered-stream tasks + idle_power_w × idle_s."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict in a stable key order (inf capacity becomes None)."""
        cap = self.memory_capacity_bytes
        return {
            "rank": self.rank,
            "represents": list(self.represents),
            "busy_s": self.busy_s,
            "idle_s": self.idle_s,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": None if math.isinf(cap) else cap,
            "oom": self.oom,
            "oom_time_s": self.oom_time_s,
            "oom_excess_bytes": self.oom_excess_bytes,
            "energy_j": self.energy_j,
        }


class ResultFigures:
    """The figures derived from a run's per-rank records (shared by `SimResult` and the lean
    `LeanResult` planners use): throughput, MFU, cost, bubbles, peak memory, OOM, energy."""

    __slots__ = ()
    program: Program
    iteration_time_s: float
    ranks: list[RankRecord]

    @property
    def samples_per_s(self) -> float | None:
        """Samples per second (needs info.global_batch)."""
        batch = self.program.info.global_batch
        if batch is None or self.iteration_time_s <= 0:
            return None
        return float(batch) / self.iteration_time_s

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second (info.tokens_per_iteration, or global_batch × seq_len)."""
        info = self.program.info
        tokens = info.tokens_per_iteration
        if tokens is None and info.global_batch is not None and info.seq_len:
            tokens = float(info.global_batch) * float(info.seq_len)
        if tokens is None or self.iteration_time_s <= 0:
            return None
        return float(tokens) / self.iteration_time_s

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation (info.model_flops_per_iteration, peak_flops_per_rank)."""
        info = self.program.info
        flops = info.model_flops_per_iteration
        peak = info.peak_flops_per_rank
        if flops is None or peak is None or self.iteration_time_s <= 0:
            return None
        groups = self.program.represents
        if isinstance(peak, (int, float)):
            total_peak = float(peak) * sum(len(g) for g in groups)
        else:
            if len(peak) != len(groups):
                raise SimulationError(
                    f"program info peak_flops_per_rank has {len(peak)} entries, expected one per "
                    f"program rank ({len(groups)})"
                )
            total_peak = sum(float(p) * len(g) for p, g in zip(peak, groups))
        if total_peak <= 0:
            return None
        return float(flops) / (self.iteration_time_s * total_peak)

    @property
    def cost_usd(self) -> float | None:
        """What the iteration costs: info.price_per_hour_usd × iteration_time_s / 3600 (None
        when the program has no price)."""
        price = self.program.info.price_per_hour_usd
        if price is None:
            return None
        return price * self.iteration_time_s / SECONDS_PER_HOUR

    @property
    def bubble_fraction(self) -> float:
        """Largest per-rank compute-stream idle share."""
        return max((r.bubble_fraction for r in self.ranks), default=0.0)

    @property
    def peak_memory_bytes(self) -> float:
        """Largest per-rank peak memory."""
        return max((r.peak_memory_bytes for r in self.ranks), default=0.0)

    @property
    def oom(self) -> bool:
        """True when any rank runs out of memory."""
        return any(r.oom for r in self.ranks)

    @property
    def energy_j(self) -> float:
        """Total energy of all physical ranks (a folded rank counts once per rank it stands for)."""
        return float(sum(r.energy_j * len(r.represents) for r in self.ranks))



@dataclass(frozen=True, kw_only=True, slots=True)
class LeanResult(ResultFigures):
    """One simulated iteration reduced to what a planner ranks on: task times and per-rank
    records, without the per-task table and the timelines (`lean_result`)."""

    program: Program
    """The program that was run."""
    engine: str
    """Name of the engine that ran it."""
    start_s: np.ndarray
    """Start time per task id."""
    end_s: np.ndarray
    """End time per task id."""
    iteration_time_s: float
    """Last task end (the iteration starts at 0)."""
    ranks: list[RankRecord]
    """Per-rank records, by rank (as `SimResult.ranks`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimResult(ResultFigures):
    """One simulated iteration: task times, per-rank records, memory and power timelines."""

    program: Program
    """The program that was run."""
    engine: str
    """Name of the engine that ran it ("simpy", "numba", ...)."""
    start_s: np.ndarray
    """Start time per task id."""
    end_s: np.ndarray
    """End time per task id."""
    tasks: pd.DataFrame
    """One row per (task, member rank): task_id, name, kind, rank, stream, start_s, end_s,
    duration_s (= end − start), fixed_s (the task's fixed part), micro_batch, stage,
    first_layer, last_layer, comm_bytes, freq_mhz (NaN if none), power_w, energy_j."""
    iteration_time_s: float
    """Last task end (the iteration starts at 0)."""
    ranks: list[RankRecord]
    """Per-rank records, by rank."""
    memory_timeline: pd.DataFrame
    """Rows (rank, time_s, bytes): memory after each change, from static memory at 0."""
    power_timeline: pd.DataFrame
    """Rows (rank, time_s, power_w): rank power from this instant on (idle when nothing runs),
    one row per change, from 0."""
    expanded: bool = False
    """True once folded ranks have been unfolded into physical ranks."""

    def to_summary_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary with a stable key order (what `sim simulate --json` prints)."""
        return {
            "iteration_time_s": self.iteration_time_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory_bytes": self.peak_memory_bytes,
            "oom": self.oom,
            "energy_j": self.energy_j,
            "cost_usd": self.cost_usd,
            "num_tasks": self.program.num_tasks,
            "num_ranks": len(self.ranks),
            "num_physical_ranks": self.program.num_physical_ranks,
            "per_rank": [r.to_dict() for r in self.ranks],
        }

    def summary_json(self) -> str:
        """The summary as JSON text (deterministic: same result, same bytes)."""
        return json.dumps(self.to_summary_dict(), indent=2, allow_nan=False)

    def expand(self) -> SimResult:
        """Unfold folded ranks: one record and one set of rows per physical rank.

        Each program rank's rows (tasks, memory and power timelines) are repeated for every
        physical rank in `program.represents[rank]`, with `rank` set to the physical one and the
        original kept as `program_rank`. Totals (energy, peak, MFU) are unchanged.
        """
        if self.expanded:
            return self
        groups = self.program.represents

        def unfold(frame: pd.DataFrame) -> pd.DataFrame:
            counts = np.array([len(groups[r]) for r in frame["rank"]], dtype=np.int64)
            out = frame.iloc[np.repeat(np.arange(len(frame)), counts)].reset_index(drop=True)
            phys = [p for r in frame["rank"] for p in groups[r]]
            out.insert(out.columns.get_loc("rank") + 1, "program_rank", out["rank"].to_numpy())
            out["rank"] = np.asarray(phys, dtype=np.int64)
            return out

        records = [
            replace(rec, rank=p, represents=(p,)) for rec in self.ranks for p in groups[rec.rank]
        ]
        records.sort(key=lambda r: r.rank)
        return replace(
            self,
            tasks=unfold(self.tasks),
            ranks=records,
            memory_timeline=unfold(self.memory_timeline)
            .sort_values(["rank"], kind="stable")
            .reset_index(drop=True),
            power_timeline=unfold(self.power_timeline)
            .sort_values(["rank"], kind="stable")
            .reset_index(drop=True),
            expanded=True,
        )


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals [start, end) (any order)."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    prev = np.concatenate((s[:1], reach[:-1]))
    return float(np.maximum(e - np.maximum(s, prev), 0.0).sum())


def build_result(
    program: Program,
    start_s: Sequence[float] | np.ndarray,
    end_s: Sequence[float] | np.ndarray,
    *,
    engine: str,
    frozen: FrozenProgram | None = None,
) -> SimResult:
    """Derive the full SimResult from per-task start/end times (shared by all engines)."""
    import pandas as pd

    fp = frozen if frozen is not None else program.freeze()
    start = np.asarray(start_s, dtype=np.float64)
    end = np.asarray(end_s, dtype=np.float64)
    rows = _Rows(fp, start, end)
    n, row_task, row_stream = fp.num_tasks, rows.task, rows.stream
    stream_names = np.array(fp.stream_names, dtype=object)
    kind_names = np.array(fp.kind_names, dtype=object)
    names = np.array(program.task_names(), dtype=object)
    tasks = pd.DataFrame(
        {
            "task_id": row_task,
            "name": names[row_task] if n else np.array([], object),
            "kind": kind_names[fp.kind_code[row_task]] if n else np.array([], object),
            "rank": rows.rank,
            "stream": stream_names[row_stream] if n else np.array([], object),
            "start_s": rows.start,
            "end_s": rows.end,
            "duration_s": rows.length,
            "fixed_s": fp.duration_s[row_task],
            "micro_batch": fp.micro_batch[row_task],
            "stage": fp.stage[row_task],
            "first_layer": fp.first_layer[row_task],
            "last_layer": fp.last_layer[row_task],
            "comm_bytes": fp.comm_bytes[row_task],
            "freq_mhz": fp.freq_mhz[row_task],
            "power_w": fp.power_w[row_task],
            "energy_j": rows.energy,
        }
    )
    records, (mem_rank, mem_time, mem_bytes), (pow_rank, pow_time, pow_w) = _rank_records(
        program, fp, rows, timelines=True)
    memory_timeline = pd.DataFrame(
        {
            "rank": np.concatenate(mem_rank).astype(np.int64),
            "time_s": np.concatenate(mem_time),
            "bytes": np.concatenate(mem_bytes),
        }
    )
    power_timeline = pd.DataFrame(
        {
            "rank": np.concatenate(pow_rank).astype(np.int64),
            "time_s": np.concatenate(pow_time),
            "power_w": np.concatenate(pow_w),
        }
    )
    return SimResult(
        program=program,
        engine=engine,
        start_s=start,
        end_s=end,
        tasks=tasks,
        iteration_time_s=rows.iteration_s,
        ranks=records,
        memory_timeline=memory_timeline,
        power_timeline=power_timeline,
    )


def lean_result(
    program: Program,
    start_s: Sequence[float] | np.ndarray,
    end_s: Sequence[float] | np.ndarray,
    *,
    engine: str,
    frozen: FrozenProgram | None = None,
) -> LeanResult:
    """The figures a planner ranks on (per-rank records, throughput, MFU, energy) without the
    per-task table and the timelines: `build_result`'s own per-rank arithmetic, so every figure
    is bit-identical to the full SimResult's, at a fraction of its cost (no pandas, no names)."""
    fp = frozen if frozen is not None else program.freeze()
    start = np.asarray(start_s, dtype=np.float64)
    end = np.asarray(end_s, dtype=np.float64)
    rows = _Rows(fp, start, end)
    records, _, _ = _rank_records(program, fp, rows, timelines=False)
    return LeanResult(program=program, engine=engine, start_s=start, end_s=end,
                      iteration_time_s=rows.iteration_s, ranks=records)


class _Rows:
    """One row per (task, member rank): the arrays both result paths derive figures from."""

    __slots__ = ("end", "energy", "iteration_s", "length", "powered", "rank", "start",
                 "stream", "task")

    def __init__(self, fp: FrozenProgram, start: np.ndarray, end: np.ndarray) -> None:
        n = fp.num_tasks
        self.iteration_s = float(end.max()) if n else 0.0
        counts = np.diff(fp.member_ptr)
        self.task = row_task = np.repeat(np.arange(n, dtype=np.int64), counts)
        self.rank = fp.member_rank.astype(np.int64)
        self.start, self.end = start[row_task], end[row_task]
        self.length = self.end - self.start
        self.stream = fp.stream_code[row_task]
        self.powered = fp.stream_powered[self.stream] if n else np.zeros(0, bool)
        self.energy = np.where(self.powered, fp.power_w[row_task] * self.length, 0.0)


_Timeline = tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]


def _rank_records(program: Program, fp: FrozenProgram, rows: _Rows, *, timelines: bool
                  ) -> tuple[list[RankRecord], _Timeline, _Timeline]:
    """Per-rank records, and (when `timelines`) the memory and power timelines' parts."""
    num_ranks, iteration_s = fp.num_ranks, rows.iteration_s
    row_task, row_rank, row_start, row_end = rows.task, rows.rank, rows.start, rows.end
    row_len, row_energy = rows.length, rows.energy
    # Memory events; class 0 = end of a task that started earlier, 1 = start, 2 = end of a
    # zero-length task (program.py: order within one instant).
    # Only rows that allocate or free make events (the others' would be dropped below), in
    # row order, so the kept events and their order are those of every row's.
    alloc, free = fp.mem_alloc_bytes[row_task], fp.mem_free_bytes[row_task]
    moves = np.flatnonzero((alloc != 0) | (free != 0))
    m_rank, m_task = row_rank[moves], row_task[moves]
    ev_rank = np.concatenate((m_rank, m_rank))
    ev_time = np.concatenate((row_start[moves], row_end[moves]))
    ev_class = np.concatenate((np.ones(len(moves), np.int64),
                               np.where(row_len[moves] > 0, 0, 2)))
    ev_task = np.concatenate((m_task, m_task))
    ev_delta = np.concatenate((alloc[moves], -free[moves]))
    keep = ev_delta != 0
    ev_rank, ev_time, ev_class, ev_task, ev_delta = (
        a[keep] for a in (ev_rank, ev_time, ev_class, ev_task, ev_delta)
    )
    order = np.lexsort((ev_task, ev_class, ev_time, ev_rank))
    ev_rank, ev_time, ev_delta = ev_rank[order], ev_time[order], ev_delta[order]
    bounds = np.searchsorted(ev_rank, np.arange(num_ranks + 1))
    # each rank's running sum starts from its static memory: one array of [static, its
    # deltas...] per rank end to end, so a rank's cumsum is one call on a slice (the same
    # sequential sum as over its own concatenation)
    mem_bounds = bounds + np.arange(num_ranks + 1)
    mem_in = np.empty(len(ev_delta) + num_ranks)
    heads = mem_bounds[:-1]
    mem_in[heads] = fp.static_memory_bytes
    body = np.ones(len(mem_in), bool)
    body[heads] = False
    mem_in[body] = ev_delta
    mem_rank: list[np.ndarray] = []
    mem_time: list[np.ndarray] = []
    mem_bytes: list[np.ndarray] = []
    # Power events: +power at start, −power at end of powered-stream tasks.
    p_rows = np.flatnonzero(rows.powered)
    # by rank, then task: rows come in task order, so a stable sort by rank is that order
    many = compiled(len(p_rows))
    if many:  # the same orders by a counting pass and per-rank merge sorts (csr_numba.py)
        # deferred: start-up time (numba)
        from trainsim.simulator.csr_numba import counting_order, sorted_within

        p_order = counting_order(row_rank[p_rows], num_ranks)
    else:
        p_order = np.argsort(row_rank[p_rows], kind="stable")
    p_rows = p_rows[p_order]
    p_bounds_a = np.searchsorted(row_rank[p_rows], np.arange(num_ranks + 1))
    p_bounds = p_bounds_a.tolist()
    energy_in = row_energy[p_rows]  # a rank's slice is `row_energy[its rows]`, summed alike
    # busy time (`_union_length` per rank): the rows by rank, then start (ties in task order:
    # a stable sort of each rank's rows by start), the reach of each rank's ends, then each
    # row's uncovered part; a rank's busy time is the sum of its slice
    if many:
        u_rows = p_rows[sorted_within(p_bounds_a, row_start[p_rows])]
    else:
        u_rows = p_rows[np.lexsort((row_start[p_rows], row_rank[p_rows]))]
    u_start, u_end = row_start[u_rows], row_end[u_rows]
    reach = np.empty(len(u_end))
    for rank in range(num_ranks):
        lo, hi = p_bounds[rank], p_bounds[rank + 1]
        if hi > lo:
            np.maximum.accumulate(u_end[lo:hi], out=reach[lo:hi])
    prev = np.empty(len(u_end))
    prev[1:] = reach[:-1]
    firsts = np.asarray(p_bounds[:-1])[np.diff(p_bounds) > 0]
    prev[firsts] = u_start[firsts]
    uncovered = np.maximum(u_end - np.maximum(u_start, prev), 0.0)
    pow_rank: list[np.ndarray] = []
    pow_time: list[np.ndarray] = []
    pow_w: list[np.ndarray] = []
    compute_code = fp.stream_names.index("compute") if "compute" in fp.stream_names else -1
    on_compute = rows.stream == compute_code
    compute_busy = np.bincount(row_rank[on_compute], row_len[on_compute],
                               minlength=num_ranks).tolist()
    caps = fp.memory_capacity_bytes.tolist()
    idles = fp.idle_power_w.tolist()
    mb = mem_bounds.tolist()
    records = []
    for rank in range(num_ranks):
        cap = caps[rank]
        running = np.cumsum(mem_in[mb[rank]:mb[rank + 1]])
        peak = float(running.max())
        oom = peak > cap
        oom_time = None
        if oom:
            over = np.flatnonzero(running > cap)
            lo = bounds[rank]
            oom_time = float(np.concatenate(([0.0], ev_time[lo:bounds[rank + 1]]))[over[0]])
        plo, phi = p_bounds[rank], p_bounds[rank + 1]
        busy = float(uncovered[plo:phi].sum()) if phi > plo else 0.0
        idle = max(iteration_s - busy, 0.0)
        idle_w = idles[rank]
        energy = float(energy_in[plo:phi].sum()) + idle_w * idle
        if timelines:
            lo, hi = bounds[rank], bounds[rank + 1]
            rank_rows = p_rows[plo:phi]
            mem_rank.append(np.full(hi - lo + 1, rank))
            mem_time.append(np.r_[0.0, ev_time[lo:hi]])
            mem_bytes.append(running)
            pt, pw = _power_steps(row_start[rank_rows], row_end[rank_rows],
                                  fp.power_w[row_task[rank_rows]], idle_w)
            pow_rank.append(np.full(len(pt), rank))
            pow_time.append(pt)
            pow_w.append(pw)

        bubble = 1.0 - compute_busy[rank] / iteration_s if iteration_s > 0 else 0.0
        records.append(
            RankRecord(
                rank=rank,
                represents=tuple(program.represents[rank]),
                busy_s=busy,
                idle_s=idle,
                bubble_fraction=max(bubble, 0.0),
                peak_memory_bytes=peak,
                memory_capacity_bytes=cap,
                oom=oom,
                oom_time_s=oom_time,
                oom_excess_bytes=peak - cap if oom else 0.0,
                energy_j=energy,
            )
        )
    return records, (mem_rank, mem_time, mem_bytes), (pow_rank, pow_time, pow_w)


def _power_steps(
    starts: np.ndarray, ends: np.ndarray, power_w: np.ndarray, idle_w: float
) -> tuple[np.ndarray, np.ndarray]:
    """Step function of rank power: Σ running powered tasks' power, or idle power when none.

    Returns (time_s, power_w): the power from each instant on, one row per instant, from 0.
    """
    times = np.r_[starts, ends]
    delta = np.r_[power_w, -power_w]
    count = np.r_[np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)]
    order = np.lexsort((count, times))  # ends before starts at one instant
    times, delta, count = times[order], delta[order], count[order]
    watts = np.where(np.cumsum(count) > 0, np.maximum(np.cumsum(delta), 0.0), idle_w)
    last = np.r_[times[1:] != times[:-1], True] if len(times) else np.zeros(0, bool)
    t_out = np.r_[0.0, times[last]]
    w_out = np.r_[idle_w, watts[last]]
    if len(t_out) > 1 and t_out[1] == 0.0:  # the value after the events at 0 wins
        t_out, w_out = t_out[1:], w_out[1:]
    changed = np.r_[True, w_out[1:] != w_out[:-1]]  # one row per change of level
    return t_out[changed], w_out[changed]
