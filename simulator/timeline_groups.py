"""Rank groups and rank selections: what timelines and traces draw once a run has many ranks.

An unfolded run of 10,240 GPUs has 10,240 ranks, but only a handful of distinct behaviours: every
GPU of a pipeline stage does the same work at (nearly) the same time. Past `GROUP_THRESHOLD`
ranks the HTML timeline therefore draws one row set per *rank group* — the ranks that share

* their pipeline stages (the `stage` of their compute-stream tasks; an interleaved rank holds
  several, and its *pipeline position* is the smallest),
* their GPU type (`program.info.gpu_names` / `gpu_name`) and memory capacity, and
* their number of compute tasks (replicas given different batch shares differ here) —

drawn from one representative rank (the group's lowest), and the Chrome trace keeps one
representative rank per group unless asked for others (`RankSelection`, `--trace-ranks`).

Rank numbers a user types are physical GPU ranks. A folded result's ranks are program ranks,
each standing for several GPUs (`RankRecord.represents`); `result_rank_of` maps a physical rank
to the result rank that draws it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trainsim.errors import SpecError
from trainsim.simulator.result import SimResult

if TYPE_CHECKING:
    import pandas as pd

#: Results with more ranks than this are drawn grouped (timeline) and traced by
#: representative (Chrome trace) unless told otherwise.
GROUP_THRESHOLD = 32

#: Most points one grouped memory or power line keeps (a max-envelope over time bins beyond).
MAX_LINE_POINTS = 4000


@dataclass(frozen=True, slots=True)
class RankGroup:
    """Ranks of a result that behave alike: drawn once, from `representative`."""

    label: str
    """Row label: "stage 3", "stages 0,4", with " · <GPU>" or " · group k" where one stage has
    several groups."""
    position: int | None
    """Pipeline position (smallest stage of the ranks' compute tasks); None without stages."""
    stages: tuple[int, ...]
    """Stages of the ranks' compute tasks (several for an interleaved schedule)."""
    gpu: str | None
    """GPU type of the ranks, if the program says."""
    capacity_bytes: float
    """Memory capacity of each of the ranks (inf when unlimited)."""
    ranks: tuple[int, ...]
    """Result ranks of the group (physical ranks unless the result is folded)."""
    gpus: int
    """Physical GPUs the group stands for."""
    representative: int
    """The result rank drawn for the group (its lowest)."""

    @property
    def note(self) -> str:
        """Hover line: "stage 3 · 640 GPUs, showing rank 512"."""
        return f"{self.label} · {self.gpus} GPUs, showing rank {self.representative}"


def program_rank_of(result: SimResult) -> dict[int, int]:
    """Result rank -> program rank (identity unless the result was expanded)."""
    if result.expanded:
        return {p: r for r, group in enumerate(result.program.represents) for p in group}
    return {rec.rank: rec.rank for rec in result.ranks}


def result_rank_of(result: SimResult) -> dict[int, int]:
    """Physical rank -> the result rank that draws it (itself, unless the result is folded)."""
    return {p: rec.rank for rec in result.ranks for p in rec.represents}


def num_gpus(result: SimResult) -> int:
    """Physical GPUs the result stands for."""
    return sum(len(rec.represents) for rec in result.ranks)


def gpu_name(result: SimResult, program_rank: int) -> str | None:
    """The GPU type of a program rank, if the program's info says."""
    info = result.program.info
    names = info.gpu_names
    if names is not None and program_rank < len(names):
        return str(names[program_rank])
    name = info.gpu_name
    return None if name is None else str(name)


def rank_stages(result: SimResult) -> dict[int, tuple[int, ...]]:
    """Result rank -> sorted stages of its compute-stream tasks (empty when none carry one)."""
    frame = result.tasks
    part = frame.loc[(frame["stream"] == "compute") & (frame["stage"] >= 0), ["rank", "stage"]]
    pairs = part.drop_duplicates().sort_values(["rank", "stage"], kind="stable")
    stages: dict[int, list[int]] = {}
    for rank, stage in zip(pairs["rank"].to_numpy(), pairs["stage"].to_numpy(), strict=True):
        stages.setdefault(int(rank), []).append(int(stage))
    return {rank: tuple(s) for rank, s in stages.items()}


def rank_groups(result: SimResult) -> list[RankGroup]:
    """Group the result's ranks (see the module docstring), ordered by pipeline position, then
    GPU type, then lowest rank."""
    frame = result.tasks
    stages = rank_stages(result)
    compute = frame.loc[frame["stream"] == "compute", "rank"].value_counts()
    n_compute = {int(r): int(n) for r, n in compute.items()}
    prog = program_rank_of(result)
    # Key: (pipeline position, stages, GPU type, capacity, compute tasks).
    members: dict[tuple[int, tuple[int, ...], str, float, int], list[int]] = {}
    gpus: dict[tuple[int, tuple[int, ...], str, float, int], int] = {}
    for rec in result.ranks:
        st = stages.get(rec.rank, ())
        key = (
            min(st) if st else -1,
            st,
            gpu_name(result, prog[rec.rank]) or "",
            float(rec.memory_capacity_bytes),
            n_compute.get(rec.rank, 0),
        )
        members.setdefault(key, []).append(rec.rank)
        gpus[key] = gpus.get(key, 0) + len(rec.represents)
    keys = sorted(members, key=lambda k: (k[0], k[2], min(members[k])))
    base = {
        key: (
            ("stage " if len(key[1]) == 1 else "stages ") + ",".join(map(str, key[1]))
            if key[1]
            else f"ranks like {min(members[key])}"
        )
        for key in keys
    }
    groups = []
    for key in keys:
        position, st, gpu, capacity, _ = key
        same = [k for k in keys if base[k] == base[key]]
        label = base[key]
        if len(same) > 1:
            names = {k[2] for k in same}
            label += (f" · {gpu}" if len(names) == len(same)
                      else f" · group {same.index(key) + 1}")
        ranks = tuple(sorted(members[key]))
        groups.append(
            RankGroup(
                label=label,
                position=position if st else None,
                stages=st,
                gpu=gpu or None,
                capacity_bytes=capacity,
                ranks=ranks,
                gpus=gpus[key],
                representative=ranks[0],
            )
        )
    return groups


def should_group(result: SimResult, ranks: Sequence[int] | None = None) -> bool:
    """True when the result (or the chosen `ranks` of it) has more than GROUP_THRESHOLD ranks."""
    count = len(result.ranks) if ranks is None else len(set(ranks))
    return count > GROUP_THRESHOLD


def rank_ranges(ranks: Sequence[int], *, limit: int = 4) -> str:
    """"0-7, 64-71, … (80 ranges)": sorted ranks as ranges, at most `limit` of them shown."""
    spans: list[tuple[int, int]] = []
    for r in sorted(ranks):
        if spans and spans[-1][1] == r - 1:
            spans[-1] = (spans[-1][0], r)
        else:
            spans.append((r, r))
    text = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    if len(text) <= limit:
        return ", ".join(text)
    return ", ".join(text[:limit]) + f", … ({len(text)} ranges)"


def step_envelope(
    times: np.ndarray, values: np.ndarray, bounds: np.ndarray, *, max_points: int = MAX_LINE_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise maximum of several step functions, as one step function.

    `times`/`values` hold the functions one after another (each sorted by time, each holding its
    value from a row's time to the next row's); `bounds[i]:bounds[i+1]` is function i. Beyond
    `max_points` steps the result is a max-envelope over equal time bins (peaks stay visible).
    """
    grid = np.unique(times)
    best = np.full(len(grid), -np.inf)
    for i in range(len(bounds) - 1):
        t, v = times[bounds[i] : bounds[i + 1]], values[bounds[i] : bounds[i + 1]]
        if len(t) == 0:
            continue
        at = np.searchsorted(t, grid, side="right") - 1
        here = np.where(at >= 0, v[np.maximum(at, 0)], -np.inf)
        np.maximum(best, here, out=best)
    keep = np.r_[True, best[1:] != best[:-1]] if len(grid) else np.zeros(0, bool)
    grid, best = grid[keep], best[keep]
    if len(grid) > max_points:
        edges = np.linspace(grid[0], grid[-1], max_points)
        bins = np.searchsorted(edges, grid, side="right") - 1
        # A bin's value: the max of the steps starting in it and the one running into it.
        running_in = best[np.searchsorted(grid, edges, side="right") - 1]
        per_bin = running_in.copy()
        np.maximum.at(per_bin, bins, best)
        grid, best = edges, per_bin
    return grid, best


def group_envelope(
    timeline: pd.DataFrame, column: str, ranks: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Max over `ranks` of a per-rank step timeline (`memory_timeline` "bytes" or
    `power_timeline` "power_w")."""
    part = timeline[timeline["rank"].isin(set(ranks))].sort_values(
        ["rank", "time_s"], kind="stable"
    )
    rank_col = part["rank"].to_numpy()
    starts = np.flatnonzero(np.r_[True, rank_col[1:] != rank_col[:-1]]) if len(part) else (
        np.zeros(0, np.int64))
    bounds = np.r_[starts, len(part)].astype(np.int64)
    return step_envelope(part["time_s"].to_numpy(), part[column].to_numpy(np.float64), bounds)


# --------------------------------------------------------------------------- rank selections

_ITEM = re.compile(r"^(?:(\d+)|(\d+)-(\d+)|stage:(\d+)(?:-(\d+))?)$")


@dataclass(frozen=True, slots=True)
class RankSelection:
    """Ranks a user chose (`--trace-ranks`): `all`, physical ranks and ranges, pipeline stages.

    Syntax: `all`, or comma-separated items `N` (a rank), `N-M` (ranks N to M), `stage:K` or
    `stage:K-L` (every rank at pipeline position K, or K to L). Parsing checks the syntax only;
    `check` checks the numbers against a run's size before it is simulated.
    """

    text: str
    everything: bool = False
    spans: tuple[tuple[int, int], ...] = ()
    stage_spans: tuple[tuple[int, int], ...] = ()

    @classmethod
    def parse(cls, text: str, option: str = "--trace-ranks") -> RankSelection:
        """Parse `text`, raising SpecError (one line naming the bad item) when it is malformed."""
        cleaned = text.strip()
        if cleaned.lower() == "all":
            return cls(text=text, everything=True)
        spans: list[tuple[int, int]] = []
        stage_spans: list[tuple[int, int]] = []
        for raw in cleaned.split(","):
            item = raw.strip().lower()
            match = _ITEM.match(item)
            if not item or match is None:
                raise SpecError(
                    f"{option} {text!r}: {raw.strip()!r} is not a rank (8), a range (16-31), "
                    f"stage:K, stage:K-L or all"
                )
            one, lo, hi, s_lo, s_hi = match.groups()
            if one is not None:
                spans.append((int(one), int(one)))
            elif lo is not None:
                spans.append((int(lo), int(hi)))
            else:
                stage_spans.append((int(s_lo), int(s_hi if s_hi is not None else s_lo)))
        for a, b in spans + stage_spans:
            if b < a:
                raise SpecError(f"{option} {text!r}: range {a}-{b} runs backwards")
        return cls(text=text, spans=tuple(spans), stage_spans=tuple(stage_spans))

    def check(self, gpus: int, stages: int, option: str = "--trace-ranks") -> None:
        """Raise SpecError unless every rank is below `gpus` and every stage below `stages`."""
        for _, hi in self.spans:
            if hi >= gpus:
                raise SpecError(
                    f"{option} {self.text!r}: rank {hi} is out of range; this run has {gpus} "
                    f"GPUs (ranks 0-{gpus - 1})"
                )
        for _, hi in self.stage_spans:
            if hi >= stages:
                raise SpecError(
                    f"{option} {self.text!r}: stage {hi} is out of range; this run has "
                    f"{stages} pipeline stages (0-{stages - 1})"
                )

    def resolve(self, result: SimResult) -> list[int]:
        """The result ranks chosen, sorted (a folded result's rank for each physical rank)."""
        if self.everything:
            return [rec.rank for rec in result.ranks]
        owner = result_rank_of(result)
        chosen = {owner[p] for a, b in self.spans for p in range(a, b + 1) if p in owner}
        if self.stage_spans:
            wanted = {s for a, b in self.stage_spans for s in range(a, b + 1)}
            for rank, st in rank_stages(result).items():
                if st and min(st) in wanted:
                    chosen.add(rank)
        return sorted(chosen)


def check_rank(rank: int, gpus: int, option: str = "--timeline-rank") -> None:
    """Raise SpecError unless 0 <= rank < gpus."""
    if rank < 0 or rank >= gpus:
        raise SpecError(f"{option} {rank} is out of range; this run has {gpus} GPUs "
                        f"(ranks 0-{gpus - 1})")


def default_trace_groups(result: SimResult) -> tuple[list[RankGroup] | None, str | None]:
    """What a Chrome trace keeps when no ranks were chosen: every rank (None) for a small
    result, else one representative per rank group (these groups), with a line saying so."""
    if not should_group(result):
        return None, None
    groups = rank_groups(result)
    reps = [g.representative for g in groups]
    shown = ", ".join(map(str, reps[:8])) + (", …" if len(reps) > 8 else "")
    line = (
        f"trace: {len(result.ranks)} ranks; wrote one representative rank per stage group "
        f"({len(reps)} ranks: {shown}); --trace-ranks all writes every "
        f"rank, --trace-ranks 0,8,16-31 or stage:0 others"
    )
    return groups, line
