"""Node types, NICs, intra-node link technologies and prices, read from data files.

A node type says how many GPUs a server holds and how they are wired: through NVSwitch (every
GPU has one port into the switch), through point-to-point NVLink (DGX-1's hybrid cube-mesh,
A40 bridge pairs) or only through PCIe. It also names the NIC and how many the node has, and,
for cloud instances, the instance whose list price it carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any, TypeVar

from trainsim.errors import DataFileError
from trainsim.hwmodels.datafiles import GB_BYTES, GBIT_BYTES, check_keys, load_json, number, unknown
from trainsim.hwmodels.gpus import GpuSpec

_T = TypeVar("_T")

INTRA_NODE_KINDS = ("nvswitch", "nvlink_mesh", "pcie")
"""How GPUs inside a node reach each other."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkTech:
    """One intra-node link technology (NVLink2 lane, NVSwitch port, NVLink bridge, PCIe x16)."""

    name: str
    """Catalog name (``"nvlink2"``, ``"nvswitch"``, ``"nvlink-bridge"``, ``"pcie3"``...)."""
    bandwidth_bytes_per_s: float | None
    """Per direction; None where it comes from the GPU's NVLink figure."""
    latency_s: float
    """Charged once per link crossed."""
    sources: Mapping[str, str] = field(hash=False, compare=False, repr=False)
    """Source of each figure."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NicSpec:
    """One network adapter model."""

    name: str
    """Catalog name, e.g. ``"ib-hdr"``."""
    description: str
    """Human-readable description."""
    bandwidth_bytes_per_s: float
    """Per adapter, per direction."""
    latency_s: float
    """One-way small-message latency per adapter crossing."""
    sources: Mapping[str, str] = field(hash=False, compare=False, repr=False)
    """Source of each figure."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able view for `sim hw show`."""
        return {
            "name": self.name,
            "kind": "nic",
            "description": self.description,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "latency_s": self.latency_s,
            "sources": dict(self.sources),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeType:
    """A server model: GPU slots, intra-node wiring, NICs, and its cloud instance if any."""

    name: str
    """Catalog name, e.g. ``"dgx-a100"``, ``"p4d.24xlarge"``."""
    description: str
    """Human-readable description."""
    max_gpus: int
    """GPU slots; a node group may use fewer (the first ones)."""
    gpus: tuple[str, ...]
    """GPU types this node type is built with (informative; other types are allowed)."""
    intra_node: str
    """One of INTRA_NODE_KINDS."""
    nvlink_pairs: tuple[tuple[int, int, int], ...]
    """(gpu a, gpu b, number of links) for point-to-point NVLink or bridges."""
    pcie_gen: int
    """PCIe generation of the GPU slots."""
    nic: str
    """Default NIC name."""
    nics_per_node: int
    """Number of NICs; their bandwidths add up in the node's NIC link."""
    instance: str | None
    """Cloud instance whose price this node type carries, or None (bought hardware)."""
    sources: Mapping[str, str] = field(hash=False, compare=False, repr=False)
    """Source of each figure."""

    def __post_init__(self) -> None:
        where = f"nodes.json: node_types.{self.name}"
        if self.intra_node not in INTRA_NODE_KINDS:
            raise DataFileError(
                f"{where}: intra_node={self.intra_node!r} not in {', '.join(INTRA_NODE_KINDS)}"
            )
        for a, b, n in self.nvlink_pairs:
            if not (0 <= a < self.max_gpus and 0 <= b < self.max_gpus and a != b and n > 0):
                raise DataFileError(f"{where}: nvlink_pairs entry {[a, b, n]} is invalid")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able view for `sim hw show`."""
        return {
            "name": self.name,
            "kind": "node_type",
            "description": self.description,
            "max_gpus": self.max_gpus,
            "gpus": list(self.gpus),
            "intra_node": self.intra_node,
            "nvlink_pairs": [list(p) for p in self.nvlink_pairs],
            "pcie_gen": self.pcie_gen,
            "nic": self.nic,
            "nics_per_node": self.nics_per_node,
            "instance": self.instance,
            "sources": dict(self.sources),
        }


@cache
def _nodes_file() -> tuple[dict[str, LinkTech], dict[str, NodeType]]:
    data = load_json("nodes.json")
    check_keys("nodes.json", data, ("links", "node_types"), ("_about",))
    techs = {}
    for name, raw in data["links"].items():
        where = f"nodes.json: links.{name}"
        check_keys(where, raw, ("bandwidth_gbps", "latency_s", "sources"))
        bw = raw["bandwidth_gbps"]
        techs[name] = LinkTech(
            name=name,
            bandwidth_bytes_per_s=None
            if bw is None
            else number(where, "bandwidth_gbps", bw) * GB_BYTES,
            latency_s=number(where, "latency_s", raw["latency_s"], positive=False),
            sources=MappingProxyType(dict(raw["sources"])),
        )
    nodes = {}
    keys = ("description", "max_gpus", "gpus", "intra_node", "nvlink_pairs", "pcie_gen", "nic",
            "nics_per_node", "instance", "sources")  # fmt: skip
    for name, raw in data["node_types"].items():
        where = f"nodes.json: node_types.{name}"
        check_keys(where, raw, keys)
        nodes[name] = NodeType(
            name=name,
            description=str(raw["description"]),
            max_gpus=int(number(where, "max_gpus", raw["max_gpus"])),
            gpus=tuple(raw["gpus"]),
            intra_node=str(raw["intra_node"]),
            nvlink_pairs=tuple((int(a), int(b), int(n)) for a, b, n in raw["nvlink_pairs"]),
            pcie_gen=int(number(where, "pcie_gen", raw["pcie_gen"])),
            nic=str(raw["nic"]),
            nics_per_node=int(number(where, "nics_per_node", raw["nics_per_node"])),
            instance=raw["instance"],
            sources=MappingProxyType(dict(raw["sources"])),
        )
    return techs, nodes


@cache
def _nics() -> dict[str, NicSpec]:
    data = load_json("nics.json")
    check_keys("nics.json", data, ("nics",), ("_about",))
    out = {}
    for name, raw in data["nics"].items():
        where = f"nics.json: nics.{name}"
        check_keys(where, raw, ("description", "bandwidth_gbitps", "latency_s", "sources"))
        out[name] = NicSpec(
            name=name,
            description=str(raw["description"]),
            bandwidth_bytes_per_s=number(where, "bandwidth_gbitps", raw["bandwidth_gbitps"])
            * GBIT_BYTES,
            latency_s=number(where, "latency_s", raw["latency_s"], positive=False),
            sources=MappingProxyType(dict(raw["sources"])),
        )
    return out


def _lookup(kind: str, name: str, table: Mapping[str, _T]) -> _T:
    if name in table:
        return table[name]
    lowered = {k.lower(): k for k in table}
    key = lowered.get(name.strip().lower())
    if key is None:
        raise unknown(kind, name, table)
    return table[key]


def list_node_types() -> list[str]:
    """Names of every node type."""
    return list(_nodes_file()[1])


def get_node_type(name: str) -> NodeType:
    """Node type by name (case-insensitive); unknown -> UnknownNameError with close names."""
    return _lookup("node type", name, _nodes_file()[1])


def list_nics() -> list[str]:
    """Names of every NIC."""
    return list(_nics())


def get_nic(name: str) -> NicSpec:
    """NIC by name (case-insensitive); unknown -> UnknownNameError with close names."""
    return _lookup("NIC", name, _nics())


def link_tech(name: str) -> LinkTech:
    """Intra-node link technology by name (``"nvlink2"``, ``"nvswitch"``, ``"pcie4"``...)."""
    return _lookup("link technology", name, _nodes_file()[0])


def pcie_tech(gen: int) -> LinkTech:
    """The PCIe x16 link technology of generation `gen`."""
    return link_tech(f"pcie{gen}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Price:
    """A price per GPU-hour with where it came from."""

    usd_per_gpu_hour: float
    """US dollars per GPU per hour."""
    source: str
    """Instance name or URL/assumption the price comes from."""


@cache
def _prices() -> tuple[dict[str, Any], dict[str, Any]]:
    data = load_json("prices.json")
    check_keys("prices.json", data, ("instances", "gpus"), ("_about",))
    for name, raw in data["instances"].items():
        check_keys(f"prices.json: instances.{name}", raw, ("usd_per_hour", "gpus", "gpu", "source"))
    for name, raw in data["gpus"].items():
        where = f"prices.json: gpus.{name}"
        if "instance" in raw:
            check_keys(where, raw, ("instance",))
            if raw["instance"] not in data["instances"]:
                raise DataFileError(f"{where}: instance={raw['instance']!r} is not in instances")
        else:
            check_keys(where, raw, ("usd_per_gpu_hour", "source"))
    return data["instances"], data["gpus"]


def instance_price(instance: str) -> Price:
    """Per-GPU-hour price of a cloud instance (instance price / its GPU count)."""
    instances, _ = _prices()
    raw = _lookup("instance", instance, instances)
    return Price(
        usd_per_gpu_hour=float(raw["usd_per_hour"]) / int(raw["gpus"]),
        source=f"{instance} ${raw['usd_per_hour']}/h / {raw['gpus']} GPUs ({raw['source']})",
    )


def default_price(gpu: GpuSpec, node_type: NodeType | None = None) -> Price:
    """Price per GPU-hour of `gpu`: the node type's own instance if it is built with this GPU,
    else the GPU type's reference price in prices.json."""
    instances, per_gpu = _prices()
    if node_type is not None and node_type.instance is not None:
        inst = instances.get(node_type.instance)
        if inst is not None and inst["gpu"] == gpu.name:
            return instance_price(node_type.instance)
    raw = per_gpu.get(gpu.name)
    if raw is None:
        raise DataFileError(f"prices.json: gpus.{gpu.name} missing (no default price)")
    if "instance" in raw:
        return instance_price(raw["instance"])
    return Price(usd_per_gpu_hour=float(raw["usd_per_gpu_hour"]), source=str(raw["source"]))
