"""An SPMD plan (one strategy per op) and what it implies: resharding on every edge, per-device
memory, FLOPs, and its JSON form.

Memory per device (mixed-precision Adam, `stage_costs.optimizer_bytes_per_param`): weights,
gradients and optimizer states of the local weight shards, plus every op's saved activations
divided as its inputs are sharded (a column-parallel GEMM keeps its whole replicated input, as
in Megatron-LM without sequence parallelism). The lowering (search/intraop/program.py) runs the
forward of all ops and then the backward, so without recompute the peak is this sum.

Recompute (Aceso-style, per block; Korthikanti et al. 2022 §5): ops of one recompute group
keep only the inputs that come from outside the group and run their forward again, in order,
just before the group's backward, holding their activations until their own backward. The
peak is then the running maximum along the compute order (`memory_bytes` walks it), which the
engine reproduces exactly; `held_bytes` is what a node holds from its forward to its backward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from trainsim.workloads.sharding.graph import SpmdGraph
from trainsim.workloads.sharding.mesh import DeviceMesh
from trainsim.workloads.sharding.spec import (
    Collective,
    format_spec,
    grad_spec_of_input,
    grad_spec_of_output,
    reshard,
    shard_factor,
)
from trainsim.workloads.sharding.strategies import Strategy, sharded_op, sync_collectives
from trainsim.workloads.stage_costs import optimizer_bytes_per_param


def edge_collectives(graph: SpmdGraph, mesh: DeviceMesh, producer: Strategy, consumer: Strategy,
                     dst: int, slot: int) -> tuple[list[Collective], list[Collective]]:
    """(forward, backward) collectives on the edge into input `slot` of node `dst`."""
    size = graph.nodes[dst].in_bytes[slot]
    want = consumer.in_specs[slot]
    fwd = reshard(producer.out_spec, want, mesh, size)
    bwd = reshard(grad_spec_of_input(want, consumer.work_split),
                  grad_spec_of_output(producer.out_spec), mesh, size)
    return fwd, bwd


def holds_tied_copy(graph: SpmdGraph, node: int) -> bool:
    """Whether the node reads tied weights whose owner is not in `graph` (an LM head on
    another pipeline stage than the embedding): then it keeps a copy of them, as Megatron-LM's
    last stage does, with its own gradients and optimizer states."""
    n = graph.nodes[node]
    return n.tied_params > 0 and (graph.tied is None or graph.tied[1] != node)


def local_params(graph: SpmdGraph, strategy: Strategy, node: int) -> int:
    """Parameters of one device's weight shard of the node (a tied copy it keeps included,
    `holds_tied_copy`)."""
    n = graph.nodes[node]
    params = n.op.params + (n.tied_params if holds_tied_copy(graph, node) else 0)
    return -(-params // strategy.param_div)


def static_bytes(graph: SpmdGraph, strategy: Strategy, node: int, dtype: str) -> float:
    """Weights + gradients + optimizer states of one node's local weight shard."""
    return local_params(graph, strategy, node) * sum(optimizer_bytes_per_param(dtype))


def saved_bytes(graph: SpmdGraph, strategy: Strategy, node: int) -> float:
    """Activation bytes one device keeps from the node's forward for its backward."""
    return graph.nodes[node].op.activation_bytes / strategy.act_div


def grad_bytes(graph: SpmdGraph, strategy: Strategy, node: int, dtype: str) -> float:
    """Bytes of one device's weight gradients of the node (tied weights it reads included)."""
    n = graph.nodes[node]
    params = n.op.params + n.tied_params
    return -(-params // strategy.param_div) * optimizer_bytes_per_param(dtype)[1]


def grad_sync(graph: SpmdGraph, strategies: Mapping[int, Strategy], node: int,
              mesh: DeviceMesh, dtype: str) -> list[Collective]:
    """The node's weight-gradient reduction (`sync_collectives`). A head reading embeddings
    tied to the input embedding adds its gradient to the embedding's, which is reduced over
    the embedding's axes: the head reduces over the rest of its own, so with both known
    (`strategies` holds them) the tied weight is reduced once over the union of their axes;
    with the embedding unknown (a block costed alone) the head reduces over all of its own."""
    st = strategies[node]
    axes = grad_sync_axes(graph, strategies, node)
    if axes != st.sync_axes:
        st = replace(st, sync_axes=axes)
    return sync_collectives(st, mesh, grad_bytes(graph, st, node, dtype))


def grad_sync_axes(graph: SpmdGraph, strategies: Mapping[int, Strategy], node: int
                   ) -> tuple[int, ...]:
    """The axes `grad_sync` reduces the node's weight gradients over."""
    axes = strategies[node].sync_axes
    if graph.tied is not None and node == graph.tied[1] and graph.tied[0] in strategies:
        taken = strategies[graph.tied[0]].sync_axes
        axes = tuple(a for a in axes if a not in taken)
    return axes


def kept_bytes(graph: SpmdGraph, strategy: Strategy, node: int,
               group: Sequence[int] | Mapping[int, int], mesh: DeviceMesh) -> float:
    """Bytes a recomputed node keeps: its inputs from outside its recompute group, local."""
    n = graph.nodes[node]
    return sum(n.in_bytes[slot] / shard_factor(strategy.in_specs[slot], mesh)
               for slot, src in enumerate(n.srcs) if group[src] != group[node])


@dataclass(frozen=True, slots=True)
class ShardingPlan:
    """A strategy for every node of `graph` on `mesh` (and optional recompute groups)."""

    graph: SpmdGraph
    mesh: DeviceMesh
    strategies: tuple[Strategy, ...]
    dtype: str
    recompute_group: tuple[int, ...] = ()
    """Per node: its recompute group (consecutive nodes of one layer), or -1 (no recompute);
    empty: none."""

    def __post_init__(self) -> None:
        if len(self.strategies) != len(self.graph.nodes):
            raise ValueError(f"plan has {len(self.strategies)} strategies for "
                             f"{len(self.graph.nodes)} ops")
        if self.recompute_group and len(self.recompute_group) != len(self.graph.nodes):
            raise ValueError("recompute_group needs one entry per op")

    def group(self, i: int) -> int:
        """Recompute group of node i (-1: none)."""
        return self.recompute_group[i] if self.recompute_group else -1

    def held_bytes(self, i: int) -> float:
        """Activation bytes node i holds from its forward until its backward."""
        if self.group(i) < 0:
            return saved_bytes(self.graph, self.strategies[i], i)
        groups = self.recompute_group
        return kept_bytes(self.graph, self.strategies[i], i, groups, self.mesh)

    def sharded(self, i: int) -> Any:
        """The per-device op of node i."""
        st = self.strategies[i]
        return sharded_op(self.graph.nodes[i].op, st, shard_factor(st.out_spec, self.mesh))

    def memory_bytes(self) -> float:
        """Peak memory of every device (all devices hold the same shards): the running sum
        along the compute order of the lowering (module docstring)."""
        n = len(self.strategies)
        running = self.static_memory_bytes() + sum(self.held_bytes(i) for i in range(n))
        peak = running
        done: set[int] = set()
        for i in range(n - 1, -1, -1):
            g = self.group(i)
            if g >= 0 and g not in done:  # the group's forward again, in order
                done.add(g)
                for j in range(n):
                    if self.group(j) == g:
                        running += saved_bytes(self.graph, self.strategies[j], j)
                        peak = max(peak, running)
            freed = self.held_bytes(i)
            if g >= 0:
                freed += saved_bytes(self.graph, self.strategies[i], i)
            running -= freed
        return peak

    def static_memory_bytes(self) -> float:
        """Weights, gradients and optimizer states per device."""
        return sum(static_bytes(self.graph, s, i, self.dtype)
                   for i, s in enumerate(self.strategies))

    def edges(self) -> list[tuple[int, int, int, list[Collective], list[Collective]]]:
        """(src, dst, slot, forward collectives, backward collectives) of every edge."""
        out = []
        for node in self.graph.nodes:
            for slot, src in enumerate(node.srcs):
                fwd, bwd = edge_collectives(self.graph, self.mesh, self.strategies[src],
                                            self.strategies[node.index], node.index, slot)
                out.append((src, node.index, slot, fwd, bwd))
        return out

    def device_flops(self) -> float:
        """Forward + backward FLOPs one device runs (replicated work counted in full)."""
        return sum((n.op.fwd_flops + n.op.bwd_flops) / s.work_div
                   for n, s in zip(self.graph.nodes, self.strategies, strict=True))

    def to_dict(self) -> dict[str, Any]:
        """JSON form: mesh, and per op its layer, strategy and input/output specs."""
        ops = []
        for n, s in zip(self.graph.nodes, self.strategies, strict=True):
            ops.append({"op": n.op.name, "layer": n.layer,
                        "layer_name": self.graph.layer_names[n.layer], "strategy": s.name,
                        "inputs": [format_spec(x) for x in s.in_specs],
                        "output": format_spec(s.out_spec),
                        "recompute": self.group(n.index) >= 0})
        return {"mesh": list(self.mesh.shape), "dtype": self.dtype, "ops": ops}


__all__ = ["ShardingPlan", "edge_collectives", "grad_bytes", "grad_sync", "grad_sync_axes",
           "holds_tied_copy", "kept_bytes", "local_params", "saved_bytes", "static_bytes"]
