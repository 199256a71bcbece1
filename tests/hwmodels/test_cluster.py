"""Cluster specs, YAML, ranks, links, paths and prices."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainsim.errors import DataFileError, SpecError, UnknownNameError
from trainsim.hwmodels.cluster import parse_cluster


def test_single_node_spec() -> None:
    """'4xV100-SXM2-32GB' is one DGX-1-style node of 4 GPUs."""
    c = parse_cluster("4xV100-SXM2-32GB")
    assert (c.num_gpus, c.num_nodes, len(c.node_groups)) == (4, 1, 1)
    assert c.node_groups[0].node_type.name == "dgx1-v100"
    assert c.ranks_of_node(0) == [0, 1, 2, 3]


def test_multi_node_spec() -> None:
    """'2x8xA100-SXM4-80GB' is two DGX A100 nodes; rank 9 is node 1, local GPU 1."""
    c = parse_cluster("2x8xA100-SXM4-80GB")
    assert (c.num_gpus, c.num_nodes) == (16, 2)
    assert c.node_groups[0].node_type.name == "dgx-a100"
    assert (c.node_of(9), c.local_rank(9), c.group_of(9)) == (1, 1, 0)


def test_heterogeneous_spec() -> None:
    """'1x8xA100-SXM4-40GB+7x4xA10': ranks 0-7 A100 on node 0, ranks 8-35 A10 on nodes 1-7."""
    c = parse_cluster("1x8xA100-SXM4-40GB+7x4xA10")
    assert (c.num_gpus, c.num_nodes, len(c.node_groups)) == (36, 8, 2)
    assert [g.node_type.name for g in c.node_groups] == ["dgx-a100", "g5.24xlarge"]
    assert c.gpu(7).name == "A100-SXM4-40GB" and c.gpu(8).name == "A10"
    assert c.node_of(8) == 1 and c.node_of(35) == 7 and c.ranks_of_node(7) == [32, 33, 34, 35]
    assert c.idle_power_w(0) == pytest.approx(83.64)


def test_default_node_types() -> None:
    """Each GPU family maps to its default node type."""
    cases = {"8xA40": "a40-pcie-bridged", "8xH100-SXM5-80GB": "hgx-h100",
             "4xA100-PCIe-80GB": "pcie-gen4-8gpu", "2xV100-PCIe-32GB": "pcie-gen3-8gpu"}  # fmt: skip
    for spec, node in cases.items():
        assert parse_cluster(spec).node_groups[0].node_type.name == node


def test_node_type_override_and_price() -> None:
    """'@p4d.24xlarge' overrides the node type; its price is $32.7726/h / 8 = $4.0966/GPU-h and
    its NIC 4 × 100 Gb/s EFA = 50 GB/s per direction."""
    c = parse_cluster("2x8xA100-SXM4-40GB@p4d.24xlarge")
    group = c.node_groups[0]
    assert group.node_type.name == "p4d.24xlarge"
    assert group.price_per_gpu_hour_usd == pytest.approx(32.7726 / 8)
    assert c.price_per_hour_usd == pytest.approx(2 * 32.7726)
    assert c.link("n0.nic.out").bandwidth_bytes_per_s == pytest.approx(400e9 / 8)


def test_prices_per_gpu_hour() -> None:
    """g5.24xlarge $8.144/4 = $2.036; p5 $98.32/8; DGX A100 priced like p4d."""
    assert parse_cluster("4xA10").node_groups[0].price_per_gpu_hour_usd == pytest.approx(2.036)
    assert parse_cluster("8xH100-SXM5-80GB").price_per_hour_usd == pytest.approx(98.32)
    assert parse_cluster("8xA100-SXM4-40GB").price_per_hour_usd == pytest.approx(32.7726)


def test_nvswitch_path_vs_inter_node_path() -> None:
    """Inside a DGX A100: two NVSwitch ports at 300 GB/s. Across nodes: src PCIe-out, src
    NIC-out, dst NIC-in, dst PCIe-in; bottleneck the PCIe Gen4 x16 link (31.5 GB/s) since the
    node's 8 × 200 Gb/s = 200 GB/s NICs are shared."""
    c = parse_cluster("2x8xA100-SXM4-80GB")
    intra = c.path(0, 3)
    assert [x.kind for x in intra] == ["nvswitch", "nvswitch"]
    assert c.bottleneck_bytes_per_s(0, 3) == pytest.approx(300e9)
    inter = c.path(2, 13)
    assert [x.link_id for x in inter] == [
        "n0.g2.pcie.out",
        "n0.nic.out",
        "n1.nic.in",
        "n1.g5.pcie.in",
    ]
    assert c.link("n0.nic.out").bandwidth_bytes_per_s == pytest.approx(200e9)
    assert c.bottleneck_bytes_per_s(2, 13) == pytest.approx(31.508e9)
    assert c.path(4, 4) == ()


def test_dgx1_cube_mesh_pairs() -> None:
    """DGX-1: GPU0-GPU3 share 2 NVLink2 links (50 GB/s each way), GPU0-GPU1 one (25 GB/s);
    GPU0-GPU5 have none and go through PCIe Gen3 (15.75 GB/s)."""
    c = parse_cluster("8xV100-SXM2-16GB")
    assert [x.link_id for x in c.path(0, 3)] == ["n0.nvlink.g0-g3"]
    assert c.bottleneck_bytes_per_s(0, 3) == pytest.approx(50e9)
    assert c.bottleneck_bytes_per_s(0, 1) == pytest.approx(25e9)
    assert [x.kind for x in c.path(0, 5)] == ["pcie", "pcie"]
    assert c.bottleneck_bytes_per_s(0, 5) == pytest.approx(15.754e9)
    lanes = {}
    for a in range(8):
        lanes[a] = sum(c.bottleneck_bytes_per_s(a, b) / 25e9 for b in range(8)
                       if b != a and c.path(a, b)[0].kind == "nvlink")  # fmt: skip
    assert all(n == pytest.approx(6) for n in lanes.values())  # 6 NVLink2 links per V100


def test_a40_bridge_pairs() -> None:
    """A40 node: GPU0-GPU1 bridged at 112.5/2 GB/s each way, GPU0-GPU2 over PCIe Gen4."""
    c = parse_cluster("8xA40")
    assert c.bottleneck_bytes_per_s(0, 1) == pytest.approx(56.25e9)
    assert [x.kind for x in c.path(0, 2)] == ["pcie", "pcie"]


def test_heterogeneous_path_crosses_both_nics() -> None:
    """A100 node -> A10 node: both NICs on the path; bottleneck the g5's 50 Gb/s NIC."""
    c = parse_cluster("1x8xA100-SXM4-40GB+7x4xA10")
    kinds = [x.link_id for x in c.path(0, 8)]
    assert kinds == ["n0.g0.pcie.out", "n0.nic.out", "n1.nic.in", "n1.g0.pcie.in"]
    assert c.bottleneck_bytes_per_s(0, 8) == pytest.approx(50e9 / 8)


def test_link_ids_unique_and_lookup() -> None:
    """links() ids are unique; link(id) returns the same object."""
    c = parse_cluster("1x8xA100-SXM4-40GB+7x4xA10")
    ids = [x.link_id for x in c.links()]
    assert len(ids) == len(set(ids))
    assert all(c.link(i).link_id == i for i in ids)


def test_total_peak_flops() -> None:
    """Cluster peak = Σ GPUs × per-GPU peak: 8 × 312 + 28 × 125 TFLOPS (rounded datasheets)."""
    c = parse_cluster("1x8xA100-SXM4-40GB+7x4xA10")
    assert c.peak_flops("fp16") == pytest.approx(8 * 312e12 + 28 * 125e12, rel=1e-3)


def test_yaml_round_trip(tmp_path: Path) -> None:
    """to_dict() written as YAML and parsed again gives an equal cluster."""
    c = parse_cluster("1x8xA100-SXM4-40GB@p4d.24xlarge+7x4xA10")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(c.to_dict()))
    again = parse_cluster(str(path))
    assert again == c and again.num_gpus == 36


def test_yaml_minimal_with_overrides(tmp_path: Path) -> None:
    """Only gpu/nodes/gpus_per_node are required; nic and price can be overridden."""
    path = tmp_path / "c.yml"
    path.write_text(
        "node_groups:\n  - {gpu: A40, nodes: 2, gpus_per_node: 4, nic: ib-hdr, price_per_gpu_hour_usd: 1.5}\n"
    )
    c = parse_cluster(str(path))
    assert c.num_gpus == 8 and c.price_per_hour_usd == pytest.approx(12.0)
    assert c.link("n1.nic.in").bandwidth_bytes_per_s == pytest.approx(25e9)


@pytest.mark.parametrize("spec", ["4xx", "x8xA100", "8", "", "2x8xA100-SXM4-80GB+", "0x8xA10"])
def test_malformed_specs_raise_spec_error(spec: str) -> None:
    """Malformed short specs raise SpecError quoting the spec."""
    with pytest.raises(SpecError):
        parse_cluster(spec)


def test_unknown_gpu_and_node_type() -> None:
    """Unknown names list close valid ones."""
    with pytest.raises(UnknownNameError, match="A100-SXM4-40GB"):
        parse_cluster("8xA100")
    with pytest.raises(UnknownNameError, match="p4d.24xlarge"):
        parse_cluster("8xA100-SXM4-40GB@p4d")


def test_too_many_gpus_per_node() -> None:
    """g5.24xlarge has 4 slots: 8 A10s per node needs another node type."""
    with pytest.raises(SpecError, match="gpus_per_node=8"):
        parse_cluster("8xA10")
    assert parse_cluster("8xA10@g5.48xlarge").num_gpus == 8


def test_yaml_missing_field_names_file_and_field(tmp_path: Path) -> None:
    """A group without gpus_per_node raises DataFileError naming the file, group and field."""
    path = tmp_path / "bad.yaml"
    path.write_text("node_groups:\n  - {gpu: A10, nodes: 2}\n")
    with pytest.raises(DataFileError) as info:
        parse_cluster(str(path))
    assert "bad.yaml" in str(info.value) and "node_groups[0]" in str(info.value)
    assert "gpus_per_node" in str(info.value)


def test_yaml_bad_values(tmp_path: Path) -> None:
    """Non-integer counts and unknown keys are DataFileErrors naming the field."""
    path = tmp_path / "bad.yaml"
    path.write_text("node_groups:\n  - {gpu: A10, nodes: two, gpus_per_node: 4}\n")
    with pytest.raises(DataFileError, match="nodes='two'"):
        parse_cluster(str(path))
    path.write_text("node_groups:\n  - {gpu: A10, nodes: 1, gpus_per_node: 4, colour: red}\n")
    with pytest.raises(DataFileError, match="colour"):
        parse_cluster(str(path))


def test_a_spec_whose_gpu_name_has_no_digit_names_the_gpu() -> None:
    """`4xFOO` has the spec's form; its GPU name is what is wrong, so that is what is said."""
    with pytest.raises(SpecError, match=r"'4xFOO': unknown GPU type 'FOO'"):
        parse_cluster("4xFOO")
