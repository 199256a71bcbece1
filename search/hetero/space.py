"""The heterogeneous search space: parallel degrees, micro-batch sizes and node orders.

A node order is the sequence in which pipeline stages fill the cluster's nodes (the plan's
`node_order`; FASOP's "device placement"). Nodes of one kind (same GPU, node type, GPUs per
node, NICs) are interchangeable, so an order matters only through its sequence of kinds:

* FASOP tries the cyclic rotations of the nodes as written ([A…A B…B] rotated).
* `distinct_orders` tries every distinct kind sequence (multiset permutations), written with
  the lowest node indices first, so two clusters holding the same nodes in a different order
  yield the same sequences; when there are more than `limit`, it keeps the rotations of the
  kind-sorted sequence and the sequences with the kinds in blocks, and says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from trainsim.hwmodels.cluster import Cluster

NodeKind = tuple[Any, ...]
"""What makes two nodes interchangeable: GPU, node type, GPUs per node, NIC, NICs per node."""


def node_kinds(cluster: Cluster) -> list[NodeKind]:
    """The kind of every node, numbered as the cluster is written."""
    return [(g.gpu.name, g.node_type.name, g.gpus_per_node, g.nic.name, g.nics_per_node)
            for g in cluster.node_groups for _ in range(g.nodes)]


def _sort_key(kind: NodeKind, cluster: Cluster, dtype: str) -> tuple[Any, ...]:
    """Fastest GPU first, then the kind itself (independent of where it is written)."""
    gpu = next(g.gpu for g in cluster.node_groups if g.gpu.name == kind[0])
    try:
        peak = float(gpu.peak_flops(dtype))
    except Exception:  # noqa: BLE001 -- a GPU without that dtype sorts last
        peak = 0.0
    return (-peak, *kind)


def _indices(kinds: list[NodeKind], sequence: tuple[NodeKind, ...]) -> tuple[int, ...]:
    """Node indices realising a kind sequence: each kind's nodes lowest index first."""
    free: dict[NodeKind, list[int]] = {}
    for i, k in enumerate(kinds):
        free.setdefault(k, []).append(i)
    for v in free.values():
        v.reverse()
    return tuple(free[k].pop() for k in sequence)


def cyclic_orders(cluster: Cluster) -> list[tuple[int, ...]]:
    """FASOP's placements: the rotations of the nodes as written (distinct kind sequences)."""
    kinds = node_kinds(cluster)
    n = len(kinds)
    seen, out = set(), []
    for r in range(n):
        seq = tuple(kinds[r:] + kinds[:r])
        if seq not in seen:
            seen.add(seq)
            out.append(_indices(kinds, seq))
    return out


def _multiset_permutations(items: list[NodeKind]) -> Iterator[tuple[NodeKind, ...]]:
    """Distinct permutations of `items` in lexicographic order of their positions."""
    counts: dict[NodeKind, int] = {}
    for k in items:
        counts[k] = counts.get(k, 0) + 1
    keys = list(counts)
    n = len(items)

    def walk(prefix: list[NodeKind]) -> Iterator[tuple[NodeKind, ...]]:
        if len(prefix) == n:
            yield tuple(prefix)
            return
        for k in keys:
            if counts[k]:
                counts[k] -= 1
                prefix.append(k)
                yield from walk(prefix)
                prefix.pop()
                counts[k] += 1

    yield from walk([])


def distinct_orders(cluster: Cluster, *, limit: int = 256, dtype: str = "fp16"
                    ) -> tuple[list[tuple[int, ...]], bool]:
    """(node orders, complete): every distinct kind sequence when there are at most `limit`;
    else first every rotation of the nodes as written (FASOP's placements) and of every
    arrangement of the kinds in blocks, then distinct sequences up to `limit` (complete=False).
    """
    kinds = node_kinds(cluster)
    ordered = sorted(kinds, key=lambda k: _sort_key(k, cluster, dtype))
    sequences = list(itertools.islice(_multiset_permutations(ordered), limit + 1))
    if len(sequences) <= limit:
        return [_indices(kinds, s) for s in sequences], True
    n = len(ordered)
    blocks = [[x for x in ordered if x == k] for k in dict.fromkeys(ordered)]
    chosen: list[tuple[NodeKind, ...]] = [tuple(kinds[r:] + kinds[:r]) for r in range(n)]
    for perm in itertools.permutations(range(len(blocks))):
        arranged = [x for b in perm for x in blocks[b]]
        chosen += [tuple(arranged[r:] + arranged[:r]) for r in range(n)]
    unique = list(dict.fromkeys(chosen))
    for seq in sequences:
        if len(unique) >= limit:
            break
        if seq not in unique:
            unique.append(seq)
    return [_indices(kinds, s) for s in unique], False


__all__ = ["cyclic_orders", "distinct_orders", "node_kinds"]
