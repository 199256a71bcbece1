"""The zoo's op graphs as data-flow graphs for SPMD sharding: nodes, edges, repeated segments.

The zoo stores a layer as an ordered tuple of ops (workloads/transformer_block.py). Sharding
needs the tensors between them, so this module adds the edges the op list implies:

* each op reads the previous op's output (the chain);
* a ``*.residual`` op also reads the residual stream (the block's input, then the attention
  residual's output) — the skip connection of a pre-norm block;
* an MoE router is a side branch: the experts read the router's input (the normed tokens),
  as the dispatch does;
* BERT's pooler/NSP head reads the last block's output, and the MLM head reads it again;
* the embedding reads token ids, which are not an activation (no edge).

An edge's tensor size is what the consumer reads: a GEMM's m·k input (for the experts the
capacity-padded dispatch buffer, for the pooler the [CLS] rows) or else the producer's output.
Every node keeps the index of its layer, and each distinct `Layer` object of the zoo graph is a
segment kind: the zoo builds repeated blocks from one object, so identical transformer layers
share a key (CFP's segment hashing, search/intraop/cfp.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainsim.workloads.model import ModelGraph
from trainsim.workloads.ops import Op

SIDE_BRANCH = ("pooler", "nsp")
"""Name prefixes of a side branch off the last block's output (BERT's pooler and NSP head)."""


@dataclass(frozen=True, slots=True)
class Node:
    """One op of the graph with its input edges."""

    index: int
    op: Op
    layer: int
    """Index of the zoo layer the op belongs to (its segment instance)."""
    srcs: tuple[int, ...]
    """Producers of its inputs, in order: (chain input[, residual stream])."""
    in_bytes: tuple[float, ...]
    """Full (unsharded) bytes of each input tensor."""
    role_class: str
    """Which strategies apply (strategies.ROLE_CLASSES)."""
    tied_params: int = 0
    """Weights the op reads but does not own: the output head's share of embeddings tied to
    the input embedding (`Layer.shared_params`). Stored once, on the embedding; the head's
    gradient of them is still reduced over the axes where the head splits the batch."""


@dataclass(frozen=True, slots=True)
class SpmdGraph:
    """Nodes in topological (forward) order, the spec that built them and segment keys."""

    nodes: tuple[Node, ...]
    graph: ModelGraph
    segment_keys: tuple[int, ...]
    """Per layer: a small integer shared by layers built from the same zoo Layer object."""
    layer_names: tuple[str, ...]
    recomputable: tuple[bool, ...] = ()
    """Per layer: whether it is a transformer block (the layers recompute applies to)."""
    tied: tuple[int, int] | None = None
    """(embedding node, head node) sharing tied weights, when both are in the graph."""

    def consumers(self) -> list[list[tuple[int, int]]]:
        """Per node, its (consumer node, input slot) pairs."""
        out: list[list[tuple[int, int]]] = [[] for _ in self.nodes]
        for node in self.nodes:
            for slot, src in enumerate(node.srcs):
                out[src].append((node.index, slot))
        return out

    def layer_nodes(self) -> list[list[int]]:
        """Per layer, its node indices."""
        out: list[list[int]] = [[] for _ in self.layer_names]
        for node in self.nodes:
            out[node.layer].append(node.index)
        return out


def role_class(op: Op) -> str:
    """The strategy family of an op (see strategies.py)."""
    if op.kind == "embedding":
        return "embedding"
    if op.kind == "cross_entropy":
        return "cross_entropy"
    if op.name.endswith(".residual"):
        return "residual"
    if op.kind in ("layernorm", "rmsnorm", "batchnorm"):
        return "norm"
    if op.kind == "router":
        return "router"
    if op.kind in ("flash_attention", "attention_score", "attention_context", "softmax") \
            or op.name.endswith((".attn_dropout", ".rotary")):
        return "attention"
    if op.kind == "matmul" and op.params > 0 and ".experts." in op.name:
        return "expert"
    if op.kind == "matmul":
        return "matmul"
    return "elementwise"


def _input_bytes(op: Op, producer: Op | None) -> float:
    if op.kind == "matmul" and op.shape is not None and len(op.shape) == 3:
        m, _n, k = op.shape
        return float(m * k * _dtype_bytes(op))
    return float(producer.output_bytes) if producer is not None else 0.0


def _dtype_bytes(op: Op) -> int:
    """Element size of a GEMM: its output bytes over its m·n output elements."""
    assert op.shape is not None
    m, n, _k = op.shape
    return max(1, round(op.output_bytes / (m * n))) if m * n else 2


def build_spmd_graph(graph: ModelGraph, layers: tuple[int, ...] | None = None) -> SpmdGraph:
    """The data-flow graph of `graph` (optionally only the layers with these indices)."""
    picked = list(range(len(graph.layers))) if layers is None else list(layers)
    nodes: list[Node] = []
    keys: dict[int, int] = {}
    seg: list[int] = []
    names: list[str] = []
    recomputable: list[bool] = []
    cur = stream = -1
    for li, layer_index in enumerate(picked):
        layer = graph.layers[layer_index]
        seg.append(keys.setdefault(id(layer), len(keys)))
        names.append(layer.name)
        recomputable.append(layer.recomputable)
        layer_input = cur
        stream = cur
        side_from = -1
        for op in layer.ops:
            rc = role_class(op)
            tied = layer.shared_params if (
                layer.shared_params and op.kind == "matmul" and op.shape is not None
                and len(op.shape) == 3 and op.shape[1] == graph.spec.vocab_size) else 0
            is_side = op.name.split(".")[0] in SIDE_BRANCH
            if is_side and side_from == -1:
                side_from = layer_input
                cur = layer_input
            elif not is_side and side_from != -1:
                cur, side_from = layer_input, -1
            if rc == "embedding" or cur < 0:
                srcs: tuple[int, ...] = ()
            elif rc == "residual" and stream >= 0 and stream != cur:
                srcs = (cur, stream)
            else:
                srcs = (cur,)
            in_bytes = tuple(_input_bytes(op, nodes[s].op) if slot == 0
                             else float(nodes[s].op.output_bytes)
                             for slot, s in enumerate(srcs))
            idx = len(nodes)
            nodes.append(Node(index=idx, op=op, layer=li, srcs=srcs, in_bytes=in_bytes,
                              role_class=rc, tied_params=tied))
            if rc == "router":
                continue  # a side output: the experts read the router's input
            if op.name == "nsp":
                continue  # the NSP logits end a side branch
            cur = idx
            if rc in ("residual", "embedding") or stream < 0:
                stream = idx
    heads = [n.index for n in nodes if n.tied_params]
    embeddings = [n.index for n in nodes if n.op.kind == "embedding" and heads
                  and n.op.params >= nodes[heads[0]].tied_params]
    return SpmdGraph(nodes=tuple(nodes), graph=graph, segment_keys=tuple(seg),
                     layer_names=tuple(names), recomputable=tuple(recomputable),
                     tied=(embeddings[0], heads[0]) if heads and embeddings else None)


__all__ = ["Node", "SpmdGraph", "build_spmd_graph", "role_class"]
