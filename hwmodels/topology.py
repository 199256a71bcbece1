"""Links inside and between nodes, and the path a transfer takes.

Every link is one direction of one physical resource, with a cluster-unique `link_id`, so that
the simulator can share a link fairly among the transfers that cross it (DESIGN.md §3).

Per node, by wiring:

- NVSwitch (DGX/HGX A100, H100, p4d, p5): each GPU has a port into the switch and one out,
  each at half the GPU's bidirectional NVLink figure (A100: 300 GB/s each way). GPU a -> b
  crosses a's port-out and b's port-in; the switch fabric itself is non-blocking.
- Point-to-point NVLink (DGX-1 hybrid cube-mesh; A40 bridge pairs): one directional link per
  connected pair, n lanes × 25 GB/s (NVLink2) or half the bridge's figure. Pairs without a
  direct link go through PCIe and the host (a's PCIe-out, b's PCIe-in) -- the route CUDA P2P
  copies take on DGX-1 for non-neighbours. NCCL rings on DGX-1 use only NVLink neighbours, so
  collectives are not penalised by this simplification; 2-hop NVLink forwarding is not modelled.
- PCIe only: a's PCIe-out, b's PCIe-in, each a x16 link of the slot's generation. The root
  complex and the CPU-to-CPU link are not modelled as shared links (a simplification that
  overestimates cross-socket PCIe traffic).

Between nodes, each node has one NIC-out and one NIC-in link whose bandwidth is the sum of its
NICs (DGX A100: 8 × 200 Gb/s = 200 GB/s). A GPU reaches its NIC over PCIe (GPUDirect RDMA),
so an inter-node path is (src PCIe-out, src NIC-out, dst NIC-in, dst PCIe-in); the fabric
between NICs is taken as non-blocking (full-bisection fat tree).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainsim.hwmodels.gpus import GpuSpec
from trainsim.hwmodels.nodes import NicSpec, NodeType, link_tech, pcie_tech

LINK_KINDS = ("nvlink", "nvswitch", "pcie", "nic")
"""Values of `Link.kind`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """One direction of one physical link."""

    link_id: str
    """Unique within the cluster, e.g. ``"n0.g3.nvswitch.out"``, ``"n1.nic.in"``."""
    bandwidth_bytes_per_s: float
    """Per direction."""
    latency_s: float
    """Charged once per transfer crossing this link."""
    kind: str
    """One of LINK_KINDS."""

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise ValueError(f"link {self.link_id}: kind={self.kind!r} not in {LINK_KINDS}")
        if self.bandwidth_bytes_per_s <= 0:
            raise ValueError(f"link {self.link_id}: bandwidth_bytes_per_s must be > 0")


def link_parts(link_id: str) -> tuple[int, int | None, str]:
    """(global node, local GPU or None, the rest) of a link id: ``n<node>.g<gpu>.<rest>`` for a
    GPU's own links, ``n<node>.<rest>`` for the node's (NIC, NVLink pairs). Every link belongs
    to one node (and most to one GPU), so collective planning can translate a collective's
    links from one set of nodes and GPUs to another alike (workloads/lowering/comm.py)."""
    head, _, rest = link_id.partition(".")
    node = int(head[1:])
    first, dot, tail = rest.partition(".")
    if dot and first[:1] == "g" and first[1:].isdigit():
        return node, int(first[1:]), tail
    return node, None, rest


def link_id_of(node: int, local: int | None, rest: str) -> str:
    """The link id with these parts (inverse of `link_parts`)."""
    return f"n{node}.{rest}" if local is None else f"n{node}.g{local}.{rest}"


class NodeLinks:
    """The links of one node and the intra-node path between two of its GPUs."""

    __slots__ = ("nic_in", "nic_out", "pairs", "pcie_in", "pcie_out", "switch_in", "switch_out")

    def __init__(
        self,
        *,
        node: int,
        node_type: NodeType,
        gpu: GpuSpec,
        gpus_per_node: int,
        nic: NicSpec,
        nics_per_node: int,
    ) -> None:
        """Build the links of global node `node` with `gpus_per_node` GPUs of type `gpu`."""
        prefix = f"n{node}"
        pcie = pcie_tech(min(node_type.pcie_gen, gpu.pcie_gen))
        assert pcie.bandwidth_bytes_per_s is not None
        self.pcie_out = [
            Link(link_id=f"{prefix}.g{g}.pcie.out", bandwidth_bytes_per_s=pcie.bandwidth_bytes_per_s,
                 latency_s=pcie.latency_s, kind="pcie")
            for g in range(gpus_per_node)
        ]  # fmt: skip
        self.pcie_in = [
            Link(link_id=f"{prefix}.g{g}.pcie.in", bandwidth_bytes_per_s=pcie.bandwidth_bytes_per_s,
                 latency_s=pcie.latency_s, kind="pcie")
            for g in range(gpus_per_node)
        ]  # fmt: skip
        self.switch_out: list[Link] = []
        self.switch_in: list[Link] = []
        self.pairs: dict[tuple[int, int], Link] = {}
        nvlink_bw = gpu.nvlink_bandwidth_bytes_per_s
        if node_type.intra_node == "nvswitch" and nvlink_bw is not None:
            tech = link_tech("nvswitch")
            for g in range(gpus_per_node):
                for direction, store in (("out", self.switch_out), ("in", self.switch_in)):
                    store.append(
                        Link(link_id=f"{prefix}.g{g}.nvswitch.{direction}",
                             bandwidth_bytes_per_s=nvlink_bw / 2, latency_s=tech.latency_s,
                             kind="nvswitch")
                    )  # fmt: skip
        elif node_type.nvlink_pairs and nvlink_bw is not None:
            mesh = node_type.intra_node == "nvlink_mesh"
            tech = link_tech("nvlink2" if mesh else "nvlink-bridge")
            for a, b, lanes in node_type.nvlink_pairs:
                if a >= gpus_per_node or b >= gpus_per_node:
                    continue
                if mesh:
                    assert tech.bandwidth_bytes_per_s is not None
                    bw = lanes * tech.bandwidth_bytes_per_s
                else:
                    bw = lanes * nvlink_bw / 2
                for s, d in ((a, b), (b, a)):
                    self.pairs[(s, d)] = Link(
                        link_id=f"{prefix}.nvlink.g{s}-g{d}", bandwidth_bytes_per_s=bw,
                        latency_s=tech.latency_s, kind="nvlink",
                    )  # fmt: skip
        total_nic = nic.bandwidth_bytes_per_s * nics_per_node
        self.nic_out = Link(link_id=f"{prefix}.nic.out", bandwidth_bytes_per_s=total_nic,
                            latency_s=nic.latency_s, kind="nic")  # fmt: skip
        self.nic_in = Link(link_id=f"{prefix}.nic.in", bandwidth_bytes_per_s=total_nic,
                           latency_s=nic.latency_s, kind="nic")  # fmt: skip

    def intra_path(self, a: int, b: int) -> tuple[Link, ...]:
        """Links crossed from local GPU `a` to local GPU `b` of this node."""
        if a == b:
            return ()
        if self.switch_out:
            return (self.switch_out[a], self.switch_in[b])
        direct = self.pairs.get((a, b))
        if direct is not None:
            return (direct,)
        return (self.pcie_out[a], self.pcie_in[b])

    @property
    def symmetric(self) -> bool:
        """Whether every GPU of the node is wired alike (NVSwitch or PCIe only: no NVLink
        pairs), so that any renumbering of its GPUs maps its links onto its links."""
        return bool(self.switch_out) or not self.pairs

    def all_links(self) -> list[Link]:
        """Every link of this node in a stable order."""
        out: list[Link] = []
        for g in range(len(self.pcie_out)):
            out.append(self.pcie_out[g])
            out.append(self.pcie_in[g])
            if self.switch_out:
                out.append(self.switch_out[g])
                out.append(self.switch_in[g])
        out.extend(self.pairs[k] for k in sorted(self.pairs))
        out.extend((self.nic_out, self.nic_in))
        return out
