"""aceso: iterative bottleneck alleviation over non-uniform plans (Aceso, EuroSys'24 §4).

Aceso searches from a few balanced start plans. At each step it finds the bottleneck stage —
the one over memory if any, else the slowest (largest compute-stream busy time, `Summary.
stage_busy_s`) — and tries moves that relieve it (search/aceso_moves.py), ordered by what
dominates that stage. A move that improves the plan is taken; when none does, the search goes
deeper (multi-hop: up to `max_hops` moves that do not improve on their own, depth first), and
when that fails too it restarts from the best plan it has not yet started from. It stops when
the time budget is spent or every restart is exhausted.

Unlike Aceso's analytic cost model, every candidate here is costed by trainsim's Oracle, which
also counts data-parallel gradient reduction, the optimizer step and compute/communication
overlap, so the plans the search prefers hold up in simulation. Starts can include given
plans (e.g. grid's best): the result is never worse than any start, since starts are evaluated
on the same Oracle and the ranking keeps the best plan seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainsim.search.aceso_moves import (
    RECOMPUTE_LADDER,
    AcesoConfig,
    AcesoStage,
    check_config,
    config_of,
    moves,
)
from trainsim.search.planner import SearchRecord, SearchState, memory_ratio


def num_blocks(model: Any) -> int:
    """Blocks the lowering partitions (transformer/conv blocks)."""
    from trainsim.workloads.model import build_graph

    return len(build_graph(model, 1).transformer_layers())


def recompute_ladder(model: Any) -> tuple[str, ...]:
    """none → selective → full where the model has selective-recompute ops, else none → full."""
    from trainsim.workloads.model import build_graph

    graph = build_graph(model, 1)
    selective = any(op.selective_recompute for la in graph.layers for op in la.ops)
    return RECOMPUTE_LADDER if selective else ("none", "full")


@dataclass(frozen=True, kw_only=True, slots=True)
class AcesoPlanner:
    """Aceso's search on the Oracle."""

    name: str = "aceso"
    """Planner name in results."""
    starts: tuple[Any, ...] = ()
    """Extra start plans (ParallelPlan or field dicts), evaluated first."""
    max_hops: int = 2
    """Moves the depth-first search may chain without improving (Aceso's multi-hop)."""
    branch: int = 6
    """Moves tried per level beyond the first."""
    max_restarts: int = 8
    """Restarts from near-best plans after the seeds."""
    seeds: Sequence[int] | None = field(default=None)
    """Pipeline depths of the balanced seeds; powers of two up to min(GPUs, blocks) if None."""

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
        top of the recompute ladder (fits first; the search then switches recompute off where
        memory allows, and halves or doubles the micro-batch)."""
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
        configs: dict[str, AcesoConfig] = {}
        batch = ctx["global_batch"]

        def run(cfg: AcesoConfig, note: str) -> SearchRecord:
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
                configs[rec.summary.plan_key] = cfg
                starts.append(rec)
        for cfg in self.seed_configs(ctx):
            if state.out_of_time():
                return
            rec = run(cfg, f"seed pp={len(cfg.stages)} rc={cfg.stages[0].recompute}")
            yield rec
            starts.append(rec)

        used: set[str] = set()
        pending = sorted(starts, key=lambda r: state.key(r.summary))
        restarts = 0
        while pending and not state.out_of_time():
            start = pending.pop(0)
            if start.summary.plan_key in used or start.summary.plan_key not in configs:
                continue
            used.add(start.summary.plan_key)
            current = start
            while not state.out_of_time():
                found: list[SearchRecord | None] = [None]
                yield from self._dfs(state, ctx, configs, current, state.key(current.summary),
                                     0, found, run)
                if found[0] is None:
                    break
                current = found[0]
                used.add(current.summary.plan_key)
            restarts += 1
            if restarts > len(starts) + self.max_restarts:
                break
            near = sorted((r for r in state.log if r.summary.plan_key not in used
                           and r.summary.plan_key in configs and r.summary.error is None),
                          key=lambda r: state.key(r.summary))
            pending = near[:1] + [p for p in pending if p.summary.plan_key not in used]

    def _dfs(self, state: SearchState, ctx: dict[str, Any], configs: dict[str, AcesoConfig],
             node: SearchRecord, target: tuple[int, float], depth: int,
             found: list[SearchRecord | None], run: Any) -> Iterator[SearchRecord]:
        """Depth-first over moves from `node`; sets found[0] to the first plan better than
        `target` (multi-hop: up to max_hops non-improving moves in a row)."""
        cfg = configs[node.summary.plan_key]
        summary = node.summary
        mem = tuple(summary.peak_memory_bytes_per_rank)
        limit = state.spec.memory_limit_bytes
        over = summary.error is None and memory_ratio(summary, limit) > 1.0
        if over and len(mem) == len(cfg.stages):
            caps = summary.memory_capacity_bytes_per_rank
            ratio = [m / min(c, limit or c) for m, c in zip(mem, caps)]
            b = max(range(len(ratio)), key=ratio.__getitem__)
        elif len(summary.stage_busy_s) == len(cfg.stages):
            b = max(range(len(cfg.stages)), key=summary.stage_busy_s.__getitem__)
        else:
            b = 0
        children: list[SearchRecord] = []
        tried = 0
        for move in moves(cfg, b, memory_bound=over, busy_s=summary.stage_busy_s,
                          ladder=ctx["ladder"]):
            if state.out_of_time() or tried >= self.branch + 2:
                break
            if not check_config(move.config, **ctx):
                continue
            fields = move.config.to_fields(ctx["global_batch"])
            if state.seen(fields) is not None:
                continue
            tried += 1
            rec = run(move.config, f"{move.name} (hop {depth})")
            yield rec
            if rec.summary.error is None and state.key(rec.summary) < target:
                found[0] = rec
                return
            if rec.summary.error is None:
                children.append(rec)
        if depth + 1 > self.max_hops:
            return
        for child in sorted(children, key=lambda r: state.key(r.summary))[:2]:
            if state.out_of_time():
                return
            yield from self._dfs(state, ctx, configs, child, target, depth + 1, found, run)
            if found[0] is not None:
                return


__all__ = ["AcesoPlanner", "num_blocks", "recompute_ladder"]
