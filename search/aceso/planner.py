"""aceso: iterative bottleneck alleviation over non-uniform plans (Aceso, EuroSys'24 §4).

Aceso searches from a few balanced start plans. At each step it finds the bottleneck stage —
the one over memory if any, else the slowest (largest compute-stream busy time, `Summary.
stage_busy_s`) — and tries moves that relieve it (search/aceso/moves.py), ordered by what
dominates that stage. A move that improves the plan is taken; when none does, the search goes
deeper (multi-hop: up to `max_hops` moves that do not improve on their own, depth first), and
when that fails too it restarts from the best plan it has not yet started from. It stops when
the time budget is spent or every restart is exhausted.

Three things keep the search cheap where trainsim's Oracle costs more per plan than Aceso's
analytic model: no config is evaluated twice in one search (a migration and its reverse, or
mbs*2 then mbs/2, lead back to seen plans — before this check most evaluations of a long
search were such repeats); migrations are sized from the Oracle's per-stage busy times
(`rebalance`, `balance_moves`), so balancing a 1024-layer pipeline takes a few moves rather
than one per layer; and a deeper hop follows both the best child and the fastest one even
when it is over memory (`hop_children`), the move pairs Aceso's multi-hop exists for.

Unlike Aceso's analytic cost model, every candidate here is costed by trainsim's Oracle, which
also counts data-parallel gradient reduction, the optimizer step and compute/communication
overlap, so the plans the search prefers hold up in simulation. Starts can include given
plans (e.g. grid's best): the result is never worse than any start, since starts are evaluated
on the same Oracle and the ranking keeps the best plan seen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trainsim.search.aceso.moves import (
    RECOMPUTE_LADDER,
    AcesoConfig,
    AcesoStage,
    Move,
    check_config,
    config_of,
    migrate,
    moves,
    op_groups,
    set_micro_batch,
)
from trainsim.search.oracle import Summary
from trainsim.search.planner import SearchRecord, SearchState, memory_ratio
from trainsim.workloads.model import ModelSpec, build_graph
from trainsim.workloads.plan import ParallelPlan


def num_blocks(model: ModelSpec) -> int:
    """Blocks the lowering partitions (transformer/conv blocks)."""
    return len(build_graph(model, 1).transformer_layers())


def recompute_ladder(model: ModelSpec) -> tuple[str, ...]:
    """none → selective → full where the model has selective-recompute ops, else none → full."""
    graph = build_graph(model, 1)
    selective = any(op.selective_recompute for la in graph.layers for op in la.ops)
    return RECOMPUTE_LADDER if selective else ("none", "full")


ROOMY_MEMORY_RATIO = 0.5
"""Peak / limit on every stage at or below which a time-bound node tries mbs*2 first: doubling
the micro-batch at most doubles activation memory, so it still fits."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AcesoPlanner:
    """Aceso's search on the Oracle."""

    name: str = "aceso"
    """Planner name in results."""
    starts: tuple[ParallelPlan | Mapping[str, Any], ...] = ()
    """Extra start plans (ParallelPlan or field dicts), evaluated first."""
    max_hops: int = 2
    """Moves the depth-first search may chain without improving (Aceso's multi-hop)."""
    branch: int = 6
    """Moves tried per node at hops 1.. (+ 2 and the sized migrations); hop 0 tries all."""
    max_restarts: int = 8
    """Restarts from near-best plans after the seeds."""
    seeds: Sequence[int] | None = field(default=None)
    """Pipeline depths of the balanced seeds; powers of two up to min(GPUs, blocks) if None."""
    prune: bool = True
    """Skip evaluating a last-hop move whose compute-only lower bound (search/bound.py) shows
    it cannot beat the plan the search is improving on: such a move is never searched from and
    never the improvement a step takes, so every climb takes the same steps with fewer
    evaluations (GPT-3 1.3B on 4 V100: 149 instead of 251, the same best plan). The skipped
    plans are missing from the log and the lower-ranked results, and a restart (which starts
    from the best unused plan in the log) may then start elsewhere; False evaluates them."""
    per_op_tp: bool = True
    """Also try per-op tensor-parallel degrees (Aceso's op-level tp over the model's
    `op_groups`, heaviest first; `moves.moves` places them after the stage's own tp)."""

    # ------------------------------------------------------------------ setup
    def _context(self, state: SearchState) -> dict[str, Any]:
        model, cluster = state.model, state.cluster
        gpn = min(g.gpus_per_node for g in cluster.node_groups) \
            if hasattr(cluster.node_groups[0], "gpus_per_node") else cluster.num_gpus
        return {"num_gpus": cluster.num_gpus, "gpus_per_node": gpn,
                "num_layers": num_blocks(model), "global_batch": state.spec.global_batch,
                "heads": int(getattr(model, "num_heads", 0) or 0),
                "ladder": recompute_ladder(model)}

    def seed_configs(self, ctx: dict[str, Any]) -> list[AcesoConfig]:
        """Balanced starts: for each pipeline depth, equal GPUs and layers per stage, tp = 1,
        two samples per data-parallel replica (one when the batch does not allow it), and the
        top of the recompute ladder. `steps` then sizes each seed's micro-batch
        (`_probe_seed`), so a depth starts from its best Megatron-like uniform plan."""
        n, layers = ctx["num_gpus"], ctx["num_layers"]
        depths = self.seeds or [p for p in (2**k for k in range(12))
                                if p <= min(n, layers) and n % p == 0]
        out = []
        for pp in depths:
            g = n // pp
            base, extra = divmod(layers, pp)
            for mbs in (2 * g, g):
                stages = tuple(AcesoStage(layers=base + (1 if i < extra else 0), gpus=g, tp=1,
                                          recompute=ctx["ladder"][-1]) for i in range(pp))
                cfg = AcesoConfig(stages=stages, micro_batch_size=mbs)
                if check_config(cfg, **ctx):
                    out.append(cfg)
                    break
        return out

    # ------------------------------------------------------------------ search
    def steps(self, state: SearchState) -> Iterator[SearchRecord]:
        """Seeds and given starts, then bottleneck-driven multi-hop DFS with restarts."""
        ctx = self._context(state)
        groups = op_groups(state.model) if self.per_op_tp else ()
        configs: dict[str, AcesoConfig] = {}
        visited: set[AcesoConfig] = set()
        batch = ctx["global_batch"]

        def run(cfg: AcesoConfig, note: str) -> SearchRecord:
            visited.add(cfg)
            record = state.evaluate(cfg.to_fields(batch), note)
            configs[record.summary.plan_key] = cfg
            return record

        starts: list[SearchRecord] = []
        for plan in self.starts:
            if state.out_of_time():
                return
            rec = state.evaluate(plan, "start (given)")
            yield rec
            if rec.plan is not None:
                cfg = config_of(rec.plan, ctx["num_layers"])
                if cfg.stages[0].recompute not in ctx["ladder"]:
                    continue
                visited.add(cfg)
                configs[rec.summary.plan_key] = cfg
                starts.append(rec)
        seeds = self.seed_configs(ctx)

        def run_seeds() -> Iterator[SearchRecord]:
            while seeds and not state.out_of_time():
                best = yield from self._probe_seed(state, ctx, seeds.pop(0), run, visited)
                if best is not None:
                    starts.append(best)
                    pending.append(best)

        # Given starts (grid's best) are evaluated first, so the search never reports less than
        # them; then the balanced seeds are probed, and the hill climb begins at the best of
        # all. Searching a given start's neighbourhood first spent a 5 s budget on +5% around
        # grid's uniform tp=2 plan for T5 770M while a seed's neighbourhood held +29%.
        used: set[str] = set()
        pending = list(starts)
        yield from run_seeds()
        pending.sort(key=lambda r: state.key(r.summary))
        restarts = 0
        while pending and not state.out_of_time():
            start = pending.pop(0)
            if start.summary.plan_key in used or start.summary.plan_key not in configs:
                continue
            used.add(start.summary.plan_key)
            current = start
            while not state.out_of_time():
                found: list[SearchRecord | None] = [None]
                yield from self._dfs(state, ctx, configs, visited, current,
                                     state.key(current.summary), 0, found, run, groups)
                if found[0] is None:
                    break
                current = found[0]
                used.add(current.summary.plan_key)
            restarts += 1
            yield from run_seeds()
            if restarts > len(starts) + self.max_restarts:
                break
            near = sorted((r for r in state.log if r.summary.plan_key not in used
                           and r.summary.plan_key in configs and r.summary.error is None),
                          key=lambda r: state.key(r.summary))
            pending = near[:1] + [p for p in pending if p.summary.plan_key not in used]

    def _probe_seed(self, state: SearchState, ctx: dict[str, Any], cfg: AcesoConfig,
                    run: Callable[[AcesoConfig, str], SearchRecord],
                    visited: set[AcesoConfig]
                    ) -> Generator[SearchRecord, None, SearchRecord | None]:
        """The balanced seed `cfg` at its best micro-batch, at both ends of the recompute
        ladder (full and none): Megatron's uniform plan at that depth as a user would tune it.

        Full recompute starts from the seed's micro-batch: while the plan fits, double it
        (larger kernels, fewer micro-batches; stop at the first plan over memory or after two
        doublings that do not improve); when the seed itself is over memory, halve it while
        the data-parallel degree still divides it. No recompute is probed only where full
        fitted, doubling up from one sample per replica. Returns the best record of all probes (the one closest to
        fitting when none fits), which the search then starts from. Without this, a deep
        model's seed kept two samples per replica and the search spent its budget doubling
        the micro-batch one depth at a time (1024 layers: ended at 0.98x grid's best)."""
        ladder = ctx["ladder"]
        best: SearchRecord | None = None
        batch = ctx["global_batch"]

        def better(rec: SearchRecord | None) -> None:
            nonlocal best
            if rec is not None and rec.summary.error is None and (
                    best is None or state.key(rec.summary) < state.key(best.summary)):
                best = rec

        def probe(c: AcesoConfig) -> Generator[SearchRecord, None, SearchRecord | None]:
            if c in visited:
                return state.seen(c.to_fields(batch))
            rec = run(c, f"seed pp={len(c.stages)} mbs={c.micro_batch_size} "
                         f"rc={c.stages[0].recompute}")
            yield rec
            return rec

        for rung in dict.fromkeys((ladder[-1], ladder[0])):
            cur = replace(cfg, stages=tuple(replace(s, recompute=rung) for s in cfg.stages))
            if rung != ladder[-1]:
                # No recompute needs more memory than full at every micro-batch: probe it only
                # where full fitted, from one sample per replica up.
                if best is None or not best.fits:
                    break
                cur = replace(cur, micro_batch_size=cur.stages[0].dp)
            if state.out_of_time() or not check_config(cur, **ctx):
                continue
            rec = yield from probe(cur)
            better(rec)
            if rec is None:
                continue
            step = 2.0 if rec.fits else 0.5
            top, worse = rec, 0
            while worse < 2 and not state.out_of_time():
                nxt = set_micro_batch(cur, step)
                if nxt is None or not check_config(nxt, **ctx):
                    break
                cur = nxt
                rec = yield from probe(cur)
                if rec is None:
                    break
                better(rec)
                if step < 1:  # halving: stop at the first plan that fits
                    if rec.fits:
                        break
                    continue
                if not rec.fits:  # doubling: stop at the first plan over memory
                    break
                if state.key(rec.summary) < state.key(top.summary):
                    top, worse = rec, 0
                else:
                    worse += 1
        return best

    def _dfs(self, state: SearchState, ctx: dict[str, Any], configs: dict[str, AcesoConfig],
             visited: set[AcesoConfig], node: SearchRecord, target: tuple[int, float],
             depth: int, found: list[SearchRecord | None],
             run: Callable[[AcesoConfig, str], SearchRecord],
             groups: tuple[tuple[str, ...], ...] = ()) -> Iterator[SearchRecord]:
        """Depth-first over moves from `node`; sets found[0] to the first plan better than
        `target` (multi-hop: up to max_hops non-improving moves in a row). Configs already
        evaluated in this search are skipped, so every evaluation is a new plan."""
        cfg = configs[node.summary.plan_key]
        summary = node.summary
        n = len(cfg.stages)
        limit = state.spec.memory_limit_bytes
        over = summary.error is None and memory_ratio(summary, limit) > 1.0
        ratios = stage_memory_ratios(summary, n, limit)
        busy = summary.stage_busy_s if len(summary.stage_busy_s) == n else ()
        if over and ratios:
            b = max(range(n), key=ratios.__getitem__)
        elif busy:
            b = max(range(n), key=busy.__getitem__)
        else:
            b = 0
        extra = list(balance_moves(cfg, b, busy_s=busy, memory_ratios=ratios,
                                   memory_bound=over))
        children: list[SearchRecord] = []
        tried = 0
        # Every move from the node itself (hop 0: Aceso tries them all, and with many stages
        # the GPU trades alone would crowd mbs*2 out); `branch` + 2 per node deeper down.
        cap = self.branch + 2 + len(extra) if depth else math.inf
        order = [*extra, *moves(cfg, b, memory_bound=over, busy_s=busy, ladder=ctx["ladder"],
                                op_groups=groups)]
        if not over and ratios and max(ratios) <= ROOMY_MEMORY_RATIO:
            # Memory to spare: a larger micro-batch (fewer, more efficient kernels; fewer
            # micro-batches to simulate) is the likeliest gain, so it goes first.
            order.sort(key=lambda m: m.name != "mbs*2")
        leaf = depth + 1 > self.max_hops  # its children are not searched from
        for move in order:
            if state.out_of_time() or tried >= cap:
                break
            if move.config in visited or not check_config(move.config, **ctx):
                continue
            tried += 1
            if leaf and self.prune and state.cannot_improve(move.config.to_fields(
                    ctx["global_batch"]), target):
                visited.add(move.config)
                state.pruned += 1
                continue
            rec = run(move.config, f"{move.name} (hop {depth})")
            yield rec
            if rec.summary.error is None and state.key(rec.summary) < target:
                found[0] = rec
                return
            if rec.summary.error is None:
                children.append(rec)
        if depth + 1 > self.max_hops:
            return
        for child in hop_children(children, state):
            if state.out_of_time():
                return
            yield from self._dfs(state, ctx, configs, visited, child, target, depth + 1,
                                 found, run, groups)
            if found[0] is not None:
                return


def hop_children(children: Sequence[SearchRecord], state: SearchState) -> list[SearchRecord]:
    """Where a multi-hop search goes deeper: the best child by the search order, and the
    fastest child even when it is over memory (Aceso's multi-hop: a move that speeds the
    bottleneck up but breaks memory, then one that repairs memory)."""
    if not children:
        return []
    best = min(children, key=lambda r: state.key(r.summary))
    fast = max(children, key=lambda r: (r.summary.samples_per_s, -r.step))
    return [best] if fast is best else [best, fast]


def stage_memory_ratios(summary: Summary, num_stages: int, limit_bytes: float | None
                        ) -> tuple[float, ...]:
    """Per stage: peak memory over its allowance (min of the limit and the device), when the
    Summary has one program rank per stage (else ())."""
    mem = summary.peak_memory_bytes_per_rank
    caps = summary.memory_capacity_bytes_per_rank
    if summary.error is not None or len(mem) != num_stages or len(caps) != num_stages:
        return ()
    return tuple(m / min(c, limit_bytes or c) for m, c in zip(mem, caps))


def rebalance(cfg: AcesoConfig, busy_s: Sequence[float]) -> AcesoConfig | None:
    """Layers re-split over the same stages in proportion to each stage's speed.

    Stage i ran ℓ_i layers in busy_s[i], so it takes t_i = busy_s[i] / ℓ_i per layer; giving it
    ℓ'_i ∝ 1 / t_i layers makes every stage's time equal if per-layer time stays t_i (largest-
    remainder rounding, ≥ 1 layer each). A stage's fixed work (embedding, head) inflates its t_i,
    so the move is repeated by the search until the stages agree. One evaluation balances a
    pipeline whatever its depth in layers — where one-layer migrations need O(layers) steps.
    """
    n = len(cfg.stages)
    if n < 2 or len(busy_s) != n or min(busy_s) <= 0:
        return None
    total = sum(s.layers for s in cfg.stages)
    speed = [s.layers / t for s, t in zip(cfg.stages, busy_s)]
    share = [total * v / sum(speed) for v in speed]
    layers = [max(1, int(x)) for x in share]
    order = sorted(range(n), key=lambda i: (-(share[i] - int(share[i])), i))
    k = 0
    while sum(layers) < total:
        layers[order[k % n]] += 1
        k += 1
    while sum(layers) > total:
        i = max((j for j in range(n) if layers[j] > 1), key=lambda j: layers[j] - share[j])
        layers[i] -= 1
    if layers == [s.layers for s in cfg.stages]:
        return None
    out = cfg
    for i, count in enumerate(layers):
        out = out.with_stage(i, layers=count)
    return out


def balance_moves(cfg: AcesoConfig, b: int, *, busy_s: Sequence[float],
                  memory_ratios: Sequence[float], memory_bound: bool) -> Iterator[Move]:
    """Migrations sized from the Oracle's figures, tried before Aceso's one-op steps.

    Time-bound: the proportional `rebalance`, then moving k = (busy_b − busy_j) / (t_b + t_j)
    layers to each neighbour j (equal times if per-layer times t hold). Memory-bound: moving
    k = ⌈ℓ_b (1 − 1/ratio_b)⌉ layers to the neighbour with more headroom (memory taken as
    proportional to layers). Sizes of one are left to `moves`, which has them.
    """
    n = len(cfg.stages)
    s = cfg.stages[b]
    neighbours = [j for j in (b - 1, b + 1) if 0 <= j < n]
    if memory_bound:
        if len(memory_ratios) != n or memory_ratios[b] <= 1.0:
            return
        k = math.ceil(s.layers * (1.0 - 1.0 / memory_ratios[b]))
        for j in sorted(neighbours, key=lambda j: memory_ratios[j]):
            k_j = min(k, s.layers - 1)
            new = migrate(cfg, b, j, k_j) if k_j >= 2 else None
            if new is not None:
                yield Move(name=f"migrate{k_j} s{b}->s{j}", config=new)
        return
    if len(busy_s) != n or min(busy_s) <= 0:
        return
    new = rebalance(cfg, busy_s)
    if new is not None:
        yield Move(name="rebalance", config=new)
    t_b = busy_s[b] / s.layers
    for j in sorted(neighbours, key=lambda j: busy_s[j]):
        t_j = busy_s[j] / cfg.stages[j].layers
        k = min(round((busy_s[b] - busy_s[j]) / (t_b + t_j)), s.layers - 1)
        new = migrate(cfg, b, j, k) if k >= 2 else None
        if new is not None:
            yield Move(name=f"migrate{k} s{b}->s{j}", config=new)


__all__ = ["AcesoPlanner", "balance_moves", "num_blocks", "rebalance", "recompute_ladder",
           "stage_memory_ratios"]
