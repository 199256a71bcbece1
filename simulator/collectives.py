"""Collectives on a topology: α-β cost formulas and their plans as link-level phases.

Two layers:

1. Pure α-β formulas (α: per-step latency in s, β: bandwidth in bytes/s, S: bytes, n ranks),
   from Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication Operations
   in MPICH" (IJHPCA 19(1), §4, ring/"bucket" algorithms) and Patarasuk & Yuan 2009,
   "Bandwidth optimal all-reduce algorithms for clusters of workstations" (JPDC 69(2)):

   - ring all-reduce: 2(n−1) steps of S/n each → ``2(n−1)·α + 2(n−1)/n · S/β``;
   - ring all-gather / reduce-scatter (S = the full tensor): ``(n−1)·α + (n−1)/n · S/β``;
   - pairwise all-to-all (S = one rank's send buffer): ``(n−1)·α + (n−1)/n · S/β``;
   - point-to-point: ``α + S/β``;
   - double-binary-tree all-reduce (Sanders, Speck & Träff 2009, "Two-tree algorithms for full
     bandwidth broadcast, reduction and scan", Parallel Computing 35(12); used by NCCL since 2.4,
     Jeaugey 2019, NVIDIA blog "Massively Scale Your Deep Learning Training with NCCL 2.4"):
     a reduce up and a broadcast down two complementary trees, each carrying S/2, pipelined.
     Depth ⌈log2 n⌉ each way; every rank sends (and receives) 2S in total →
     ``2⌈log2 n⌉·α + 2·S/β`` -- logarithmic latency, so it wins for small (latency-bound) S;
   - hierarchical all-reduce over N nodes × k GPUs (Jia et al. 2018, "Highly Scalable Deep
     Learning Training System with Mixed-Precision", arXiv:1807.11205, §3.3; Horovod's
     hierarchical allreduce): intra-node reduce-scatter, inter-node all-reduce of the S/k shard
     by the k local ranks in parallel, intra-node all-gather →
     ``2·[(k−1)·α_intra + (k−1)/k · S/β_intra] + 2(N−1)·α_inter + 2(N−1)/N · S/β_nic``
     where the k parallel inter-node rings share each node's NIC (k × S/k = S per NIC).

2. `plan_collective` turns a collective on concrete ranks of a cluster into `CommPhase`s, run
   in sequence by the engine. A phase is one rendezvous across its ranks: it waits `latency_s`,
   then moves `bytes_per_link` over every link in `links`; the engine's fluid model shares a
   link among concurrent transfers, so two collectives through one NIC each take twice as long.
   The links of a phase are found from the transfers the algorithm makes (cluster.path of each
   sender → receiver): the load of each link is summed, and the phase names the links carrying
   the largest load, with that load as `bytes_per_link`. Should a lighter but slower link be the
   real bottleneck (load/bandwidth largest), it is named as well and `bytes_per_link` becomes
   the volume that makes the lone time exact on it (the heaviest links, kept for sharing, are
   then charged that smaller volume -- the one approximation of the single-volume phase). For a ring these are all the links its
   neighbour transfers cross (the slowest is its bottleneck); for the inter-node phase of a
   hierarchical all-reduce they are the NIC links, each carrying the k parallel rings' volume,
   so a lone phase takes exactly the formula's time. α of a step is the largest summed link
   latency of a path the step uses. Rings are NCCL's (`_rings`): on a node with point-to-point
   NVLinks several NVLink-only rings sharing the data (simulator/rings.py), across nodes one
   ring per local GPU, each crossing the nodes through a different GPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Protocol
from weakref import WeakKeyDictionary

from trainsim.errors import SpecError, unknown_name
from trainsim.simulator.rings import Hop, node_path, node_rings


class _Link(Protocol):
    """What collectives read of a link (`trainsim.hwmodels.topology.Link`)."""

    @property
    def link_id(self) -> str: ...

    @property
    def bandwidth_bytes_per_s(self) -> float: ...

    @property
    def latency_s(self) -> float: ...

    @property
    def kind(self) -> str: ...


class ClusterTopology(Protocol):
    """What collectives need of `trainsim.hwmodels.cluster.Cluster`."""

    def path(self, src_rank: int, dst_rank: int) -> tuple[_Link, ...]: ...

    def node_of(self, rank: int) -> int: ...

    def ranks_of_node(self, node: int) -> list[int]: ...


# ------------------------------------------------------------------------------ formulas


def _check(n: int, size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> None:
    if n < 1:
        raise SpecError(f"collective group size n={n} must be >= 1")
    if not size_bytes >= 0:
        raise SpecError(f"collective size_bytes={size_bytes} must be >= 0")
    if not alpha_s >= 0:
        raise SpecError(f"collective alpha_s={alpha_s} must be >= 0")
    if not bandwidth_bytes_per_s > 0:
        raise SpecError(f"collective bandwidth_bytes_per_s={bandwidth_bytes_per_s} must be > 0")


def ring_all_reduce_time_s(n: int, size_bytes: float, alpha_s: float,
                           bandwidth_bytes_per_s: float) -> float:
    """Ring all-reduce: ``2(n−1)·α + 2(n−1)/n · S/β`` (Patarasuk & Yuan 2009, §3)."""
    _check(n, size_bytes, alpha_s, bandwidth_bytes_per_s)
    return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * size_bytes / bandwidth_bytes_per_s


def ring_all_gather_time_s(n: int, size_bytes: float, alpha_s: float,
                           bandwidth_bytes_per_s: float) -> float:
    """Ring all-gather of a full tensor of S bytes: ``(n−1)·α + (n−1)/n · S/β``
    (Thakur et al. 2005, §4.1)."""
    _check(n, size_bytes, alpha_s, bandwidth_bytes_per_s)
    return (n - 1) * alpha_s + (n - 1) / n * size_bytes / bandwidth_bytes_per_s


def ring_reduce_scatter_time_s(n: int, size_bytes: float, alpha_s: float,
                               bandwidth_bytes_per_s: float) -> float:
    """Ring reduce-scatter of a full tensor of S bytes: ``(n−1)·α + (n−1)/n · S/β``
    (Thakur et al. 2005, §4.4; computation cost ignored)."""
    return ring_all_gather_time_s(n, size_bytes, alpha_s, bandwidth_bytes_per_s)


def tree_all_reduce_time_s(n: int, size_bytes: float, alpha_s: float,
                           bandwidth_bytes_per_s: float) -> float:
    """Double-binary-tree all-reduce: ``2⌈log2 n⌉·α + 2·S/β`` (Sanders et al. 2009; NCCL 2.4)."""
    _check(n, size_bytes, alpha_s, bandwidth_bytes_per_s)
    if n == 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * alpha_s + 2 * size_bytes / bandwidth_bytes_per_s


def all_to_all_time_s(n: int, size_bytes: float, alpha_s: float,
                      bandwidth_bytes_per_s: float) -> float:
    """Pairwise all-to-all, S = one rank's send buffer: ``(n−1)·α + (n−1)/n · S/β``
    (Thakur et al. 2005, §4.6, pairwise exchange)."""
    return ring_all_gather_time_s(n, size_bytes, alpha_s, bandwidth_bytes_per_s)


def p2p_time_s(size_bytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Point-to-point send: ``α + S/β``."""
    _check(2, size_bytes, alpha_s, bandwidth_bytes_per_s)
    return alpha_s + size_bytes / bandwidth_bytes_per_s


def hierarchical_all_reduce_time_s(
    num_nodes: int,
    gpus_per_node: int,
    size_bytes: float,
    alpha_intra_s: float,
    bandwidth_intra_bytes_per_s: float,
    alpha_inter_s: float,
    nic_bandwidth_bytes_per_s: float,
) -> float:
    """Hierarchical all-reduce (Jia et al. 2018, §3.3): reduce-scatter in the node, all-reduce
    of S/k across nodes by the k local ranks sharing the NIC, all-gather in the node:
    ``2·[(k−1)·α_i + (k−1)/k · S/β_i] + 2(N−1)·α_e + 2(N−1)/N · S/β_nic``."""
    k, nodes = gpus_per_node, num_nodes
    _check(k, size_bytes, alpha_intra_s, bandwidth_intra_bytes_per_s)
    _check(nodes, size_bytes, alpha_inter_s, nic_bandwidth_bytes_per_s)
    intra = (k - 1) * alpha_intra_s + (k - 1) / k * size_bytes / bandwidth_intra_bytes_per_s
    inter = ring_all_reduce_time_s(nodes, size_bytes, alpha_inter_s, nic_bandwidth_bytes_per_s)
    return 2 * intra + inter


# ------------------------------------------------------------------------------ phases


@dataclass(frozen=True, kw_only=True, slots=True)
class CommPhase:
    """One step of a collective: a rendezvous of `ranks`, then a transfer over `links`."""

    name: str
    """What the phase does, e.g. ``"ring_all_reduce"`` or ``"inter_node_all_reduce"``."""
    ranks: tuple[int, ...]
    """Every rank taking part; the phase starts when all are ready."""
    latency_s: float
    """Fixed start-up time of the phase: steps × per-step α."""
    bytes_per_link: float
    """Bytes moved over each link in `links` (per direction)."""
    links: tuple[str, ...]
    """Link ids (`Link.link_id`) the phase loads with `bytes_per_link`; sorted."""

    def __post_init__(self) -> None:
        if not self.ranks:
            raise SpecError(f"comm phase {self.name!r} has no ranks")
        if not self.latency_s >= 0:
            raise SpecError(f"comm phase {self.name!r} latency_s={self.latency_s} must be >= 0")
        if not self.bytes_per_link >= 0:
            raise SpecError(
                f"comm phase {self.name!r} bytes_per_link={self.bytes_per_link} must be >= 0")
        if self.bytes_per_link > 0 and not self.links:
            raise SpecError(f"comm phase {self.name!r} moves bytes but names no links")


def collective_time_s(phases: Iterable[CommPhase], link_bandwidth: Mapping[str, float]) -> float:
    """Time of `phases` run alone (no other traffic): Σ latency + bytes / slowest link.

    Args:
        phases: as returned by `plan_collective`.
        link_bandwidth: bytes/s per link id (e.g. from `link_bandwidths`).
    """
    total = 0.0
    for phase in phases:
        total += phase.latency_s
        if phase.bytes_per_link > 0:
            slowest = min(link_bandwidth[link] for link in phase.links)
            total += phase.bytes_per_link / slowest
    return total


def link_bandwidths(cluster: ClusterTopology, ranks: Sequence[int]) -> dict[str, float]:
    """Bandwidth (bytes/s) of every link on a path between two of `ranks` (O(n²) paths)."""
    found: dict[str, float] = {}
    for src in ranks:
        for dst in ranks:
            if src != dst:
                for link in cluster.path(src, dst):
                    found[link.link_id] = float(link.bandwidth_bytes_per_s)
    return dict(sorted(found.items()))


Transfer = tuple[int, int, float]
"""(source rank, destination rank, bytes)."""


def _phase(name: str, ranks: tuple[int, ...], steps: int, transfers: Sequence[Transfer],
           cluster: ClusterTopology, bandwidths: dict[str, float]) -> CommPhase:
    """A phase from its concurrent transfers: max-loaded links and the slowest step latency."""
    load: dict[str, float] = {}
    alpha = 0.0
    info = _path_info(cluster)
    for src, dst, size in transfers:
        ids, latency, bws = info(src, dst)
        if latency > alpha:  # noqa: PLR1730  # = max(alpha, latency), without the call
            alpha = latency
        for link_id, bw in zip(ids, bws):
            prev = load.get(link_id)
            if prev is None:
                load[link_id] = 0.0 + size
                bandwidths[link_id] = bw
            else:
                load[link_id] = prev + size
    return _loaded_phase(name, ranks, steps, load, alpha, bandwidths)


class _RingLinks:
    """Which links the neighbour transfers of some rings cross, how often, grouped for
    `_ring_phase` (which sizes them): per topology and rings, size-free, so one collective
    planned again with another size (or another algorithm's phase on the same rings) reuses
    them."""

    __slots__ = ("_bws", "_by_ring", "_paths", "_sorted", "alpha", "bandwidths", "by_total")

    def __init__(self, cluster: ClusterTopology, rings: tuple[tuple[int, ...], ...]) -> None:
        path = cluster.path
        self._paths = [[path(a, b) for a, b in zip(ring, ring[1:] + ring[:1])]
                       for ring in rings]
        alpha = 0.0
        for paths in self._paths:
            for p in paths:
                latency = 0.0  # as `_path_info` sums it
                for link in p:
                    latency += float(link.latency_s)
                if latency > alpha:  # noqa: PLR1730
                    alpha = latency
        self.alpha = alpha
        """Largest summed latency of a transfer's path."""
        total = self._counts(chain.from_iterable(chain.from_iterable(self._paths)))
        self.bandwidths = self._bws
        """Bandwidth of every link crossed."""
        groups: dict[tuple[int, float], list[str]] = {}
        for k, c in total.items():
            groups.setdefault((c, self.bandwidths[k]), []).append(k)
        self.by_total = list(groups.items())
        """((times crossed by all rings' transfers together, bandwidth), links) groups."""
        self._by_ring: list[tuple[tuple[tuple[int, ...], float], list[str]]] | None = None
        self._sorted: dict[tuple[bool, frozenset[int]], tuple[str, ...]] = {}

    _bws: dict[str, float]

    def _counts(self, links: Iterable[_Link]) -> dict[str, int]:
        """Times each link id occurs among `links` (counted per link object, then by id: a
        topology may make a new object per path); notes each one's bandwidth (`_bws`)."""
        flat = list(links)
        per_object = Counter(map(id, flat))
        objects = dict(zip(map(id, flat), flat))
        out: dict[str, int] = {}
        bws = getattr(self, "_bws", None)
        if bws is None:
            bws = self._bws = {}
        for key, c in per_object.items():
            link = objects[key]
            link_id = link.link_id
            out[link_id] = out.get(link_id, 0) + c
            if link_id not in bws:
                bws[link_id] = float(link.bandwidth_bytes_per_s)
        return out

    def by_ring(self) -> list[tuple[tuple[tuple[int, ...], float], list[str]]]:
        """((times crossed by each ring's transfers, bandwidth), links) groups."""
        if self._by_ring is None:
            per_ring = [self._counts(chain.from_iterable(paths)) for paths in self._paths]
            groups: dict[tuple[tuple[int, ...], float], list[str]] = {}
            for k, bw in self.bandwidths.items():
                key = (tuple(c.get(k, 0) for c in per_ring), bw)
                groups.setdefault(key, []).append(k)
            self._by_ring = list(groups.items())
        return self._by_ring

    def links(self, per_ring: bool, chosen: frozenset[int]) -> tuple[str, ...]:
        """The links of groups `chosen` (of `by_ring` or `by_total`), sorted."""
        key = (per_ring, chosen)
        found = self._sorted.get(key)
        if found is None:
            groups = self.by_ring() if per_ring else self.by_total
            found = self._sorted[key] = tuple(sorted(
                chain.from_iterable(groups[i][1] for i in chosen)))
        return found


def _ring_phase(name: str, ranks: tuple[int, ...], steps: int,
                rings: Sequence[tuple[Sequence[int], float]], cluster: ClusterTopology,
                bandwidths: dict[str, float]) -> CommPhase:
    """`_phase` of the neighbour transfers of `rings` ((members, bytes of each transfer) each,
    in order: what `_ring` makes of them), from their `_RingLinks` (remembered per topology).

    The same to the bit: `_phase` adds each transfer's size to each link it crosses, transfer
    by transfer; a link crossed c_r times by ring r's transfers (of s_r bytes each) so gets
    s_1 added c_1 times, then s_2 c_2 times, and so on, which is what is added here, once per
    group of links with the same counts (all of whose loads are then equal); with every s_r
    equal, only the total count matters. The peak, the bottleneck test and the named links
    follow from those loads and bandwidths as in `_phase`."""
    live = [(tuple(m), size) for m, size in rings if len(m) >= 2]
    if not live:
        return _loaded_phase(name, ranks, steps, {}, 0.0, bandwidths)
    members = tuple(m for m, _ in live)
    cache = _ring_cache(cluster)
    key = ("ring links", members)
    found = None if cache is None else cache.get(key)
    if found is None:
        found = _RingLinks(cluster, members)
        if cache is not None:
            cache[key] = found
    sizes = [size for _, size in live]
    first = sizes[0]
    per_ring = any(size != first for size in sizes)
    loads: list[float] = []
    group_bw: list[float] = []
    for (counts, bw), _ in (found.by_ring() if per_ring else found.by_total):
        v = 0.0
        if per_ring:
            for c, size in zip(counts, sizes):  # type: ignore[arg-type]
                for _ in range(c):
                    v += size
        else:
            for _ in range(counts):  # type: ignore[arg-type]
                v += first
        loads.append(v)
        group_bw.append(bw)
    bandwidths.update(found.bandwidths)
    alpha = found.alpha
    peak = max(loads, default=0.0)
    if not peak:
        return CommPhase(name=name, ranks=ranks, latency_s=steps * alpha, bytes_per_link=0.0,
                         links=())
    heaviest = {i for i, v in enumerate(loads) if v >= peak * (1 - 1e-12)}
    volume = peak
    slowest_time = max(v / bw for v, bw in zip(loads, group_bw))
    if slowest_time > peak / min(group_bw[i] for i in heaviest) * (1 + 1e-12):
        slow = {i for i, (v, bw) in enumerate(zip(loads, group_bw))
                if v / bw >= slowest_time * (1 - 1e-12)}
        heaviest |= slow
        volume = slowest_time * min(group_bw[i] for i in heaviest)
    return CommPhase(name=name, ranks=ranks, latency_s=steps * alpha, bytes_per_link=volume,
                     links=found.links(per_ring, frozenset(heaviest)))


def _loaded_phase(name: str, ranks: tuple[int, ...], steps: int, load: dict[str, float],
                  alpha: float, bandwidths: dict[str, float]) -> CommPhase:
    """The phase of links loaded with `load` bytes (`_phase`): the max-loaded links, or with
    them a lighter but slower bottleneck."""
    peak = max(load.values(), default=0.0)
    if not peak:
        return CommPhase(name=name, ranks=ranks, latency_s=steps * alpha, bytes_per_link=0.0,
                         links=())
    heaviest = {k for k, v in load.items() if v >= peak * (1 - 1e-12)}
    volume = peak
    slowest_time = max(v / bandwidths[k] for k, v in load.items())
    if slowest_time > peak / min(bandwidths[k] for k in heaviest) * (1 + 1e-12):
        # A lighter but slower link (e.g. a GPU's PCIe path to the NIC) is the bottleneck:
        # name it too, and charge the volume that makes the lone time exact on it.
        slow = {k for k, v in load.items() if v / bandwidths[k] >= slowest_time * (1 - 1e-12)}
        heaviest |= slow
        volume = slowest_time * min(bandwidths[k] for k in heaviest)
    return CommPhase(name=name, ranks=ranks, latency_s=steps * alpha, bytes_per_link=volume,
                     links=tuple(sorted(heaviest)))


PathInfo = tuple[tuple[str, ...], float, tuple[float, ...]]
"""(link ids, summed latency, bandwidths) of the path between two ranks."""

_PATH_INFO: WeakKeyDictionary[object, dict[tuple[int, int], PathInfo]] = WeakKeyDictionary()
"""`PathInfo` per (source, destination), per topology object (as `_RING_CACHES`)."""


def _path_info(cluster: ClusterTopology) -> Callable[[int, int], PathInfo]:
    """`PathInfo` of a pair, remembered per topology: `_phase` reads it for every transfer."""
    try:
        cache = _PATH_INFO.setdefault(cluster, {})
    except TypeError:
        cache = {}

    def info(src: int, dst: int) -> PathInfo:
        found = cache.get((src, dst))
        if found is None:
            path = cluster.path(src, dst)
            latency = 0.0
            for link in path:
                latency += float(link.latency_s)
            found = cache[(src, dst)] = (tuple(link.link_id for link in path), latency,
                                         tuple(float(link.bandwidth_bytes_per_s)
                                               for link in path))
        return found

    return info


def _ring(members: Sequence[int], size: float) -> list[Transfer]:
    n = len(members)
    return [(members[i], members[(i + 1) % n], size) for i in range(n)] if n > 1 else []


def _by_node(cluster: ClusterTopology, ranks: Sequence[int]) -> dict[int, list[int]]:
    nodes: dict[int, list[int]] = {}
    for r in sorted(ranks, key=lambda r: (cluster.node_of(r), r)):
        nodes.setdefault(cluster.node_of(r), []).append(r)
    return nodes


def _hop(cluster: ClusterTopology) -> Callable[[int, int], Hop]:
    """(one direct NVLink?, slowest bandwidth on the path) between two ranks of `cluster`."""
    def hop(a: int, b: int) -> Hop:
        path = cluster.path(a, b)
        direct = len(path) == 1 and path[0].kind == "nvlink"
        return direct, min(float(link.bandwidth_bytes_per_s) for link in path)

    return hop


def _node_ordered(cluster: ClusterTopology, ranks: Sequence[int]) -> list[int]:
    """Ranks node by node (nodes in order), so a ring crosses each node boundary once (as
    NCCL); inside a node along NVLink neighbours where the node has point-to-point NVLinks
    (rings.node_path), else in rank order."""
    cache = _ring_cache(cluster)
    key = ("path", *ranks)
    if cache is not None and key in cache:
        return list(cache[key])
    order = [r for members in _by_node(cluster, ranks).values()
             for r in _node_path(cluster, members)]
    if cache is not None:
        cache[key] = order
    return order


def _node_path(cluster: ClusterTopology, members: list[int]) -> list[int]:
    """`rings.node_path` of one node's `members`, remembered per `_alike` key."""
    cache = _ring_cache(cluster)
    alike = _alike(cluster, members)
    if cache is None or alike is None:
        return node_path(members, _hop(cluster), _rings(cluster, members))
    key = ("node path", alike)
    found = cache.get(key)
    if found is None:
        order = node_path(members, _hop(cluster), _rings(cluster, members))
        found = cache[key] = tuple(members.index(r) for r in order)
    return [members[i] for i in found]


def _alike(cluster: ClusterTopology, ranks: Sequence[int]) -> Hashable | None:
    """A key shared by rank lists of one node that are wired alike (the same GPUs of nodes of
    one node group), from the topology's optional ``wiring_key`` (MemoTopology has one);
    rings found for one serve the others position by position. None: not known."""
    key = getattr(cluster, "wiring_key", None)
    return None if key is None else key(ranks)


def _rings(cluster: ClusterTopology, ranks: Sequence[int]) -> list[tuple[tuple[int, ...], float]]:
    """The weighted rings a ring collective over `ranks` uses.

    On one node: NCCL's NVLink rings (rings.node_rings; several on an NVLink mesh). Across
    nodes: as many rings as the largest node has members, each visiting the nodes in order and
    every node's members along its best ring rotated by one more place, so that each ring
    leaves and enters a node through a different GPU (and so through that GPU's PCIe path to
    the NICs). This is how NCCL's channels spread a multi-node ring over all of a node's GPUs
    and NICs (ncclTopoCompute searches one inter-node ring per NIC; "NCCL 2.0", GTC 2017);
    a single ring would push all inter-node traffic through one GPU's PCIe link.
    """
    cache = _ring_cache(cluster)
    key = ("rings", *ranks)
    if cache is not None and key in cache:
        return list(cache[key])
    alike = _alike(cluster, ranks) if cache is not None else None
    if alike is not None:
        assert cache is not None
        found = cache.get(("alike rings", alike))
        if found is None:
            found = cache[("alike rings", alike)] = [
                (tuple(ranks.index(r) for r in ring), w)
                for ring, w in _build_rings(cluster, ranks)]
        rings = [(tuple(ranks[i] for i in ring), w) for ring, w in found]
    else:
        rings = _build_rings(cluster, ranks)
    if cache is not None:
        cache[key] = rings
    return rings


_RING_CACHES: WeakKeyDictionary[object, dict[tuple[object, ...], Any]] = WeakKeyDictionary()
"""Rings (and `_node_ordered` orders, keyed ("path", *ranks)) per group, per topology object:
lowering plans the same groups thousands of times. A topology that cannot be weakly referenced
or hashed is not cached."""


def _ring_cache(cluster: ClusterTopology) -> dict[tuple[object, ...], Any] | None:
    try:
        return _RING_CACHES.setdefault(cluster, {})
    except TypeError:
        return None


def _build_rings(cluster: ClusterTopology, ranks: Sequence[int]
                 ) -> list[tuple[tuple[int, ...], float]]:
    nodes = _by_node(cluster, ranks)
    hop = _hop(cluster)
    if len(nodes) == 1:
        return node_rings(next(iter(nodes.values())), hop)
    cycles = [list(max(_rings(cluster, m), key=lambda r: r[1])[0]) for m in nodes.values()]
    k = max(len(c) for c in cycles)
    rings = []
    for shift in range(k):
        ring: list[int] = []
        for c in cycles:
            s = shift % len(c)
            ring += c[s:] + c[:s]
        rings.append((tuple(ring), 1.0 / k))
    return rings


def _ring_transfers(cluster: ClusterTopology, ranks: Sequence[int], size: float
                    ) -> list[Transfer]:
    """Neighbour transfers of every ring of `_rings`, each carrying its share of `size`."""
    return [t for ring, weight in _rings(cluster, ranks) for t in _ring(ring, weight * size)]


def _weighted_rings(cluster: ClusterTopology, ranks: Sequence[int], size: float
                    ) -> list[tuple[tuple[int, ...], float]]:
    """The rings of `_rings`, each with its share of `size`: `_ring_transfers` as
    `_ring_phase` takes it."""
    return [(ring, weight * size) for ring, weight in _rings(cluster, ranks)]


def _ring_all_reduce(ranks: tuple[int, ...], size: float, cluster: ClusterTopology,
                     bw: dict[str, float]) -> list[CommPhase]:
    n = len(ranks)
    return [_ring_phase("ring_all_reduce", ranks, 2 * (n - 1),
                        _weighted_rings(cluster, ranks, 2 * (n - 1) / n * size), cluster, bw)]


def _tree_all_reduce(ranks: tuple[int, ...], size: float, cluster: ClusterTopology,
                     bw: dict[str, float]) -> list[CommPhase]:
    # NCCL trees are chains inside a node and double binary trees across nodes; each rank
    # sends 2S in total (see module docstring), charged on the links its chain/tree edges use.
    n = len(ranks)
    chain = _node_ordered(cluster, ranks)
    phase = _ring_phase("tree_all_reduce", ranks, 2 * math.ceil(math.log2(n)),
                        [(chain, 2 * size)], cluster, bw)
    return [phase]


def _hierarchical_all_reduce(ranks: tuple[int, ...], size: float, cluster: ClusterTopology,
                             bw: dict[str, float]) -> list[CommPhase]:
    nodes = _by_node(cluster, ranks)
    sizes = {len(m) for m in nodes.values()}
    if len(nodes) < 2 or len(sizes) != 1:
        raise SpecError(
            f"hierarchical all-reduce needs ranks on >= 2 nodes with the same count on each; "
            f"got {({node: len(m) for node, m in nodes.items()})} ranks per node")
    k = sizes.pop()
    num_nodes = len(nodes)
    phases: list[CommPhase] = []
    if k > 1:
        intra = [r for m in nodes.values() for r in _weighted_rings(cluster, m, (k - 1) / k * size)]
        scatter = _ring_phase("intra_node_reduce_scatter", ranks, k - 1, intra, cluster, bw)
        phases.append(scatter)
    members = list(nodes.values())
    inter = [([m[local] for m in members], 2 * (num_nodes - 1) / num_nodes * size / k)
             for local in range(k)]
    phases.append(_ring_phase("inter_node_all_reduce", ranks, 2 * (num_nodes - 1), inter,
                              cluster, bw))
    if k > 1:  # the reduce-scatter's transfers again: its loads, under its own name
        phases.append(dataclasses.replace(scatter, name="intra_node_all_gather"))
    return phases


def _hierarchical_applies(ranks: tuple[int, ...], cluster: ClusterTopology) -> bool:
    counts = [len(m) for m in _by_node(cluster, ranks).values()]
    return len(counts) >= 2 and len(set(counts)) == 1 and counts[0] >= 2


def _ring_half(name: str) -> Callable[..., list[CommPhase]]:
    def build(ranks: tuple[int, ...], size: float, cluster: ClusterTopology,
              bw: dict[str, float]) -> list[CommPhase]:
        n = len(ranks)
        return [_ring_phase(name, ranks, n - 1,
                            _weighted_rings(cluster, ranks, (n - 1) / n * size), cluster, bw)]

    return build


def _all_to_all(ranks: tuple[int, ...], size: float, cluster: ClusterTopology,
                bw: dict[str, float]) -> list[CommPhase]:
    n = len(ranks)
    transfers = [(s, d, size / n) for s in ranks for d in ranks if s != d]
    return [_phase("pairwise_all_to_all", ranks, n - 1, transfers, cluster, bw)]


def _p2p(ranks: tuple[int, ...], size: float, cluster: ClusterTopology,
         bw: dict[str, float]) -> list[CommPhase]:
    if len(ranks) != 2:
        raise SpecError(f"p2p needs ranks=(src, dst); got {ranks}")
    return [_phase("p2p", ranks, 1, [(ranks[0], ranks[1], size)], cluster, bw)]


_ALGORITHMS: dict[str, dict[str, Callable[..., list[CommPhase]]]] = {
    "all_reduce": {"ring": _ring_all_reduce, "hierarchical": _hierarchical_all_reduce,
                   "tree": _tree_all_reduce},
    "all_gather": {"ring": _ring_half("ring_all_gather")},
    "reduce_scatter": {"ring": _ring_half("ring_reduce_scatter")},
    "all_to_all": {"pairwise": _all_to_all},
    "p2p": {"direct": _p2p},
}
"""Per collective kind, its algorithms; under "auto" they are tried in this order."""


def plan_collective(
    kind: str,
    ranks: tuple[int, ...],
    size_bytes: float,
    cluster: ClusterTopology,
    algorithm: str = "auto",
) -> list[CommPhase]:
    """Plan collective `kind` over `ranks` as phases run in sequence (see module docstring).

    Args:
        kind: ``all_reduce``, ``all_gather``, ``reduce_scatter`` (S = full tensor),
            ``all_to_all`` (S = one rank's send buffer) or ``p2p`` (ranks = (src, dst)).
        ranks: the group (order ignored except for p2p; rings go in (node, rank) order).
        size_bytes: S.
        cluster: anything with ``path``, ``node_of`` and ``ranks_of_node`` (the Cluster).
        algorithm: ``auto`` (the fastest alone; all-reduce tries ring, hierarchical when the
            group spans nodes evenly, and tree), or ``ring`` / ``tree`` / ``hierarchical`` /
            ``pairwise`` / ``direct`` as the kind allows.

    Returns:
        The phases; empty for a group of one rank.

    Raises:
        UnknownNameError: unknown kind or algorithm. SpecError: bad ranks or size.
    """
    algorithms = _ALGORITHMS.get(kind)
    if algorithms is None:
        raise unknown_name("collective", kind, _ALGORITHMS)
    if algorithm != "auto" and algorithm not in algorithms:
        raise unknown_name(f"{kind} algorithm", algorithm, [*algorithms, "auto"])
    ranks = tuple(ranks)
    if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
        raise SpecError(f"collective {kind} ranks={ranks} must be non-empty ranks >= 0")
    if len(set(ranks)) != len(ranks):
        raise SpecError(f"collective {kind} ranks={ranks} repeat a rank")
    if not (isinstance(size_bytes, (int, float)) and math.isfinite(size_bytes)
            and size_bytes >= 0):
        raise SpecError(f"collective {kind} size_bytes={size_bytes!r} must be a finite number >= 0")
    if len(ranks) == 1:
        return []
    if algorithm != "auto":
        return algorithms[algorithm](ranks, float(size_bytes), cluster, {})
    if len(algorithms) == 1:  # nothing to compare
        return next(iter(algorithms.values()))(ranks, float(size_bytes), cluster, {})
    best: tuple[float, list[CommPhase]] | None = None
    for name, build in algorithms.items():
        if name == "hierarchical" and not _hierarchical_applies(ranks, cluster):
            continue
        bandwidths: dict[str, float] = {}
        phases = build(ranks, float(size_bytes), cluster, bandwidths)
        time_s = collective_time_s(phases, bandwidths)
        if best is None or time_s < best[0]:
            best = (time_s, phases)
    assert best is not None  # every kind has at least one algorithm that always applies
    return best[1]
