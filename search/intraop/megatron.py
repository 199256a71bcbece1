"""Megatron-LM's hand-written tensor parallelism as an SPMD plan: the baseline both planners
must match on a dense GPT layer.

Tensor-parallel axis (Shoeybi et al. 2019): QKV and MLP-up GEMMs column-parallel, the attention
core by heads, the output projection and MLP-down row-parallel (their partial outputs
all-reduced before the residual add), norms and residual adds replicated, the embedding
vocab-parallel, the LM head column-parallel with the vocab-parallel cross entropy; MoE experts
tensor-parallel the same way (up column, down row) with the router replicated. With
`sequence_parallel` the norms and residual adds split the tokens instead, so the all-reduces
become reduce-scatter + all-gather (Korthikanti et al. 2022 §4.2.2). On a 2-D mesh axis 0 is
data-parallel and axis 1 tensor-parallel (Megatron's usual tp inside a node, dp across).

One simplification against Megatron-LM itself: the SPMD strategies split every parameter of
an op over its axes, so the learned position table is vocab-split with the word table here,
where Megatron-LM keeps it whole on each rank (`Op.replicated_params`, which `sim simulate`
counts): GPT-3 1.3B at tp 8 holds 13.4 M embedding parameters a GPU here against 17.1 M there.
"""

from __future__ import annotations

from trainsim.workloads.sharding.graph import Node, SpmdGraph
from trainsim.workloads.sharding.mesh import DeviceMesh
from trainsim.workloads.sharding.plan import ShardingPlan
from trainsim.workloads.sharding.strategies import make_strategy


def megatron_role(node: Node, sequence_parallel: bool = False) -> str:
    """The tensor-parallel role Megatron-LM gives `node`."""
    rc, default = node.role_class, node.op.shardings[0].name
    name = node.op.name
    if rc == "embedding":
        return "vocab"
    if rc == "cross_entropy":
        return "split"
    if rc in ("norm", "residual"):
        return "dp" if sequence_parallel else "rep"
    if rc == "router":
        return "rep"
    if rc == "attention":
        return "heads"
    if rc == "expert":
        return "col" if name.endswith("fc1") else "row"
    if rc == "matmul":
        return {"column": "col", "row": "row"}.get(default, "rep")
    # elementwise: between a column- and a row-parallel GEMM it is feature-split
    if default in ("column", "expert"):
        return "split"
    return "dp" if sequence_parallel and default in ("replicate", "sequence") else "rep"


def megatron_plan(graph: SpmdGraph, mesh: DeviceMesh, dtype: str,
                  sequence_parallel: bool = False) -> ShardingPlan:
    """Megatron's plan: tp over a 1-D mesh, or dp × tp over a 2-D one."""
    out = []
    for node in graph.nodes:
        tp = megatron_role(node, sequence_parallel)
        roles = (tp,) if mesh.ndim == 1 else ("dp", tp)
        out.append(make_strategy(node, roles, mesh))
    return ShardingPlan(graph=graph, mesh=mesh, strategies=tuple(out), dtype=dtype)


__all__ = ["megatron_plan", "megatron_role"]
