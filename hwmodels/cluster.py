"""Clusters: one or more node groups (heterogeneous clusters have several), their ranks and links.

Ranks are numbered node group by node group, node by node, GPU by GPU: in
``1x8xA100-SXM4-40GB+7x4xA10`` ranks 0-7 are the A100 node (global node 0) and ranks 8-35 the
seven A10 nodes (global nodes 1-7).

Short specification (`parse_cluster`), parts joined with ``+``::

    [NODES x] GPUS_PER_NODE x GPU_TYPE [@NODE_TYPE]

``4xV100-SXM2-32GB`` is one node of 4 GPUs; ``2x8xA100-SXM4-80GB@p4de.24xlarge`` two p4de
nodes. Without ``@`` a group uses its GPU type's default node type (A100-SXM4 -> dgx-a100,
V100-SXM2 -> dgx1-v100, A10 -> g5.24xlarge, A40 -> a40-pcie-bridged, H100 -> hgx-h100, PCIe
types -> a generic PCIe server). The same cluster as YAML (also accepted by `parse_cluster`)::

    node_groups:
      - {gpu: A100-SXM4-40GB, nodes: 1, gpus_per_node: 8, node_type: p4d.24xlarge,
         nic: efa, nics_per_node: 4, price_per_gpu_hour_usd: 4.0966}
    inter_node: {nic: ib-hdr}          # optional default NIC for groups that name none

Only ``gpu``, ``nodes`` and ``gpus_per_node`` are required.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import (
    DataFileError,
    SpecError,
    TrainsimError,
    UnknownNameError,
    read_user_text,
)
from trainsim.hwmodels.gpus import GpuSpec, get_gpu
from trainsim.hwmodels.nodes import NicSpec, NodeType, default_price, get_nic, get_node_type
from trainsim.hwmodels.topology import Link, NodeLinks

__all__ = [
    "Cluster",
    "Link",
    "NodeGroup",
    "load_cluster_yaml",
    "parse_cluster",
    "parse_cluster_spec",
]

_PART = re.compile(
    r"^(?:(?P<nodes>\d+)x)?(?P<gpus>\d+)x(?P<gpu>[A-Za-z][A-Za-z.\-]*[0-9][A-Za-z0-9.\-]*)(?:@(?P<node>[A-Za-z0-9._\-]+))?$"
)
_SPEC_FORM = "[NODES x] GPUS_PER_NODE x GPU_TYPE [@NODE_TYPE], parts joined by '+'"


MAX_GPUS = 131_072
"""Largest cluster accepted (16× the 10,240-GPU benchmark); beyond it the per-GPU link tables
alone would take minutes and gigabytes to build."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeGroup:
    """`nodes` identical nodes of one node type, each with `gpus_per_node` GPUs of one type."""

    gpu: GpuSpec
    """GPU type of every GPU in the group."""
    nodes: int
    """Number of nodes."""
    gpus_per_node: int
    """GPUs used per node (the first slots of the node type)."""
    node_type: NodeType
    """Server model: wiring and NICs."""
    nic: NicSpec
    """Network adapter model."""
    nics_per_node: int
    """Adapters per node; their bandwidths add up."""
    price_per_gpu_hour_usd: float
    """Price of one GPU of this group for one hour."""
    price_source: str = field(default="", compare=False)
    """Where the price comes from."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise SpecError(f"node group {self.gpu.name}: nodes={self.nodes} must be >= 1")
        if not 1 <= self.gpus_per_node <= self.node_type.max_gpus:
            raise SpecError(
                f"node group {self.gpu.name}: gpus_per_node={self.gpus_per_node} must be in "
                f"1..{self.node_type.max_gpus} (node type {self.node_type.name} has "
                f"{self.node_type.max_gpus} GPU slots; pick another with @NODE_TYPE)"
            )
        if self.nics_per_node < 1:
            raise SpecError(
                f"node group {self.gpu.name}: nics_per_node={self.nics_per_node} must be >= 1"
            )
        if not math.isfinite(self.price_per_gpu_hour_usd) or self.price_per_gpu_hour_usd < 0:
            raise SpecError(
                f"node group {self.gpu.name}: price_per_gpu_hour_usd={self.price_per_gpu_hour_usd} must be a finite number >= 0"
            )

    @property
    def num_gpus(self) -> int:
        """GPUs in the group."""
        return self.nodes * self.gpus_per_node

    def to_dict(self) -> dict[str, Any]:
        """The YAML form of this group (every field explicit)."""
        return {
            "gpu": self.gpu.name,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "node_type": self.node_type.name,
            "nic": self.nic.name,
            "nics_per_node": self.nics_per_node,
            "price_per_gpu_hour_usd": self.price_per_gpu_hour_usd,
        }


def make_node_group(
    gpu: str,
    nodes: int,
    gpus_per_node: int,
    *,
    node_type: str | None = None,
    nic: str | None = None,
    nics_per_node: int | None = None,
    price_per_gpu_hour_usd: float | None = None,
) -> NodeGroup:
    """Build a NodeGroup from names, filling defaults from the GPU's and node type's data."""
    spec = get_gpu(gpu)
    ntype = get_node_type(node_type if node_type is not None else spec.default_node_type)
    nic_spec = get_nic(nic if nic is not None else ntype.nic)
    if nics_per_node is None:
        nics_per_node = ntype.nics_per_node if nic is None or nic_spec.name == ntype.nic else 1
    if price_per_gpu_hour_usd is None:
        price = default_price(spec, ntype)
        price_usd, source = price.usd_per_gpu_hour, price.source
    else:
        price_usd, source = float(price_per_gpu_hour_usd), "given"
    return NodeGroup(
        gpu=spec, nodes=nodes, gpus_per_node=gpus_per_node, node_type=ntype, nic=nic_spec,
        nics_per_node=nics_per_node, price_per_gpu_hour_usd=price_usd, price_source=source,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """Node groups plus the rank numbering, links and paths derived from them."""

    node_groups: tuple[NodeGroup, ...]
    """The groups, in rank order."""
    _rank_node: list[int] = field(init=False, repr=False, compare=False)
    _rank_local: list[int] = field(init=False, repr=False, compare=False)
    _node_group: list[int] = field(init=False, repr=False, compare=False)
    _node_first_rank: list[int] = field(init=False, repr=False, compare=False)
    _node_links: list[NodeLinks] = field(init=False, repr=False, compare=False)
    _links: dict[str, Link] = field(init=False, repr=False, compare=False)
    _paths: dict[tuple[int, int], tuple[Link, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.node_groups:
            raise SpecError("cluster: node_groups is empty; give at least one node group")
        rank_node: list[int] = []
        rank_local: list[int] = []
        node_group: list[int] = []
        first: list[int] = []
        node_links: list[NodeLinks] = []
        for gi, group in enumerate(self.node_groups):
            for _ in range(group.nodes):
                node = len(node_group)
                node_group.append(gi)
                first.append(len(rank_node))
                node_links.append(
                    NodeLinks(node=node, node_type=group.node_type, gpu=group.gpu,
                              gpus_per_node=group.gpus_per_node, nic=group.nic,
                              nics_per_node=group.nics_per_node)
                )  # fmt: skip
                for local in range(group.gpus_per_node):
                    rank_node.append(node)
                    rank_local.append(local)
        links = {link.link_id: link for nl in node_links for link in nl.all_links()}
        for name, value in (
            ("_rank_node", rank_node), ("_rank_local", rank_local), ("_node_group", node_group),
            ("_node_first_rank", first), ("_node_links", node_links), ("_links", links),
            ("_paths", {}),
        ):  # fmt: skip
            object.__setattr__(self, name, value)

    # --- ranks -------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        """Total GPUs (ranks)."""
        return len(self._rank_node)

    @property
    def num_nodes(self) -> int:
        """Total nodes."""
        return len(self._node_group)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.num_gpus:
            raise IndexError(f"rank {rank} out of range 0..{self.num_gpus - 1}")

    def gpu(self, rank: int) -> GpuSpec:
        """GPU type of `rank`."""
        return self.node_groups[self.group_of(rank)].gpu

    def node_of(self, rank: int) -> int:
        """Global node index of `rank`."""
        self._check_rank(rank)
        return self._rank_node[rank]

    def local_rank(self, rank: int) -> int:
        """Index of `rank` within its node."""
        self._check_rank(rank)
        return self._rank_local[rank]

    def group_of(self, rank: int) -> int:
        """Index of the node group holding `rank`."""
        return self._node_group[self.node_of(rank)]

    def ranks_of_node(self, node: int) -> list[int]:
        """Ranks on global node `node`, ascending."""
        if not 0 <= node < self.num_nodes:
            raise IndexError(f"node {node} out of range 0..{self.num_nodes - 1}")
        start = self._node_first_rank[node]
        return list(range(start, start + self.node_groups[self._node_group[node]].gpus_per_node))

    def placement(self) -> tuple[list[int], list[int], list[int]]:
        """(node of each rank, local index of each rank, node group of each node): the tables
        behind `node_of`, `local_rank` and `group_of`, for loops over many ranks (read only)."""
        return self._rank_node, self._rank_local, self._node_group

    def node_symmetric(self, node: int) -> bool:
        """Whether every GPU of global node `node` is wired alike (`NodeLinks.symmetric`)."""
        return self._node_links[node].symmetric

    def idle_power_w(self, rank: int) -> float:
        """Idle (blocking) power of the GPU at `rank`."""
        return self.gpu(rank).idle_power_w

    # --- links -------------------------------------------------------------------------
    def path(self, src_rank: int, dst_rank: int) -> tuple[Link, ...]:
        """Every link a transfer from `src_rank` to `dst_rank` crosses (empty if equal).

        The transfer's bandwidth is the minimum over the path (see topology.py for routes).
        """
        key = (src_rank, dst_rank)
        cached = self._paths.get(key)
        if cached is not None:
            return cached
        src_node, dst_node = self.node_of(src_rank), self.node_of(dst_rank)
        a, b = self._rank_local[src_rank], self._rank_local[dst_rank]
        if src_node == dst_node:
            result = self._node_links[src_node].intra_path(a, b)
        else:
            s, d = self._node_links[src_node], self._node_links[dst_node]
            result = (s.pcie_out[a], s.nic_out, d.nic_in, d.pcie_in[b])
        self._paths[key] = result
        return result

    def bottleneck_bytes_per_s(self, src_rank: int, dst_rank: int) -> float:
        """Minimum link bandwidth on the path (inf for src == dst)."""
        links = self.path(src_rank, dst_rank)
        return min((link.bandwidth_bytes_per_s for link in links), default=float("inf"))

    def link(self, link_id: str) -> Link:
        """Link by id."""
        try:
            return self._links[link_id]
        except KeyError:
            raise UnknownNameError(f"unknown link id {link_id!r}") from None

    def links(self) -> list[Link]:
        """Every link of the cluster, node by node, in a stable order."""
        return list(self._links.values())

    # --- cost and capacity -------------------------------------------------------------
    @property
    def price_per_hour_usd(self) -> float:
        """Price of the whole cluster for one hour."""
        return sum(g.num_gpus * g.price_per_gpu_hour_usd for g in self.node_groups)

    def peak_flops(self, dtype: str = "fp16") -> float:
        """Sum of every GPU's dense peak at its boost clock (GPUs without `dtype` count 0)."""
        return sum(
            g.num_gpus * g.gpu.peak_flops(dtype) for g in self.node_groups if dtype in g.gpu.dtypes
        )

    def describe(self) -> list[dict[str, Any]]:
        """One row per node group, for printing: GPUs, wiring, NICs, peak and price."""
        rows = []
        first_rank = 0
        for gi, g in enumerate(self.node_groups):
            nl = self._node_links[self._node_group.index(gi)]
            intra = nl.intra_path(0, 1) if g.gpus_per_node > 1 else ()
            rows.append({
                "group": gi,
                "gpu": g.gpu.name,
                "nodes": g.nodes,
                "gpus_per_node": g.gpus_per_node,
                "ranks": f"{first_rank}-{first_rank + g.num_gpus - 1}",
                "node_type": g.node_type.name,
                "intra_node": g.node_type.intra_node,
                "intra_node_bytes_per_s": min((x.bandwidth_bytes_per_s for x in intra), default=None),
                "nic": f"{g.nics_per_node}x{g.nic.name}",
                "nic_bytes_per_s": nl.nic_out.bandwidth_bytes_per_s,
                "peak_fp16_flops": (g.num_gpus * g.gpu.peak_flops("fp16")
                                    if "fp16" in g.gpu.dtypes else None),
                "price_per_gpu_hour_usd": g.price_per_gpu_hour_usd,
                "price_per_hour_usd": g.num_gpus * g.price_per_gpu_hour_usd,
                "price_source": g.price_source,
            })  # fmt: skip
            first_rank += g.num_gpus
        return rows

    def to_dict(self) -> dict[str, Any]:
        """The YAML form of this cluster; `parse_cluster` of it rebuilds an equal cluster."""
        return {"node_groups": [g.to_dict() for g in self.node_groups]}


def parse_cluster_spec(spec: str) -> Cluster:
    """Parse a short spec such as ``1x8xA100-SXM4-40GB+7x4xA10`` (see module docstring)."""
    if not spec or not spec.strip():
        raise SpecError(f"cluster spec {spec!r} is empty; expected {_SPEC_FORM}")
    groups = []
    for part in spec.replace(" ", "").split("+"):
        match = _PART.match(part)
        if match is None:
            loose = re.match(r"^(?:\d+x)?\d+x([A-Za-z][A-Za-z0-9.\-]*)(?:@[A-Za-z0-9._\-]+)?$", part)
            if loose is not None:  # the form is right but the name is no GPU's: say which
                try:
                    get_gpu(loose[1])
                except TrainsimError as exc:
                    raise SpecError(f"cluster spec {spec!r}: {exc}") from None
            raise SpecError(f"cluster spec {spec!r}: part {part!r} is not {_SPEC_FORM}")
        nodes = int(match["nodes"]) if match["nodes"] else 1
        gpus = int(match["gpus"])
        if nodes < 1 or gpus < 1:
            raise SpecError(f"cluster spec {spec!r}: part {part!r} needs nodes >= 1 and GPUs >= 1")
        if nodes * gpus > MAX_GPUS:
            raise SpecError(f"cluster spec {spec!r}: part {part!r} has {nodes * gpus} GPUs, more "
                            f"than the {MAX_GPUS} trainsim simulates")
        groups.append(make_node_group(match["gpu"], nodes, gpus, node_type=match["node"]))
    if sum(g.num_gpus for g in groups) > MAX_GPUS:
        raise SpecError(f"cluster spec {spec!r} has more than the {MAX_GPUS} GPUs trainsim "
                        f"simulates")
    return Cluster(node_groups=tuple(groups))


_GROUP_REQUIRED = ("gpu", "nodes", "gpus_per_node")
_GROUP_OPTIONAL = ("node_type", "nic", "nics_per_node", "price_per_gpu_hour_usd")


def _int_field(where: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataFileError(f"{where}: field {key}={value!r} must be a positive integer")
    return value


def cluster_from_dict(data: Any, where: str = "cluster") -> Cluster:
    """Build a cluster from its YAML/JSON form; errors name `where` and the field."""
    if not isinstance(data, Mapping):
        raise DataFileError(f"{where}: top level must be a mapping with node_groups")
    extra = sorted(set(data) - {"node_groups", "inter_node", "name"})
    if extra:
        raise DataFileError(f"{where}: unexpected field(s) {', '.join(map(str, extra))}")
    if "node_groups" not in data:
        raise DataFileError(f"{where}: missing field node_groups")
    inter = data.get("inter_node") or {}
    if not isinstance(inter, Mapping) or set(inter) - {"nic", "nics_per_node"}:
        raise DataFileError(f"{where}: inter_node may only hold nic and nics_per_node")
    raw_groups = data["node_groups"]
    if not isinstance(raw_groups, list) or not raw_groups:
        raise DataFileError(f"{where}: node_groups must be a non-empty list")
    groups = []
    for i, raw in enumerate(raw_groups):
        gw = f"{where}: node_groups[{i}]"
        if not isinstance(raw, Mapping):
            raise DataFileError(f"{gw}: must be a mapping")
        missing = [k for k in _GROUP_REQUIRED if k not in raw]
        if missing:
            raise DataFileError(f"{gw}: missing field(s) {', '.join(missing)}")
        unknown = sorted(set(raw) - set(_GROUP_REQUIRED) - set(_GROUP_OPTIONAL))
        if unknown:
            raise DataFileError(f"{gw}: unexpected field(s) {', '.join(map(str, unknown))}")
        price = raw.get("price_per_gpu_hour_usd")
        if price is not None and (isinstance(price, bool) or not isinstance(price, int | float)):
            raise DataFileError(f"{gw}: field price_per_gpu_hour_usd={price!r} is not a number")
        nics = raw.get("nics_per_node", inter.get("nics_per_node"))
        for key in ("node_type", "nic"):
            value = raw.get(key, inter.get(key) if key == "nic" else None)
            if value is not None and not isinstance(value, str):
                raise DataFileError(f"{gw}: field {key}={value!r} must be a name (a string)")
        total = _int_field(gw, "nodes", raw["nodes"]) * _int_field(gw, "gpus_per_node",
                                                                     raw["gpus_per_node"])
        if total > MAX_GPUS:
            raise DataFileError(f"{gw}: {total} GPUs exceeds the {MAX_GPUS} trainsim simulates")
        try:
            groups.append(
                make_node_group(
                    str(raw["gpu"]),
                    _int_field(gw, "nodes", raw["nodes"]),
                    _int_field(gw, "gpus_per_node", raw["gpus_per_node"]),
                    node_type=raw.get("node_type"),
                    nic=raw.get("nic", inter.get("nic")),
                    nics_per_node=None if nics is None else _int_field(gw, "nics_per_node", nics),
                    price_per_gpu_hour_usd=price,
                )
            )
        except UnknownNameError as exc:
            raise UnknownNameError(f"{gw}: {exc}") from None
        except SpecError as exc:
            raise DataFileError(f"{gw}: {exc}") from None
    return Cluster(node_groups=tuple(groups))


def load_cluster_yaml(path: str | Path) -> Cluster:
    """Load a cluster YAML file (see module docstring)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(read_user_text(path))
    except yaml.YAMLError as exc:
        raise DataFileError(f"{path}: invalid YAML: {exc}") from None
    return cluster_from_dict(data, str(path))


def parse_cluster(spec_or_path: str) -> Cluster:
    """A cluster from a short spec (``2x8xA100-SXM4-80GB``) or a YAML file path."""
    text = str(spec_or_path).strip()
    if text.lower().endswith((".yaml", ".yml")) or Path(text).is_file():
        return load_cluster_yaml(text)
    return parse_cluster_spec(text)
