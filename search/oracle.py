"""The Oracle: what every planner asks — "what does this plan cost?" — answered once per plan.

`Oracle(model, cluster)` lowers a candidate ParallelPlan (workloads/lowering/), runs it on the
fast engine (simulator/engine_numba.py, the reference's twin) and keeps a `Summary` of what
planners rank on: iteration time, throughput, MFU, peak memory per rank and OOM, energy, cost
in dollars from the cluster's prices, and per-stage busy time for bottleneck analysis
(DESIGN.md §2 and §4). Answers are cached under the plan's canonical form (its sorted-key JSON,
`ParallelPlan.to_json`), so a search that revisits a plan pays nothing.

`evaluate` raises `PlanError` for a plan that does not fit the model or cluster; `evaluate_many`
instead returns a Summary whose `error` says why, so a sweep over candidates never stops on one
infeasible point (its iteration time is +inf so it sorts last).
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.errors import PlanError, SimulationError, TrainsimError
from trainsim.hwmodels.cluster import Cluster
from trainsim.simulator.engines import check_engine, run_program
from trainsim.simulator.program import FrozenProgram
from trainsim.simulator.result import LeanResult, SimResult, lean_result
from trainsim.simulator.task_table import use_compiled_kernels
from trainsim.workloads.framework import FrameworkProfile, get_framework
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.lowering.cache import LoweringCache
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan

#: Seconds per hour, to turn a price per hour into a price per iteration.
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Summary:
    """What a planner ranks a plan on: one simulated iteration, reduced to numbers."""

    plan_key: str
    """The plan's canonical JSON (the cache key); for an unparsable plan, its fields as JSON."""
    iteration_time_s: float = math.inf
    """Time of one training iteration (+inf when the plan is infeasible)."""
    samples_per_s: float = 0.0
    """Samples per second (global batch / iteration time)."""
    tokens_per_s: float = 0.0
    """Tokens per second."""
    mfu: float | None = None
    """Model FLOPs utilisation (PaLM App. B definition; result.py); None when unknown."""
    bubble_fraction: float = 0.0
    """Largest per-rank share of the iteration the compute stream is idle."""
    peak_memory_bytes: float = 0.0
    """Largest peak memory over ranks."""
    peak_memory_bytes_per_rank: tuple[float, ...] = ()
    """Peak memory per program rank (a folded rank stands for `represents[rank]` GPUs)."""
    memory_capacity_bytes_per_rank: tuple[float, ...] = ()
    """Device memory per program rank, for headroom (inf when unlimited)."""
    oom: bool = False
    """True when some rank's peak exceeds its device memory."""
    energy_j: float = 0.0
    """Energy of one iteration over every physical GPU (busy + idle power, program.py)."""
    cost_usd: float = 0.0
    """Price of one iteration: cluster price per hour × iteration time / 3600."""
    stage_busy_s: tuple[float, ...] = ()
    """Per pipeline (virtual) stage: the compute-stream time of its busiest rank — the largest
    entry is the pipeline's bottleneck stage."""
    num_tasks: int = 0
    """Tasks in the lowered program."""
    error: str | None = None
    """Why the plan is infeasible (its PlanError / SimulationError message); None when it ran."""

    def __post_init__(self) -> None:
        if not isinstance(self.plan_key, str):
            raise TrainsimError(f"summary plan_key={self.plan_key!r} must be a string")

    @property
    def feasible(self) -> bool:
        """True when the plan ran (it may still be OOM)."""
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict in a stable key order (inf becomes None)."""

        def clean(x: Any) -> Any:
            if isinstance(x, float) and math.isinf(x):
                return None
            if isinstance(x, tuple):
                return [clean(v) for v in x]
            return x

        return {
            "plan": json.loads(self.plan_key) if self.plan_key else None,
            "iteration_time_s": clean(self.iteration_time_s),
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_bytes_per_rank": clean(self.peak_memory_bytes_per_rank),
            "memory_capacity_bytes_per_rank": clean(self.memory_capacity_bytes_per_rank),
            "oom": self.oom,
            "energy_j": self.energy_j,
            "cost_usd": self.cost_usd,
            "stage_busy_s": list(self.stage_busy_s),
            "num_tasks": self.num_tasks,
            "error": self.error,
        }


def stage_busy_s(result: SimResult | LeanResult, frozen: FrozenProgram | None = None) -> tuple[float, ...]:
    """Per stage id (tasks' `stage` field): the largest per-rank compute-stream busy time.

    Σ (end − start) over a rank's compute tasks of that stage; the maximum over ranks is the
    stage's time when its replicas run in parallel (unfolded programs have one rank per GPU).
    """
    fp = frozen if frozen is not None else result.program.freeze()
    if fp.num_tasks == 0 or "compute" not in fp.stream_names:
        return ()
    code = fp.stream_names.index("compute")
    counts = np.diff(fp.member_ptr)
    row_task = np.repeat(np.arange(fp.num_tasks), counts)
    keep = (fp.stream_code[row_task] == code) & (fp.stage[row_task] >= 0)
    row_task = row_task[keep]
    if len(row_task) == 0:
        return ()
    rank = fp.member_rank[keep].astype(np.int64)
    stage = fp.stage[row_task].astype(np.int64)
    length = result.end_s[row_task] - result.start_s[row_task]
    num_stages = int(stage.max()) + 1
    busy = np.zeros((num_stages, fp.num_ranks))
    np.add.at(busy, (stage, rank), length)
    return tuple(float(x) for x in busy.max(axis=1))


def summarize(
    result: SimResult | LeanResult,
    plan_key: str,
    price_per_hour_usd: float,
    *,
    frozen: FrozenProgram | None = None,
) -> Summary:
    """Reduce a SimResult to the Summary planners rank on (`frozen`: the program's arrays)."""
    t = result.iteration_time_s
    return Summary(
        plan_key=plan_key,
        iteration_time_s=t,
        samples_per_s=result.samples_per_s or 0.0,
        tokens_per_s=result.tokens_per_s or 0.0,
        mfu=result.mfu,
        bubble_fraction=result.bubble_fraction,
        peak_memory_bytes=result.peak_memory_bytes,
        peak_memory_bytes_per_rank=tuple(r.peak_memory_bytes for r in result.ranks),
        memory_capacity_bytes_per_rank=tuple(r.memory_capacity_bytes for r in result.ranks),
        oom=result.oom,
        energy_j=result.energy_j,
        cost_usd=price_per_hour_usd * t / SECONDS_PER_HOUR,
        stage_busy_s=stage_busy_s(result, frozen),
        num_tasks=result.program.num_tasks,
    )


@dataclass(kw_only=True, slots=True)
class OracleStats:
    """Counters of one Oracle: how many plans it simulated and how many it answered from cache."""

    simulated: int = 0
    """Plans lowered and run."""
    cache_hits: int = 0
    """Answers served from the cache."""
    infeasible: int = 0
    """Plans rejected with an error Summary (by evaluate_many)."""


@dataclass(init=False, eq=False, slots=True)
class Oracle:
    """Lower + fast engine + cache for one model on one cluster.

    Args:
        model: The model (names and files are resolved above, by `trainsim.api.load_model`).
        cluster: The cluster (`trainsim.api.load_cluster` resolves specs and YAML files).
        engine: "numba" (default) or "simpy" (the reference, for cross-checks).
        options: Lowering options (folding on by default, what-if switches).
        fast: Reuse plan-independent lowering work between plans (`LoweringCache`: graphs and
            stage costs keyed by content) and summarise from the lean result (no per-task
            table or timelines). False runs every plan from scratch through the full
            SimResult, as before issue 15 — the same Summaries, kept to measure the
            difference (bench/oracle.py).
        framework: A framework profile's name (workloads/data/frameworks.yaml): plans given
            as fields get its plan defaults where they leave a field unset (sequence
            parallelism, distributed optimizer, overlap), as `sim simulate --framework` does.
    """

    model: ModelSpec
    cluster: Cluster
    engine: str = "numba"
    options: LoweringOptions | None = None
    framework: FrameworkProfile | None = None
    fast: bool = True
    stats: OracleStats = field(default_factory=OracleStats)
    _cache: dict[str, Summary] = field(default_factory=dict, repr=False)
    _lowering: LoweringCache = field(default_factory=LoweringCache, repr=False)

    def __init__(
        self,
        model: ModelSpec,
        cluster: Cluster,
        *,
        engine: str = "numba",
        options: LoweringOptions | None = None,
        fast: bool = True,
        framework: str | None = None,
    ) -> None:
        self.engine = check_engine(engine)
        if self.engine == "numba":  # many programs: compiled CSR passes pay off (task_table)
            use_compiled_kernels()
        if not isinstance(model, ModelSpec):
            raise TrainsimError(f"oracle: model={model!r} must be a ModelSpec (resolve names "
                                "with trainsim.api.load_model)")
        if not isinstance(cluster, Cluster):
            raise TrainsimError(f"oracle: cluster={cluster!r} must be a Cluster (resolve specs "
                                "with trainsim.api.load_cluster)")
        self.model = model
        self.cluster = cluster
        self.framework = None if framework is None else get_framework(framework)
        """Whose plan defaults fill what a planner's fields leave unset (`plan`); the model
        should be that stack's too (`workloads.framework.apply_framework`)."""
        self.options = options
        self.fast = fast
        self.stats = OracleStats()
        self._cache = {}
        self._lowering = LoweringCache()

    def plan_fields(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """`fields` with the framework's plan defaults where they leave a field unset (as given
        without one): what `plan` builds, and what a planner that builds its plans itself
        (`search.microbatch.planner`) asks once, so its plans run as this stack's too."""
        out = dict(fields)
        if self.framework is not None:
            out.update(self.framework.plan_defaults(out, self.model.family))
        return out

    def plan(self, plan: ParallelPlan | Mapping[str, Any]) -> ParallelPlan:
        """The checked ParallelPlan for `plan` (a plan, or a dict of its fields)."""
        if isinstance(plan, ParallelPlan):
            plan.check(self.model, self.cluster)
            return plan
        if isinstance(plan, Mapping):
            return ParallelPlan.build(self.model, self.cluster, **self.plan_fields(plan))
        raise PlanError(f"oracle: plan={plan!r} must be a ParallelPlan or a dict of its fields")

    def simulate(self, plan: ParallelPlan | Mapping[str, Any]) -> SimResult:
        """The full SimResult of `plan` (not cached: planners want `evaluate`)."""
        result = self._run(self.plan(plan), lean=False)[0]
        assert isinstance(result, SimResult)
        return result

    def _run(self, plan: ParallelPlan, *, lean: bool
             ) -> tuple[SimResult | LeanResult, FrozenProgram]:
        """Lower, freeze once, run on the Oracle's engine (`lean`: only the figures)."""
        cache = self._lowering if self.fast else None
        with _no_gc():
            program = lower(self.model, self.cluster, plan, self.options, cache=cache)
            frozen = program.freeze()
        if self.engine == "numba":
            # deferred: start-up time (numba)
            from trainsim.simulator.engine_numba import event_times, run_numba

            # deferred: start-up time (simpy), only to report a deadlock
            from trainsim.simulator.engine_simpy import deadlock_error

            if not lean:
                return run_numba(program, frozen=frozen), frozen
            start, end = event_times(frozen)
            if frozen.num_tasks and np.isnan(end).any():
                raise deadlock_error(program, ~np.isnan(end))
            return lean_result(program, start, end, engine="numba", frozen=frozen), frozen
        return run_program(program, engine=self.engine), frozen

    def evaluate(self, plan: ParallelPlan | Mapping[str, Any]) -> Summary:
        """Summary of one iteration under `plan`, from the cache when seen before.

        Raises:
            PlanError: the plan does not fit the model or cluster.
            SimulationError: the plan's program cannot finish (a deadlocking explicit order).
        """
        checked = self.plan(plan)
        key = checked.to_json()
        cached = self._cache.get(key)
        if cached is not None:
            self.stats.cache_hits += 1
            return cached
        result, frozen = self._run(checked, lean=self.fast)
        price = self.cluster.price_per_hour_usd
        summary = summarize(result, key, price, frozen=frozen)
        self.stats.simulated += 1
        self._cache[key] = summary
        return summary

    def evaluate_many(self, plans: Iterable[ParallelPlan | Mapping[str, Any]]) -> list[Summary]:
        """Summaries of `plans` in order; an infeasible plan gives a Summary with `error` set."""
        return list(self.iter_evaluate(plans))

    def iter_evaluate(
        self, plans: Iterable[ParallelPlan | Mapping[str, Any]]
    ) -> Iterator[Summary]:
        """`evaluate_many` as a generator, one Summary per plan (for progress bars)."""
        for plan in plans:
            try:
                yield self.evaluate(plan)
            except (PlanError, SimulationError) as exc:
                self.stats.infeasible += 1
                yield Summary(plan_key=_key_of(plan), error=f"{type(exc).__name__}: {exc}")

    @property
    def lowering_cache(self) -> LoweringCache | None:
        """The lowering work this Oracle shares between plans (None when `fast` is off), for
        planners that cost plans the way lowering does (search/bound.py)."""
        return self._lowering if self.fast else None

    def cache_size(self) -> int:
        """Number of distinct plans answered so far."""
        return len(self._cache)

    def clear_cache(self) -> None:
        """Forget every cached answer (and the lowering work shared between plans)."""
        self._cache.clear()
        self._lowering.clear()


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic garbage collector off for one lowering. A lowering allocates about a
    million short-lived tuples and lists, which would set off hundreds of collections, each
    walking every live object (the caches a search keeps): half a small plan's time. Nothing
    it leaves in cycles outlives the next collection after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _key_of(plan: Any) -> str:
    """A stable key for a plan that may not even build: its JSON, or its repr."""
    to_json = getattr(plan, "to_json", None)
    if callable(to_json):
        return to_json()
    try:
        return json.dumps(dict(plan), indent=2, sort_keys=True, default=repr) + "\n"
    except (TypeError, ValueError):
        return json.dumps({"repr": repr(plan)}) + "\n"
