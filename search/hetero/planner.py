"""Planners for clusters of several GPU types: `hetero` (ours), `fasop` and `uniform`.

All three walk the same degree grid (FASOP's: tp among the divisors of the GPUs per node,
dp dividing the global batch, pp = GPUs / (dp tp) up to the block count, every micro-batch
size dividing global_batch / dp) and differ in what else they try:

* `uniform` -- Megatron-LM as users run it: even layer split, even batch split, stages filling
  the nodes in the order the cluster is written. The baseline a heterogeneous planner must beat.
* `fasop` -- FASOP (HPDC'24) on our Oracle: the cyclic rotations of the nodes as written, its
  min-max partition (each stage costed on its slowest GPU type), even batch split, no
  recompute.
* `hetero` -- ours: every distinct node-kind sequence (pruned beyond a limit, space.py), the
  exact partition under memory caps (partition.py) next to FASOP's and the uniform one, a
  speed-proportional batch split across unequal replicas, recompute none or full.

Every candidate the planner runs is scored by the Oracle (lowered program + engine). It asks
in the order of the candidates' estimates and skips a candidate only when its proven lower
bound (candidates.py) is not below the best time already found: the best plan is then the
best of the whole space, not of a sample. `max_evals` and the time budget cap the work; the
result says whether the search finished (`complete`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from trainsim.errors import SpecError
from trainsim.search.hetero.block_costs import BlockCostTable
from trainsim.search.hetero.candidates import (
    SCHEDULES,
    Candidate,
    CandidateBuilder,
    Degrees,
    Layout,
)
from trainsim.search.hetero.space import cyclic_orders, distinct_orders
from trainsim.search.planner import SearchRecord, SearchState
from trainsim.workloads.plan import normalise_schedule
from trainsim.workloads.plan_fields import _divisors as divisors

MODES = {"hetero": "exact", "fasop": "fasop", "uniform": "uniform"}
"""Planner name -> candidate mode (candidates.py)."""


@dataclass(kw_only=True)
class HeteroPlanner:
    """Branch and bound over a heterogeneous plan space (module docstring)."""

    name: str = "hetero"
    """hetero, fasop or uniform."""
    max_evals: int = 1000
    """Oracle evaluations at most (the bound usually stops it well before)."""
    order_limit: int = 256
    """Distinct node orders tried at most (`hetero`)."""
    tp_degrees: tuple[int, ...] | None = None
    """Tensor-parallel degrees; the divisors of the smallest GPUs-per-node when None."""
    schedules: tuple[str, ...] | None = None
    """Pipeline schedules (of candidates.SCHEDULES); `hetero`: 1F1B and ZB-H1 (zero-bubble,
    Qi et al. ICLR'24: W passes fill the bubbles; every stage holds p micro-batches'
    activations, 1F1B's first stage's count, `held_micro_batches`); the others 1F1B
    (Megatron's)."""
    recompute: tuple[str, ...] | None = None
    """Recompute policies; `hetero`: none and full; the others none."""
    refine_rounds: int = 3
    """`hetero`: rounds of one-layer moves from each seed after the branch and bound."""
    refine_seeds: int = 3
    """`hetero`: plan shapes whose fastest plan seeds a climb (`_refine`)."""
    stats: dict[str, int | bool] = field(default_factory=dict)
    """After `steps`: candidates, evaluated, complete, orders_complete (what was pruned or left
    by the budget is in the search's result: `SearchResult.pruned`, `.capped`)."""

    def __post_init__(self) -> None:
        self._blocks = 0
        if self.name not in MODES:
            raise SpecError(f"hetero planner name {self.name!r} must be one of "
                            f"{', '.join(MODES)}")
        if self.max_evals < 1:
            raise SpecError(f"max_evals={self.max_evals} must be >= 1")

    # ------------------------------------------------------------------ the space
    def grid(self, state: SearchState, blocks: int) -> list[Degrees]:
        """FASOP's degree grid (module docstring); `hetero` adds full recompute and ZB-H1."""
        cluster, batch = state.cluster, state.spec.global_batch
        n = cluster.num_gpus
        per_node = min(g.gpus_per_node for g in cluster.node_groups)
        tps = self.tp_degrees or tuple(divisors(per_node))
        heads = int(getattr(state.model, "num_heads", 0) or 0)
        ours = self.name == "hetero"
        recompute = self.recompute or (("none", "full") if ours else ("none",))
        schedules = tuple(normalise_schedule(x) for x in self.schedules or
                          (("1f1b", "zb-h1") if ours else ("1f1b",)))
        for x in schedules:
            if x not in SCHEDULES:
                raise SpecError(f"schedule {x!r}: the heterogeneous planners size and bound "
                                f"partitions for {', '.join(SCHEDULES)}")
        out = []
        for tp in tps:
            if n % tp or (heads and heads % tp):
                continue
            for dp in divisors(n // tp):
                pp = n // (tp * dp)
                if batch % dp or pp > blocks:
                    continue
                for mbs in divisors(batch // dp):
                    for rc in recompute:
                        for sched in (schedules if pp > 1 else ("1f1b",)):
                            out.append(Degrees(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs,
                                               recompute=rc, schedule=sched))
        return out

    def orders(self, state: SearchState) -> list[tuple[tuple[int, ...], str]]:
        """(node order, note) pairs this planner tries."""
        cluster = state.cluster
        nodes = sum(g.nodes for g in cluster.node_groups)
        if self.name == "uniform":
            return [(tuple(range(nodes)), "nodes as written")]
        if self.name == "fasop":
            return [(o, f"rotation {i}") for i, o in enumerate(cyclic_orders(cluster))]
        found, complete = distinct_orders(cluster, limit=self.order_limit)
        self.stats["orders_complete"] = complete
        return [(o, f"order {i}") for i, o in enumerate(found)]

    def candidates(self, state: SearchState) -> list[Candidate]:
        """Every candidate of the space, best estimate first."""
        options = state.oracle.options
        table = BlockCostTable(state.model, state.cluster,
                               cost_model=None if options is None else options.cost_model,
                               embedding_and_head=options is None or options.embedding_and_head)
        self._blocks = table.num_blocks
        builder = CandidateBuilder(table, state.cluster, state.spec.global_batch,
                                   memory_limit_bytes=state.spec.memory_limit_bytes,
                                   framework=state.oracle.framework)
        out: list[Candidate] = []
        orders = self.orders(state)
        for deg in self.grid(state, table.num_blocks):
            seen: set[object] = set()
            for order, note in orders:
                kinds = Layout(state.cluster, order, deg).kinds
                if kinds in seen:  # another order giving every stage the same nodes' kinds
                    continue
                seen.add(kinds)
                out += builder.build(deg, order, MODES[self.name], note)
        out.sort(key=lambda c: (c.estimate_s, c.bound_s, c.note))
        return out

    # ------------------------------------------------------------------ the search
    def steps(self, state: SearchState) -> Iterator[SearchRecord]:
        """Ask the Oracle in estimate order; skip what the bound rules out.

        A candidate is skipped when its bound is no faster than the `top_k`-th fastest
        distinct fitting plan so far (ties keep discovery order), so the ranked plans are
        those of the unpruned search, not only the first (against the best alone, `--top 4`
        returned plans 2-4 that were not the next fastest). Skips count in `state.pruned`;
        candidates left when the time or `max_evals` runs out count in `state.capped`."""
        cands = self.candidates(state)
        self.stats.update(candidates=len(cands), evaluated=0, complete=False)
        bounded = state.spec.objective in ("throughput", "cost")  # both ∝ time here
        top_k = state.spec.top_k
        fastest: list[float] = []  # the top_k fastest fitting times, negated (a max-heap)
        kept: set[str] = set()
        for i, cand in enumerate(cands):
            if bounded and len(fastest) >= top_k and cand.bound_s >= -fastest[0]:
                state.pruned += 1
                continue
            if state.out_of_time() or int(self.stats["evaluated"]) >= self.max_evals:
                state.capped += len(cands) - i
                return
            record = state.evaluate(cand.fields, f"{self.name} {cand.note}")
            self.stats["evaluated"] = int(self.stats["evaluated"]) + 1
            if record.fits and record.summary.plan_key not in kept:
                kept.add(record.summary.plan_key)
                heapq.heappush(fastest, -record.summary.iteration_time_s)
                if len(fastest) > top_k:
                    heapq.heappop(fastest)
            yield record
        self.stats["complete"] = True
        if self.name == "hetero":
            yield from self._refine(state)

    def _refine(self, state: SearchState) -> Iterator[SearchRecord]:
        """Hill-climb by moving one layer between two stages, on the Oracle: the partition
        estimate cannot see transfers and schedule details the engine does, so the engine has
        the last word on the split. It climbs from the fastest plan of each pipeline depth
        and shape (tp, micro-batch size, schedule, recompute; up to `refine_seeds`, fastest
        first), not from the best plan alone: a shape whose best split the estimate misjudged
        can overtake after a move, and climbing from the single best made a looser memory
        limit return a slower plan (the bug hunt: gpt3-350m
        on A100 + A10, 0.4177 s at 3 GB, 0.4275 s at 4 GB, where the 3 GB plan fits)."""
        seeds: dict[tuple[Any, ...], SearchRecord] = {}
        for record in state.ranked_all():
            plan = record.plan
            if plan is not None and plan.pp >= 2:
                shape = (plan.pp, plan.tp, plan.micro_batch_size, plan.schedule, plan.recompute)
                seeds.setdefault(shape, record)
        for seed in list(seeds.values())[: self.refine_seeds]:
            yield from self._climb(state, seed)

    def _climb(self, state: SearchState, start: SearchRecord) -> Iterator[SearchRecord]:
        """`refine_rounds` rounds of one-layer moves from `start`, each from the best so far."""
        assert start.plan is not None
        best, base, moves = start, start.note.removeprefix("hetero "), 0
        for _ in range(self.refine_rounds):
            assert best.plan is not None
            counts = list(best.plan.layers_per_stage(self._blocks))
            round_best = best
            for i in range(len(counts)):
                for j in range(len(counts)):
                    if i == j or counts[i] <= 1 or state.out_of_time() \
                            or int(self.stats["evaluated"]) >= self.max_evals:
                        continue
                    moved = list(counts)
                    moved[i] -= 1
                    moved[j] += 1
                    fields = {**best.plan.to_dict(), "stage_layers": moved}
                    if state.seen(fields) is not None:
                        continue
                    record = state.evaluate(fields, f"hetero refined ({moves + 1} layer moves, "
                                                    f"layers={'/'.join(map(str, moved))}) from "
                                                    f"{base}")
                    self.stats["evaluated"] = int(self.stats["evaluated"]) + 1
                    if record.fits and record.score < round_best.score:
                        round_best = record
                    yield record
            moves += 1
            improved = round_best is not best
            best = round_best
            if not improved:
                return


__all__ = ["MODES", "HeteroPlanner"]
