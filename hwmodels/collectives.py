"""Collectives as measured: NCCL's protocol latencies plus a measured bus efficiency per link class.

The planner (simulator/collectives.py) says which links a collective loads, with how many bytes
and in how many steps; on those links' peak alone a collective would run at link peak and pay
only the links' own latency. Measured NCCL collectives do neither. Per link class (the class of
a phase's slowest link) this module prices a phase of V bytes per link of peak B in s steps, of
which s_net cross nodes, the way NCCL's own cost model does (src/graph/tuning.cc; the numbers
and the commit are in data/collectives.json):

    t = min over protocols p  [ base_p + (s − s_net)·step_p(intra) + s_net·step_p(net)
                                + V / (B · e_kind · f_p) ]

- ``base_p``: once per collective (kernel launch and protocol set-up), NCCL's baseLat;
- ``step_p``: per algorithm step, NCCL's hwLat for NVLink, PCIe or the network;
- ``f_p``: the protocol's share of the bandwidth (LL sends 8-byte flag+data words: 1/4 for an
  all-reduce or across nodes, else 1/3; LL128 0.92; Simple 1);
- ``e_kind``: the fraction of the link's per-direction peak that large messages of that
  collective kind reach (nccl-tests "busbw" / line rate, or fitted to Aceso's measured
  collectives), per class.

The minimum over protocols is what makes bandwidth depend on message size: small messages take
LL (low latency, a quarter of the bandwidth), large ones Simple (full bandwidth, higher
latency), as NCCL chooses. A phase's time never falls as V grows (each term grows with V).

Coefficients live in data/collectives.json (each with its source), are read and checked once
(`collective_models`). Layering: hwmodels imports only errors and datafiles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any

from trainsim.errors import DataFileError
from trainsim.hwmodels.datafiles import check_keys, load_json, number

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
"""Collective kinds with their own large-message efficiency."""

PROTOCOLS = ("ll", "ll128", "simple")
"""NCCL's protocols, in the order tuning.cc lists them."""

LINK_CLASSES = ("nvlink", "nvswitch_nvlink3", "nvswitch_nvlink4", "pcie", "infiniband",
                "ethernet", "gloo_tcp")
"""Every class collectives.json must describe."""

NVLINK4_MIN_BYTES_PER_S = 400e9
"""An NVSwitch port at least this fast per direction is NVLink4 (H100: 450 GB/s; A100: 300)."""

MAX_EFFICIENCY = 1.2
"""Above 1 only where the switch reduces (NVLink SHARP: an all-reduce moves S, not 2(n−1)/n·S,
per GPU, so its busbw exceeds the line rate); see collectives.json."""

_CLASS_FIELDS = ("description", "step_s", "protocols", "efficiency", "source")


@dataclass(frozen=True, slots=True)
class Protocol:
    """One NCCL protocol: start-up latency and share of the bandwidth."""

    name: str
    base_s: float
    bandwidth_factor: float
    """Share of bandwidth for an all-reduce or a multi-node collective."""
    bandwidth_factor_intra_gather: float
    """Share for a single-node all-gather / reduce-scatter / all-to-all / p2p (LL: 1/3)."""

    def factor(self, kind: str, multi_node: bool) -> float:
        """Bandwidth share for a collective `kind` (tuning.cc's rule for LL)."""
        if multi_node or kind == "all_reduce":
            return self.bandwidth_factor
        return self.bandwidth_factor_intra_gather


@dataclass(frozen=True, slots=True)
class LinkClassModel:
    """How collectives behave when their slowest link is of one class."""

    name: str
    step_s: Mapping[str, float] | None
    """Per-step latency per protocol; None: the links' own summed latency is kept as planned
    (a CPU cluster's loopback links carry the α fitted to that machine)."""
    protocols: tuple[str, ...]
    """Protocols NCCL enables on this class."""
    efficiency: Mapping[str, float]
    """Large-message fraction of the link's per-direction peak, per collective kind."""
    source: str


@dataclass(frozen=True, slots=True)
class PhasePrice:
    """What the measured model adds to a planned phase."""

    latency_s: float
    """Start-up (if first) plus per-step latency of the chosen protocol."""
    efficiency: float
    """Fraction of the slowest link's peak the phase's bytes move at (e_kind × f_p)."""
    protocol: str


@dataclass(frozen=True, slots=True)
class CollectiveModels:
    """Every link class's model plus the protocol table and the algorithm-wide factors."""

    classes: Mapping[str, LinkClassModel]
    protocols: Mapping[str, Protocol]
    tree_efficiency: float
    """Bus efficiency of a (double binary) tree all-reduce relative to a ring's."""
    nic_classes: Mapping[str, str]
    """NIC name (nics.json, or ``loopback`` for CPU clusters) → link class."""
    harness_overheads: Mapping[str, float]
    """Host-side timing overhead of measurement harnesses (bench and tests only)."""

    def price(self, kind: str, link_class_name: str, *, steps: int, volume_bytes: float,
              bandwidth_bytes_per_s: float, first: bool, inter_steps: int = 0,
              intra_class_name: str | None = None, multi_node: bool = False,
              tree: bool = False) -> PhasePrice:
        """Latency and efficiency of one phase (module docstring), protocol chosen for the
        least time alone. `inter_steps` of the `steps` cross nodes (charged at the network
        class's step latency; the others at `intra_class_name`'s, default the phase's class).
        Raises KeyError for a class whose step latency is kept as planned (gloo_tcp)."""
        cls = self.classes[link_class_name]
        intra = self.classes[intra_class_name or link_class_name]
        if cls.step_s is None or intra.step_s is None:
            raise KeyError(f"link class {link_class_name} keeps the links' own latency")
        top = cls.efficiency[kind] * (self.tree_efficiency if tree else 1.0)
        best: tuple[float, PhasePrice] | None = None
        for name in cls.protocols:
            proto = self.protocols[name]
            latency = ((proto.base_s if first else 0.0)
                       + (steps - inter_steps) * intra.step_s[name]
                       + inter_steps * cls.step_s[name])
            eff = top * proto.factor(kind, multi_node)
            time = latency + (volume_bytes / (bandwidth_bytes_per_s * eff)
                              if volume_bytes > 0 else 0.0)
            if best is None or time < best[0]:
                best = (time, PhasePrice(latency_s=latency, efficiency=eff, protocol=name))
        assert best is not None  # every class enables at least one protocol (checked on load)
        return best[1]


def _fraction(where: str, field: str, value: Any, top: float = 1.0) -> float:
    got = number(where, field, value)
    if got > top:
        raise DataFileError(f"{where}: field {field}={got!r} must be <= {top}")
    return got


def _parse_class(name: str, raw: Any) -> LinkClassModel:
    where = f"collectives.json: link_classes.{name}"
    check_keys(where, raw, _CLASS_FIELDS, ("_note",))
    protocols = raw["protocols"]
    if (not isinstance(protocols, list) or not protocols
            or any(p not in PROTOCOLS for p in protocols)):
        raise DataFileError(f"{where}: field protocols={protocols!r} must be a non-empty list "
                            f"of {', '.join(PROTOCOLS)}")
    step_raw = raw["step_s"]
    step: Mapping[str, float] | None = None
    if step_raw is not None:
        check_keys(f"{where}.step_s", step_raw, PROTOCOLS)
        values = {p: number(f"{where}.step_s", p, step_raw[p], positive=False) for p in PROTOCOLS}
        for p, v in values.items():
            if v < 0:
                raise DataFileError(f"{where}.step_s: field {p}={v!r} must be >= 0")
        step = MappingProxyType(values)
    eff_raw = raw["efficiency"]
    check_keys(f"{where}.efficiency", eff_raw, COLLECTIVE_KINDS)
    eff = {k: _fraction(f"{where}.efficiency", k, eff_raw[k], MAX_EFFICIENCY)
           for k in COLLECTIVE_KINDS}
    source = raw["source"]
    if not isinstance(source, str) or not source.strip():
        raise DataFileError(f"{where}: field source must be a non-empty string")
    return LinkClassModel(name=name, step_s=step, protocols=tuple(protocols),
                          efficiency=MappingProxyType(eff), source=source)


def _parse_protocols(raw: Any) -> dict[str, Protocol]:
    where = "collectives.json: protocols"
    check_keys(where, raw, (*PROTOCOLS, "source"))
    out: dict[str, Protocol] = {}
    for name in PROTOCOLS:
        rec = raw[name]
        check_keys(f"{where}.{name}", rec,
                   ("base_s", "bandwidth_factor", "bandwidth_factor_intra_gather"))
        base = number(f"{where}.{name}", "base_s", rec["base_s"], positive=False)
        if base < 0:
            raise DataFileError(f"{where}.{name}: field base_s={base!r} must be >= 0")
        out[name] = Protocol(
            name=name, base_s=base,
            bandwidth_factor=_fraction(f"{where}.{name}", "bandwidth_factor",
                                       rec["bandwidth_factor"]),
            bandwidth_factor_intra_gather=_fraction(
                f"{where}.{name}", "bandwidth_factor_intra_gather",
                rec["bandwidth_factor_intra_gather"]))
    return out


def parse_collective_models(data: Any) -> CollectiveModels:
    """Check the content of collectives.json and build the models.

    Raises:
        DataFileError: one line naming the file, the record and the field at fault.
    """
    where = "collectives.json"
    check_keys(where, data, ("protocols", "link_classes", "tree_efficiency", "nic_classes",
                             "harness_overheads"), ("_about",))
    protocols = _parse_protocols(data["protocols"])
    classes_raw = data["link_classes"]
    check_keys(f"{where}: link_classes", classes_raw, LINK_CLASSES)
    classes = {name: _parse_class(name, classes_raw[name]) for name in LINK_CLASSES}
    tree = data["tree_efficiency"]
    check_keys(f"{where}: tree_efficiency", tree, ("value", "source"))
    tree_eff = _fraction(f"{where}: tree_efficiency", "value", tree["value"])
    nics = data["nic_classes"]
    if not isinstance(nics, Mapping):
        raise DataFileError(f"{where}: field nic_classes must be an object")
    for nic, cls in nics.items():
        if not nic.startswith("_") and cls not in ("infiniband", "ethernet", "gloo_tcp"):
            raise DataFileError(f"{where}: nic_classes: field {nic}={cls!r} must be one of "
                                "infiniband, ethernet, gloo_tcp")
    harness = data["harness_overheads"]
    if not isinstance(harness, Mapping):
        raise DataFileError(f"{where}: field harness_overheads must be an object")
    overheads: dict[str, float] = {}
    for name, rec in harness.items():
        if name.startswith("_"):
            continue
        check_keys(f"{where}: harness_overheads.{name}", rec, ("value_s", "source"))
        overheads[name] = number(f"{where}: harness_overheads.{name}", "value_s",
                                 rec["value_s"], positive=False)
    return CollectiveModels(
        classes=MappingProxyType(classes), protocols=MappingProxyType(protocols),
        tree_efficiency=tree_eff,
        nic_classes=MappingProxyType({k: str(v) for k, v in nics.items()
                                      if not k.startswith("_")}),
        harness_overheads=MappingProxyType(overheads))


@cache
def collective_models() -> CollectiveModels:
    """The models of hwmodels/data/collectives.json, read and checked once."""
    return parse_collective_models(load_json("collectives.json"))


def link_class(link_kind: str, bandwidth_bytes_per_s: float, nic_name: str | None = None,
               models: CollectiveModels | None = None) -> str:
    """The class of a link of `link_kind` (topology.LINK_KINDS): NVLink pairs, NVSwitch ports
    (NVLink3 or NVLink4 by their speed), PCIe, or a NIC's class by its name (an unknown NIC
    counts as Ethernet)."""
    if link_kind == "nvswitch":
        return ("nvswitch_nvlink4" if bandwidth_bytes_per_s >= NVLINK4_MIN_BYTES_PER_S
                else "nvswitch_nvlink3")
    if link_kind in ("nvlink", "pcie"):
        return link_kind
    models = models or collective_models()
    return models.nic_classes.get(nic_name or "", "ethernet")


def ring_bus_bandwidth_bytes_per_s(models: CollectiveModels, class_name: str, kind: str,
                                   n: int, size_bytes: float, link_bytes_per_s: float,
                                   nodes: int = 1) -> float:
    """nccl-tests busbw of a ring collective of S bytes (the full tensor; all-to-all: one
    rank's send buffer) over n ranks on `nodes` nodes whose slowest link has the given peak:
    ``busbw = factor · S / t`` (factor 2(n−1)/n for all-reduce, (n−1)/n otherwise)."""
    if n < 2 or size_bytes <= 0:
        return 0.0
    if kind == "all_reduce":
        steps, inter, factor = 2 * (n - 1), 2 * (nodes - 1), 2 * (n - 1) / n
    elif kind == "p2p":
        steps, inter, factor = 1, int(nodes > 1), 1.0
    else:
        steps, inter, factor = n - 1, nodes - 1, (n - 1) / n
    volume = factor * size_bytes
    price = models.price(kind, class_name, steps=steps, volume_bytes=volume,
                         bandwidth_bytes_per_s=link_bytes_per_s, first=True,
                         inter_steps=inter, multi_node=nodes > 1)
    t = price.latency_s + volume / (link_bytes_per_s * price.efficiency)
    return volume / t if t > 0 else math.inf


__all__ = ["COLLECTIVE_KINDS", "LINK_CLASSES", "PROTOCOLS", "CollectiveModels",
           "LinkClassModel", "PhasePrice", "Protocol", "collective_models", "link_class",
           "parse_collective_models", "ring_bus_bandwidth_bytes_per_s"]
