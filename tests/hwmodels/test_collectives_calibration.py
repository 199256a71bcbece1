"""Collectives as measured (hwmodels/collectives.py, data/collectives.json, simulator/rings.py)
against Aceso's measured NCCL collectives and cited nccl-tests figures.

Aceso rows (../shared/data/aceso/SOURCES.md; bench/collectives.py says how they were measured
and prints the full tables): ``profiled-time-miniset`` = 2 and 4 V100 over PCIe Gen3,
``profiled-time-eurosys`` = a V100 NVLink node (2 GPUs: the NV2 pair 0-3; 4: GPUs 0-3; 8: all).
The simulator's time alone plus the harness's host overhead (``harness_overheads``, never used
by the simulator) is compared with each row. The eurosys 8-GPU all-to-all rows are reported by
the bench but not bounded here: the topology sends the pairs without NVLink over PCIe, and the
measurement is about twice as fast as that allows.

Bounds sit just above what the model reaches (bench/collectives.py prints: PCIe 17.9 %, NVLink
without the 8-GPU all-to-all 14.1 %), and far below link-peak α-β with rank-order rings (PCIe
58.2 %, NVLink 132.7 %).
"""

from __future__ import annotations

import copy
import csv
import itertools
import json
import re
from pathlib import Path

import pytest

from trainsim.errors import DataFileError
from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.hwmodels.collectives import (
    collective_models,
    link_class,
    parse_collective_models,
    ring_bus_bandwidth_bytes_per_s,
)
from trainsim.hwmodels.datafiles import load_json
from trainsim.simulator.collectives import collective_time_s, link_bandwidths, plan_collective
from trainsim.validate.cpu_hardware import cpu_cluster
from trainsim.validate.profile_db import ProfileDB
from trainsim.workloads.lowering.comm import MemoTopology, alone_time_s, plan_measured

MIB = 1 << 20
MINISET_MAPE_BOUND = 0.19
EUROSYS_MAPE_BOUND = 0.15

_NAME = re.compile(r"prim_(.+)_(all_gather|all_reduce|reduce_scatter|all_to_all)_(\d+)gpus\.csv")
MINISET = ("1x4xV100-PCIe-32GB", {2: (0, 1), 4: (0, 1, 2, 3)})
EUROSYS = ("1x8xV100-SXM2-32GB", {2: (0, 3), 4: (0, 1, 2, 3), 8: tuple(range(8))})


def aceso_rows(folder: Path) -> list[tuple[str, int, int, float]]:
    """(kind, n, label MiB, measured seconds) of every measured row of the prim_*.csv files."""
    rows = []
    for path in sorted(folder.glob("prim_*.csv")):
        m = _NAME.fullmatch(path.name)
        assert m, path.name
        with path.open() as fh:
            reader = csv.reader(fh)
            assert next(reader) == ["data_size(MB)", "time(ms)"]
            rows += [(m.group(2), int(m.group(3)), int(mb), float(ms) * 1e-3)
                     for mb, ms in reader if float(ms) < 1e5]  # 1e9: not measured
    return rows


def full_size_bytes(kind: str, n: int, label_mib: int) -> float:
    """S as the planner takes it: the full tensor (all-gather: n × one rank's input)."""
    per_rank = (label_mib + 0.5) * MIB
    return per_rank * n if kind == "all_gather" else per_rank


def predict_s(topology: MemoTopology, kind: str, group: tuple[int, ...], size: float) -> float:
    """The simulator's time for one collective alone (lowering's own planning path)."""
    return alone_time_s(plan_measured(kind, group, size, topology), topology)


def _mape(folder: Path, setup: tuple[str, dict[int, tuple[int, ...]]],
          skip: frozenset[tuple[str, int]] = frozenset()) -> tuple[int, float]:
    spec, groups = setup
    topo = MemoTopology(parse_cluster_spec(spec))
    harness = collective_models().harness_overheads
    errors = [abs((predict_s(topo, kind, groups[n], full_size_bytes(kind, n, mb))
                   + harness[f"aceso_comm_profiler.{kind}"]) / t - 1)
              for kind, n, mb, t in aceso_rows(folder) if n in groups and (kind, n) not in skip]
    return len(errors), sum(errors) / len(errors)


def test_miniset_pcie_collectives_within_mape(shared_subdir) -> None:
    rows, mape = _mape(shared_subdir("aceso/profiled-time-miniset"), MINISET)
    print(f"aceso miniset (PCIe): {rows} rows, MAPE {100 * mape:.1f} %")
    assert rows == 834
    assert mape <= MINISET_MAPE_BOUND


def test_eurosys_nvlink_collectives_within_mape(shared_subdir) -> None:
    rows, mape = _mape(shared_subdir("aceso/profiled-time-eurosys"), EUROSYS,
                       skip=frozenset({("all_to_all", 8)}))
    print(f"aceso eurosys (NVLink, 2-8 GPUs): {rows} rows, MAPE {100 * mape:.1f} %")
    assert rows > 8000
    assert mape <= EUROSYS_MAPE_BOUND


def test_dgx1_rings_follow_nvlink_neighbours() -> None:
    """A rank-order ring on DGX-1 crosses PCIe (3 -> 4, 7 -> 0): 15.75 GB/s. NCCL's rings use
    only NVLinks, several at once: 6 lanes × 25 GB/s per GPU for all 8, 4 lanes for GPUs 0-3."""
    cluster = parse_cluster_spec("1x8xV100-SXM2-32GB")
    for group, busbw in ((tuple(range(8)), 150e9), ((0, 1, 2, 3), 100e9), ((0, 3), 50e9)):
        n, size = len(group), 1e9
        phases = plan_collective("all_reduce", group, size, cluster, "ring")
        assert all(".nvlink." in link for ph in phases for link in ph.links)
        got = 2 * (n - 1) / n * size / collective_time_s(phases, link_bandwidths(cluster, group))
        assert got == pytest.approx(busbw, rel=0.01)


def test_multi_node_ring_is_nic_bound_not_pcie_bound() -> None:
    """NCCL spreads a multi-node ring over every GPU's NIC path: 2 DGX A100 all-gather at
    about the nodes' 200 GB/s NIC rate, not one GPU's PCIe Gen4 (31.5 GB/s)."""
    cluster = parse_cluster_spec("2x8xA100-SXM4-80GB")
    group, size = tuple(range(16)), 1e9
    phases = plan_collective("all_gather", group, size, cluster)
    busbw = 15 / 16 * size / collective_time_s(phases, link_bandwidths(cluster, group))
    assert busbw > 150e9


def test_small_all_reduce_latency_matches_nccl_tests() -> None:
    """32 B all-reduce on 8 × A100-SXM4-40GB: 10.14 µs measured (NCCL issue #583)."""
    topo = MemoTopology(parse_cluster_spec("1x8xA100-SXM4-40GB"))
    assert predict_s(topo, "all_reduce", tuple(range(8)), 32.0) == pytest.approx(10.14e-6,
                                                                                rel=0.1)


@pytest.mark.parametrize(("spec", "kind", "busbw"), [
    ("1x8xA100-SXM4-80GB", "all_reduce", 235e9),  # NCCL's own sm80 cap, nccl-tests 230-250
    ("1x8xH100-SXM5-80GB", "all_gather", 370e9),  # NCCL maintainer, nccl-tests issue #212
    ("1x8xH100-SXM5-80GB", "all_reduce", 480e9),  # NVLink SHARP, same issue
])
def test_large_message_bus_bandwidth_matches_nccl_tests(spec: str, kind: str,
                                                        busbw: float) -> None:
    topo = MemoTopology(parse_cluster_spec(spec))
    size, n = 8e9, 8
    factor = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    got = factor * size / predict_s(topo, kind, tuple(range(n)), size)
    assert got == pytest.approx(busbw, rel=0.02)


@pytest.mark.parametrize("spec", ["1x8xV100-PCIe-32GB", "1x8xA100-SXM4-80GB",
                                  "1x8xH100-SXM5-80GB", "2x8xA100-SXM4-80GB",
                                  "1x8xV100-SXM2-32GB", "2x8xV100-SXM2-32GB@p3dn.24xlarge"])
@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_larger_message_never_takes_less_time(spec: str, kind: str) -> None:
    topo = MemoTopology(parse_cluster_spec(spec))
    group = tuple(range(topo.cluster.num_gpus))
    times = [predict_s(topo, kind, group, float(1 << e)) for e in range(3, 32, 2)]
    assert all(b >= a for a, b in itertools.pairwise(times)), times


@pytest.mark.parametrize("name", ["nvlink", "nvswitch_nvlink3", "pcie", "infiniband",
                                  "ethernet"])
def test_ring_busbw_rises_with_size_towards_the_measured_plateau(name: str) -> None:
    models = collective_models()
    peak = 100e9
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for n, nodes in ((2, 1), (8, 1), (64, 8)):
            bws = [ring_bus_bandwidth_bytes_per_s(models, name, kind, n, float(1 << e), peak,
                                                  nodes) for e in range(3, 34)]
            assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(bws))
            assert bws[-1] <= peak * models.classes[name].efficiency[kind] * (1 + 1e-12)
            assert bws[-1] >= 0.9 * peak * models.classes[name].efficiency[kind]


def test_planning_is_deterministic() -> None:
    """Same inputs, same phases (the ring LP and the protocol choice are deterministic)."""
    spec, group = "2x8xV100-SXM2-32GB", tuple(range(16))
    first = plan_measured("all_gather", group, 3e8, MemoTopology(parse_cluster_spec(spec)))
    again = plan_measured("all_gather", group, 3e8, MemoTopology(parse_cluster_spec(spec)))
    assert first == again


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "p2p"])
def test_cpu_gloo_collectives_stay_as_fitted(kind: str) -> None:
    """A CPU cluster's loopback links carry the α/β `sim profile` fitted to gloo: the measured
    model leaves those phases exactly as planned."""
    repo = Path(__file__).resolve().parents[2]
    topo = MemoTopology(cpu_cluster(ProfileDB.load(repo / "traces" / "profile.csv"), 4))
    group = (0, 1) if kind == "p2p" else (0, 1, 2, 3)
    assert plan_measured(kind, group, 3e6, topo) == plan_collective(kind, group, 3e6, topo)


def test_link_classes() -> None:
    assert link_class("nvswitch", 300e9) == "nvswitch_nvlink3"
    assert link_class("nvswitch", 450e9) == "nvswitch_nvlink4"
    assert link_class("nic", 25e9, "ib-hdr") == "infiniband"
    assert link_class("nic", 12.5e9, "eth-100g") == "ethernet"
    assert link_class("nic", 1e9, "loopback") == "gloo_tcp"
    assert link_class("pcie", 15.754e9) == "pcie"


def test_every_coefficient_has_a_source() -> None:
    raw = load_json("collectives.json")
    assert "tuning.cc" in raw["protocols"]["source"]
    for name, cls in raw["link_classes"].items():
        assert "http" in cls["source"] or "fitted" in cls["source"] or name == "gloo_tcp", name
    for name, rec in raw["harness_overheads"].items():
        assert name.startswith("_") or rec["source"].strip(), name


def _broken(path: list[str], value: object) -> dict[str, object]:
    data = copy.deepcopy(load_json("collectives.json"))
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@pytest.mark.parametrize(("path", "value", "field"), [
    (["protocols", "ll", "base_s"], "fast", "base_s"),
    (["protocols", "simple", "base_s"], -1.0, "base_s"),
    (["protocols", "ll128", "bandwidth_factor"], 1.5, "bandwidth_factor"),
    (["link_classes", "nvlink", "efficiency", "all_gather"], 1.5, "all_gather"),
    (["link_classes", "nvlink", "protocols"], ["fast"], "protocols"),
    (["link_classes", "ethernet", "source"], KeyError, "source"),
    (["link_classes", "pcie", "step_s", "ll"], -1e-6, "ll"),
    (["tree_efficiency", "value"], 0, "value"),
    (["nic_classes", "ib-hdr"], "warp-drive", "ib-hdr"),
    (["link_classes", "gloo_tcp"], KeyError, "gloo_tcp"),
])
def test_data_file_errors_are_one_line_naming_the_field(path: list[str], value: object,
                                                        field: str) -> None:
    with pytest.raises(DataFileError) as info:
        parse_collective_models(json.loads(json.dumps(_broken(path, value))))
    message = str(info.value)
    assert "\n" not in message
    assert field in message and message.startswith("collectives.json")
