"""SPMD plans lowered to Programs: FLOPs are conserved and the plan's memory is the engine's peak."""

from __future__ import annotations

import random

import pytest

from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.intraop.costs import OraclePricing
from trainsim.search.intraop.megatron import megatron_plan
from trainsim.search.intraop.program import lower_plan
from trainsim.simulator.engines import run_program
from trainsim.workloads.model import build_graph
from trainsim.workloads.sharding.graph import build_spmd_graph
from trainsim.workloads.sharding.mesh import DeviceMesh
from trainsim.workloads.sharding.plan import ShardingPlan
from trainsim.workloads.sharding.strategies import strategies
from trainsim.workloads.zoo import get_model

CLUSTER = parse_cluster("2x4xA100-SXM4-40GB")


def _graph(model: str, batch: int = 8):  # type: ignore[no-untyped-def]
    spec = get_model(model)
    full = build_graph(spec, batch, 512)
    last = len(full.layers) - 1
    return build_spmd_graph(full, (0, 1, 2, last))


def _random_plan(graph, mesh: DeviceMesh, seed: int) -> ShardingPlan:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    chosen = tuple(rng.choice(strategies(n, mesh, graph.graph)) for n in graph.nodes)
    return ShardingPlan(graph=graph, mesh=mesh, strategies=chosen, dtype="fp16")


@pytest.mark.parametrize("model", ["gpt3-125m", "gpt-moe-1.3b-8e", "bert-base", "llama2-7b"])
@pytest.mark.parametrize("shape", [(8,), (2, 4)])
@pytest.mark.parametrize("seed", [0, 1])
def test_plan_memory_is_the_engine_peak(model: str, shape: tuple[int, ...], seed: int) -> None:
    graph = _graph(model)
    mesh = DeviceMesh(shape)
    plan = _random_plan(graph, mesh, seed)
    pricing = OraclePricing(CLUSTER, mesh, "fp16")
    result = run_program(lower_plan(plan, CLUSTER, pricing, memory_limit_bytes=1e15))
    assert result.peak_memory_bytes == pytest.approx(plan.memory_bytes(), rel=1e-9)
    assert len({r.peak_memory_bytes for r in result.ranks}) == 1  # SPMD: every GPU alike


@pytest.mark.parametrize("model", ["gpt3-125m", "gpt-moe-1.3b-8e", "bert-base"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flops_are_conserved(model: str, seed: int) -> None:
    """Σ over GPUs of the FLOPs each runs = the model's FLOPs × how often each op is
    replicated; with no replicated op it is exactly the model's (collectives add bytes, not
    FLOPs)."""
    graph = _graph(model)
    mesh = DeviceMesh((2, 4))
    plan = _random_plan(graph, mesh, seed)
    model_flops = sum(n.op.fwd_flops + n.op.bwd_flops for n in graph.nodes)
    replicas = sum((n.op.fwd_flops + n.op.bwd_flops) * mesh.size / s.work_div
                   for n, s in zip(graph.nodes, plan.strategies, strict=True))
    assert plan.device_flops() * mesh.size == pytest.approx(replicas, rel=1e-12)
    assert replicas >= model_flops * (1 - 1e-12)
    split = megatron_plan(graph, mesh, "fp16", sequence_parallel=True)
    if all(s.work_div == mesh.size for s in split.strategies):
        assert split.device_flops() * mesh.size == pytest.approx(model_flops, rel=1e-12)


def test_fully_split_plan_runs_exactly_the_model_flops() -> None:
    graph = _graph("gpt3-125m")
    mesh = DeviceMesh((8,))
    dp = tuple(next(s for s in strategies(n, mesh, graph.graph) if s.roles == ("dp",))
               for n in graph.nodes)
    plan = ShardingPlan(graph=graph, mesh=mesh, strategies=dp, dtype="fp16")
    assert plan.device_flops() * 8 == pytest.approx(
        sum(n.op.fwd_flops + n.op.bwd_flops for n in graph.nodes), rel=1e-12)
    # the same FLOPs as the zoo graph's own count for the layers taken
    layers = [graph.graph.layers[i] for i in (0, 1, 2, len(graph.graph.layers) - 1)]
    assert sum(n.op.fwd_flops for n in graph.nodes) == pytest.approx(
        sum(op.fwd_flops for la in layers for op in la.ops))


def test_graph_edges_follow_the_block() -> None:
    graph = _graph("gpt3-125m")
    names = [n.op.name for n in graph.nodes]
    res = graph.nodes[names.index("attn.residual")]
    # the attention residual adds the projection's output and the block's input
    assert graph.nodes[res.srcs[0]].op.name == "attn.proj"
    assert res.srcs[1] == graph.nodes[names.index("attn.norm")].srcs[0]
    moe = _graph("gpt-moe-1.3b-8e")
    by = {n.op.name: n for n in moe.nodes if n.layer == 2}
    assert by["moe.experts.fc1"].srcs == by["moe.router"].srcs  # the router is a side branch


@pytest.mark.parametrize("model", ["gpt3-125m", "gpt-moe-1.3b-8e", "llama2-7b"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plan_memory_is_the_engine_peak_with_recompute(model: str, seed: int) -> None:
    """Recompute groups (one per run of ops of a layer) change the peak to a running maximum
    along the compute order; the plan's walk of it equals the engine's peak."""
    graph = _graph(model)
    mesh = DeviceMesh((2, 4))
    plan = _random_plan(graph, mesh, seed)
    rng = random.Random(seed + 100)
    groups, g = [], 0
    for node in graph.nodes:
        if node.index and (graph.nodes[node.index - 1].layer != node.layer or rng.random() < 0.4):
            g += 1
        groups.append(g)
    chosen = {x for x in set(groups) if rng.random() < 0.6}
    plan = ShardingPlan(graph=graph, mesh=mesh, strategies=plan.strategies, dtype="fp16",
                        recompute_group=tuple(x if x in chosen else -1 for x in groups))
    pricing = OraclePricing(CLUSTER, mesh, "fp16")
    program = lower_plan(plan, CLUSTER, pricing, memory_limit_bytes=1e15)
    result = run_program(program)
    assert result.peak_memory_bytes == pytest.approx(plan.memory_bytes(), rel=1e-9)
    assert "recompute" in set(program.table().kind_names)


def test_a_tied_head_reduces_its_gradient_where_the_embedding_does_not() -> None:
    """GPT-3's LM head reads the embedding's tied V×h weight (params 0 on the head). Its
    gradient is reduced once over the union of the axes where the embedding or the head
    splits the batch: the head's share over the axes the embedding leaves out, and over all
    of its own when costed without the embedding (a block alone). An untied model has no pair.
    (The head's share was once reduced nowhere: a review helper's finding.)"""
    from trainsim.workloads.sharding.plan import grad_sync, grad_sync_axes
    from trainsim.workloads.sharding.strategies import make_strategy

    graph = _graph("gpt3-125m")
    spec = graph.graph.spec
    assert graph.tied is not None
    emb, head = graph.tied
    assert graph.nodes[head].op.name == "lm_head" and graph.nodes[head].op.params == 0
    assert graph.nodes[head].tied_params == spec.vocab_size * spec.hidden
    mesh = DeviceMesh((2, 4))
    head_dp = make_strategy(graph.nodes[head], ("dp", "dp"), mesh)
    emb_dp_rep = make_strategy(graph.nodes[emb], ("dp", "rep"), mesh)
    assert head_dp.sync_axes == (0, 1) and emb_dp_rep.sync_axes == (0,)
    both = {emb: emb_dp_rep, head: head_dp}
    assert grad_sync_axes(graph, both, head) == (1,)
    sync, = grad_sync(graph, both, head, mesh, "fp16")
    assert (sync.axis, sync.kind) == (1, "all_reduce")
    assert sync.size_bytes == spec.vocab_size * spec.hidden * 2
    assert grad_sync_axes(graph, {head: head_dp}, head) == (0, 1)
    untied = build_spmd_graph(build_graph(get_model("llama2-7b"), 8, 512))
    assert untied.tied is None and all(n.tied_params == 0 for n in untied.nodes)
