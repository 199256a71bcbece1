"""Communication tasks for lowering: collectives and transfers as Program tasks on real links.

`CommLowering` turns "collective `kind` of S bytes over physical ranks G" into Program tasks:
it plans the collective on the cluster (simulator/collectives.py), merges consecutive phases
that load the same links into one task (their latencies and bytes add, so a lone task takes
exactly the planned time), and names the links each task crosses so that the engine's fluid
model shares them with every other transfer running at the same time.

**Folding.** A folded program rank stands for several identical GPUs, so one folded task stands
for N concurrent copies of a collective (e.g. the data-parallel all-reduces of the eight
tensor-parallel ranks of a stage). Where n of those copies cross one physical link ``l``, the
folded task crosses the virtual link ``l/n`` with bandwidth ``bw(l)/n``: alone it then takes
exactly as long as the n copies sharing ``l`` would (Program semantics: equal sharing).
Copies of *different* folded tasks that meet on a link are shared through the representative
copies' links only, which is exact when each representative's links carry the same mix of
traffic as every other copy's (true for the symmetric layouts lowering builds on one
homogeneous node group) and an approximation otherwise (see `LoweringOptions.fold`).

**Collectives as measured.** `plan_measured` prices the planned phases with NCCL's protocol
latencies and the measured bus efficiencies of hwmodels/collectives.py (data/collectives.json):
each phase's latency becomes the chosen protocol's start-up (first phase of a collective only)
and per-step latencies, plus the time the efficiency e < 1 costs at the slowest link's peak,
``V / B · (1/e − 1)``, so that a phase alone takes ``latency + V / (B · e)``. Its volume V stays
the bytes on the wire (what tasks report and the engine shares); under sharing only that volume
is slowed and the efficiency loss stays a fixed time (an approximation: protocol overhead is
taken as not contended). An efficiency above 1 (NVLink SHARP all-reduce on H100, where the
switch reduces) instead divides the volume: fewer bytes cross the links. The class is that of
the phase's slowest link, or of its NIC when the phase spans nodes (by the node's NIC name; the
efficiency then applies to the slowest link, which may be a GPU's PCIe path to the NIC); steps
that cross nodes pay the network's per-step latency, the others the intra-node class's. A CPU
cluster's loopback (gloo) phases are left as planned. With algorithm "auto" an all-reduce takes
the fastest of ring, hierarchical and tree *as priced here*, as NCCL chooses.

**Planning once per shape.** With caches shared between lowerings (a `LoweringCache`), a
collective is planned once per group `Shape` -- the same GPUs of nodes of one node group, in
the same order -- and renamed onto every other group of that shape (the 128 data-parallel
groups of a 1024-GPU plan are a handful of shapes), and the copies counted on a folded task's
links are only those sharing a node with it (every link belongs to one node). Planned or
renamed, the phases are the same to the bit (tests/workloads/test_comm_symmetry.py); without a
shared cache every group is planned, as before.

`cross_unit` runs collectives whose groups span several replica units of a stage (expert-parallel
all-to-alls, ZeRO-3 parameter gathers) and joins each unit's chain to the groups it touches.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainsim.hwmodels.cluster import Cluster
from trainsim.hwmodels.collectives import CollectiveModels, collective_models, link_class
from trainsim.hwmodels.topology import Link, link_id_of, link_parts
from trainsim.simulator.collectives import CommPhase, plan_collective
from trainsim.simulator.program import shared_link_id
from trainsim.simulator.task_table import TaskTableBuilder
from trainsim.workloads.lowering.layout import LoweringLayout

Need = tuple[str, float]
"""(collective kind, size in bytes as `plan_collective` takes it)."""

Meta = tuple[int, int, int, int]
"""(micro-batch, stage, first layer, last layer) of a task; -1 where none."""

NO_META: Meta = (-1, -1, -1, -1)

Template = list[tuple[float, float, tuple[int, ...]]]
"""(latency, bytes per link, link codes) of each task of a planned chain of collectives."""
NamedTemplate = tuple[tuple[float, float, tuple[tuple[str, float], ...]], ...]
"""A `Template` with each link as (link id, its bandwidth) instead of a builder code: what a
`LoweringCache` keeps between lowerings (`CommLowering.template`)."""


@dataclass(frozen=True, slots=True)
class PlannedComm:
    """A planned chain of communication tasks on fixed program ranks (builder codes): what
    lowering stamps out once per micro-batch with `CommLowering.emit_planned`."""

    template: Template
    name: int
    kind: int
    stream: int
    prog_ranks: tuple[int, ...]


class MemoTopology:
    """The cluster's `path`, `node_of`, `ranks_of_node` and `link`, remembered per argument.

    Planning one lowering's collectives asks for the same few paths thousands of times (every
    tensor-parallel group, every copy of a folded collective); the cluster computes each from
    its node groups. The answers are pure functions of the cluster, so they are kept.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._path: dict[tuple[int, int], tuple[Link, ...]] = {}
        self._node: dict[int, int] = {}
        self._ranks: dict[int, list[int]] = {}
        self._link: dict[str, Link] = {}
        self._nic: dict[int, str] = {}
        self._shape: dict[tuple[int, ...], Shape] = {}
        self._facts: dict[tuple[str, tuple[int, ...], tuple[str, ...]], Any] = {}
        """`measured_phases`' facts per (phase name, ranks, links)."""
        self._min_bw: dict[tuple[str, ...], float] = {}
        """Slowest bandwidth per tuple of link ids (`alone_time_s`)."""
        self._sym: dict[int, bool] = {}
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._placement = cluster.placement()
        self.translatable = type(cluster).path is Cluster.path \
            and type(cluster).link is Cluster.link
        """Whether links are the cluster's own, named per node and GPU (topology.py), so that
        a collective planned on one group can be renamed onto another of its `Shape` (a
        subclass with its own links, such as validate's CPU cluster, is planned per group)."""
        self.renaming = False
        """Set by `CommLowering` when a shared cache adopts this memo and it is
        `translatable`: then `wiring_key` answers."""

    def nic_name(self, rank: int) -> str:
        """Name of the NIC of `rank`'s node group (``loopback`` on a CPU cluster)."""
        found = self._nic.get(rank)
        if found is None:
            groups = self.cluster.node_groups
            found = self._nic[rank] = groups[self.cluster.group_of(rank)].nic.name
        return found

    def nic_of_link(self, link_id: str, fallback_rank: int) -> str:
        """Name of the NIC behind NIC link `link_id` (``n<node>.nic.<dir>``, topology.py); links
        named otherwise (a CPU cluster's loopback) take `fallback_rank`'s NIC."""
        head, _, rest = link_id.partition(".")
        if rest.startswith("nic.") and head[:1] == "n" and head[1:].isdigit():
            ranks = self.ranks_of_node(int(head[1:]))
            if ranks:
                return self.nic_name(ranks[0])
        return self.nic_name(fallback_rank)

    def path(self, src_rank: int, dst_rank: int) -> tuple[Link, ...]:
        """`cluster.path`, remembered."""
        key = (src_rank, dst_rank)
        found = self._path.get(key)
        if found is None:
            found = self._path[key] = self.cluster.path(src_rank, dst_rank)
        return found

    def node_of(self, rank: int) -> int:
        """`cluster.node_of`, remembered."""
        found = self._node.get(rank)
        if found is None:
            found = self._node[rank] = self.cluster.node_of(rank)
        return found

    def ranks_of_node(self, node: int) -> list[int]:
        """`cluster.ranks_of_node`, remembered."""
        if node not in self._ranks:
            self._ranks[node] = self.cluster.ranks_of_node(node)
        return self._ranks[node]

    def link(self, link_id: str) -> Link:
        """`cluster.link`, remembered."""
        if link_id not in self._link:
            self._link[link_id] = self.cluster.link(link_id)
        return self._link[link_id]

    def shape(self, group: tuple[int, ...]) -> Shape:
        """The `Shape` of a group of ranks (remembered)."""
        found = self._shape.get(group)
        if found is None:
            rank_node, rank_local, node_group = self._placement
            nodes = tuple(sorted({rank_node[r] for r in group}))
            pos = {n: i for i, n in enumerate(nodes)}
            on_node: list[list[int]] = [[] for _ in nodes]
            for r in group:
                on_node[pos[rank_node[r]]].append(rank_local[r])
            locals_ = tuple(tuple(sorted(m)) for m in on_node)
            index = [{g: j for j, g in enumerate(m)} for m in locals_]
            places = tuple((pos[rank_node[r]], index[pos[rank_node[r]]][rank_local[r]])
                           for r in group)
            wiring = tuple(
                (node_group[n], len(m), _string_order(m)) if self._symmetric(n)
                else (node_group[n], m) for n, m in zip(nodes, locals_, strict=True))
            found = self._shape[group] = Shape((places, wiring, _string_order(nodes)),
                                               nodes, locals_)
        return found

    def wiring_key(self, ranks: Sequence[int]) -> Hashable | None:
        """For ranks of one node, a key shared by the same GPUs of any node of its node group
        (wired alike), so collectives.py finds NCCL's rings for one and reuses them; None for
        ranks of several nodes, or unless `renaming` (set for a shared cache)."""
        if not self.renaming:
            return None
        rank_node, rank_local, node_group = self._placement
        node = rank_node[ranks[0]]
        for r in ranks:
            if rank_node[r] != node:
                return None
        return node_group[node], tuple(rank_local[r] for r in ranks)

    def placement_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(node of each rank, local index of each rank, node group of each node, whether each
        node is wired alike) as numpy arrays, worked out once, for tests over many groups."""
        found = self._arrays
        if found is None:
            rank_node, rank_local, node_group = self._placement
            nodes = len(node_group)
            found = self._arrays = (np.asarray(rank_node, np.int64),
                                    np.asarray(rank_local, np.int64),
                                    np.asarray(node_group, np.int64),
                                    np.array([self._symmetric(n) for n in range(nodes)], bool))
        return found

    def _symmetric(self, node: int) -> bool:
        found = self._sym.get(node)
        if found is None:
            found = self._sym[node] = self.cluster.node_symmetric(node)
        return found


def _groups_alike(copies: Sequence[tuple[int, ...]], rank_node: np.ndarray,
                  rank_local: np.ndarray, node_group: np.ndarray, symmetric: np.ndarray) -> bool:
    """`CommLowering.copies_alike` on the placement arrays: every group, member by member, on
    nodes of the same node groups, sharing nodes in the same pattern, at the same GPUs where a
    node is not wired alike, each node carrying as many of the groups as every other's."""
    if len({len(g) for g in copies}) != 1:
        return False
    ranks = np.asarray(copies, dtype=np.int64)  # groups x members
    nodes = rank_node[ranks]
    k = ranks.shape[1]
    # which earlier member shares each member's node (its first such member)
    pattern = np.argmax(nodes[:, :, None] == nodes[:, None, :], axis=2)
    distinct = np.ones_like(nodes, dtype=bool)
    for j in range(1, k):
        distinct[:, j] = (nodes[:, :j] != nodes[:, j:j + 1]).all(axis=1)
    load = np.bincount(nodes[distinct], minlength=len(node_group))
    local = np.where(symmetric[nodes], -1, rank_local[ranks])
    sig = np.concatenate([pattern, node_group[nodes], local, load[nodes]], axis=1)
    return bool((sig == sig[0]).all())


@dataclass(frozen=True, slots=True)
class Shape:
    """A group of ranks up to renaming nodes and GPUs (`MemoTopology.shape`).

    Two groups with one `key` are the same collective elsewhere: position by position their
    ranks sit on nodes of the same node group, in the same node order, at GPUs of the same rank
    among the group's GPUs of that node -- the same GPUs where the node's GPUs are not all
    wired alike (NVLink pairs) -- and node ids and GPU indices sort the same way as strings.
    Every path of one is then the other's with each link renamed to its counterpart, and every
    sum, tie and sort of link ids in planning goes the same way, so the planned phases are the
    other's renamed (`CommLowering.phases`)."""

    key: Hashable
    nodes: tuple[int, ...]
    """The group's nodes, ascending."""
    locals: tuple[tuple[int, ...], ...]
    """Per node, the group's GPUs on it (local indices), ascending."""


def _string_order(values: Sequence[int]) -> tuple[int, ...]:
    """Positions of ascending `values` sorted as the strings link ids spell them (``n<v>.``,
    ``g<v>.``); () when that is their order (all of as many digits)."""
    if len(values) < 2 or len(str(values[0])) == len(str(values[-1])):
        return ()
    return tuple(sorted(range(len(values)), key=lambda i: f"{values[i]}."))


class CommLowering:
    """Plans collectives on a cluster and appends them as tasks to a `TaskTableBuilder`.

    Args:
        cluster: the Cluster (paths, links).
        algorithm: all-reduce algorithm ("auto", "ring", "tree", "hierarchical").
        builder: where tasks go (name, kind, stream and link codes are the builder's).
    """

    translate = True
    """With shared caches (a `LoweringCache`), plan a collective once per group `Shape` and
    rename it onto the other groups of that shape (the same phases, bit for bit). A lowering
    without one plans every group, as before issue 15 (the Oracle benchmark's "old" side);
    tests switch it off to compare."""

    def __init__(self, cluster: Cluster, algorithm: str, builder: TaskTableBuilder) -> None:
        self.topology = MemoTopology(cluster)
        self.algorithm = algorithm
        self.builder = builder
        self.links: dict[str, float] = {}
        """Bandwidth of every (possibly virtual ``l/n``) link a task crosses."""
        self._own: dict[Hashable, Any] = {}
        self._phase_cache: dict[Hashable, Any] = self._own
        """(kind, group, size) -> phases, and ("shape", kind, signature, size) -> (the group
        planned, its `Shape`, its phases); a `LoweringCache` shares it between lowerings
        (lower.py assigns it), and with it the `MemoTopology` (key "topology")."""
        self._load_cache: dict[Hashable, Any] = {}
        """(needs, copies) -> link loads, and ("used", needs, signature) -> the links one copy
        uses; shared like `_phase_cache`."""
        self._template_cache: dict[tuple[tuple[Need, ...], Hashable], Template] = {}
        self._named_cache: dict[Hashable, NamedTemplate] = {}
        """(needs, copies) -> `NamedTemplate`: a `LoweringCache` shares it between lowerings
        (lower.py assigns it), so each lowering only turns link ids into its builder's codes."""

    def _renaming(self) -> bool:
        """Whether to plan per shape (module docstring of `translate`); adopts the shared
        `MemoTopology` when caches are shared."""
        if self._phase_cache is self._own or not self.translate:
            return False
        topology = self._phase_cache.get("topology")
        if topology is None:
            topology = self._phase_cache["topology"] = self.topology
        self.topology = topology
        topology.renaming = topology.translatable
        return topology.renaming

    def phases(self, kind: str, group: tuple[int, ...], size: float) -> tuple[CommPhase, ...]:
        """The planned phases of one collective on physical ranks `group` (cached).

        A collective is planned once per group *shape* (`MemoTopology.shape`); another group
        of that shape gets the planned phases renamed to its ranks and links, which is what
        planning it would give, bit for bit (tests/workloads/test_comm_symmetry.py)."""
        key = (kind, group, size)
        found = self._phase_cache.get(key)
        if found is None:
            found = self._phase_cache[key] = self._planned(kind, group, size)
        return found

    def _planned(self, kind: str, group: tuple[int, ...], size: float
                 ) -> tuple[CommPhase, ...]:
        if not self._renaming():
            algorithm = self.algorithm if kind == "all_reduce" else "auto"
            return tuple(plan_measured(kind, group, size, self.topology, algorithm))
        shape = self.topology.shape(group)
        shape_key = ("shape", kind, shape.key, size)
        entry = self._phase_cache.get(shape_key)
        if entry is None:
            # planned on the group first planned of this shape (at any size), whose rings and
            # link counts collectives.py then has (they do not depend on the size), and
            # renamed onto this group: what planning this group gives, bit for bit (as below)
            first = self._phase_cache.setdefault(("shape group", kind, shape.key),
                                                 (group, shape))
            rep_group, rep_shape = first
            algorithm = self.algorithm if kind == "all_reduce" else "auto"
            phases = tuple(plan_measured(kind, rep_group, size, self.topology, algorithm))
            entry = self._phase_cache[shape_key] = (rep_group, rep_shape, phases)
        rep_group, rep_shape, phases = entry
        return _translated(rep_group, rep_shape, phases, group, shape)

    def link_load(self, needs: Sequence[Need], copies: Sequence[tuple[int, ...]]
                  ) -> dict[str, int]:
        """How many of the concurrent `copies` cross each link (a copy counts once per link).

        The links a copy uses are worked out once per group `Shape` (as node position, GPU
        position and the rest of the id) and renamed onto each copy's nodes and GPUs."""
        chain = tuple(needs)
        key = (chain, tuple(copies))
        found = self._load_cache.get(key)
        if found is None and not self._renaming():
            count: Counter[str] = Counter()
            for group in copies:
                count.update({lid for kind, size in chain
                              for phase in self.phases(kind, group, size)
                              for lid in phase.links})
            found = self._load_cache[key] = dict(count)
        elif found is None:
            load: dict[str, int] = {}
            shape_of = self.topology.shape
            for group in copies:
                shape = shape_of(group)
                nodes, locals_ = shape.nodes, shape.locals
                for pos, j, rest in self._used(chain, group, shape):
                    lid = link_id_of(nodes[pos], None if j is None else locals_[pos][j], rest)
                    load[lid] = load.get(lid, 0) + 1
            found = self._load_cache[key] = load
        return found

    def _near_load(self, needs: tuple[Need, ...], copies: tuple[tuple[int, ...], ...]
                   ) -> dict[str, int]:
        """`link_load` where `_template` reads it: on the links of `copies[0]`. Every link
        belongs to one node, so with renaming on only the copies that share a node with the
        first are counted (the rest cannot cross its links)."""
        if not self._renaming():
            return self.link_load(needs, copies)
        rank_node = self.topology._placement[0]
        mine = {rank_node[r] for r in copies[0]}
        near = [g for g in copies if not mine.isdisjoint([rank_node[r] for r in g])]
        return self.link_load(needs, near)

    def _used(self, needs: tuple[Need, ...], group: tuple[int, ...], shape: Shape
              ) -> tuple[tuple[int, int | None, str], ...]:
        """Links one copy of `needs` over `group` uses, as (node position, GPU position or
        None, rest of the id): `link_load`'s per-shape part."""
        key = ("used", needs, shape.key)
        found = self._load_cache.get(key)
        if found is None:
            pos = {n: i for i, n in enumerate(shape.nodes)}
            used: set[tuple[int, int | None, str]] = set()
            for kind, size in needs:
                for phase in self.phases(kind, group, size):
                    for lid in phase.links:
                        node, local, rest = link_parts(lid)
                        p = pos[node]
                        used.add((p, None if local is None else shape.locals[p].index(local),
                                  rest))
            found = self._load_cache[key] = tuple(used)
        return found

    def tasks(self, needs: Sequence[Need], *, name: int, arg: int, kind: int, stream: int,
              prog_ranks: tuple[int, ...], copies: Sequence[tuple[int, ...]],
              deps: Sequence[int], meta: Meta, alloc_bytes: float = 0.0,
              key: Hashable = None) -> list[int]:
        """Tasks running `needs` one after another over `copies[0]`; returns their ids in order.

        `copies` lists every physical group running the same collectives at the same time
        (several when folded, else just the one). `name`, `kind` and `stream` are builder
        codes, `arg` the name's argument; every task allocates `alloc_bytes` at its start.
        `key`, when given, stands for `copies` in the plan cache (the caller promises one key
        always comes with the same copies), which spares hashing long lists of groups. Returns
        [] when nothing moves (a group of one rank, or no needs).
        """
        return self.emit(self.template(needs, copies, key), name=name, arg=arg, kind=kind,
                         stream=stream, prog_ranks=prog_ranks, deps=deps, meta=meta,
                         alloc_bytes=alloc_bytes)

    def template(self, needs: Sequence[Need], copies: Sequence[tuple[int, ...]],
                 key: Hashable = None) -> Template:
        """(latency, bytes per link, link codes) of each task `tasks` would create for `needs`
        over `copies` (cached; `key` as for `tasks`)."""
        chain = tuple(needs)
        cache_key = (chain, key) if key is not None else (chain, tuple(copies))
        template = self._template_cache.get(cache_key)
        if template is None:
            full = (chain, self._representative_first(chain, tuple(copies)))
            named = self._named_cache.get(full)
            if named is None:
                named = self._named_cache[full] = self._named_template(*full)
            template = self._template_cache[cache_key] = self._coded(named)
        return template

    def _representative_first(self, chain: tuple[Need, ...],
                              copies: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        """`copies` with the copy a folded task stands for first: the slowest, where some of
        their nodes are not wired alike (the DGX-1 hybrid cube-mesh's NVLink pairs of one or
        two links, bridged A40 pairs), since the replicas meet at the gradient reduction and
        the slowest sets the pace; as given elsewhere (every copy alike, nothing to choose).
        Taking the first copy there made folded V100-SXM2 plans up to 0.8 % faster and 1.7 %
        slower than unfolded (bench/folding.py)."""
        if len(copies) < 2:
            return copies
        key = ("slowest", chain, copies)
        found = self._load_cache.get(key)
        if found is None:
            rank_node, _, _, symmetric = self.topology.placement_arrays()
            alike = bool(symmetric.all()) or bool(
                symmetric[rank_node[np.fromiter((r for g in copies for r in g), np.int64)]].all())
            found = self._load_cache[key] = copies if alike \
                else tuple(self.slowest_first(chain, copies))
        return found

    def copies_alike(self, copies: Sequence[tuple[int, ...]]) -> bool:
        """Whether groups running the same collective at once (the pairs of a stage boundary,
        the tied embedding's groups) are wired alike, so each takes as long as any other and
        the first may stand for all (`copy_times` times the first alone): member
        by member on nodes of the same node groups, sharing nodes in the same pattern, at the
        same GPUs where a node is not wired alike, each node carrying as many of the groups as
        every other's. A cheap test on the placement alone (False: time them); remembered."""
        key = ("alike", tuple(copies))
        found = self._load_cache.get(key)
        if found is not None:
            return bool(found)
        found = _groups_alike(copies, *self.topology.placement_arrays())
        self._load_cache[key] = found
        return found

    def slowest_first(self, needs: Sequence[Need], copies: Sequence[tuple[int, ...]]
                      ) -> list[tuple[int, ...]]:
        """`copies` with the one that takes longest first (the first of equal ones; the rest
        in order), each timed by `copy_times`.

        A folded task runs on the links of `copies[0]` (`_named_template`), exact when every
        copy is wired alike. Copies that are not -- the point-to-point pairs of a stage
        boundary between stages of different sizes (`stage_gpus`), some crossing NVLink and
        some a PCIe path to the NIC -- all run at once, and the receiving stage waits for the
        last of them, so the folded task is the slowest."""
        if len(copies) < 2:
            return list(copies)
        times = self.copy_times(needs, copies)
        worst = max(range(len(copies)), key=times.__getitem__)
        return [copies[worst], *copies[:worst], *copies[worst + 1:]]

    def _chain_phases(self, needs: Sequence[Need], group: tuple[int, ...]) -> list[CommPhase]:
        """The phases of `needs` run one after another over `group` (sizes 0 skipped)."""
        return [ph for k, size in needs if size > 0 for ph in self.phases(k, group, size)]

    def copy_times(self, needs: Sequence[Need], copies: Sequence[tuple[int, ...]]
                   ) -> list[float]:
        """How long `needs` take over each of the concurrent `copies`, on its own links shared
        with the other copies (`link_load`, as a folded task with that copy first would)."""
        chain = tuple(needs)
        load = self.link_load(chain, copies) if len(copies) > 1 else {}
        link = self.topology.link

        def alone(group: tuple[int, ...]) -> float:
            if len(group) < 2:
                return 0.0
            phases = self._chain_phases(chain, group)
            total = 0.0
            for merged in merge_phases(phases):
                total += merged.latency_s
                if merged.bytes_per_link > 0 and merged.links:
                    total += merged.bytes_per_link / min(
                        link(lid).bandwidth_bytes_per_s / load.get(lid, 1)
                        for lid in merged.links)
            return total

        if len(copies) > 1 and self.copies_alike(copies):  # each takes as long as the first
            return [alone(copies[0])] * len(copies)
        return [alone(group) for group in copies]

    def emit_planned(self, planned: PlannedComm, deps: Sequence[int], arg: int, meta: Meta
                     ) -> list[int]:
        """Append a `PlannedComm` chain after `deps` with name argument `arg`; ids in order."""
        ids: list[int] = []
        prev: Sequence[int] = deps
        add = self.builder.add
        mb, stage, first, last = meta
        name, kind, stream, ranks = planned.name, planned.kind, planned.stream, planned.prog_ranks
        for latency_s, nbytes, links in planned.template:
            tid = add(name, arg, kind, stream, ranks, latency_s, nbytes, links, prev, 0.0, 0.0,
                      0.0, math.nan, mb, stage, first, last)
            prev = (tid,)
            ids.append(tid)
        return ids

    def emit(self, template: Template, *, name: int, arg: int,
             kind: int, stream: int, prog_ranks: tuple[int, ...], deps: Sequence[int],
             meta: Meta, alloc_bytes: float = 0.0) -> list[int]:
        """Append the chain of tasks of a `template` (each after the previous, the first after
        `deps`); returns their ids."""
        ids: list[int] = []
        prev: Sequence[int] = deps
        add = self.builder.add
        mb, stage, first, last = meta
        for latency_s, nbytes, links in template:
            tid = add(name, arg, kind, stream, prog_ranks, latency_s, nbytes, links, prev,
                      alloc_bytes, 0.0, 0.0, math.nan, mb, stage, first, last)
            prev = (tid,)
            ids.append(tid)
        return ids

    def _named_template(self, needs: tuple[Need, ...], copies: tuple[tuple[int, ...], ...]
                        ) -> NamedTemplate:
        """(latency, bytes per link, (link id, bandwidth) of each link) of each task `tasks`
        creates: lowering asks for the same collective on the same groups once per
        micro-batch, and a planner's lowerings for it again, so it is cached (`template`).
        A link crossed by n of the concurrent `copies` is the shared id ``<id>/<n>`` with 1/n
        of its bandwidth, its users counted in copies on the physical link (program.py)."""
        out = []
        group = copies[0]
        phases = self._chain_phases(needs, group) if len(group) >= 2 else []
        load = self._near_load(needs, copies) if len(copies) > 1 and phases else {}
        for merged in merge_phases(phases):
            links = []
            for link in merged.links if merged.bytes_per_link > 0 else ():
                n = load.get(link, 1)
                bandwidth = self.topology.link(link).bandwidth_bytes_per_s
                links.append((shared_link_id(link, n), bandwidth / n))
            out.append((merged.latency_s, merged.bytes_per_link if links else 0.0,
                        tuple(links)))
        return tuple(out)

    def _coded(self, named: NamedTemplate) -> Template:
        """`named` in this lowering's builder codes, each link entered in its link table."""
        links, code = self.links, self.builder.link
        out: Template = []
        for latency_s, nbytes, named_links in named:
            codes = []
            for lid, bandwidth in named_links:
                links.setdefault(lid, bandwidth)
                codes.append(code(lid))
            out.append((latency_s, nbytes, tuple(codes)))
        return out


def cross_unit(comm: CommLowering, layout: LoweringLayout, s: int,
               groups: list[tuple[int, ...]], needs: list[Need], *, name: int, arg: int,
               kind: int, stream: int, last: dict[int, list[int]], meta: Meta,
               alloc_bytes: float = 0.0, key: Hashable = None) -> dict[int, list[int]]:
    """Collectives over groups that may span several units of physical stage `s` (expert-
    parallel all-to-alls, ZeRO-3 parameter gathers): each group waits for `last` of every unit
    it touches, and every unit then waits for the groups holding its ranks. Returns the new
    `last` (per unit, what its next step waits for)."""
    if not needs or not layout.opt.communication or len(groups[0]) < 2:
        return last
    if layout.fold and len(last) == 1:
        ids = comm.tasks(needs, name=name, arg=arg, kind=kind, stream=stream, prog_ranks=(s,),
                         copies=groups, deps=last[0], meta=meta, alloc_bytes=alloc_bytes,
                         key=key)
        return {0: ids[-1:] or last[0]}
    if layout.fold:  # several replica classes: one task per set of classes the groups join
        return _folded_cross_class(comm, layout, s, groups, needs, name=name, arg=arg,
                                   kind=kind, stream=stream, last=last, meta=meta,
                                   alloc_bytes=alloc_bytes, key=key)
    unit_of = layout.unit_of(s)
    out: dict[int, list[int]] = {u: [] for u in last}
    for group in groups:
        touched = sorted({unit_of[r] for r in group})
        deps = sorted({d for u in touched for d in last[u]})
        ids = comm.tasks(needs, name=name, arg=arg, kind=kind, stream=stream, prog_ranks=group,
                         copies=[group], deps=deps, meta=meta, alloc_bytes=alloc_bytes)
        for u in touched:
            out[u] += ids[-1:] or last[u]
    return {u: sorted(set(v)) for u, v in out.items()}


def _folded_cross_class(comm: CommLowering, layout: LoweringLayout, s: int,
                        groups: list[tuple[int, ...]], needs: list[Need], *, name: int,
                        arg: int, kind: int, stream: int, last: dict[int, list[int]],
                        meta: Meta, alloc_bytes: float, key: Hashable) -> dict[int, list[int]]:
    """`cross_unit` on a folded stage of several replica classes (units): classes joined by a
    group (directly or through others) run one task over their program ranks standing for
    their groups, after every one of them; a class no group joins to another runs its own."""
    units = layout.units(s)
    class_of = {r: u for u in range(len(units))
                for r in layout.represents[units[u][0][0]]}
    parent = list(range(len(units)))

    def root(u: int) -> int:
        while parent[u] != u:
            u = parent[u]
        return u

    for group in groups:
        first = root(class_of[group[0]])
        for r in group[1:]:
            parent[root(class_of[r])] = first
    out: dict[int, list[int]] = {}
    for top in sorted({root(u) for u in last}):
        members = [u for u in sorted(last) if root(u) == top]
        mine = [g for g in groups if root(class_of[g[0]]) == top]
        deps = sorted({d for u in members for d in last[u]})
        ids = comm.tasks(needs, name=name, arg=arg, kind=kind, stream=stream,
                         prog_ranks=tuple(units[u][0][0] for u in members), copies=mine,
                         deps=deps, meta=meta, alloc_bytes=alloc_bytes,
                         key=None if key is None else (key, top))
        for u in members:
            out[u] = ids[-1:] or last[u]
    return out


def _translated(rep_group: tuple[int, ...], rep: Shape, phases: tuple[CommPhase, ...],
                group: tuple[int, ...], shape: Shape) -> tuple[CommPhase, ...]:
    """`phases` planned on `rep_group` renamed onto `group` of the same shape: ranks position
    by position, each link to the same link of the corresponding node and GPU (ids re-sorted)."""
    if rep_group == group:
        return phases
    rank = dict(zip(rep_group, group, strict=True))
    node = dict(zip(rep.nodes, range(len(rep.nodes)), strict=True))
    out = []
    for ph in phases:
        links = []
        for lid in ph.links:
            n, local, rest = link_parts(lid)
            p = node[n]
            if local is not None:
                local = shape.locals[p][rep.locals[p].index(local)]
            links.append(link_id_of(shape.nodes[p], local, rest))
        out.append(CommPhase(name=ph.name, ranks=tuple(rank[r] for r in ph.ranks),
                             latency_s=ph.latency_s, bytes_per_link=ph.bytes_per_link,
                             links=tuple(sorted(links))))
    return tuple(out)


def merge_phases(phases: Sequence[CommPhase]) -> list[CommPhase]:
    """Merge consecutive phases over the same links into one (same time alone, fewer tasks):
    latencies and bytes add."""
    out: list[CommPhase] = []
    for ph in phases:
        if out and out[-1].links == ph.links:
            prev = out[-1]
            out[-1] = CommPhase(name=prev.name, ranks=prev.ranks,
                                latency_s=prev.latency_s + ph.latency_s,
                                bytes_per_link=prev.bytes_per_link + ph.bytes_per_link,
                                links=prev.links)
        else:
            out.append(ph)
    return out


def kind_of(needs: Sequence[Need]) -> str:
    """Task kind for a run of collectives: the collective's name if they are all one kind."""
    kinds = {k for k, _ in needs}
    return kinds.pop() if len(kinds) == 1 else "tp_comm"


_PHASE_KIND = {
    "ring_all_reduce": "all_reduce", "tree_all_reduce": "all_reduce",
    "inter_node_all_reduce": "all_reduce", "intra_node_reduce_scatter": "reduce_scatter",
    "intra_node_all_gather": "all_gather", "ring_all_gather": "all_gather",
    "ring_reduce_scatter": "reduce_scatter", "pairwise_all_to_all": "all_to_all", "p2p": "p2p",
}
"""Collective kind of each phase `plan_collective` names (its efficiency in collectives.json)."""

_ALL_REDUCE_ALGORITHMS = ("ring", "hierarchical", "tree")
"""Tried in this order under "auto" (the first of equal times wins, as in plan_collective)."""


def _phase_steps(name: str, n: int, nodes: int) -> tuple[int, int]:
    """(algorithm steps of a phase, how many of them cross nodes): what its per-step latency
    is charged for (NCCL tuning.cc: nsteps and nInterSteps)."""
    k = n // max(nodes, 1)
    if name == "ring_all_reduce":
        return 2 * (n - 1), 2 * (nodes - 1)
    if name == "tree_all_reduce":  # NCCL: a chain inside each node, binary trees across
        inter = 2 * math.ceil(math.log2(nodes)) if nodes > 1 else 0
        return 2 * (k - 1) + inter, inter
    if name == "inter_node_all_reduce":
        return 2 * (nodes - 1), 2 * (nodes - 1)
    if name in ("intra_node_reduce_scatter", "intra_node_all_gather"):
        return k - 1, 0
    if name == "p2p":
        return 1, int(nodes > 1)
    if name == "pairwise_all_to_all":
        return n - 1, round((n - 1) * (nodes - 1) / nodes) if nodes > 1 else 0
    return n - 1, nodes - 1  # ring all-gather / reduce-scatter


def _slowest(links: Sequence[Link]) -> Link:
    return min(links, key=lambda link: (link.bandwidth_bytes_per_s, link.link_id))


def _class_of(link: Link, topology: MemoTopology, rank: int, models: CollectiveModels) -> str:
    nic = topology.nic_of_link(link.link_id, rank) if link.kind == "nic" else None
    return link_class(link.kind, link.bandwidth_bytes_per_s, nic, models)


def _intra_class(ranks: Sequence[int], topology: MemoTopology, models: CollectiveModels
                 ) -> str | None:
    """Class of the slowest link between two ranks of one node of `ranks` (None: one per node)."""
    seen: dict[int, int] = {}
    for r in ranks:
        node = topology.node_of(r)
        if node in seen:
            link = _slowest(topology.path(seen[node], r))
            return _class_of(link, topology, r, models)
        seen[node] = r
    return None


_ABSENT = object()

PhaseFacts = tuple[str, str, float, int, int, "str | None", int]
"""(collective kind, link class, slowest link's bandwidth, steps, inter-node steps, intra-node
class, nodes) of a planned phase: what `measured_phases` prices it by."""


def _phase_facts(ph: CommPhase, topology: MemoTopology, models: CollectiveModels
                 ) -> PhaseFacts | None:
    """What pricing reads of a phase's name, ranks and links (not its size); None where it is
    left as planned (a phase the model does not know, gloo over loopback)."""
    kind = _PHASE_KIND.get(ph.name)
    if kind is None or len(ph.ranks) < 2:
        return None
    links = ([topology.link(lid) for lid in ph.links] if ph.links
             else list(topology.path(ph.ranks[0], ph.ranks[1])))
    slowest = _slowest(links)
    nodes = len({topology.node_of(r) for r in ph.ranks})
    # across nodes NCCL runs over the network (tuning.cc: hw = NET when nNodes > 1), even
    # where a GPU's PCIe path to the NIC is the slowest link
    nics = [link for link in links if link.kind == "nic"] if nodes > 1 else []
    cls = _class_of(_slowest(nics) if nics else slowest, topology, ph.ranks[0], models)
    if models.classes[cls].step_s is None:  # gloo over loopback: fitted as planned
        return None
    steps, inter = _phase_steps(ph.name, len(ph.ranks), nodes)
    intra = _intra_class(ph.ranks, topology, models) if nodes > 1 else cls
    if intra is not None and models.classes[intra].step_s is None:
        intra = cls
    return kind, cls, slowest.bandwidth_bytes_per_s, steps, inter, intra, nodes


def measured_phases(phases: Sequence[CommPhase], topology: MemoTopology,
                    models: CollectiveModels | None = None) -> list[CommPhase]:
    """Price planned `phases` (one collective) with the link-class models (module docstring)."""
    default = models is None
    models = models or collective_models()
    out: list[CommPhase] = []
    for i, ph in enumerate(phases):
        if default:  # what pricing reads of the phase's links and ranks, remembered
            key = (ph.name, ph.ranks, ph.links)
            facts = topology._facts.get(key, _ABSENT)
            if facts is _ABSENT:
                facts = topology._facts[key] = _phase_facts(ph, topology, models)
        else:
            facts = _phase_facts(ph, topology, models)
        if facts is None:  # a phase this model does not know, or gloo: as planned
            out.append(ph)
            continue
        kind, cls, slowest_bw, steps, inter, intra, nodes = facts
        price = models.price(kind, cls, steps=steps, volume_bytes=ph.bytes_per_link,
                             bandwidth_bytes_per_s=slowest_bw,
                             first=i == 0, inter_steps=inter, intra_class_name=intra,
                             multi_node=nodes > 1, tree=ph.name == "tree_all_reduce")
        overhead, volume = 0.0, ph.bytes_per_link
        if volume > 0 and price.efficiency < 1.0:
            overhead = volume / slowest_bw * (1.0 / price.efficiency - 1.0)
        elif volume > 0:  # NVLink SHARP: the switch reduces, fewer bytes cross the links
            volume /= price.efficiency
        out.append(CommPhase(name=ph.name, ranks=ph.ranks,
                             latency_s=price.latency_s + overhead,
                             bytes_per_link=volume, links=ph.links))
    return out


def alone_time_s(phases: Sequence[CommPhase], topology: MemoTopology) -> float:
    """Time of `phases` with no other traffic: Σ latency + bytes / slowest named link."""
    total = 0.0
    for ph in phases:
        total += ph.latency_s
        if ph.bytes_per_link > 0:
            slowest = topology._min_bw.get(ph.links)
            if slowest is None:
                slowest = topology._min_bw[ph.links] = min(
                    topology.link(lid).bandwidth_bytes_per_s for lid in ph.links)
            total += ph.bytes_per_link / slowest
    return total


def _hierarchical_applies(group: tuple[int, ...], topology: MemoTopology) -> bool:
    counts = Counter(topology.node_of(r) for r in group)
    sizes = set(counts.values())
    return len(counts) >= 2 and len(sizes) == 1 and min(sizes) >= 2


def plan_measured(kind: str, group: tuple[int, ...], size: float, topology: MemoTopology,
                  algorithm: str = "auto") -> list[CommPhase]:
    """`plan_collective` priced as measured (`measured_phases`); under "auto" an all-reduce
    takes the algorithm fastest alone with those prices."""
    if kind != "all_reduce" or algorithm != "auto" or len(group) < 2:
        return measured_phases(plan_collective(kind, group, size, topology, algorithm), topology)
    best: tuple[float, list[CommPhase]] | None = None
    for name in _ALL_REDUCE_ALGORITHMS:
        if name == "hierarchical" and not _hierarchical_applies(tuple(group), topology):
            continue
        phases = measured_phases(plan_collective(kind, group, size, topology, name), topology)
        t = alone_time_s(phases, topology)
        if best is None or t < best[0]:
            best = (t, phases)
    assert best is not None  # ring always applies
    return best[1]


__all__ = ["NO_META", "CommLowering", "MemoTopology", "Meta", "Need", "PlannedComm", "Shape",
           "Template", "alone_time_s", "cross_unit", "kind_of", "measured_phases", "merge_phases",
           "plan_measured"]
