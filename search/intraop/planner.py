"""Entry of the intra-operator planners: `run_intraop(model, cluster, method=...)`.

method "intraop" is CFP (cfp.py: blocks priced on the engine, DP over repeated segments);
"alpa" is the ILP (alpa.py) over the same blocks with Alpa's α-β cost model; "megatron" is
the hand-written baseline (megatron.py, the better of plain TP and TP + sequence parallelism).
Whatever found it, the plan is lowered whole (program.py) and scored by the numba engine: the
figures reported are the engine's, never a planner's own estimate.

One iteration is one batch of `global_batch` samples sharded SPMD over the mesh (no pipeline
stages, no gradient accumulation: CFP and Alpa's intra-op pass search one mesh's sharding);
pipeline.py ("intraop-pp") adds stages and micro-batches around this planner.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from trainsim.errors import PlanError, SpecError
from trainsim.hwmodels.cluster import Cluster, parse_cluster
from trainsim.search.intraop.alpa import IlpResult, solve_ilp
from trainsim.search.intraop.blocks import Block, build_blocks, with_plan_options
from trainsim.search.intraop.cfp import CfpSolver
from trainsim.search.intraop.costs import AlphaBetaPricing, OraclePricing
from trainsim.search.intraop.megatron import megatron_plan
from trainsim.search.intraop.problem import Problem, build_problem
from trainsim.search.intraop.program import lower_nodes, lower_plan, program_time_s
from trainsim.simulator.program import Program
from trainsim.workloads.model import ModelSpec, build_graph, trained_in
from trainsim.workloads.sharding.graph import SpmdGraph, build_spmd_graph
from trainsim.workloads.sharding.mesh import DeviceMesh, parse_mesh
from trainsim.workloads.sharding.plan import ShardingPlan, grad_sync, saved_bytes
from trainsim.workloads.sharding.spec import format_spec
from trainsim.workloads.zoo import get_model

METHODS = ("intraop", "alpa", "megatron")
GB = 1e9


class IntraopMemoryError(PlanError):
    """No sharding plan fits the memory limit (the CLI exits 3)."""

    def __init__(self, message: str, least_bytes: float | None = None) -> None:
        super().__init__(message)
        self.least_bytes = least_bytes
        """The least memory per GPU any plan needs, where known."""


@dataclass(slots=True)
class IntraopResult:
    """A found plan with the engine's verdict and the search's own figures."""

    method: str
    model: str
    cluster: Cluster
    plan: ShardingPlan
    blocks: list[Block]
    choice: list[int]
    iteration_time_s: float
    memory_bytes: float
    search_s: float
    oracle_evaluations: int
    strategy_space: int
    planner_estimate_s: float
    ilp: IlpResult | None = None
    program: Program | None = field(default=None, repr=False)
    pricing: OraclePricing | None = field(default=None, repr=False)

    @property
    def samples_per_s(self) -> float:
        """Samples per second on the engine."""
        batch = self.plan.graph.graph.micro_batch_size
        return batch / self.iteration_time_s if self.iteration_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON (spec per op) with the figures; no wall-clock times (stable bytes)."""
        out: dict[str, Any] = {
            "method": self.method, "model": self.model,
            "global_batch": self.plan.graph.graph.micro_batch_size,
            "iteration_time_s": self.iteration_time_s, "samples_per_s": self.samples_per_s,
            "memory_bytes_per_gpu": self.memory_bytes,
            "oracle_evaluations": self.oracle_evaluations,
            "ilp_strategy_space": self.strategy_space,
            "plan": self.plan.to_dict(),
        }
        if self.ilp is not None:
            out["ilp"] = {"status": self.ilp.status, "mip_gap": self.ilp.mip_gap,
                          "objective_s": self.ilp.objective_s, "variables": self.ilp.variables}
        return out

    def summary_rows(self) -> list[dict[str, Any]]:
        """One row per block of each distinct layer: ops, strategy, specs, the collectives
        into the block and inside it (forward, backward, and "grad": its weight-gradient
        reduction) and what they cost alone (ms), and how many layers are laid out exactly
        alike ("repeats")."""
        graph, pricing = self.plan.graph, self.pricing
        assert pricing is not None
        strategies = self.plan.strategies
        edges = {(dst, slot): (fwd, bwd) for _s, dst, slot, fwd, bwd in self.plan.edges()}
        per_layer: dict[int, list[dict[str, Any]]] = {}
        for b in self.blocks:
            colls = []
            for n in b.nodes:
                for slot in range(len(graph.nodes[n].srcs)):
                    fwd, bwd = edges[(n, slot)]
                    colls += [("fwd", c) for c in fwd] + [("bwd", c) for c in bwd]
                colls += [("fwd", c) for c in strategies[n].fwd_comm]
                colls += [("grad", c) for c in grad_sync(
                    graph, dict(enumerate(strategies)), n, self.plan.mesh, self.plan.dtype)]
            st = strategies[b.nodes[0]]
            layer = graph.nodes[b.nodes[0]].layer
            per_layer.setdefault(layer, []).append({
                "layer": graph.layer_names[layer],
                "ops": [graph.nodes[n].op.name for n in b.nodes], "strategy": st.name,
                "input": format_spec(st.in_specs[0]) if st.in_specs else "-",
                "output": format_spec(strategies[b.nodes[-1]].out_spec),
                "collectives": [f"{p} {c.kind} axis{c.axis} {c.size_bytes / 2**20:.1f} MiB"
                                for p, c in colls],
                "comm_ms": sum(pricing.collective_s(c) for _p, c in colls) * 1e3})
        groups: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        for rows in per_layer.values():
            key = repr(rows)
            count, _ = groups.get(key, (0, rows))
            groups[key] = (count + 1, rows)
        return [{**row, "repeats": count} for count, rows in groups.values() for row in rows]


def _resolve(model: str | ModelSpec, cluster: str | Cluster) -> tuple[ModelSpec, Cluster]:
    spec = get_model(model) if isinstance(model, str) else model
    cl = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if spec.family == "wresnet" or spec.family == "t5":
        raise SpecError(f"intra-op search covers GPT, LLaMA, BERT and MoE models; "
                        f"{spec.name} is {spec.family}")
    return spec, cl


def resolve_inputs(model: str | ModelSpec, cluster: str | Cluster, global_batch: int,
                   mesh: str | tuple[int, ...] | None, memory_limit_gb: float | None,
                   dtype: str | None) -> tuple[ModelSpec, Cluster, DeviceMesh, str, float]:
    """Model, cluster, mesh (default 1-D over every GPU), dtype and memory limit per GPU in
    bytes (default the GPU's) of a search, checked: bad values are one-line SpecErrors."""
    if global_batch < 1:
        raise SpecError(f"--global-batch {global_batch} must be >= 1")
    spec, cl = _resolve(model, cluster)
    the_mesh = parse_mesh(mesh if mesh is not None else str(cl.num_gpus), cl.num_gpus)
    limit = memory_limit_gb * GB if memory_limit_gb is not None \
        else float(cl.gpu(0).memory_bytes)
    if limit <= 0:
        raise SpecError(f"--memory-limit-gb {memory_limit_gb} must be > 0")
    dtype = dtype or spec.dtype
    return trained_in(spec, dtype), cl, the_mesh, dtype, limit  # activations in its bytes


def plan_from_choice(graph: SpmdGraph, mesh: DeviceMesh, blocks: list[Block],
                     choice: list[int], dtype: str) -> ShardingPlan:
    """The per-op plan of one option per block (a recomputing option makes its block a
    recompute group)."""
    out: list[Any] = [None] * len(graph.nodes)
    groups = [-1] * len(graph.nodes)
    for b, k in zip(blocks, choice, strict=True):
        for n, st in zip(b.nodes, b.options[k], strict=True):
            out[n] = st
            if b.recomputes(k):
                groups[n] = b.index
    return ShardingPlan(graph=graph, mesh=mesh, strategies=tuple(out), dtype=dtype,
                        recompute_group=tuple(groups) if max(groups) >= 0 else ())


def least_memory_bytes(problem: Problem) -> float:
    """The least memory per GPU any plan needs (memory is a sum over blocks)."""
    return float(sum(m.min() for m in problem.memory_bytes))


def _with_megatron(blocks: list[Block], graph: SpmdGraph, mesh: DeviceMesh, dtype: str
                   ) -> list[Block]:
    """Beyond CFP and Alpa's blocks: Megatron-LM's plan (with and without sequence
    parallelism) is in the space, so a search is never refused a limit the Megatron baseline
    meets nor beaten by it where it fits (`blocks.with_plan_options`)."""
    for sp in (False, True):
        blocks = with_plan_options(blocks, megatron_plan(graph, mesh, dtype, sp).strategies)
    return blocks


def _no_fit(limit: float, least: float) -> IntraopMemoryError:
    return IntraopMemoryError(
        f"no sharding plan fits in {limit / GB:.2f} GB per GPU; the smallest limit any plan "
        f"meets is {least / GB:.2f} GB", least_bytes=least)


POLISH_MAX_RUNS = 48
"""Engine runs the polish of segment-boundary blocks may spend (`_polish_boundaries`); a count,
not a time, so that the same inputs always give the same plan."""


def _polish_boundaries(graph: SpmdGraph, mesh: DeviceMesh, blocks: list[Block],
                       choice: list[int], cluster: Cluster, oracle: OraclePricing, dtype: str,
                       limit: float, problem: Problem) -> tuple[list[int], int]:
    """Beyond CFP: the blocks that read or feed another segment (the first layer after the
    embedding, the head) are where the segment DP's sum of block times is least like the
    whole iteration (overlap of gradient reductions with the neighbours' work). Each of
    their other options is scored on the engine with its neighbourhood (the layers around
    every segment boundary), greedily, within `POLISH_MAX_RUNS`. Returns the choice and the
    engine runs spent."""
    boundary = []
    for b in blocks:
        layer = graph.nodes[b.nodes[0]].layer
        crosses = any(graph.nodes[s].layer != layer for n in b.nodes for s in graph.nodes[n].srcs)
        unique = graph.segment_keys.count(graph.segment_keys[layer]) == 1
        if (crosses or unique) and len(b.options) > 1:
            boundary.append(b)
    runs = 0
    # Score on the layers around the boundaries only (the options differ there): the
    # unique segments and the first and last two layers of every repeated one.
    keys = graph.segment_keys
    near: set[int] = set()
    for key in set(keys):
        where = [i for i, k in enumerate(keys) if k == key]
        near.update(where if len(where) == 1 else where[:2] + where[-2:])
    subset = [n.index for n in graph.nodes if n.layer in near]

    def score(c: list[int]) -> float:
        plan = plan_from_choice(graph, mesh, blocks, c, dtype)
        return program_time_s(lower_nodes(graph, {n: plan.strategies[n] for n in subset},
                                          cluster, oracle,
                                          recompute_group=plan.recompute_group or None))

    best_t = score(choice)
    runs += 1
    mem = [float(problem.memory_bytes[b.index][k]) for b, k in zip(blocks, choice, strict=True)]
    total_mem = sum(mem)
    for b in boundary:
        # cheapest options (as the block runs alone) first
        for k in map(int, problem.time_s[b.index].argsort(kind="stable")):
            if runs >= POLISH_MAX_RUNS:
                return choice, runs
            if k == choice[b.index]:
                continue
            new_mem = total_mem - mem[b.index] + float(problem.memory_bytes[b.index][k])
            if new_mem > limit:
                continue
            cand = [*choice]
            cand[b.index] = k
            t = score(cand)
            runs += 1
            if t < best_t:
                best_t, choice, total_mem = t, cand, new_mem
                mem[b.index] = float(problem.memory_bytes[b.index][k])
    return choice, runs


def _run_cfp(graph: SpmdGraph, mesh: DeviceMesh, blocks: list[Block], problem: Problem,
             cluster: Cluster, oracle: OraclePricing, dtype: str, limit: float
             ) -> tuple[list[int], float, int] | None:
    """CFP's DP within `limit` and the steps past it: (choice, DP estimate, extra engine
    runs), or None when nothing fits."""
    solver = CfpSolver(problem, oracle)
    found, _least = solver.solve_with_limit(limit)
    if found is None:
        return None
    choice, estimate = found.choice, found.time_s
    runs = 0
    # Beyond CFP: the block runs price a gradient reduction as exposed, the whole iteration
    # hides all but the last; the DP is run again with them hidden and the engine scores
    # both plans whole (two more Oracle runs).
    assert problem.hidden_sync_time_s is not None
    hidden = dataclasses.replace(problem, time_s=problem.hidden_sync_time_s)
    alt, _ = CfpSolver(hidden, oracle, share=solver).solve_with_limit(limit)
    if alt is not None and alt.choice != choice:
        scored = [(program_time_s(lower_plan(plan_from_choice(graph, mesh, blocks, c, dtype),
                                             cluster, oracle)), c, e)
                  for c, e in ((choice, estimate), (alt.choice, alt.time_s))]
        runs += 2
        _t, choice, estimate = min(scored, key=lambda x: x[0])
    choice, polished = _polish_boundaries(graph, mesh, blocks, choice, cluster, oracle, dtype,
                                          limit, problem)
    return choice, estimate, runs + polished


def run_intraop(model: str | ModelSpec, cluster: str | Cluster, *, method: str = "intraop",
                global_batch: int = 8, mesh: str | tuple[int, ...] | None = None,
                memory_limit_gb: float | None = None, time_limit_s: float = 60.0,
                seq_len: int | None = None, layers: tuple[int, ...] | None = None,
                dtype: str | None = None, recompute: bool = False) -> IntraopResult:
    """Search (or build, for "megatron") a sharding plan and score it on the engine.

    Args:
        mesh: "8", "2x4" or a tuple; default 1-D over every GPU of the cluster.
        memory_limit_gb: per GPU (10^9 bytes); default the GPU's memory.
        time_limit_s: the ILP's limit (alpa).
        layers: only these layers of the model's graph (tests: one transformer layer).
        recompute: let CFP ("intraop") recompute blocks where memory binds.
    Raises:
        SpecError: bad method, mesh or model. IntraopMemoryError: nothing fits.
    """
    if method not in METHODS:
        raise SpecError(f"intra-op method {method!r} is not one of {', '.join(METHODS)}")
    spec, cl, the_mesh, dtype, limit = resolve_inputs(model, cluster, global_batch, mesh,
                                                      memory_limit_gb, dtype)
    start = time.perf_counter()
    graph = build_spmd_graph(build_graph(spec, global_batch, seq_len), layers)
    blocks = _with_megatron(build_blocks(graph, the_mesh), graph, the_mesh, dtype)
    oracle = OraclePricing(cl, the_mesh, dtype)
    ilp = None
    if method == "alpa":
        problem = build_problem(graph, blocks, cl, AlphaBetaPricing(cl, the_mesh, dtype),
                                engine=False)
        least = least_memory_bytes(problem)
        if least > limit:
            raise _no_fit(limit, least)
        ilp = solve_ilp(problem, limit, time_limit_s)
        if ilp.choice is None:
            raise IntraopMemoryError(f"the ILP found no plan within {time_limit_s:g} s "
                                     f"({ilp.status})")
        choice, estimate = ilp.choice, ilp.objective_s
        evaluations = 0
    elif method == "intraop":
        runs: dict[tuple[object, ...], tuple[float, float]] = {}
        problem = build_problem(graph, blocks, cl, oracle, engine=True, runs=runs)
        least = least_memory_bytes(problem)
        cands: list[tuple[list[Block], Problem, float]] = []
        if least <= limit:
            cands.append((blocks, problem, limit))
        memory_bound = CfpSolver(problem, oracle).solve().memory_bytes > limit
        if recompute and memory_bound:
            # Beyond CFP: per-block recompute (Aceso) where memory binds. The DP counts what
            # blocks hold from forward to backward; a recomputed block's activations come
            # back during its backward, so the limit keeps room for the largest of them.
            rblocks = _with_megatron(build_blocks(graph, the_mesh, recompute=True), graph,
                                     the_mesh, dtype)
            rproblem = build_problem(graph, rblocks, cl, oracle, engine=True, runs=runs)
            reserve = max((sum(saved_bytes(graph, st, n) for n, st in zip(b.nodes, opt,
                                                                            strict=True))
                           for b in rblocks for k, opt in enumerate(b.options)
                           if b.recomputes(k)), default=0.0)
            rleast = least_memory_bytes(rproblem) + reserve
            least = min(least, rleast)
            if rleast <= limit:
                cands.append((rblocks, rproblem, limit - reserve))
            problem.oracle_evaluations += rproblem.oracle_evaluations
        if not cands:
            raise _no_fit(limit, least)
        evaluations = problem.oracle_evaluations
        best_found: tuple[float, list[Block], list[int], float] | None = None
        for cblocks, cproblem, climit in cands:
            got = _run_cfp(graph, the_mesh, cblocks, cproblem, cl, oracle, dtype, climit)
            if got is None:
                continue
            c_choice, c_estimate, c_runs = got
            evaluations += c_runs
            t = program_time_s(lower_plan(plan_from_choice(graph, the_mesh, cblocks, c_choice,
                                                           dtype), cl, oracle))
            evaluations += 1
            if best_found is None or t < best_found[0]:
                best_found = (t, cblocks, c_choice, c_estimate)
        if best_found is None:
            raise _no_fit(limit, least)
        _t, blocks, choice, estimate = best_found
    else:
        problem = build_problem(graph, blocks, cl, oracle, engine=False)
        evaluations = 0
        best: tuple[float, ShardingPlan] | None = None
        for sp in (False, True):
            cand = megatron_plan(graph, the_mesh, dtype, sp)
            t = program_time_s(lower_plan(cand, cl, oracle))
            if cand.memory_bytes() <= limit and (best is None or t < best[0]):
                best = (t, cand)
        if best is None:
            raise _no_fit(limit, megatron_plan(graph, the_mesh, dtype, True).memory_bytes())
        plan = best[1]
        choice = [next(k for k, opt in enumerate(b.options)
                       if opt == tuple(plan.strategies[n] for n in b.nodes))
                  if tuple(plan.strategies[n] for n in b.nodes) in b.options else 0
                  for b in blocks]
        estimate = best[0]
    if method != "megatron":
        plan = plan_from_choice(graph, the_mesh, blocks, choice, dtype)
    search_s = time.perf_counter() - start
    program = lower_plan(plan, cl, oracle, memory_limit_bytes=limit)
    return IntraopResult(method=method, model=spec.name, cluster=cl, plan=plan, blocks=blocks,
                         choice=choice, iteration_time_s=program_time_s(program),
                         memory_bytes=plan.memory_bytes(), search_s=search_s,
                         oracle_evaluations=evaluations, strategy_space=problem.strategy_space(),
                         planner_estimate_s=estimate, ilp=ilp, program=program, pricing=oracle)


__all__ = ["METHODS", "IntraopMemoryError", "IntraopResult", "least_memory_bytes",
           "plan_from_choice", "run_intraop"]
