"""ParallelBlocks (CFP, arXiv 2504.00598 §3): groups of ops inside which a sharding propagates
with no communication.

A block opens at an op that owns weights (a contraction: GEMM, embedding, router; or a norm,
whose weights and whole-row reduction stop propagation) or at a residual add (two tensors
meet), and absorbs every following op that has neither — the attention core after QKV, GeLU /
SwiGLU after the up projection, the cross entropy after the LM head — as long as the sharding
propagates: for each strategy of the opening op, each absorbed op takes the strategy whose
input layout equals the current output layout and whose edge needs no collective forward or
backward. Opening strategies with no such propagation (a row-parallel QKV, whose partial
output the attention core cannot read) are not block options.

Both planners work on blocks: CFP searches only each block's opening strategy; Alpa's ILP
merges light ops into their producers the same way (Zheng et al. 2022 §4.2), so its nodes are
these blocks too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from trainsim.workloads.sharding.graph import Node, SpmdGraph
from trainsim.workloads.sharding.mesh import DeviceMesh
from trainsim.workloads.sharding.plan import edge_collectives
from trainsim.workloads.sharding.strategies import Strategy, strategies


@dataclass(frozen=True, slots=True)
class Block:
    """Consecutive nodes and their joint options (one strategy per node each)."""

    index: int
    nodes: tuple[int, ...]
    options: tuple[tuple[Strategy, ...], ...]
    key: tuple[object, ...]
    """Equal for blocks made of the same ops (repeated layers): CFP evaluates one of them."""
    recompute: tuple[bool, ...] = ()
    """Per option: whether the block recomputes its forward before its backward (keeping
    only its inputs); empty: never."""

    def recomputes(self, k: int) -> bool:
        """Whether option k recomputes."""
        return bool(self.recompute) and self.recompute[k]


def opens_block(node: Node) -> bool:
    """Whether `node` starts a new block (module docstring)."""
    return node.op.params > 0 or node.role_class in ("residual", "norm", "embedding") \
        or not node.srcs


def _propagate(graph: SpmdGraph, mesh: DeviceMesh, head: Strategy, members: list[int],
               legal: dict[int, list[Strategy]]) -> tuple[Strategy, ...] | None:
    chosen: dict[int, Strategy] = {members[0]: head}
    for i in members[1:]:
        node = graph.nodes[i]
        found = None
        for cand in legal[i]:
            ok = True
            for slot, src in enumerate(node.srcs):
                if src not in chosen:
                    ok = False
                    break
                fwd, bwd = edge_collectives(graph, mesh, chosen[src], cand, i, slot)
                if fwd or bwd:
                    ok = False
                    break
            if ok:
                found = cand
                break
        if found is None:
            return None
        chosen[i] = found
    return tuple(chosen[i] for i in members)


def build_blocks(graph: SpmdGraph, mesh: DeviceMesh, recompute: bool = False) -> list[Block]:
    """The graph's ParallelBlocks in order; every block lies inside one layer. With
    `recompute`, blocks of transformer layers get each option twice: as is, and recomputing
    (Aceso's per-op recompute at block granularity)."""
    groups: list[list[int]] = []
    for node in graph.nodes:
        prev = graph.nodes[node.index - 1] if node.index else None
        if not groups or opens_block(node) or prev is None or prev.layer != node.layer \
                or node.srcs != (node.index - 1,):
            groups.append([node.index])
        else:
            groups[-1].append(node.index)
    blocks: list[Block] = []
    for members in groups:
        legal = {i: strategies(graph.nodes[i], mesh, graph.graph) for i in members}
        options = []
        for head in legal[members[0]]:
            opt = _propagate(graph, mesh, head, members, legal)
            if opt is not None:
                options.append(opt)
        key = tuple((id(graph.nodes[i].op), graph.nodes[i].in_bytes,
                     tuple(s - members[0] for s in graph.nodes[i].srcs if s >= members[0]))
                    for i in members)
        flags: tuple[bool, ...] = ()
        if recompute and graph.recomputable and graph.recomputable[graph.nodes[members[0]].layer]:
            flags = (False,) * len(options) + (True,) * len(options)
            options = options + options
        blocks.append(Block(index=len(blocks), nodes=tuple(members), options=tuple(options),
                            key=key, recompute=flags))
    return blocks


def with_plan_options(blocks: list[Block], strategies: Sequence[Strategy]) -> list[Block]:
    """`blocks` with each block also offering the strategies a whole-graph plan gives its
    nodes (`strategies`, one per node) where its own options lack them (twice, as is and
    recomputing, for blocks that recompute). Used to put Megatron-LM's plan in the search's
    space: CFP's propagation from each head strategy never reaches its vocabulary-parallel
    embedding and head, so `sim search --method intraop` refused memory limits the Megatron
    baseline meets (gpt3-125m on 4 A100s: least 3.56 GB, Megatron 3.10 GB; the planner bug
    hunt)."""
    out = []
    for block in blocks:
        opt = tuple(strategies[i] for i in block.nodes)
        if opt in block.options:
            out.append(block)
            continue
        if block.recompute:
            half = len(block.options) // 2
            options = block.options[:half] + (opt,) + block.options[half:] + (opt,)
            flags = (False,) * (half + 1) + (True,) * (half + 1)
        else:
            options, flags = block.options + (opt,), ()
        out.append(dataclasses.replace(block, options=options, recompute=flags))
    return out


__all__ = ["Block", "build_blocks", "opens_block", "with_plan_options"]
