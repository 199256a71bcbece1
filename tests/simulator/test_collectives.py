"""Collectives: α-β formulas with explicit numbers, and their link-level phases on a topology."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from trainsim.errors import SpecError, UnknownNameError
from trainsim.simulator.collectives import (
    CommPhase,
    all_to_all_time_s,
    collective_time_s,
    hierarchical_all_reduce_time_s,
    link_bandwidths,
    p2p_time_s,
    plan_collective,
    ring_all_gather_time_s,
    ring_all_reduce_time_s,
    ring_reduce_scatter_time_s,
    tree_all_reduce_time_s,
)

GB = 1e9
GPU_BW = 150 * GB
"""NVSwitch-like per-GPU link, per direction."""
NIC_BW = 25 * GB
"""One NIC per node (200 Gbit/s class), per direction."""
GPU_LAT = 1e-6
NIC_LAT = 5e-6


@dataclass(frozen=True)
class FakeLink:
    link_id: str
    bandwidth_bytes_per_s: float
    latency_s: float
    kind: str


class FakeCluster:
    """2 nodes × 4 GPUs; intra-node: GPU out-link → GPU in-link; inter-node also crosses the
    source node's NIC-out and the destination node's NIC-in (the contract's `path`)."""

    def __init__(self, nodes: int = 2, gpus_per_node: int = 4, nic_bw: float = NIC_BW) -> None:
        self.k = gpus_per_node
        self.nic_bw = nic_bw
        self.num_gpus = nodes * gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.k

    def ranks_of_node(self, node: int) -> list[int]:
        return list(range(node * self.k, (node + 1) * self.k))

    def path(self, src: int, dst: int) -> tuple[FakeLink, ...]:
        out = FakeLink(f"gpu{src}.out", GPU_BW, GPU_LAT, "nvswitch")
        into = FakeLink(f"gpu{dst}.in", GPU_BW, GPU_LAT, "nvswitch")
        a, b = self.node_of(src), self.node_of(dst)
        if a == b:
            return (out, into)
        return (out, FakeLink(f"node{a}.nic.out", self.nic_bw, NIC_LAT, "nic"),
                FakeLink(f"node{b}.nic.in", self.nic_bw, NIC_LAT, "nic"), into)


CLUSTER = FakeCluster()
ALL = tuple(range(8))
BW = link_bandwidths(CLUSTER, ALL)
INTRA_ALPHA = 2 * GPU_LAT
INTER_ALPHA = 2 * GPU_LAT + 2 * NIC_LAT


def test_ring_all_reduce_formula_numbers() -> None:
    """n=8, S=1 GB, α=10 µs, β=100 GB/s: 14·10 µs + 1.75 GB / 100 GB/s = 17.64 ms."""
    assert ring_all_reduce_time_s(8, 1e9, 10e-6, 100e9) == pytest.approx(0.01764, rel=1e-12)


def test_half_collectives_and_p2p_formula_numbers() -> None:
    """All-gather = reduce-scatter = 7·α + 7/8·S/β; all-to-all likewise; p2p α + S/β."""
    expected = 7 * 10e-6 + 0.875 * 1e9 / 100e9
    assert ring_all_gather_time_s(8, 1e9, 10e-6, 100e9) == pytest.approx(expected)
    assert ring_reduce_scatter_time_s(8, 1e9, 10e-6, 100e9) == pytest.approx(expected)
    assert all_to_all_time_s(8, 1e9, 10e-6, 100e9) == pytest.approx(expected)
    assert p2p_time_s(1e6, 5e-6, 1e9) == pytest.approx(5e-6 + 1e-3)


def test_tree_beats_ring_only_when_latency_bound() -> None:
    """Tree: 2·⌈log2 64⌉·α + 2S/β = 12α + 2S/β vs ring 126α + 126/64·S/β. At 1 KB the tree
    wins; at 1 GB the ring does."""
    alpha, beta = 5e-6, 25e9
    assert tree_all_reduce_time_s(64, 1e3, alpha, beta) == pytest.approx(12 * alpha + 2e3 / beta)
    assert tree_all_reduce_time_s(64, 1e3, alpha, beta) < ring_all_reduce_time_s(64, 1e3, alpha,
                                                                                 beta)
    assert tree_all_reduce_time_s(64, 1e9, alpha, beta) > ring_all_reduce_time_s(64, 1e9, alpha,
                                                                                 beta)


def test_lone_ring_all_reduce_takes_its_formula_time() -> None:
    """A ring over 8 GPUs on 2 nodes crosses every GPU link and each NIC once; its time alone
    is 2·7·α_inter + 2·7/8·S / 25 GB/s (NIC bottleneck)."""
    size = 1e9
    phases = plan_collective("all_reduce", ALL, size, CLUSTER, algorithm="ring")
    assert len(phases) == 1
    (phase,) = phases
    assert phase.ranks == ALL
    assert phase.bytes_per_link == pytest.approx(2 * 7 / 8 * size)
    assert {"node0.nic.out", "node1.nic.in", "gpu0.out", "gpu7.in"} <= set(phase.links)
    expected = ring_all_reduce_time_s(8, size, INTER_ALPHA, NIC_BW)
    assert collective_time_s(phases, BW) == pytest.approx(expected, rel=1e-12)


def test_intra_node_ring_uses_nvswitch_links_only() -> None:
    """Inside one node the ring's links are the 4 GPUs' out/in links at 150 GB/s."""
    ranks = (0, 1, 2, 3)
    phases = plan_collective("all_reduce", ranks, 4e8, CLUSTER, algorithm="ring")
    assert phases[0].links == tuple(sorted(f"gpu{r}.{d}" for r in ranks for d in ("in", "out")))
    assert collective_time_s(phases, BW) == pytest.approx(
        ring_all_reduce_time_s(4, 4e8, INTRA_ALPHA, GPU_BW))


def test_hierarchical_follows_three_phase_formula() -> None:
    """Across 2 nodes × 4 GPUs: reduce-scatter in nodes (3α_i + 3/4·S/150 GB/s), all-reduce
    of S/4 by 4 parallel rings sharing each NIC (2α_e + S/25 GB/s), all-gather in nodes."""
    size = 1e9
    phases = plan_collective("all_reduce", ALL, size, CLUSTER, algorithm="hierarchical")
    assert [p.name for p in phases] == ["intra_node_reduce_scatter", "inter_node_all_reduce",
                                        "intra_node_all_gather"]
    inter = phases[1]
    assert inter.links == ("node0.nic.in", "node0.nic.out", "node1.nic.in", "node1.nic.out")
    assert inter.bytes_per_link == pytest.approx(size)  # 4 rings × 2·(1/2)·S/4
    expected = hierarchical_all_reduce_time_s(2, 4, size, INTRA_ALPHA, GPU_BW, INTER_ALPHA,
                                              NIC_BW)
    hand = 2 * (3 * INTRA_ALPHA + 0.75 * size / GPU_BW) + 2 * INTER_ALPHA + size / NIC_BW
    assert expected == pytest.approx(hand)
    assert collective_time_s(phases, BW) == pytest.approx(expected, rel=1e-12)


def test_lighter_slower_link_can_be_the_bottleneck() -> None:
    """With a 1000 GB/s NIC, the inter-node phase's NIC carries S (1 ms) but each GPU link
    S/4 at 150 GB/s (1.67 ms): the GPU links bound the phase, and its lone time is theirs."""
    fast_nic = FakeCluster(nic_bw=1000 * GB)
    phases = plan_collective("all_reduce", ALL, 1e9, fast_nic, algorithm="hierarchical")
    inter = phases[1]
    assert {"gpu0.out", "node0.nic.out"} <= set(inter.links)
    bandwidths = link_bandwidths(fast_nic, ALL)
    assert collective_time_s([inter], bandwidths) == pytest.approx(
        2 * INTER_ALPHA + 0.25e9 / GPU_BW, rel=1e-12)


def test_auto_picks_fastest_algorithm() -> None:
    """Large all-reduce across nodes: hierarchical (S/25 GB/s on the NIC beats the flat
    ring's 1.75·S); a tiny one over 4 ranks split 3+1 (no hierarchy): tree, 2·⌈log2 4⌉ = 4
    steps against the ring's 6; inside a node at 1 GB: ring."""
    big = plan_collective("all_reduce", ALL, 1e9, CLUSTER)
    assert big[0].name == "intra_node_reduce_scatter"
    tiny = plan_collective("all_reduce", (0, 1, 2, 4), 8.0, CLUSTER)
    assert [p.name for p in tiny] == ["tree_all_reduce"]
    assert collective_time_s(tiny, BW) == pytest.approx(4 * INTER_ALPHA + 16 / NIC_BW)
    local = plan_collective("all_reduce", (0, 1, 2, 3), 1e9, CLUSTER)
    assert [p.name for p in local] == ["ring_all_reduce"]


def test_all_gather_reduce_scatter_phases() -> None:
    """Ring all-gather / reduce-scatter in a node: (n−1)/n·S per link, (n−1)·α."""
    for kind in ("all_gather", "reduce_scatter"):
        phases = plan_collective(kind, (0, 1, 2, 3), 1e9, CLUSTER)
        assert phases[0].bytes_per_link == pytest.approx(0.75e9)
        assert collective_time_s(phases, BW) == pytest.approx(
            ring_all_gather_time_s(4, 1e9, INTRA_ALPHA, GPU_BW))


def test_all_to_all_loads_the_nic_with_all_cross_node_traffic() -> None:
    """All-to-all of S per rank over 8 GPUs: each node's 4 ranks send 4/8·S across, so each
    NIC carries 4·4·S/8 = 2S: time 7·α_e + 2S / 25 GB/s. Inside a node the formula holds."""
    size = 1e8
    phases = plan_collective("all_to_all", ALL, size, CLUSTER)
    assert phases[0].bytes_per_link == pytest.approx(2 * size)
    assert set(phases[0].links) == {"node0.nic.out", "node0.nic.in", "node1.nic.out",
                                    "node1.nic.in"}
    assert collective_time_s(phases, BW) == pytest.approx(7 * INTER_ALPHA + 2 * size / NIC_BW)
    local = plan_collective("all_to_all", (0, 1, 2, 3), size, CLUSTER)
    assert collective_time_s(local, BW) == pytest.approx(
        all_to_all_time_s(4, size, INTRA_ALPHA, GPU_BW))


def test_parallel_groups_share_the_nic() -> None:
    """Two data-parallel all-reduces (ranks 0+4 and 1+5) both load node 0's NIC-out link, so
    the engine's fair sharing can slow each when they overlap; alone each takes S/25 GB/s."""
    first = plan_collective("all_reduce", (0, 4), 1e9, CLUSTER, algorithm="ring")[0]
    second = plan_collective("all_reduce", (1, 5), 1e9, CLUSTER, algorithm="ring")[0]
    assert "node0.nic.out" in set(first.links) & set(second.links)
    assert collective_time_s([first], BW) == pytest.approx(2 * INTER_ALPHA + 1e9 / NIC_BW)


def test_p2p_crosses_its_path() -> None:
    """A send from GPU 1 to GPU 6 crosses 4 links; time α_e + S/25 GB/s."""
    (phase,) = plan_collective("p2p", (1, 6), 5e7, CLUSTER)
    assert phase.links == ("gpu1.out", "gpu6.in", "node0.nic.out", "node1.nic.in")
    assert collective_time_s([phase], BW) == pytest.approx(INTER_ALPHA + 5e7 / NIC_BW)


def test_edge_cases_and_errors() -> None:
    """One rank needs no phases; unknown kinds/algorithms list the valid names; bad input."""
    assert plan_collective("all_reduce", (3,), 1e6, CLUSTER) == []
    with pytest.raises(UnknownNameError, match="all_reduce"):
        plan_collective("allreduce", ALL, 1.0, CLUSTER)
    with pytest.raises(UnknownNameError, match="ring"):
        plan_collective("all_gather", ALL, 1.0, CLUSTER, algorithm="tree")
    with pytest.raises(SpecError, match="repeat a rank"):
        plan_collective("all_reduce", (0, 0), 1.0, CLUSTER)
    with pytest.raises(SpecError, match="size_bytes"):
        plan_collective("all_reduce", (0, 1), math.nan, CLUSTER)
    with pytest.raises(SpecError, match="same count on each"):
        plan_collective("all_reduce", (0, 1, 4), 1.0, CLUSTER, algorithm="hierarchical")
    with pytest.raises(SpecError, match="bytes_per_link"):
        CommPhase(name="x", ranks=(0,), latency_s=0.0, bytes_per_link=-1.0, links=())
