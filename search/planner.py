"""The planner frame: one interface for every parallelism planner (DESIGN.md §4).

Every planner takes the same inputs — a `SearchSpec` (workload, cluster, global batch, per-GPU
memory limit, time budget, objective) — and proposes plans that a `SearchState` evaluates on
the Oracle (search/oracle.py). A planner is a generator (`Planner.steps(state)`) that yields one
`SearchRecord` per evaluated plan, as lowtime's solver yields one record per iteration
(STYLE.md §11): a caller can draw a progress bar, stop early, or time it. `run_search` drives
one to the end (or to Ctrl-C, which returns the best so far) and returns a `SearchResult`:
the ranked feasible plans with their Oracle summaries and the search log.

**Ranking.** A plan *fits* when it ran (no PlanError), is not OOM, and every rank's peak memory
is within the memory limit. Fitting plans rank by the objective: throughput (samples/s, higher
is better), cost (dollars per iteration, lower is better: the global batch is fixed, so this is
dollars per sample) or energy (joules per iteration). For search *direction* planners also need
to compare plans that do not fit; `search_key` orders every plan: fitting ones first by the
objective, then over-memory ones by how far over the limit they are, then broken ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainsim.errors import PlanError, SimulationError, SpecError, unknown_name
from trainsim.hwmodels.cluster import Cluster
from trainsim.search.bound import plan_bound
from trainsim.search.oracle import SECONDS_PER_HOUR, Oracle, Summary, _key_of
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan

OBJECTIVES = ("throughput", "cost", "energy")
"""What a search optimises."""

MAX_GLOBAL_BATCH = 1_000_000
"""Largest global batch a search takes: each plan lowers global_batch / (dp × micro-batch)
micro-batches, and real runs use a few thousand samples (Llama 3 405B: 16M tokens = 2,048
sequences of 8,192)."""

BYTES_PER_MB = 1e6
"""Aceso's memory limits are in MB (10^6 bytes): 12000 MB on 4 GPUs, 28000 MB on 32."""


def check_global_batch(global_batch: object) -> None:
    """A positive integer up to MAX_GLOBAL_BATCH, else one clear line."""
    if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
        raise SpecError(f"search.global_batch={global_batch!r} must be a positive integer")
    if global_batch > MAX_GLOBAL_BATCH:
        raise SpecError(f"--global-batch {global_batch:,} is above {MAX_GLOBAL_BATCH:,} samples: "
                        f"every candidate would lower that many samples' micro-batches")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpec:
    """What every planner is asked: the workload, the cluster and the limits."""

    model: ModelSpec
    """The model (names and files are resolved above, by `trainsim.api.load_model`)."""
    cluster: Cluster
    """The cluster (`trainsim.api.load_cluster` resolves specs and YAML files)."""
    global_batch: int
    """Samples per iteration (fixed: every candidate keeps it)."""
    memory_limit_bytes: float | None = None
    """Per-GPU memory a plan may use; the device's memory when None."""
    time_budget_s: float = 60.0
    """Wall-clock seconds the search may spend; it returns the best so far when they run out."""
    objective: str = "throughput"
    """throughput (samples/s), cost (USD per iteration) or energy (J per iteration)."""
    top_k: int = 5
    """How many ranked plans the result keeps."""

    def __post_init__(self) -> None:
        check_global_batch(self.global_batch)
        if self.memory_limit_bytes is not None and not self.memory_limit_bytes > 0:
            raise SpecError(f"search.memory_limit_bytes={self.memory_limit_bytes!r} must be > 0")
        if not self.time_budget_s > 0:
            raise SpecError(f"search.time_budget_s={self.time_budget_s!r} must be > 0")
        if self.objective not in OBJECTIVES:
            raise SpecError(str(unknown_name("objective", self.objective, OBJECTIVES)))
        if self.top_k < 1:
            raise SpecError(f"search.top_k={self.top_k} must be >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchRecord:
    """One step of a search: the plan tried, what the Oracle said, and whether it was best."""

    step: int
    """0-based index of the evaluation."""
    elapsed_s: float
    """Seconds since the search started."""
    note: str
    """What was tried (planner-specific: "grid", "migrate 1 layer 2->1", ...)."""
    summary: Summary
    """The Oracle's answer (an error Summary for a plan that does not build)."""
    fits: bool
    """Ran, not OOM, and within the memory limit."""
    score: float
    """Objective value to minimise (−samples/s, USD, J); +inf when it does not fit."""
    improved: bool
    """True when this plan became the best so far."""
    plan: ParallelPlan | None = field(default=None, compare=False)
    """The checked plan (None when it did not build)."""

    def to_dict(self, *, timing: bool = True) -> dict[str, Any]:
        """A flat log row (no plan body: `SearchResult.ranked` carries the plans).

        `timing=False` leaves out the wall-clock `elapsed_s`, so that a log written to a file
        is byte-identical across identical searches.
        """
        s = self.summary
        row: dict[str, Any] = {"step": self.step, "note": self.note, "fits": self.fits,
                               "improved": self.improved, "samples_per_s": s.samples_per_s,
                               "iteration_time_s": None if math.isinf(s.iteration_time_s)
                               else s.iteration_time_s,
                               "peak_memory_bytes": s.peak_memory_bytes, "error": s.error}
        if timing:
            row["elapsed_s"] = round(self.elapsed_s, 6)
        return row


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """Ranked plans, the log, and counters of one search."""

    method: str
    """Planner name."""
    spec: SearchSpec
    """What was asked."""
    ranked: tuple[SearchRecord, ...]
    """Best first: distinct fitting plans by score (ties keep discovery order)."""
    log: tuple[SearchRecord, ...]
    """Every evaluation in order."""
    evaluated: int
    """Plans evaluated (cache hits included)."""
    search_s: float
    """Wall-clock seconds of the search."""
    interrupted: bool = False
    """True when Ctrl-C (or the caller) stopped it early."""
    pruned: int = 0
    """Candidates skipped before lowering: their proven lower bound (search/bound.py) could
    not beat the plans they would have to displace (not counted in `evaluated`)."""
    capped: int = 0
    """Candidates never evaluated because the time budget or the evaluation cap ran out (the
    ranked plans are then those of a partial search)."""

    @property
    def best(self) -> SearchRecord | None:
        """The best fitting plan's record, None when no candidate fits."""
        return self.ranked[0] if self.ranked else None

    def no_fit_reason(self) -> str:
        """Why `best` is None, in one line: nothing evaluated, nothing ran, or — the usual
        case — the candidate closest to fitting and by how much it misses the limit."""
        n = self.evaluated
        ran = [r for r in self.log if r.summary.error is None]
        if not self.log:
            return "no candidate was evaluated" + (" (interrupted)" if self.interrupted else "")
        if not ran:
            return (f"no candidate plan could run ({n} evaluated; first error: "
                    f"{self.log[0].summary.error})")
        limit = self.spec.memory_limit_bytes
        closest = min(ran, key=lambda r: memory_ratio(r.summary, limit))
        peak, allow = _worst_rank(closest.summary, limit)
        what = "the memory limit" if limit is not None else "GPU memory"
        return (f"no candidate fits {what} ({n} evaluated; smallest peak {peak / 1e9:.2f} GB "
                f"> limit {allow / 1e9:.2f} GB on a GPU: {closest.note})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: `best` (plan + figures), `ranked`, `evaluated`, `search_s`, `log`."""

        def row(r: SearchRecord) -> dict[str, Any]:
            d = r.summary.to_dict()
            return {"plan": d["plan"], "samples_per_s": d["samples_per_s"],
                    "iteration_time_s": d["iteration_time_s"],
                    "peak_memory_bytes": d["peak_memory_bytes"], "energy_j": d["energy_j"],
                    "cost_usd": d["cost_usd"], "stage_busy_s": d["stage_busy_s"],
                    "note": r.note, "step": r.step}

        return {
            "method": self.method, "objective": self.spec.objective,
            "global_batch": self.spec.global_batch,
            "memory_limit_bytes": self.spec.memory_limit_bytes,
            "best": row(self.best) if self.best else None,
            "ranked": [row(r) for r in self.ranked],
            "evaluated": self.evaluated, "pruned": self.pruned, "capped": self.capped,
            "search_s": self.search_s,
            "interrupted": self.interrupted,
            "improvements": [r.to_dict() for r in self.log if r.improved],
        }


def objective_score(summary: Summary, objective: str) -> float:
    """The value to minimise: −samples/s, USD per iteration, or J per iteration."""
    if objective == "throughput":
        return -summary.samples_per_s
    if objective == "cost":
        return summary.cost_usd
    return summary.energy_j


def memory_ratio(summary: Summary, limit_bytes: float | None) -> float:
    """Largest per-rank peak over its allowance (min of the limit and the device memory)."""
    peaks = summary.peak_memory_bytes_per_rank or (summary.peak_memory_bytes,)
    caps = summary.memory_capacity_bytes_per_rank or (math.inf,) * len(peaks)
    worst = 0.0
    for peak, cap in zip(peaks, caps):
        allow = min(cap, limit_bytes) if limit_bytes is not None else cap
        worst = max(worst, peak / allow if allow > 0 else math.inf)
    return worst


def _worst_rank(summary: Summary, limit_bytes: float | None) -> tuple[float, float]:
    """(peak, allowance) of the rank with the largest peak / allowance (`memory_ratio`)."""
    peaks = summary.peak_memory_bytes_per_rank or (summary.peak_memory_bytes,)
    caps = summary.memory_capacity_bytes_per_rank or (math.inf,) * len(peaks)
    pairs = [(peak, min(cap, limit_bytes) if limit_bytes is not None else cap)
             for peak, cap in zip(peaks, caps)]
    return max(pairs, key=lambda pa: pa[0] / pa[1] if pa[1] > 0 else math.inf)


def fits(summary: Summary, limit_bytes: float | None) -> bool:
    """Ran, is not OOM, and every rank's peak is within the memory limit."""
    return summary.error is None and not summary.oom and \
        memory_ratio(summary, limit_bytes) <= 1.0


def search_key(summary: Summary, objective: str, limit_bytes: float | None
               ) -> tuple[int, float]:
    """Total order for search direction: (0, score) fits; (1, memory ratio) over memory;
    (2, inf) broken. Smaller is better."""
    if summary.error is not None:
        return (2, math.inf)
    if fits(summary, limit_bytes):
        return (0, objective_score(summary, objective))
    return (1, memory_ratio(summary, limit_bytes))


class SearchState:
    """Evaluates plans for a planner and keeps the best ones, the log and the clock."""

    def __init__(self, spec: SearchSpec, oracle: Oracle | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.spec = spec
        self.oracle = oracle if oracle is not None else Oracle(spec.model, spec.cluster)
        self.clock = clock
        self.start_s = clock()
        self.log: list[SearchRecord] = []
        self.best: SearchRecord | None = None
        self.pruned = 0
        """Candidates a planner skipped with `cannot_improve`."""
        self.capped = 0
        """Candidates a planner left unevaluated when its time or evaluation budget ran out."""
        self._seen: dict[str, SearchRecord] = {}

    @property
    def model(self) -> ModelSpec:
        """The model the Oracle costs plans of."""
        return self.oracle.model

    @property
    def cluster(self) -> Cluster:
        """The cluster the Oracle costs plans on."""
        return self.oracle.cluster

    def elapsed_s(self) -> float:
        """Seconds since the search started."""
        return self.clock() - self.start_s

    def out_of_time(self) -> bool:
        """True once the time budget is spent."""
        return self.elapsed_s() >= self.spec.time_budget_s

    def key(self, summary: Summary) -> tuple[int, float]:
        """`search_key` under this search's objective and limit."""
        return search_key(summary, self.spec.objective, self.spec.memory_limit_bytes)

    def seen(self, plan: ParallelPlan | Mapping[str, Any]) -> SearchRecord | None:
        """The record of an already evaluated plan, else None.

        Records are keyed by the checked plan's canonical JSON, so a dict of fields is first
        built into its ParallelPlan (a dict's own JSON lacks the defaults and never matches).
        """
        record = self._seen.get(_key_of(plan))
        if record is not None or not isinstance(plan, Mapping):
            return record
        try:
            return self._seen.get(self.oracle.plan(plan).to_json())
        except PlanError:
            return self._seen.get(_key_of(plan))

    def evaluate(self, plan: ParallelPlan | Mapping[str, Any], note: str) -> SearchRecord:
        """Check, simulate (through the Oracle's cache) and log one plan."""
        checked: ParallelPlan | None = None
        try:
            checked = self.oracle.plan(plan)
            summary = self.oracle.evaluate(checked)
        except (PlanError, SimulationError) as exc:
            self.oracle.stats.infeasible += 1
            summary = Summary(plan_key=_key_of(plan), error=f"{type(exc).__name__}: {exc}")
        ok = fits(summary, self.spec.memory_limit_bytes)
        score = objective_score(summary, self.spec.objective) if ok else math.inf
        improved = ok and (self.best is None or score < self.best.score)
        record = SearchRecord(step=len(self.log), elapsed_s=self.elapsed_s(), note=note,
                              summary=summary, fits=ok, score=score, improved=improved,
                              plan=checked)
        self.log.append(record)
        self._seen.setdefault(summary.plan_key, record)
        if improved:
            self.best = record
        return record

    def ranked(self) -> list[SearchRecord]:
        """Distinct fitting plans so far, best first (ties keep discovery order), top_k."""
        return self.ranked_all()[: self.spec.top_k]

    def ranked_all(self) -> list[SearchRecord]:
        """Every distinct fitting plan so far, best first (ties keep discovery order)."""
        ranked: dict[str, SearchRecord] = {}
        for r in self.log:
            if r.fits and r.summary.plan_key not in ranked:
                ranked[r.summary.plan_key] = r
        return sorted(ranked.values(), key=lambda r: (r.score, r.step))

    def cannot_improve(self, fields: Mapping[str, Any], target: tuple[int, float]) -> bool:
        """True when the plan of `fields` provably cannot rank before `target` (a fitting
        plan's search key): its iteration time is at least `plan_bound`, and that is no faster
        than the target's. Only for the throughput and cost objectives (both monotone in
        time); False wherever the bound does not apply or the plan does not build."""
        if target[0] != 0 or self.spec.objective not in ("throughput", "cost"):
            return False
        try:
            plan = self.oracle.plan(fields)
        except PlanError:
            return False
        oracle = self.oracle
        bound = plan_bound(oracle.model, oracle.cluster, plan, oracle.options,
                           cache=oracle.lowering_cache)
        if bound is None or bound <= 0:
            return False
        if self.spec.objective == "throughput":
            # score = -samples/s = -batch / time: the target's time is batch / -score
            target_s = self.spec.global_batch / -target[1] if target[1] < 0 else math.inf
        else:  # cost = price x time / 3600
            price = oracle.cluster.price_per_hour_usd
            target_s = target[1] * SECONDS_PER_HOUR / price if price > 0 else math.inf
        return bound > target_s * (1 + 1e-9)

    def result(self, method: str, interrupted: bool = False) -> SearchResult:
        """Ranked distinct fitting plans (top_k) and the log."""
        return SearchResult(method=method, spec=self.spec, ranked=tuple(self.ranked()),
                            log=tuple(self.log), evaluated=len(self.log),
                            search_s=self.elapsed_s(), interrupted=interrupted,
                            pruned=self.pruned, capped=self.capped)


class Planner(Protocol):
    """A planner: a name and a generator of one record per evaluated plan."""

    @property
    def name(self) -> str:
        """Planner name in results."""
        ...

    def steps(self, state: SearchState) -> Iterator[SearchRecord]:
        """Propose plans through `state.evaluate`, yielding each record; stop when done or
        when `state.out_of_time()`."""
        ...


def run_search(planner: Planner, spec: SearchSpec, *, oracle: Oracle | None = None,
               on_record: Callable[[SearchRecord], None] | None = None) -> SearchResult:
    """Drive `planner` to the end of its search or its time budget.

    Ctrl-C (KeyboardInterrupt) stops it and returns the best so far with `interrupted=True`.
    `on_record` sees every record (progress bars).
    """
    state = SearchState(spec, oracle)
    interrupted = False
    try:
        for record in planner.steps(state):
            if on_record is not None:
                on_record(record)
    except KeyboardInterrupt:
        interrupted = True
    return state.result(planner.name, interrupted)


__all__ = ["BYTES_PER_MB", "OBJECTIVES", "Planner", "SearchRecord", "SearchResult",
           "SearchSpec", "SearchState", "fits", "memory_ratio",
           "objective_score", "run_search", "search_key"]
